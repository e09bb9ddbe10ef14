"""All-reduce only the gradients of active weights, in one flat all-reduce after the backward.

A masked weight's gradient is thrown away at every step (``before_optimizer_step`` zeroes it), yet plain DDP
averages it across ranks like any other: at 80 % sparsity of BERT-base's encoder Linear weights, 68 M of the
110 M gradient values on the wire are never used.

``ActiveGradientSync`` replaces DDP's reducer for sparse runs: the backward runs under DDP's ``no_sync`` (the
Trainer integration, trainer/ddp.py, does that), and afterwards the sync

1. concatenates every trainable parameter's gradient into one flat buffer per dtype and device (a few batched
   copy kernels, where DDP's reducer copies each gradient into its bucket on its own: 202 small copies for
   BERT-base, which paced the end of the step on H200s; docs/benchmarks.md);
2. gathers the values at active positions (every value of a parameter without a mask) into one compact tensor,
   multiplies it by 1 / world size and sums it across ranks, as DDP's default all-reduce does;
3. writes the averages back with zeros at masked positions, and makes each gradient a view of the buffer.

A RigL update scores growth by the dense gradient of the step's own batch, so on a step where one is due the
whole buffer is averaged, as plain DDP does. Nothing overlaps the backward: with one compiled graph, the fastest
DDP setting measured, every gradient is ready only at its end anyway.

The positions are one int64 index per buffer, rebuilt with one ``nonzero`` (a host read) whenever the masks
(``SparsityController.mask_version``) or the set of trainable parameters change: ~330 MB for BERT-base at 80 %,
beside DDP's own bucket storage, which DDP allocates anyway; while the sync runs, the flat buffer holds a second
copy of the gradients (~440 MB, fp32), which then become its views.

Every trainable parameter needs a gradient on every rank (sparsebert's models use all of theirs): a rank without
one raises, and the launcher (torchrun, accelerate launch) then stops the other ranks.

The averages are plain DDP's up to the order of summation (bit for bit with 2 ranks, where a + b = b + a). One
difference: an inf or NaN gradient at a masked position never travels, so it cannot make a fp16 step skip or a
clipped gradient norm NaN, as plain DDP's masked copy would.

Plain PyTorch: it works on any model whose backward ran without DDP's all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .controller import SparsityController


@dataclass
class _Plan:
    key: tuple[int, ...]  # id() of the group's parameters, in order
    mask_version: int
    index: torch.Tensor | None  # flat positions sent on a sparse step; None: no mask in the group, all are sent


class ActiveGradientSync:
    """Call once per optimizer step, after the last backward (run under ``no_sync``) and before clipping.

    ``sent_fraction()``: gradient values on the wire relative to plain DDP, over every call so far. After each call
    the controller learns whether the gradients arrived masked, so ``before_optimizer_step`` can skip masking
    them again.
    """

    def __init__(self, model: nn.Module, controller: SparsityController,
                 process_group: dist.ProcessGroup | None = None):
        self.controller = controller
        self.process_group = process_group
        self.world = dist.get_world_size(process_group)
        self.named = list(model.named_parameters())
        self._names = {id(param): name for name, param in controller.params.items()}
        missing = set(self._names) - {id(param) for _, param in self.named}
        if missing:  # their gradients would be neither averaged nor masked (the controller is told they are)
            names = sorted(self._names[i] for i in missing)
            raise ValueError(f"the sparsity controller's {', '.join(names[:3])} are not parameters of this model")
        self.scale = 1.0 / self.world
        self._plans: dict[tuple[torch.dtype, torch.device], _Plan] = {}
        self.sent = 0
        self.dense = 0

    def sent_fraction(self) -> float:
        return self.sent / self.dense if self.dense else 1.0

    def __call__(self) -> None:
        dense = self.controller.dense_gradients_due()
        groups: dict[tuple[torch.dtype, torch.device], list[nn.Parameter]] = {}
        for name, param in self.named:
            if not param.requires_grad:
                continue
            if param.grad is None:
                raise RuntimeError(f"parameter {name} has no gradient after the backward (unused in the forward?): "
                                   "the sparse all-reduce needs one for every trainable parameter")
            groups.setdefault((param.grad.dtype, param.grad.device), []).append(param)
        for group_key, params in groups.items():
            self._average(params, None if dense else self._plan(group_key, params))
        self._plans = {k: plan for k, plan in self._plans.items() if k in groups}
        self.controller.note_gradients_masked(not dense)

    def _average(self, params: list[nn.Parameter], plan: _Plan | None) -> None:
        flat = torch.cat([param.grad.reshape(-1) for param in params])
        if plan is None or plan.index is None:
            sent = flat.mul_(self.scale)
            dist.all_reduce(sent, group=self.process_group)
        else:
            sent = flat.index_select(0, plan.index).mul_(self.scale)
            dist.all_reduce(sent, group=self.process_group)
            flat.zero_().index_copy_(0, plan.index, sent)
        self.sent += sent.numel()
        self.dense += flat.numel()
        for param, values in zip(params, flat.split([param.numel() for param in params])):
            if param.is_contiguous():
                param.grad = values.view_as(param)
            else:  # a gradient with the parameter's own strides, which fused optimizers expect
                param.grad.copy_(values.view_as(param))

    def _plan(self, group_key: tuple[torch.dtype, torch.device], params: list[nn.Parameter]) -> _Plan:
        """The group's positions to send, rebuilt when its parameters or the masks changed (one ``nonzero``)."""
        key = tuple(id(param) for param in params)
        version = self.controller.mask_version
        plan = self._plans.get(group_key)
        if plan is not None and plan.key == key and plan.mask_version == version:
            return plan
        keep = torch.ones(sum(param.numel() for param in params), dtype=torch.bool, device=group_key[1])
        offset, masked = 0, False
        for param in params:
            name = self._names.get(id(param))
            if name is not None:  # mask and reshape(-1) both follow the parameter's logical (row-major) order
                keep[offset:offset + param.numel()] = self.controller.masks[name].reshape(-1)
                masked = True
            offset += param.numel()
        plan = _Plan(key=key, mask_version=version, index=keep.nonzero().squeeze(1) if masked else None)
        self._plans[group_key] = plan
        return plan
