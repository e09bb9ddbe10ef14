"""Summary statistics over runs (seeds) that keep a collapsed run visible."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def sample_std(values: Sequence[float]) -> float:
    """The sample standard deviation of ``values`` (two or more); NaN when one of them is NaN (a collapsed run:
    constant STS-B predictions have no correlation), where ``statistics.stdev`` raises AttributeError."""
    return math.nan if any(map(math.isnan, values)) else statistics.stdev(values)
