"""GPU kernels of our own, built on demand: ``sparse24.cu``, a 2:4 sparse Linear for sm90 GPUs (CUTLASS SM90).

Build with ``python -m sparsebert.kernels.build`` on any x86-64 Linux machine, GPU or not (it fetches CUDA 13.0's
compiler and CUTLASS's headers as wheels from PyPI); ``sparsebert.export.sparse24_kernel`` loads the result.
"""

from __future__ import annotations

import os
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent


def kernel_dir() -> Path:
    """Where built kernels live: ``$SPARSEBERT_KERNEL_DIR``, else ``~/.cache/sparsebert/kernels``."""
    return Path(os.environ.get("SPARSEBERT_KERNEL_DIR", Path.home() / ".cache" / "sparsebert" / "kernels"))


def sparse24_library() -> Path:
    """The 2:4 kernel library: ``$SPARSEBERT_SPARSE24_LIB``, else ``libsparse24.so`` in ``kernel_dir()``; where
    the build writes it and the loader looks."""
    return Path(os.environ.get("SPARSEBERT_SPARSE24_LIB", kernel_dir() / "libsparse24.so"))
