"""``train.precision`` resolved for this machine: what ``auto`` means here, and a one-line error for a precision
the machine cannot train in (read before the run directory exists: runner.check_train_settings)."""

from __future__ import annotations

import torch

from sparsebert.errors import SparseBertError
from sparsebert.models.fp8 import fp8_unavailable_reason


def resolve_precision(precision: str) -> str:
    """bf16 / fp16 / fp32 / fp8 for ``train.precision`` (``auto``: bf16 where the GPU has it, else fp32)."""
    if precision == "auto":
        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
    if precision in ("bf16", "fp16") and not torch.cuda.is_available():
        raise SparseBertError(f"train.precision={precision} needs a GPU; use auto or fp32 on CPU")
    if precision == "fp8" and (reason := fp8_unavailable_reason()):
        raise SparseBertError(reason)
    return precision
