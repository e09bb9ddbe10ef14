"""The residual stream in the autocast dtype (``model.half_precision_residual``).

Under bf16 / fp16 autocast on CUDA, matrix products run in half precision but LayerNorm runs in fp32 and returns
fp32, so every layer's residual stream (LayerNorm output, residual add, dropout) is stored and read in fp32, and
each matrix product first casts its input down. With this option every LayerNorm of the trained model computes
as autocast has it (fp32 on CUDA) but returns the autocast dtype: the residual stream is half precision, as in
Megatron-style mixed precision, while weights, gradients and optimizer state stay fp32 (the Trainer's master
weights). That halves the bytes of the memory-bound elementwise kernels around each LayerNorm; it also rounds
each residual sum to 8 mantissa bits (bf16; fp16 keeps 11 but its range can overflow where bf16 cannot), so it
changes numerics (a pretraining default after an 8 000-step pair showed the same eval loss; under fp16 training
it is left off). Without autocast (fp32, CPU) it changes nothing. Teachers (distillation) keep
their LayerNorms. Checkpoints are unchanged: the modules keep their class's parameters.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger(__name__)


class AutocastDtypeLayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose output takes the autocast dtype (computed in fp32 as autocast does)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        device = x.device.type
        if torch.is_autocast_enabled(device):
            return out.to(torch.get_autocast_dtype(device))
        return out


def use_half_precision_residual(model: nn.Module) -> int:
    """Make every nn.LayerNorm of ``model`` an AutocastDtypeLayerNorm in place; returns how many."""
    swapped = 0
    for module in model.modules():
        if type(module) is nn.LayerNorm:
            module.__class__ = AutocastDtypeLayerNorm  # same parameters and state_dict keys
            swapped += 1
    return swapped


def apply_half_precision_residual(model: nn.Module, precision: str) -> int:
    """``use_half_precision_residual`` under bf16 training (``precision``: the resolved train.precision), saying
    what it changes. Under fp16 the LayerNorms stay as they are: an fp16 residual sum can overflow, and the
    setting is a pretraining default. Returns how many LayerNorms now return the autocast dtype."""
    if precision == "fp16":
        log.info("model.half_precision_residual: left off under fp16 (an fp16 residual stream can overflow)")
        return 0
    swapped = use_half_precision_residual(model)
    if swapped == 0:
        log.warning("model.half_precision_residual: this model has no nn.LayerNorm; nothing changes")
    elif precision != "bf16":
        log.info("model.half_precision_residual has no effect without bf16 (precision is %s)", precision)
    else:
        log.info("model.half_precision_residual: %d LayerNorms return the autocast dtype", swapped)
    return swapped
