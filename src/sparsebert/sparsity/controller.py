"""``SparsityController``: the one object the Trainer talks to.

It owns the masks of the selected weights and keeps the invariant "a masked weight is exactly 0 after every
optimizer step" (by re-applying the masks, or, for Adam / AdamW after masked gradients, by the step itself), and
updates the masks on the RigL and/or GMP schedule (GMP by its pruning score, ``scores.py``). The Trainer calls
``on_optimizer_step()`` once after every ``optimizer.step()``, with the (unscaled, all-reduced) gradients still in
``p.grad``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .config import (
    GMPConfig,
    RigLConfig,
    SparsityConfig,
    check_gmp_fits,
    check_mask_evolution,
    check_schedules_fit,
)
from .distribution import kept_count, layer_densities
from .gmp import gmp_prune, gmp_prune_global, gmp_sparsity, gmp_update_due
from .masks import apply_masks_, magnitude_mask, make_generator, nm_mask, nm_violations, random_mask
from .optimizer_state import reset_optimizer_state, seed_second_moment
from .persistence import load_sparsity_state, save_sparsity_state
from .report import module_label, sparsity_report
from .rigl import MaskChange, rigl_drop_fraction, rigl_global_change, rigl_layer_change, rigl_update_due
from .scores import MagnitudeScore, PruningScore, make_score
from .selection import select_parameters


class SparsityController:
    """Masks for the selected weights of ``model``: static, or evolving with RigL, GMP, or both (GMP prunes, then
    RigL moves a share of what is left).

    Build it after the model is on its device and before wrapping it (DDP adds a ``module.`` prefix that
    would end up in the mask names). ``masks`` may be given instead of built (see ``from_zeros``).
    """

    def __init__(
        self,
        model: nn.Module,
        sparsity: SparsityConfig,
        rigl: RigLConfig | None = None,
        gmp: GMPConfig | None = None,
        total_steps: int = 0,
        seed: int = 42,
        masks: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        sparsity.validate()
        check_mask_evolution(sparsity, rigl, gmp)
        if rigl is not None:
            rigl.validate()
        if gmp is not None:
            gmp.validate()
            check_gmp_fits(gmp, sparsity)
        self.model = model
        self.sparsity = sparsity
        self.rigl = rigl
        self.gmp = gmp
        self.seed = seed
        if total_steps > 0:  # known (an epoch-counted run learns it only here): a schedule must fit it
            check_schedules_fit(rigl, gmp, total_steps)
        self.rigl_end_step = rigl.resolved_end_step(total_steps) if rigl is not None else None
        self.gmp_end_step = gmp.resolved_end_step(total_steps) if gmp is not None else None
        self.step = 0
        self.optimizer: torch.optim.Optimizer | None = None
        self._growth_grads: dict[str, torch.Tensor] | None = None
        self._grads_masked = False  # before_optimizer_step ran since the last optimizer step
        # the optimizer's moments are 0 at every masked position (see _optimizer_keeps_zeros)
        self._masked_state_clean = False
        self.mask_version = 0  # changes whenever any mask does (distributed/all_reduce.py keys its positions by it)

        self.params = select_parameters(model, sparsity)
        if sparsity.pattern == "2:4":
            self._check_two_four_shapes()
        self.target_densities = layer_densities(sparsity, {n: tuple(p.shape) for n, p in self.params.items()})
        self.masks = self._given_masks(masks) if masks is not None else self._initial_masks()
        self.initial_masks = {n: m.clone() for n, m in self.masks.items()}
        if masks is None and sparsity.rescale_init:
            self._rescale_kept_weights()
        # what GMP prunes by (sparsity/scores.py); without GMP nothing asks it, and magnitude observes nothing
        self.score: PruningScore = (make_score(gmp, self.params, self.gmp_end_step) if gmp is not None
                                    else MagnitudeScore())
        self.apply_masks()

    @classmethod
    def from_zeros(cls, model: nn.Module, sparsity: SparsityConfig, **kwargs: Any) -> SparsityController:
        """Recover the masks as ``w != 0`` of the selected weights, e.g. to finetune an exported sparse model
        without letting the optimizer fill the zeros back in. An active weight that is exactly 0 (RigL-regrown
        and not stepped since) cannot be told from a pruned one and comes back inactive."""
        masks = {name: param.detach() != 0 for name, param in select_parameters(model, sparsity).items()}
        return cls(model, sparsity, masks=masks, **kwargs)

    def follow_model_device(self) -> None:
        """Move masks to where their weights are now (the Trainer moves the model after the masks were built)."""
        for name, param in self.params.items():
            if self.masks[name].device != param.device:
                self.masks[name] = self.masks[name].to(param.device)
                self.initial_masks[name] = self.initial_masks[name].to(param.device)
                self.mask_version += 1
        self.score.to(self._device)

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Needed before a RigL update: regrown weights must not inherit the stale state of their position.

        Attach again after loading optimizer state by hand: whatever state the optimizer holds was not built under
        these masks, so its masked positions are cleared at the next step (the Trainer loads a checkpoint's state
        before ``on_train_begin`` attaches it).
        """
        self.optimizer = optimizer
        self._masked_state_clean = False

    def apply_masks(self) -> None:
        apply_masks_(list(self.params.values()), [self.masks[name] for name in self.params])

    def dense_gradients_due(self) -> bool:
        """Whether the coming optimizer step needs the gradient of masked weights too (a RigL update)."""
        return self.rigl is not None and rigl_update_due(self.step + 1, self.rigl, self.rigl_end_step)

    def before_optimizer_step(self, grads_masked: bool = False) -> None:
        """Call once per optimizer step after the last backward and before gradient clipping.

        If a RigL update is due at this step, keep a copy of the dense gradient (growth is scored with the
        gradient of this very step's batch, never an extra one). Then zero the gradient of masked weights, so
        clipping and the optimizer see only the sparse model's gradient and the optimizer state of masked
        positions stays empty.

        ``grads_masked``: every selected layer's gradient already has zeros at its masked positions (the sparse
        all-reduce's result for this step), so masking them again is skipped (85 M values for BERT-base).
        Under fp16 the copy is loss-scaled: ranking by magnitude does not change.
        """
        with_grad = [name for name, p in self.params.items() if p.grad is not None]
        if self.dense_gradients_due():
            missing = [name for name, p in self.params.items() if p.grad is None]
            if missing:  # growth is scored by gradient: a layer without one cannot take part
                raise ValueError(f"RigL update at step {self.step + 1}: {', '.join(missing[:3])} received no "
                                 "gradient (frozen, or unused in the forward pass); exclude it through "
                                 "sparsity.exclude")
            self._growth_grads = {n: p.grad.detach().clone() for n, p in self.params.items()}
        if not grads_masked:
            # a layer without a gradient (frozen) is skipped; every other one is masked
            apply_masks_([self.params[name].grad for name in with_grad], [self.masks[name] for name in with_grad])
        self._grads_masked = True

    def on_optimizer_step(self, skipped: bool = False) -> dict[str, float] | None:
        """Call once after every ``optimizer.step()``; returns log stats when the masks changed, else None.

        ``skipped``: the fp16 grad scaler skipped the step (inf/nan gradients). It does not count as a step and
        never updates masks, but masks are still re-applied in case anything touched the weights.
        """
        grads_masked, self._grads_masked = self._grads_masked, False
        if skipped:
            self._growth_grads = None  # inf/nan gradients: the update waits for the next real step
            self.apply_masks()
            return None
        self.step += 1
        if self.score.observes(self.step):
            self._observe_gradients()
        if grads_masked and self._optimizer_keeps_zeros():
            if not self._masked_state_clean:
                # once after attaching (or after a step with unmasked gradients): moments left at masked positions
                # would move masked weights on every later step
                self._clear_masked_optimizer_state()
                self.apply_masks()
                self._masked_state_clean = True
        else:
            self.apply_masks()
            self._masked_state_clean = False  # unmasked gradients may have reached the moments
        stats: dict[str, float] = {}
        # with both schedules: prune first, then move, so that a weight regrown at this step is not pruned at it
        # (RigL may regrow a weight GMP has just pruned, by its gradient: it restarts at zero; both draw their
        # tie-breaks from the step's stream, so equal |w| are ordered alike, which is harmless)
        if self.gmp is not None and gmp_update_due(self.step, self.gmp, self.gmp_end_step):
            stats |= self._gmp_update()
        if self.rigl is not None and rigl_update_due(self.step, self.rigl, self.rigl_end_step):
            stats |= self._rigl_update()
        self._growth_grads = None
        if not stats:
            return None
        self.apply_masks()
        return stats

    def density_logs(self) -> dict[str, float]:
        """The masks' density: ``density`` over every selected weight, ``density/layer_0_Q`` ... per tensor (the
        trackers' scalars over time). One host-device sync for all the tensors."""
        if not self.masks:
            return {}
        active = _counts(list(self.masks.values()))
        sizes = [m.numel() for m in self.masks.values()]
        logs = {"density": sum(active) / sum(sizes)}
        for name, kept, size in zip(self.masks, active, sizes):
            logs[f"density/{module_label(name).replace(' ', '_')}"] = kept / size
        return logs

    def _observe_gradients(self) -> None:
        """Hand the score this step's gradients still in ``p.grad`` (the whole step's: accumulated, all-reduced,
        unscaled, masked) and the weights just stepped; a layer without a gradient (frozen) is left out."""
        grads = {name: p.grad for name, p in self.params.items() if p.grad is not None}
        self.score.observe(self.step, {name: self.params[name].detach() for name in grads}, grads)

    def _optimizer_keeps_zeros(self) -> bool:
        """Whether a step after masked gradients leaves every masked weight at exactly 0 by itself, so re-applying
        the masks would rewrite 85 M weights (BERT-base) with what they already hold.

        True for torch's Adam and AdamW once their moments are 0 at the masked positions (``_masked_state_clean``:
        cleared once after attaching the optimizer or after any step with unmasked gradients, and kept so by
        ``_commit``, which zeroes the state wherever a mask changes): weight, gradient and moments are then all 0,
        so the update is 0 / (0 + eps) = 0 and weight decay multiplies 0. Any other optimizer gets the masks
        re-applied after every step; so does every step that changes masks.
        """
        return type(self.optimizer) in (torch.optim.Adam, torch.optim.AdamW)

    def _clear_masked_optimizer_state(self) -> None:
        for name, param in self.params.items():
            reset_optimizer_state(self.optimizer, param, ~self.masks[name])

    def state_dict(self) -> dict[str, Any]:
        state = {
            "step": self.step,
            "masks": {n: m.detach().cpu().clone() for n, m in self.masks.items()},
            "initial_masks": {n: m.detach().cpu().clone() for n, m in self.initial_masks.items()},
        }
        return state | self.score.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore masks and step (e.g. on resume); the masks are applied to the weights right away."""
        for key in ("masks", "initial_masks"):
            if set(state[key]) != set(self.params):
                missing = sorted(set(self.params) - set(state[key]))
                unexpected = sorted(set(state[key]) - set(self.params))
                raise ValueError(
                    f"sparsity state {key} do not match the selected layers (missing {missing[:3]}, "
                    f"unexpected {unexpected[:3]}): was it saved with another sparsity config or model?"
                )
        self.masks = self._given_masks(state["masks"])
        self.initial_masks = self._given_masks(state["initial_masks"])
        self.mask_version += 1
        self.step = int(state["step"])
        self.score.load_state_dict(state)
        self._masked_state_clean = False  # the optimizer's state was built under the masks it had before
        self.apply_masks()

    def save(self, directory: str | os.PathLike) -> None:
        """Write ``masks.safetensors`` and ``sparsity_state.json`` into ``directory``."""
        save_sparsity_state(directory, self.state_dict())

    def load(self, directory: str | os.PathLike) -> None:
        self.load_state_dict(load_sparsity_state(directory))

    def report(self) -> dict[str, Any]:
        """The sparsity report (``sparsity.json``); with RigL (without GMP, whose pruning would count as moves) also,
        per layer, the share of its initially active weights that have moved away since the start (the console
        shows only the total)."""
        report = sparsity_report(self.model, self.masks, pattern=self.sparsity.pattern)
        if self.rigl is not None and self.gmp is None:
            names = list(self.masks)
            gone = _counts([self.initial_masks[n] & ~self.masks[n] for n in names])
            initial = _counts([self.initial_masks[n] for n in names])
            report["rigl_changed_since_start"] = {n: g / i if i else 0.0 for n, g, i in zip(names, gone, initial)}
        return report

    def _initial_masks(self) -> dict[str, torch.Tensor]:
        if self.sparsity.pattern == "2:4":
            return self._two_four_masks()
        # One generator for all layers, consumed in a fixed order: equal-shaped layers (Q, K, V) must not get
        # identical random masks. The (seed, 0) stream is free: updates happen after step t >= 1.
        generator = make_generator(self.seed, 0, self._device)
        if self.sparsity.init == "zeros":
            return {name: param.detach() != 0 for name, param in self.params.items()}
        if self.gmp is not None and self.gmp.global_ranking and self.gmp.initial_sparsity > 0:
            return self._global_magnitude_masks(self.gmp.initial_sparsity, generator)
        build = magnitude_mask if self.sparsity.init == "magnitude" else random_mask
        masks = {}
        for name, param in self.params.items():
            density = self.target_densities[name]
            if self.gmp is not None:
                # GMP starts denser and prunes towards the target; a layer already sparser stays as is.
                density = max(density, 1.0 - self.gmp.initial_sparsity)
            masks[name] = build(param, kept_count(density, param.numel()), generator)
        return masks

    @torch.no_grad()
    def _rescale_kept_weights(self) -> None:
        """sparsity.rescale_init: each layer's weights times 1/sqrt(its density), so that the kept inputs of a unit
        sum to the dense init's variance (masked weights are zeroed right after, so scaling them is harmless)."""
        for name, param in self.params.items():
            density = int(self.masks[name].sum()) / self.masks[name].numel()
            if 0.0 < density < 1.0:
                param.mul_(density ** -0.5)

    def _global_magnitude_masks(self, sparsity: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """The largest |w| of all selected layers together, ``1 - sparsity`` of them (capped at the target)."""
        everything = {name: torch.ones_like(p, dtype=torch.bool) for name, p in self.params.items()}
        magnitudes = {name: p.detach().abs() for name, p in self.params.items()}
        n_keep = kept_count(1.0 - min(sparsity, self._overall_target()), self._total_selected())
        dropped = gmp_prune_global(magnitudes, everything, n_keep, generator, self._min_keep())
        return {name: ~dropped[name] for name in self.params}

    def _min_keep(self) -> dict[str, int] | None:
        """Per tensor, the weights ``gmp.max_tensor_sparsity`` keeps whatever the global ranking says."""
        cap = None if self.gmp is None else self.gmp.max_tensor_sparsity
        if cap is None:
            return None
        return {name: math.ceil((1.0 - cap) * p.numel()) for name, p in self.params.items()}

    def _total_selected(self) -> int:
        return sum(p.numel() for p in self.params.values())

    def _overall_target(self) -> float:
        """The overall sparsity of the per-layer targets, weighted by layer size."""
        kept = sum(self.target_densities[n] * p.numel() for n, p in self.params.items())
        return 1.0 - kept / self._total_selected()

    def _check_two_four_shapes(self) -> None:
        for name, param in self.params.items():
            if param.dim() != 2 or param.shape[1] % 4:
                raise ValueError(
                    f'sparsity.pattern "2:4" needs 2-D weights whose input dimension (columns) is a multiple of '
                    f"4: {name} has shape {tuple(param.shape)}; exclude it with sparsity.exclude"
                )

    def _two_four_masks(self) -> dict[str, torch.Tensor]:
        """Fixed 2:4 masks: from the weights' magnitudes, or (init "zeros") from a model that is already 2:4."""
        masks = {}
        for name, param in self.params.items():
            if self.sparsity.init == "zeros":
                bad = nm_violations(param)
                if bad:
                    raise ValueError(
                        f'sparsity.init "zeros" with sparsity.pattern "2:4": {name} is not 2:4 ({bad} groups of 4 '
                        'have more than 2 non-zeros); use init "magnitude" to prune it to 2:4'
                    )
            # For "zeros" the non-zeros are then among the 2 largest |w| of their group, so this keeps all of
            # them and tops up a group with fewer than 2 non-zeros with its first zeros: exactly half stays active.
            masks[name] = nm_mask(param)
        return masks

    @property
    def _device(self) -> torch.device:
        # The generator lives where the weights are, so tie-break noise never crosses devices; sparse weights
        # on several devices (model parallelism) are not supported.
        return next(iter(self.params.values())).device

    def _given_masks(self, masks: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        result = {}
        for name, param in self.params.items():
            if name not in masks:
                raise ValueError(f"no mask given for selected layer {name!r}")
            mask = masks[name]
            if tuple(mask.shape) != tuple(param.shape):
                raise ValueError(
                    f"mask for {name!r} has shape {tuple(mask.shape)}, the weight {tuple(param.shape)}"
                )
            result[name] = mask.to(device=param.device, dtype=torch.bool).clone()
            if self.sparsity.pattern == "2:4" and (bad := nm_violations(result[name])):
                raise ValueError(
                    f'mask for {name!r} is not 2:4 ({bad} groups of 4 have more than 2 active weights) but '
                    'sparsity.pattern is "2:4"'
                )
        return result

    def _commit(self, name: str, change: MaskChange) -> None:
        """Apply one layer's change: new positions start at 0 and with empty optimizer state."""
        param = self.params[name]
        with torch.no_grad():
            param.masked_fill_(change.grown, 0)
        self.masks[name] = (self.masks[name] & ~change.dropped) | change.grown
        self.mask_version += 1
        if self.optimizer is not None:
            reset_optimizer_state(self.optimizer, param, change.dropped | change.grown)

    def _rigl_update(self) -> dict[str, float]:
        if self.optimizer is None:
            raise RuntimeError(
                "RigL needs the optimizer to reset regrown weights: call attach_optimizer() first"
            )
        grads = dict(self._growth_grads or {})
        for name, param in self.params.items():
            if name in grads:
                continue
            if param.grad is None:
                raise RuntimeError(
                    f"RigL update at step {self.step} found no gradient for {name}: call on_optimizer_step() "
                    "after optimizer.step() and before optimizer.zero_grad()"
                )
            grads[name] = param.grad
        drop_fraction = rigl_drop_fraction(self.step, self.rigl, self.rigl_end_step)
        generator = make_generator(self.seed, self.step, self._device)
        if self.rigl.global_ranking:
            changes = rigl_global_change(self.params, grads, self.masks, drop_fraction, generator)
        else:
            # every layer's active count in one device-to-host read, not one per layer
            active = _counts([self.masks[name] for name in self.params])
            changes = {
                name: rigl_layer_change(param, grads[name], self.masks[name], drop_fraction, generator, n_active=n)
                for (name, param), n in zip(self.params.items(), active)
            }
        for name, change in changes.items():
            self._commit(name, change)
            if self.rigl.grow_second_moment == "layer_mean":
                seed_second_moment(self.optimizer, self.params[name], change.grown, self.masks[name] & ~change.grown)
        if self.rigl.grow_init == "normal":
            self._draw_grown_weights(changes, generator)
        names = list(changes)
        moved = _counts([changes[name].grown for name in names])
        stats = {"rigl/drop_fraction": drop_fraction,
                 **{f"rigl/moved/{name}": float(n) for name, n in zip(names, moved)}}
        stats["rigl/moved_total"] = float(sum(moved))
        if self.gmp is None:  # with GMP the pruned weights are gone since the start too
            initially_active = sum(_counts(list(self.initial_masks.values())))
            gone = sum(_counts([self.initial_masks[n] & ~self.masks[n] for n in self.masks]))
            stats["rigl/mask_changed_since_start"] = gone / initially_active if initially_active else 0.0
        return stats

    def _draw_grown_weights(self, changes: Mapping[str, MaskChange], generator: torch.Generator) -> None:
        """rigl.grow_init "normal": each regrown weight from N(0, s^2), s the std of the layer's kept weights.

        The draw uses the update's seeded generator after the selection, so every DDP rank draws the same values.
        """
        with torch.no_grad():
            for name, change in changes.items():
                param = self.params[name]
                kept = (self.masks[name] & ~change.grown).float()
                n_kept = kept.sum().clamp(min=2)  # a tensor: no device-to-host read per layer
                mean = (param.float() * kept).sum() / n_kept
                std = (((param.float() - mean) * kept).square().sum() / (n_kept - 1)).sqrt()
                noise = torch.randn(param.shape, generator=generator, device=param.device, dtype=torch.float32)
                param.copy_(torch.where(change.grown, (noise * std).to(param.dtype), param))

    def finish_schedule(self) -> dict[str, float] | None:
        """At the end of training: prune to GMP's final sparsity if the schedule has not got there.

        Steps the fp16 loss scaler skipped do not count as controller steps, while the Trainer still counts them
        towards ``max_steps``: a schedule ending at the last step would then stop short of its target. Returns
        log stats when it pruned, else None.
        """
        if self.gmp is None or self.step >= self.gmp_end_step:
            return None
        stats = self._gmp_update(at_step=self.gmp_end_step)
        self.apply_masks()
        return stats

    def _gmp_update(self, at_step: int | None = None) -> dict[str, float]:
        step = self.step if at_step is None else at_step
        generator = make_generator(self.seed, step, self._device)
        scores = self.score.scores(self.params, self.masks)
        if self.gmp.global_ranking:
            final = self._overall_target()
            target = gmp_sparsity(step, min(self.gmp.initial_sparsity, final), final, self.gmp.begin_step,
                                  self.gmp_end_step)
            n_keep = kept_count(1.0 - target, self._total_selected())
            dropped_by_layer = gmp_prune_global(scores, self.masks, n_keep, generator, self._min_keep())
        else:
            dropped_by_layer = {}
            for name, param in self.params.items():
                final = 1.0 - self.target_densities[name]
                target = gmp_sparsity(step, min(self.gmp.initial_sparsity, final), final, self.gmp.begin_step,
                                      self.gmp_end_step)
                n_keep = kept_count(1.0 - target, param.numel())
                dropped_by_layer[name] = gmp_prune(scores[name], self.masks[name], n_keep, generator)
        for name, dropped in dropped_by_layer.items():
            self._commit(name, MaskChange(dropped=dropped, grown=torch.zeros_like(dropped)))
        self.score.after_prune(self.params, self.masks)
        active = sum(_counts(list(self.masks.values())))
        total = sum(m.numel() for m in self.masks.values())
        return {"gmp/sparsity": 1.0 - active / total}


def _counts(masks: list[torch.Tensor]) -> list[int]:
    """The number of True entries of each mask, read back from the device once for all of them."""
    if not masks:
        return []
    return torch.stack([m.sum() for m in masks]).tolist()
