"""Targets for ``run_in_processes`` in the tests: module-level, so a spawned process can import them."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import torch

from sparsebert.errors import SparseBertError

# what a job's modules do while a worker imports them (torchao asks whether CUDA is there): CUDA's driver starts
# and reads CUDA_VISIBLE_DEVICES, before the worker's own code runs
torch.cuda.is_available()
VISIBLE_AT_IMPORT = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")


def touch(path: str) -> None:
    """Write how this process would start its own children (a DataLoader's workers)."""
    Path(path).write_text(multiprocessing.get_start_method())


def refuse(message: str) -> None:
    raise SparseBertError(message)


def call(target, argument) -> None:
    """``target(argument)``: one target per call of a list."""
    target(argument)


def record_gpu(path: str) -> None:
    """Write the GPUs this process saw when it imported this module, and sees now."""
    Path(path).write_text(f"{VISIBLE_AT_IMPORT} {os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}")


def record_cuda_device(path: str) -> None:
    """Write how many GPUs this process sees and the UUID of the one it computes on."""
    torch.ones(1, device="cuda")
    Path(path).write_text(f"{torch.cuda.device_count()} {torch.cuda.get_device_properties(0).uuid}")
