"""Optimizer state at weights whose mask changed: cleared, and for a regrown weight Adam's second moment seeded.

A masked weight still receives a gradient from the backward pass; the controller zeroes it before each step, but
state built before the masks (or by a step with unmasked gradients) can hold exp_avg / exp_avg_sq there. If that
stale momentum survived regrowth, the weight would jump away from its intended start at 0 on the next step.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def reset_optimizer_state(
    optimizer: torch.optim.Optimizer, param: torch.Tensor, changed: torch.Tensor
) -> None:
    """Zero every per-element state tensor of ``param`` (same shape as the param) where ``changed`` is True.

    Scalar state such as Adam's ``step`` is left alone: it is shared by the whole tensor.
    """
    for value in optimizer.state.get(param, {}).values():
        if torch.is_tensor(value) and value.shape == param.shape:
            value.masked_fill_(changed, 0)


@torch.no_grad()
def seed_second_moment(
    optimizer: torch.optim.Optimizer, param: torch.Tensor, grown: torch.Tensor, kept: torch.Tensor
) -> None:
    """Start Adam's second moment at ``grown`` positions at its mean over the ``kept`` positions.

    Adam's bias correction counts steps per tensor, not per element, so a weight regrown with empty moments late in
    training is not corrected for its own age: k steps after regrowth its second moment holds only (1 - beta2^k) of
    its gradient's square, and its steps are (1 - beta1^k) / sqrt(1 - beta2^k) times an ordinary Adam step: 3.2x
    at the first, 6.5x at the tenth, 3.2x at the hundredth (betas 0.9, 0.999). Starting the second moment at the
    layer's typical value gives a regrown weight ordinary steps from the start (``rigl.grow_second_moment``; not the
    default: the larger steps pretrain better). Optimizers without ``exp_avg_sq`` (SGD) are left alone.

    Args:
        optimizer: holds ``param``'s state (nothing happens before its first step, when there is none).
        param: the weight whose positions changed.
        grown: bool mask of the positions that just became active.
        kept: bool mask of the positions that were active before and stay active.
    """
    state = optimizer.state.get(param, {})
    for key in ("exp_avg_sq", "max_exp_avg_sq"):
        value = state.get(key)
        if not torch.is_tensor(value) or value.shape != param.shape:
            continue
        weights = kept.to(value.dtype)
        mean = (value * weights).sum() / weights.sum().clamp(min=1)  # a tensor: no device-to-host read
        value.masked_fill_(grown, mean)
