"""Where the data lives: --data-dir, else $SPARSEBERT_DATA, else ./data if present, else the Hugging Face hub."""

from __future__ import annotations

import os
from pathlib import Path

from sparsebert.errors import SparseBertError

DATA_ENV = "SPARSEBERT_DATA"
HOW_TO_POINT = (f"point sparsebert at your data with --data-dir DIR or ${DATA_ENV}=DIR "
                "(see README, 'Data setup')")


def resolve_data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The local data directory, or None to use the Hugging Face hub."""
    if explicit:
        path = Path(explicit)
        if not path.is_dir():
            raise SparseBertError(f"data directory {path} (from --data-dir) does not exist")
        return path.resolve()
    env = os.environ.get(DATA_ENV)
    if env:
        path = Path(env)
        if not path.is_dir():
            raise SparseBertError(f"data directory {path} (from ${DATA_ENV}) does not exist")
        return path.resolve()
    local = Path("data")
    return local.resolve() if local.is_dir() else None
