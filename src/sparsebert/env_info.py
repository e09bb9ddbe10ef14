"""What ``env.json`` records: seed, package versions, git commit, hardware, command line."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from sparsebert.distributed import world_size

PACKAGES = ("sparsebert", "torch", "transformers", "accelerate", "datasets", "tokenizers", "safetensors", "numpy")


def git_commit(cwd: Path | None = None) -> str | None:
    """HEAD of the checkout (with -dirty for uncommitted changes), or $SPARSEBERT_COMMIT where it is set: a copy
    of the working tree on another machine may carry no .git, or a stale one."""
    if os.environ.get("SPARSEBERT_COMMIT"):
        return os.environ["SPARSEBERT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=cwd or Path(__file__).parent, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def hardware() -> dict[str, Any]:
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "gpus": gpus,
        "cuda": torch.version.cuda,
        "world_size": world_size(),
    }


def environment(seed: int) -> dict[str, Any]:
    return {
        "seed": seed,
        "python": sys.version.split()[0],
        "packages": versions(),
        "git_commit": git_commit(),
        "hardware": hardware(),
        "argv": sys.argv,
    }
