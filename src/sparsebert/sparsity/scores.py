"""Pruning scores: what GMP ranks weights by, as plug-ins of ``SparsityController``.

A pruning method is its score (as in google-research/rigl, whose methods differ only in theirs): GMP keeps the
weights of largest score, and whatever else a method needs — gradients seen along the way, a weight update after
a prune, state for the checkpoint — lives in its score object. The controller drives every score alike:

- after each optimizer step, while ``observes(step)``: ``observe(step, weights, grads)`` with the gradients of
  the whole step still in ``p.grad`` (accumulated over its micro-batches, all-reduced, unscaled, zero at masked
  positions) and the weights just stepped;
- at a prune: ``scores(weights, masks)`` (larger = keep); the masks change; ``after_prune(weights, masks)`` with
  the new masks; then the controller zeroes every masked weight;
- ``state_dict()`` / ``load_state_dict(state)`` with each checkpoint, ``to(device)`` when the weights move.

``make_score`` builds the one a ``GMPConfig`` names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .config import GMPConfig
from .gmp import accumulate_movement


class PruningScore:
    """The score GMP keeps the largest of. This base observes nothing, updates no weight and has no state."""

    def observes(self, step: int) -> bool:
        """Whether ``observe`` wants the gradients of optimizer step ``step`` (counted from 1)."""
        return False

    def observe(self, step: int, weights: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]) -> None:
        """Take in one optimizer step.

        Args:
            step: the optimizer step just taken, counted from 1.
            weights: the selected weights after the step, by name.
            grads: their gradients of the step (a layer without one, e.g. frozen, is absent).
        """

    def scores(self, weights: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each weight's score, shaped like it; larger = keep. Masked entries are never picked, whatever they hold.

        Args:
            weights: the selected weights by name.
            masks: their masks (True = active).

        Returns:
            name -> score tensor.
        """
        raise NotImplementedError

    def after_prune(self, weights: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> None:
        """Called once the masks of a prune are set (with the new ``masks``), before the masked weights are zeroed;
        may update ``weights`` in place."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to go on scoring alike after a resume (merged into the controller's)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from a controller state (``SparsityController.load_state_dict`` passes the whole of it)."""

    def to(self, device: torch.device) -> None:
        """Move whatever tensors the score holds to ``device``, where the weights now are."""


class MagnitudeScore(PruningScore):
    """|w| (Zhu & Gupta 2017)."""

    def scores(self, weights: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: weight.detach().abs() for name, weight in weights.items()}


class MovementScore(PruningScore):
    """Hard movement pruning (Sanh et al. 2020): ``S = -sum_t grad_t * w_t`` over every optimizer step up to the
    end of pruning (float32, one per weight). A masked weight is 0 and adds nothing, so its score freezes.

    Checkpointed as ``movement_scores`` (``score/<name>`` in ``masks.safetensors``), so a resumed run prunes by
    the same scores.

    Args:
        params: the selected weights by name.
        end_step: the last step of pruning (``SparsityController.gmp_end_step``).
    """

    STATE_KEY = "movement_scores"

    def __init__(self, params: Mapping[str, torch.Tensor], end_step: int) -> None:
        self.end_step = end_step
        self.params = params
        self.accumulated = {name: torch.zeros_like(p, dtype=torch.float32) for name, p in params.items()}

    def observes(self, step: int) -> bool:
        return step <= self.end_step

    def observe(self, step: int, weights: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]) -> None:
        names = list(grads)
        accumulate_movement([self.accumulated[n] for n in names], [weights[n] for n in names],
                            [grads[n] for n in names])

    def scores(self, weights: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.accumulated

    def state_dict(self) -> dict[str, Any]:
        return {self.STATE_KEY: {n: s.detach().cpu().clone() for n, s in self.accumulated.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.STATE_KEY not in state:
            raise ValueError("the sparsity state holds no movement scores but gmp.score is movement: was it "
                             "saved by a run with another gmp.score?")
        saved = state[self.STATE_KEY]
        self.accumulated = {n: saved[n].to(device=p.device, dtype=torch.float32).clone()
                            for n, p in self.params.items()}

    def to(self, device: torch.device) -> None:
        self.accumulated = {n: s.to(device) for n, s in self.accumulated.items()}


def make_score(gmp: GMPConfig, params: Mapping[str, torch.Tensor], end_step: int) -> PruningScore:
    """The score ``gmp.score`` names.

    Args:
        gmp: the GMP section.
        params: the selected weights by name.
        end_step: the resolved last step of pruning.

    Returns:
        A ``MagnitudeScore`` or ``MovementScore``.
    """
    if gmp.score == "movement":
        return MovementScore(params, end_step)
    return MagnitudeScore()
