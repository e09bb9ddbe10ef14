"""ClipInOptimizer: gradient clipping folded into the fused AdamW step (``train.clip_in_optimizer``).

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
the all-reduce itself (the step asks for it once a clip target is chosen, and hands it to ``clip``): it squares
and sums each averaged piece as soon as that piece arrives, while the next piece is still on the wire, so after
the last all-reduce only the last piece's sum is left
(distributed/all_reduce.py). A sparse run uses that norm only on steps where the sparse all-reduce already left
zeros at masked positions; on other steps the masked gradients are zeroed after the all-reduce, and the norm is
taken over the gradients as the optimizer will see them.
"""

from __future__ import annotations

import logging

import torch

from sparsebert.upstream.torch_ops import foreach_norm

log = logging.getLogger(__name__)

# torch.nn.utils.clip_grad_norm_'s guard against a zero norm: the factor is max_norm / (norm + 1e-6)
_EPS = 1e-6


class ClipInOptimizer:
    """The clip-in-optimizer stage. ``target`` is the torch optimizer whose fused step takes the clip factor, or
    None where the Trainer must clip; chosen at the first clipped step of each ``train()`` (``reset`` at its
    start: the optimizer, Accelerate's state and the gradients exist by then; a new ``train()`` may bring a new
    optimizer)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.checked = False
        self.target: torch.optim.Optimizer | None = None

    def reset(self) -> None:
        self.checked = False
        self.target = None

    @property
    def wants_norm(self) -> bool:
        """Whether a norm summed by the flat all-reduce would be used (from the step after the choice on)."""
        return self.target is not None

    def choose(self, optimizer, accelerator, model) -> torch.optim.Optimizer | None:
        if not self.enabled:
            return None
        if self.checked:
            return self.target
        self.checked = True
        # imported here: only a clipped training step needs it, and accelerate imports torch.distributed pieces
        from accelerate.utils import DistributedType

        optimizer = getattr(optimizer, "optimizer", optimizer)  # under Accelerate's wrapper
        # a union, not AdamW alone: AdamW is a subclass of Adam only in recent torch versions
        fused = (isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW)
                 and all(group.get("fused") for group in optimizer.param_groups))
        supported_distribution = accelerator.distributed_type in (
            DistributedType.NO, DistributedType.MULTI_GPU, DistributedType.MULTI_CPU)
        # tensor-parallel models keep DTensor gradients, whose norm the Trainer takes its own way (matched by
        # name: the class moved between torch versions)
        sharded = any(type(p.grad).__name__ == "DTensor" for p in model.parameters())
        scaler = getattr(accelerator, "scaler", None) is not None
        if fused and supported_distribution and not sharded and not scaler:
            self.target = optimizer
            log.info("train.clip_in_optimizer: gradients are clipped inside the fused %s step",
                     type(optimizer).__name__)
        else:
            reason = ("the optimizer is not a fused torch Adam / AdamW" if not fused else
                      "fp16's loss scaler uses the optimizer's grad_scale" if scaler else
                      "the gradients are DTensors" if sharded else
                      f"{accelerator.distributed_type} clips its own way")
            log.info("train.clip_in_optimizer: the Trainer clips as usual (%s)", reason)
        return self.target

    def clip(self, model, max_norm: float, norm_from_sync: torch.Tensor | None) -> torch.Tensor:
        """Sets the clip divisor on the target optimizer and returns the pre-clip norm: the all-reduce's where
        one came with this step, else computed here."""
        norm = norm_from_sync
        if norm is None:
            norm = total_norm([p.grad for p in model.parameters() if p.grad is not None])
        self.target.grad_scale = clip_divisor(norm, max_norm)
        return norm

    def after_optimizer_step(self) -> None:
        """Takes the clip factor off the optimizer, so nothing else reads it as a loss scale."""
        if self.target is not None and hasattr(self.target, "grad_scale"):
            del self.target.grad_scale


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
    return torch.linalg.vector_norm(torch.stack(foreach_norm(grads, 2.0)), 2.0)
