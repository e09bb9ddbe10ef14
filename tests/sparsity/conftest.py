"""Fixtures for the sparsity tests; makes ``src/`` importable when the package is not installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

try:
    import sparsebert  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from sparsity_helpers import make_mlp, make_tiny_bert  # noqa: E402


@pytest.fixture(autouse=True)
def _single_thread():
    """Tiny tensors run several times faster on one thread than with intra-op threads fighting for 2 cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_bert() -> nn.Module:
    return make_tiny_bert()


@pytest.fixture
def mlp() -> nn.Sequential:
    return make_mlp()
