"""Environment variables set for a while: what a process starts with (spawned workers) or a library reads."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def environ(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` set inside; each variable as it was (or unset) after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
