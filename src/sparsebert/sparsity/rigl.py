"""RigL mask updates (Evci et al. 2020, "Rigging the Lottery"): drop the smallest active weights, regrow the
same number of inactive positions where the dense gradient is largest.

The schedule and the mask arithmetic are pure functions; the controller owns the step counter, the weights and
the optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .config import RigLConfig
from .masks import mask_from_indices, top_k_indices


@dataclass
class MaskChange:
    """Positions of one layer that leave (``dropped``) and join (``grown``) the active set; disjoint bool masks."""

    dropped: torch.Tensor
    grown: torch.Tensor


def rigl_update_due(step: int, config: RigLConfig, end_step: int) -> bool:
    """Whether the mask changes after optimizer step ``step`` (1-based, counted after the step)."""
    return step % config.update_freq == 0 and config.begin_step <= step < end_step


def rigl_drop_fraction(step: int, config: RigLConfig, end_step: int) -> float:
    """Fraction of active weights moved at ``step``; cosine decays from ``drop_fraction`` at begin to 0 at end."""
    if config.drop_schedule == "constant":
        return config.drop_fraction
    progress = (step - config.begin_step) / (end_step - config.begin_step)
    progress = min(max(progress, 0.0), 1.0)
    return config.drop_fraction / 2 * (1 + math.cos(math.pi * progress))


def rigl_layer_change(
    weight: torch.Tensor,
    grad: torch.Tensor,
    mask: torch.Tensor,
    drop_fraction: float,
    generator: torch.Generator,
    n_active: int | None = None,
) -> MaskChange:
    """Move ``round(drop_fraction · active)`` weights of one layer, keeping its density exactly constant.

    Growth only considers positions inactive *before* this update, so a weight just dropped cannot be regrown
    in the same update (which would make the move a no-op and inflate the reported count). ``n_active``: the
    mask's number of active weights, when the caller has it (saves a device-to-host read per layer).
    """
    n_active = int(mask.sum()) if n_active is None else n_active
    n_inactive = mask.numel() - n_active
    n_move = min(round(drop_fraction * n_active), n_inactive)
    dropped = top_k_indices(-weight.detach().abs(), mask, n_move, generator, n_eligible=n_active)
    grown = top_k_indices(grad.abs(), ~mask, n_move, generator, n_eligible=n_inactive)
    return MaskChange(dropped=mask_from_indices(dropped, mask), grown=mask_from_indices(grown, mask))


def rigl_global_change(
    weights: Mapping[str, torch.Tensor],
    grads: Mapping[str, torch.Tensor],
    masks: Mapping[str, torch.Tensor],
    drop_fraction: float,
    generator: torch.Generator,
) -> dict[str, MaskChange]:
    """Like ``rigl_layer_change`` but ranking all layers together: the total number of active weights is
    constant, while each layer's density can drift towards where magnitudes and gradients are large."""
    names = list(masks)
    mask = torch.cat([masks[n].reshape(-1) for n in names])
    magnitude = torch.cat([weights[n].detach().abs().reshape(-1) for n in names])
    grad = torch.cat([grads[n].abs().reshape(-1).to(magnitude.dtype) for n in names])
    n_active = int(mask.sum())
    n_inactive = mask.numel() - n_active
    n_move = min(round(drop_fraction * n_active), n_inactive)
    dropped = mask_from_indices(top_k_indices(-magnitude, mask, n_move, generator, n_eligible=n_active), mask)
    grown = mask_from_indices(top_k_indices(grad, ~mask, n_move, generator, n_eligible=n_inactive), mask)
    sizes = [masks[n].numel() for n in names]
    return {
        name: MaskChange(dropped=d.view(masks[name].shape), grown=g.view(masks[name].shape))
        for name, d, g in zip(names, dropped.split(sizes), grown.split(sizes))
    }
