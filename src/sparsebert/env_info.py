"""What ``env.json`` records: seed, package versions, git commit, hardware, command line.

A run directory's ``env.json`` is the environment of the invocation that started the run; each ``--resume`` of it
adds its own environment to the list under ``resumes``, so the run's origin is never overwritten and the invocation
that finished it is the last one (:func:`invocations`). A finetuning run (``<task>/run<k>/``) is trained whole by
one invocation, which writes its own ``env.json`` beside its model: an experiment resumed at another commit holds
runs of both, and each run's file names the one that trained it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
import time
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
    """This process's environment, as ``env.json`` records it."""
    return {
        "seed": seed,
        "python": sys.version.split()[0],
        "packages": versions(),
        "git_commit": git_commit(),
        "hardware": hardware(),
        "argv": sys.argv,
    }


def with_resume(started: dict[str, Any], resumed: dict[str, Any]) -> dict[str, Any]:
    """``env.json`` once ``resumed`` (an :func:`environment`) continues the run ``started`` describes: the start stays
    on top (what the run began with; readers of ``env.json`` keep reading it there) and the resume is appended, in
    order, with the time it began."""
    earlier = started.get("resumes") if isinstance(started.get("resumes"), list) else []
    entry = {**resumed, "resumed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    return {**started, "resumes": [*earlier, entry]}


def invocations(env: dict[str, Any]) -> list[dict[str, Any]]:
    """The invocations an ``env.json`` records, first to last: the one that started the run, then each resume.
    The last one is the one that wrote the run's latest files (its ``DONE``, once finished)."""
    start = {k: v for k, v in env.items() if k != "resumes"}
    resumes = env.get("resumes") if isinstance(env.get("resumes"), list) else []
    return [start, *(r for r in resumes if isinstance(r, dict))]
