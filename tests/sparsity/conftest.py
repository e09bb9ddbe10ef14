"""Fixtures for the sparsity tests; makes ``src/`` importable when the package is not installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

try:
    import sparsebert  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from sparsity_helpers import mlp, one_thread, tiny_bert  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _single_thread(request):
    """Every sparsity test on one thread (``one_thread``)."""
    request.getfixturevalue("one_thread")
