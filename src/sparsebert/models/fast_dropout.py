"""Dropout with counter-hash random bits under ``torch.compile`` (``model.fast_dropout``).

Inductor's dropout draws each value's random number with its own 10-round Philox call; in a compiled bf16
BERT-base step those kernels cost more than their bytes (docs/performance.md). ``HashDropout`` keeps the keep
probability (to 2^-24) and takes each value's random bits from two rounds of MurmurHash3's 32-bit finalizer over
the value's index, keyed by two random 32-bit keys drawn from torch's generator per call: runs are reproducible
from the seed, and under CUDA graphs the keys come from the compiler's own random-number state. The compiled
pretraining step is faster with it (docs/performance.md), though the dropout kernel timed alone was not, and the
step was not profiled, so where the gain comes from is not established.

It is a different random stream from ``nn.Dropout``'s (a run does not reproduce one made without it), and the
hash has been checked for bias and correlation by the tests, not by a random-number test suite. Outside
torch.compile (eager, CPU runs of the Trainer) it runs torch's own dropout, whose single kernel is faster there.
The swap keeps every parameter and state_dict key.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

MAX_VALUES = 1 << 31  # one int32 counter per value


log = logging.getLogger(__name__)

def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finalizer on int32 (products wrap; ``& mask`` makes the right shifts logical)."""
    h = h ^ ((h >> 16) & 0xFFFF)
    h = h * -2048144789  # 0x85EBCA6B
    h = h ^ ((h >> 13) & 0x7FFFF)
    h = h * -1028477387  # 0xC2B2AE35
    return h ^ ((h >> 16) & 0xFFFF)


def _keep_mask(shape: torch.Size, p: float, keys: torch.Tensor, device: torch.device) -> torch.Tensor:
    index = torch.arange(shape.numel(), dtype=torch.int32, device=device).view(shape)
    bits = _fmix32(_fmix32(index ^ keys[0]) ^ keys[1])
    return ((bits >> 8) & 0xFFFFFF) >= round(p * (1 << 24))  # the top 24 bits, uniform in [0, 2^24)


def hash_dropout(x: torch.Tensor, p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Dropout of ``x`` in training mode with counter-hash random bits (two new keys from torch's generator);
    torch's own dropout for tensors of more than 2^31 values."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if p == 0.0:
        return x
    if x.numel() > MAX_VALUES:
        return F.dropout(x, p, training=True)
    keys = torch.randint(-(1 << 31), 1 << 31, (2,), dtype=torch.int32, device=x.device, generator=generator)
    # plain differentiable ops: the compiler derives the backward (the same mask) itself; a custom autograd
    # Function that recomputed the mask got zero gradients from Inductor's CUDA backward (tests/gpu)
    return torch.where(_keep_mask(x.shape, p, keys, x.device), x * (1.0 / (1.0 - p)), 0.0)


class HashDropout(nn.Dropout):
    """nn.Dropout; in training under torch.compile through :func:`hash_dropout` (``inplace`` is not honoured
    there: the result is a new tensor)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.compiler.is_compiling():
            return hash_dropout(x, self.p)
        return super().forward(x)


def use_hash_dropout(model: nn.Module) -> int:
    """Make every ``nn.Dropout`` of ``model`` a :class:`HashDropout` in place; returns how many were swapped. A
    module that is only read for its ``p`` (transformers' attention hands it to sdpa) is swapped too and changes
    nothing."""
    swapped = 0
    for module in model.modules():
        if type(module) is nn.Dropout:
            module.__class__ = HashDropout
            swapped += 1
    return swapped


def apply_fast_dropout(model: nn.Module, torch_compile: bool) -> int:
    """``model.fast_dropout`` on the trained model (models/prepare.py), saying what it changes; returns how many
    nn.Dropout modules were swapped."""
    swapped = use_hash_dropout(model)
    if swapped == 0:
        log.warning("model.fast_dropout: this model has no nn.Dropout; nothing changes")
    elif not torch_compile:
        log.info("model.fast_dropout changes nothing without train.torch_compile (eager runs torch's dropout)")
    else:
        log.info("model.fast_dropout: %d nn.Dropout modules swapped (those only read for their p, as the "
                 "attention's, work as before)", swapped)
    return swapped
