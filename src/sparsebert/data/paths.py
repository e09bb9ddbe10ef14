"""Where the data lives: --data-dir, else $SPARSEBERT_DATA, else ./data if present, else the Hugging Face hub."""

from __future__ import annotations

import os
from pathlib import Path

from sparsebert.errors import SparseBertError

DATA_ENV = "SPARSEBERT_DATA"
HOW_TO_POINT = (f"point sparsebert at your data with --data-dir DIR or ${DATA_ENV}=DIR "
                "(see README, 'Getting the data')")


def resolve_data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The local data directory, or None to use the Hugging Face hub."""
    if explicit:
        return _directory(Path(explicit), "--data-dir")
    env = os.environ.get(DATA_ENV)
    if env:
        return _directory(Path(env), f"${DATA_ENV}")
    local = Path("data")
    return local.resolve() if local.is_dir() else None


def _directory(path: Path, source: str) -> Path:
    """``path`` resolved if it is a directory; else the error that says what it is instead."""
    if path.is_dir():
        return path.resolve()
    what = "is not a directory" if path.exists() else "does not exist"
    raise SparseBertError(f"data directory {path} (from {source}) {what}")
