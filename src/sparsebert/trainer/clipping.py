"""ClipInOptimizerMixin: gradient clipping folded into the fused AdamW step (``train.clip_in_optimizer``).

``clip_grad_norm_`` computes the gradients' total norm and then multiplies every gradient by
``min(1, max_norm / (norm + 1e-6))``: one more pass that reads and writes all of them (BERT-base: 440 MB in
fp32). Torch's fused Adam / AdamW kernel already divides each gradient by a
``grad_scale`` tensor when one is set on the optimizer (the hook torch's GradScaler uses to unscale fp16
gradients inside the step), so the clip factor goes there instead, as its reciprocal
``max(1, (norm + 1e-6) / max_norm)``: the same update up to the rounding of a division against a multiplication
(~1e-7 relative), no pass of its own. The kernel also writes the divided gradients back, so anything reading
them after the step sees them clipped, as before.

It applies only where that contract holds: a fused torch Adam / AdamW (``train.optim=auto`` on GPU), no fp16
loss scaler (which uses ``grad_scale`` itself), DDP or a single process (DeepSpeed and FSDP clip their own way),
and no DTensor gradients (tensor parallelism). Elsewhere the Trainer clips as usual.

Under sparsebert's flat all-reduce (``train.ddp.comm_hook=flat``, ``flat_bf16``, ``sparse``) the norm comes from
the all-reduce itself: it squares and sums each averaged piece as soon as that piece arrives, while the next
piece is still on the wire, so after the last all-reduce only the last piece's sum is left
(distributed/all_reduce.py). A sparse run uses that norm only on steps where the sparse all-reduce already left
zeros at masked positions; on other steps the masked gradients are zeroed after the all-reduce, and the norm is
taken over the gradients as the optimizer will see them.
"""

from __future__ import annotations

import logging

import torch
from transformers import TrainerCallback

log = logging.getLogger(__name__)

# torch.nn.utils.clip_grad_norm_'s guard against a zero norm: the factor is max_norm / (norm + 1e-6)
_EPS = 1e-6


class ClipInOptimizerMixin:
    def __init__(self, *args, clip_in_optimizer: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.clip_in_optimizer = clip_in_optimizer
        self._clip_target_checked = False
        self._clip_target: torch.optim.Optimizer | None = None
        if clip_in_optimizer:
            self.add_callback(_ClipTargetUpkeep(self))

    def _clip_optimizer(self, model) -> torch.optim.Optimizer | None:
        """The torch optimizer whose fused step takes the clip factor, or None where the Trainer must clip.
        Decided at the first clipped step of each ``train()`` (the optimizer, Accelerate's state and the
        gradients exist by then; a new ``train()`` may bring a new optimizer)."""
        if self._clip_target_checked:
            return self._clip_target
        self._clip_target_checked = True
        # imported here: only a clipped training step needs it, and accelerate imports torch.distributed pieces
        from accelerate.utils import DistributedType

        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # under Accelerate's wrapper
        # a union, not AdamW alone: AdamW is a subclass of Adam only in recent torch versions
        fused = (isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW)
                 and all(group.get("fused") for group in optimizer.param_groups))
        supported_distribution = self.accelerator.distributed_type in (
            DistributedType.NO, DistributedType.MULTI_GPU, DistributedType.MULTI_CPU)
        # tensor-parallel models keep DTensor gradients, whose norm the Trainer takes its own way (matched by
        # name: the class moved between torch versions)
        sharded = any(type(p.grad).__name__ == "DTensor" for p in model.parameters())
        scaler = getattr(self.accelerator, "scaler", None) is not None
        if fused and supported_distribution and not sharded and not scaler:
            self._clip_target = optimizer
            sync = getattr(self, "gradient_sync", None)
            if sync is not None:
                sync.track_norm = True  # from the next step on, the flat all-reduce sums the norm as pieces arrive
            log.info("train.clip_in_optimizer: gradients are clipped inside the fused %s step",
                     type(optimizer).__name__)
        else:
            reason = ("the optimizer is not a fused torch Adam / AdamW" if not fused else
                      "fp16's loss scaler uses the optimizer's grad_scale" if scaler else
                      "the gradients are DTensors" if sharded else
                      f"{self.accelerator.distributed_type} clips its own way")
            log.info("train.clip_in_optimizer: the Trainer clips as usual (%s)", reason)
        return self._clip_target

    def _clip_grad_norm(self, model):
        optimizer = self._clip_optimizer(model) if self.clip_in_optimizer else None
        if optimizer is None:
            return super()._clip_grad_norm(model)
        norm = self._norm_from_all_reduce(getattr(self, "gradient_sync", None))
        if norm is None:
            norm = total_norm([p.grad for p in model.parameters() if p.grad is not None])
        optimizer.grad_scale = clip_divisor(norm, self.args.max_grad_norm)
        return norm

    def _norm_from_all_reduce(self, sync) -> torch.Tensor | None:
        """The norm the flat all-reduce summed in this step, if it is that of the gradients the optimizer sees;
        taken, so that a step whose sync did not run can never reuse it."""
        if sync is None or sync.gradient_norm is None:
            return None
        norm, sync.gradient_norm = sync.gradient_norm, None
        if getattr(self, "sparsity", None) is not None and not sync.masked_last_call:
            return None  # the sparsity hook zeroes the masked gradients after the all-reduce
        return norm


def clip_divisor(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """What the fused kernel divides each gradient by: the reciprocal of clip_grad_norm_'s clamped factor
    ``min(1, max_norm / (norm + 1e-6))``, as the fp32 tensor the kernel reads."""
    return torch.clamp((norm + _EPS) / max_norm, min=1.0).float()


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all ``grads`` together, as clip_grad_norm_ computes it: torch's own ``get_total_norm``
    (torch >= 2.6), or its computation (one norm per tensor, then theirs) on older versions."""
    get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)
    if get_total_norm is not None:
        return get_total_norm(grads, 2.0)
    if not grads:
        return torch.tensor(0.0)
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)


class _ClipTargetUpkeep(TrainerCallback):
    """Takes the clip factor off the optimizer after its step, so nothing else reads it as a loss scale, and
    has the optimizer chosen again at the next ``train()``."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer._clip_target_checked = False
        self.trainer._clip_target = None

    def on_optimizer_step(self, args, state, control, **kwargs):
        optimizer = self.trainer._clip_target
        if optimizer is not None and hasattr(optimizer, "grad_scale"):
            del optimizer.grad_scale
