"""Gradual magnitude pruning (Zhu & Gupta 2017, "To prune, or not to prune").

Sparsity follows a cubic ramp: it rises fast while the network has redundant weights and slowly near the end,
giving the remaining weights time to recover. Pruning is permanent: a pruned weight never comes back.
"""

from __future__ import annotations

import torch

from .config import GMPConfig
from .masks import mask_from_indices, top_k_indices


def gmp_sparsity(step: int, initial: float, final: float, begin: int, end: int) -> float:
    """``s_t = s_f + (s_i − s_f)(1 − (t − t0)/(t1 − t0))³``, held at ``s_i`` before ``t0`` and ``s_f`` after ``t1``."""
    if step <= begin:
        return initial
    if step >= end:
        return final
    progress = (step - begin) / (end - begin)
    return final + (initial - final) * (1.0 - progress) ** 3


def gmp_update_due(step: int, config: GMPConfig, end_step: int) -> bool:
    """Every ``frequency`` steps from ``begin_step``, plus ``end_step`` itself so the target is always reached."""
    if not config.begin_step <= step <= end_step:
        return False
    return (step - config.begin_step) % config.frequency == 0 or step == end_step


def gmp_prune(
    weight: torch.Tensor, mask: torch.Tensor, n_keep: int, generator: torch.Generator
) -> torch.Tensor:
    """Bool mask of the active weights to remove so that the ``n_keep`` largest-magnitude ones remain."""
    n_drop = max(0, int(mask.sum()) - n_keep)
    dropped = top_k_indices(-weight.detach().abs(), mask, n_drop, generator)
    return mask_from_indices(dropped, mask)
