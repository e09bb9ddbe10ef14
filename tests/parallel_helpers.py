"""Targets for ``run_in_processes`` in the tests: module-level, so a spawned process can import them."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from sparsebert.errors import SparseBertError


def touch(path: str) -> None:
    """Write how this process would start its own children (a DataLoader's workers)."""
    Path(path).write_text(multiprocessing.get_start_method())


def refuse(message: str) -> None:
    raise SparseBertError(message)


def call(target, argument) -> None:
    """``target(argument)``: one target per call of a list."""
    target(argument)


def record_gpu(path: str) -> None:
    """Write the GPUs this process was left to see."""
    Path(path).write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))


def record_cuda_device(path: str) -> None:
    """Write how many GPUs this process sees and the UUID of the one it computes on."""
    import torch

    torch.ones(1, device="cuda")  # CUDA starts here, after the worker set its CUDA_VISIBLE_DEVICES
    Path(path).write_text(f"{torch.cuda.device_count()} {torch.cuda.get_device_properties(0).uuid}")
