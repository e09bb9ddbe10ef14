"""Gradual pruning (Zhu & Gupta 2017, "To prune, or not to prune"): the schedule, and pruning by a score.

Sparsity follows a cubic ramp: it rises fast while the network has redundant weights and slowly near the end,
giving the remaining weights time to recover. A pruned weight never comes back (unless RigL runs too and regrows
it, GraNet-style: see ``SparsityController``). The methods
differ only in their score (the largest scores stay): |w| for magnitude pruning; for movement pruning (Sanh et
al. 2020, "Movement Pruning") ``S = -sum_t grad_t * w_t``, the first-order estimate of how much the loss would
rise without the weight, summed over training, so weights that move towards zero go even while still large; for
oBERT's second-order score, see ``scores.py``, where every score lives as a plug-in of the controller.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from sparsebert.upstream.torch_ops import foreach_addcmul_

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


def gmp_next_update(step: int, config: GMPConfig, end_step: int) -> int | None:
    """The first step ``>= step`` at which ``gmp_update_due``; None once ``end_step`` is past."""
    if step > end_step:
        return None
    if step <= config.begin_step:
        return config.begin_step
    periods = -(-(step - config.begin_step) // config.frequency)  # ceil: the next multiple of frequency
    return min(config.begin_step + periods * config.frequency, end_step)


def gmp_prune(score: torch.Tensor, mask: torch.Tensor, n_keep: int, generator: torch.Generator) -> torch.Tensor:
    """Bool mask of the active entries to remove so that the ``n_keep`` of largest ``score`` remain."""
    n_drop = max(0, int(mask.sum()) - n_keep)
    dropped = top_k_indices(-score, mask, n_drop, generator)
    return mask_from_indices(dropped, mask)


def gmp_prune_global(
    scores: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor], n_keep: int, generator: torch.Generator,
    min_keep: Mapping[str, int] | None = None,
) -> dict[str, torch.Tensor]:
    """``gmp_prune`` over all layers at once: the ``n_keep`` largest scores of all of them remain, so a layer whose
    scores are small ends sparser than one whose scores are large. ``min_keep``: per layer, that many of its
    best-scored active entries stay whatever the others score (``gmp.max_tensor_sparsity``); a layer that has
    fewer (pruned before the run: ``sparsity.init`` zeros) keeps every one it has. Returns each layer's dropped
    entries."""
    names = list(masks)
    scores = {n: scores[n].detach().float() for n in names}
    for name, count in (min_keep or {}).items():
        active = int(masks[name].sum())
        if min(count, active) > 0:  # the layer's own best stay: ranked above every other score
            protected = top_k_indices(scores[name], masks[name], min(count, active), generator, n_eligible=active)
            scores[name] = scores[name].reshape(-1).index_fill(0, protected, torch.inf).view(masks[name].shape)
    flat_scores = torch.cat([scores[n].reshape(-1) for n in names])
    flat_mask = torch.cat([masks[n].reshape(-1) for n in names])
    dropped = gmp_prune(flat_scores, flat_mask, n_keep, generator)
    sizes = [masks[n].numel() for n in names]
    return {name: part.view(masks[name].shape) for name, part in zip(names, dropped.split(sizes))}


@torch.no_grad()
def accumulate_movement(scores: list[torch.Tensor], weights: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    """``S -= grad * w`` in place for every layer: one step of movement scores. A weight that the gradient pushes
    away from zero (sign(grad) = -sign(w)) gains score, one pushed towards zero loses it."""
    foreach_addcmul_(scores, [g.float() for g in grads], [w.float() for w in weights], value=-1.0)


def rewound_linear_factor(step: int, warmup_steps: int, rewind_step: int, total_steps: int) -> float:
    """Learning-rate factor of a linear schedule that is rewound when pruning ends.

    Up to ``rewind_step`` the usual warm-up then linear decay towards 0 at ``total_steps``; from ``rewind_step``
    the factor jumps back to 1 and decays linearly to 0 at ``total_steps``, so the recovery steps after pruning
    train at the learning rates the dense model saw (Renda et al. 2020, "Comparing Rewinding and Fine-tuning").
    """
    if step < rewind_step:
        if step < warmup_steps:
            return step / max(1, warmup_steps)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
    return max(0.0, (total_steps - step) / max(1, total_steps - rewind_step))
