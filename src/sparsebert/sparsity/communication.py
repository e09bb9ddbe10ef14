"""All-reduce only the gradients of active weights: a DDP communication hook for sparse runs.

A masked weight's gradient is thrown away at every step (``before_optimizer_step`` zeroes it), yet plain DDP
averages it across ranks like any other: at 80 % sparsity of BERT-base's encoder Linear weights, 68 M of the
110 M gradient values on the wire are never used. This hook gathers each bucket's entries at active positions
(and every entry of parameters without a mask) into one compact tensor, averages that across ranks, and writes
it back with zeros at the masked positions. A RigL update scores growth by the dense gradient of the step's own
batch, so on the steps where one is due the hook averages the whole bucket as plain DDP does.

The positions are computed once per bucket and mask state (``SparsityController.mask_version``): a ``nonzero``
per bucket, which reads a count back to the host, after every mask change (RigL / GMP update, loaded state) and
after DDP rebuilds its buckets following the first step; none on the other steps. They are kept as int64
indices on the gradients' device, 8 bytes for every value sent from a bucket that holds a masked weight (~145 MB
for BERT-base at 80 %; buckets without one, like the word embeddings', need none).

The averaged values are those of plain DDP up to the order of summation (bit for bit with 2 ranks, where a + b =
b + a). One difference: an inf or NaN gradient at a masked position never travels, so it cannot make a fp16 step
skip or a clipped gradient norm NaN, as plain DDP's masked copy would.

Plain PyTorch: ``register(ddp_module, controller)`` works on any DistributedDataParallel model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .controller import SparsityController


@dataclass
class _BucketPlan:
    params: tuple[int, ...]  # id() of the bucket's parameters, to notice DDP rebuilding its buckets
    mask_version: int
    index: torch.Tensor | None  # flat positions that are sent; None: the whole bucket is sent
    masked_names: frozenset[str]  # masked layers whose gradient arrives with zeros at masked positions


class ActiveGradientAllReduce:
    """The hook's state: per-bucket positions, and what the last backward sent (for the logs and the controller).

    ``sent_fraction()``: gradient values on the wire relative to plain DDP, over every backward so far.
    After the last bucket of a backward it tells the controller whether every masked layer's gradient arrived
    with zeros at its masked positions, so ``before_optimizer_step`` can skip masking them again.
    """

    def __init__(self, controller: SparsityController, process_group: dist.ProcessGroup | None = None):
        self.controller = controller
        self.process_group = process_group
        self.world = dist.get_world_size(process_group)
        self._names = {id(param): name for name, param in controller.params.items()}
        self._plans: dict[int, _BucketPlan] = {}
        self._arrived_masked: set[str] = set()  # in this backward
        self.sent = 0
        self.dense = 0

    def sent_fraction(self) -> float:
        return self.sent / self.dense if self.dense else 1.0

    def __call__(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        plan = None if self.controller.dense_gradients_due() else self._plan(bucket)
        if plan is None or plan.index is None:
            sent = buffer.div_(self.world)
            future = self._all_reduce(sent).then(lambda done: done.value()[0])
        else:
            self._arrived_masked |= plan.masked_names
            sent = buffer.index_select(0, plan.index).div_(self.world)
            index = plan.index
            future = self._all_reduce(sent).then(
                lambda done: buffer.zero_().index_copy_(0, index, done.value()[0]))
        self.sent += sent.numel()
        self.dense += buffer.numel()
        if bucket.is_last():
            trainable = {name for name, param in self.controller.params.items() if param.requires_grad}
            self.controller.note_gradients_masked(self._arrived_masked >= trainable)
            self._arrived_masked = set()
            # after DDP rebuilds its buckets there may be fewer: their positions would stay on the GPU
            self._plans = {i: plan for i, plan in self._plans.items() if i <= bucket.index()}
        return future

    def _all_reduce(self, tensor: torch.Tensor) -> torch.futures.Future:
        return dist.all_reduce(tensor, group=self.process_group, async_op=True).get_future()

    def _plan(self, bucket: dist.GradBucket) -> _BucketPlan:
        """The bucket's positions to send, rebuilt when its parameters or the masks changed (one ``nonzero``,
        i.e. one host read, per bucket)."""
        params = bucket.parameters()
        key = tuple(id(p) for p in params)
        version = self.controller.mask_version
        plan = self._plans.get(bucket.index())
        if plan is not None and plan.params == key and plan.mask_version == version:
            return plan
        buffer = bucket.buffer()
        keep = torch.ones(buffer.numel(), dtype=torch.bool, device=buffer.device)
        masked = set()
        for param, grad in zip(params, bucket.gradients()):
            name = self._names.get(id(param))
            if name is None:
                continue
            if not param.is_contiguous():
                # DDP lays such a gradient out by the parameter's strides, not row-major like its mask: send the
                # bucket whole (the controller then masks this layer's gradient itself)
                masked = set()
                break
            start = (grad.data_ptr() - buffer.data_ptr()) // buffer.element_size()
            keep[start:start + grad.numel()] = self.controller.masks[name].reshape(-1)
            masked.add(name)
        index = keep.nonzero().squeeze(1) if masked else None  # none masked: nothing to leave out
        plan = _BucketPlan(params=key, mask_version=version, index=index, masked_names=frozenset(masked))
        self._plans[bucket.index()] = plan
        return plan


def _hook(state, bucket):
    # unannotated on purpose: DDP checks annotations against dist.GradBucket, and this module's are strings
    return state(bucket)


def register(ddp_module: nn.parallel.DistributedDataParallel,
             controller: SparsityController) -> ActiveGradientAllReduce:
    """Install the hook on ``ddp_module`` (before its first backward); returns its state."""
    state = ActiveGradientAllReduce(controller, ddp_module.process_group)
    ddp_module.register_comm_hook(state, _hook)
    return state
