"""Clearing optimizer state at weights whose mask changed.

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
