"""Average the gradients across ranks in one flat all-reduce after the backward, instead of DDP's reducer.

With one compiled graph for the whole model (the fastest DDP setting measured, docs/performance.md), every
gradient is ready only at the end of the backward, so DDP's buckets overlap nothing: the reducer copies each
gradient into its bucket on its own (202 small copies per step for BERT-base, which paced the end of the step)
and then runs one all-reduce per 25 MB bucket. ``FlatGradientSync`` replaces that: the backward runs under DDP's ``no_sync`` (the
Trainer integration, trainer/ddp.py, does that), and afterwards the sync

1. copies every trainable parameter's gradient into one flat buffer per dtype and device (one batched copy per
   buffer; a strided gradient is copied once more on the way);
2. averages it across ranks in one all-reduce: NCCL's average, or a multiplication by 1 / world size and a sum,
   as DDP's default does (on other backends, and for 16-bit values at a world size that is not a power of two,
   where NCCL's average would multiply by a rounded 1 / world size);
3. makes each gradient a view of the averaged buffer (a copy for a parameter with its own strides).

Steps 1 and 2 run per piece of the buffer (``pieces``): each piece's all-reduce starts as soon as its copy is
done, so the other pieces' copies run beside it.

Two options on top:

- ``controller`` (sparse runs): only the values at active positions (every value of a parameter without a mask)
  go on the wire. A masked weight's gradient is thrown away at every step (``before_optimizer_step`` zeroes it),
  yet plain DDP averages it like any other: at 80 % sparsity of BERT-base's encoder Linear weights, 68 M of the
  110 M values are never used. The averages come back with zeros at masked positions, and the controller learns
  that it need not mask them again. A RigL update scores growth by the dense gradient of the step's own batch, so
  on a step where one is due the whole buffer is averaged. The positions are one int64 index per buffer (a slice
  of it per piece), rebuilt on the first sparse step after the masks (``SparsityController.mask_version``) or
  the set of trainable parameters changed, with one ``nonzero`` and one read of the pieces' counts (host
  syncs): ~330 MB for BERT-base at 80 %.
- ``wire_dtype`` (e.g. bf16): fp32 gradients are rounded to it on the way into the flat buffer, averaged with
  half the bytes on the wire, and copied back into a new fp32 buffer whose views they become; the averages then
  carry bf16's ~3 significant digits, as with DDP's bf16 hook. Gradients of other dtypes travel in their own.

Memory: while the sync runs, the flat buffer holds a second copy of the gradients (~440 MB in fp32 for
BERT-base; with ``wire_dtype`` bf16 also the 220 MB bf16 buffer), which then become its views; DDP's own bucket
storage stays allocated beside it, idle.

Every trainable parameter needs a gradient on every rank (sparsebert's models use all of theirs): a rank without
one raises, and the launcher (torchrun, accelerate launch) then stops the other ranks.

In full precision the averages are plain DDP's up to the order of summation (bit for bit with 2 ranks, where
a + b = b + a). One difference of the sparse mode: an inf or NaN gradient at a masked position never travels, so
it cannot make a fp16 step skip or a clipped gradient norm NaN, as plain DDP's masked copy would.

Plain PyTorch: it works on any model whose backward ran without DDP's all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from sparsebert.sparsity.controller import SparsityController
from sparsebert.upstream.torch_ops import foreach_copy_


@dataclass(frozen=True)
class SyncResult:
    """What one sync hands on to the rest of the optimizer step."""

    norm: torch.Tensor | None  # the averaged gradients' 2-norm (asked for with track_norm), else None
    masked: bool  # zeros already at every masked position: the controller need not mask again


@dataclass
class _Piece:
    start: int  # the piece's range of the group's flat buffer
    end: int
    segments: list[tuple[nn.Parameter, int, int]]  # (parameter, first, end): its gradient's values in the piece
    index: torch.Tensor | None = None  # positions (of the flat buffer) sent on a sparse step; None: the whole range


@dataclass
class _Plan:
    key: tuple[int, ...]  # id() of the group's parameters, in order
    pieces: list[_Piece]
    mask_version: int | None = None  # the masks the pieces' indices were built for (None: not built)

    @property
    def masked(self) -> bool:
        return any(piece.index is not None for piece in self.pieces)


class FlatGradientSync:
    """Call once per optimizer step, after the last backward (run under ``no_sync``) and before clipping.

    ``pieces`` > 1 cuts each flat buffer into that many ranges (:func:`_cut`), each all-reduced on its own as soon
    as its gradients are copied in: the copies of one piece (and, with ``wire_dtype``, the copy back of another)
    run while NCCL sends a third, instead of all before and after one all-reduce. The averages are the same, up
    to the order of summation at 3 ranks or more (which NCCL and gloo choose by message size).

    ``sent_fraction()``: gradient values on the wire relative to plain DDP, over every call so far (1.0 without
    a controller).

    A call returns a :class:`SyncResult`. ``track_norm=True`` (whoever clips asks for it): the result carries the
    2-norm of all averaged gradients, summed from each piece's squares as the piece arrives, so only the last
    piece's sum is left after the last all-reduce. ``masked``: whether that call sent active values only (zeros at
    masked positions), so the norm is that of the gradients the sparse model's optimizer sees and the controller
    need not mask them again.
    """

    def __init__(self, model: nn.Module, controller: SparsityController | None = None,
                 process_group: dist.ProcessGroup | None = None, wire_dtype: torch.dtype | None = None,
                 pieces: int = 1):
        if pieces < 1:
            raise ValueError(f"pieces must be >= 1, got {pieces}")
        self.controller = controller
        self.process_group = process_group
        self.wire_dtype = wire_dtype
        self.pieces = pieces
        self.world = dist.get_world_size(process_group)
        # NCCL averages inside the all-reduce, multiplying by 1 / world size in the values' dtype: exact for fp32
        # (DDP's own reciprocal) and for any power of two; elsewhere the multiplication comes first
        self.nccl = dist.get_backend(process_group) == "nccl"
        self.named = list(model.named_parameters())
        self._names = {id(param): name for name, param in controller.params.items()} if controller else {}
        missing = set(self._names) - {id(param) for _, param in self.named}
        if missing:  # their gradients would be neither averaged nor masked (the controller is told they are)
            names = sorted(self._names[i] for i in missing)
            raise ValueError(f"the sparsity controller's {', '.join(names[:3])} are not parameters of this model")
        self._plans: dict[tuple[torch.dtype, torch.device], _Plan] = {}
        self.sent = 0
        self.dense = 0

    def sent_fraction(self) -> float:
        return self.sent / self.dense if self.dense else 1.0

    def __call__(self, track_norm: bool = False) -> SyncResult:
        dense = self.controller is None or self.controller.dense_gradients_due()
        groups: dict[tuple[torch.dtype, torch.device], list[nn.Parameter]] = {}
        for name, param in self.named:
            if not param.requires_grad:
                continue
            if param.grad is None:
                raise RuntimeError(f"parameter {name} has no gradient after the backward (unused in the forward?): "
                                   "the flat all-reduce needs one for every trainable parameter")
            groups.setdefault((param.grad.dtype, param.grad.device), []).append(param)
        squares: list[torch.Tensor] = []  # each piece's sum of squared averages (track_norm)
        for group_key, params in groups.items():
            if any(param.numel() for param in params):  # a group of empty parameters has nothing to average
                self._average(params, self._plan(group_key, params, sparse=not dense), not dense, squares,
                              track_norm)
        self._plans = {k: plan for k, plan in self._plans.items() if k in groups}
        norm = None
        if track_norm:
            device = next(iter(groups))[1] if groups else None
            norm = torch.stack(squares).sum().sqrt() if squares else torch.zeros((), device=device)
        return SyncResult(norm=norm, masked=self.controller is not None and not dense)

    def _average(self, params: list[nn.Parameter], plan: _Plan, sparse: bool, squares: list[torch.Tensor],
                 track_norm: bool) -> None:
        """Per piece: copy its gradients into the flat buffer (rounded into a ``wire_dtype`` buffer instead when
        every value of it is sent) and start its all-reduce; then, as each finishes, put its averages into the
        flat buffer, whose views the gradients become (and, with ``track_norm``, append the sum of their squares
        to ``squares``: read from the wire, whose values the gradients now hold exactly)."""
        dtype, device = params[0].grad.dtype, params[0].grad.device
        rounded = self.wire_dtype is not None and dtype == torch.float32  # only fp32 gradients are rounded
        flat = torch.empty(plan.pieces[-1].end, dtype=dtype, device=device)
        wire_buffer = torch.empty(flat.numel(), dtype=self.wire_dtype, device=device) if rounded else None
        pending = []
        for piece in plan.pieces:
            index = piece.index if sparse else None
            direct = rounded and index is None  # one casting copy, no fp32 copy first
            self._copy_in(piece, wire_buffer if direct else flat)
            if index is not None:
                wire = flat.index_select(0, index)
                wire = wire.to(self.wire_dtype) if rounded else wire
            else:
                wire = (wire_buffer if direct else flat)[piece.start:piece.end]
            # a piece whose values are all masked sends nothing (on every rank: the masks are the same)
            pending.append((piece, index, wire, self._all_reduce_mean(wire) if wire.numel() else None))
            self._count(wire.numel(), piece.end - piece.start)
        for piece, index, wire, work in pending:
            if work is not None:
                work.wait()  # NCCL: the current stream waits for the all-reduce; the host does not
            if index is not None:
                flat[piece.start:piece.end].zero_()
                flat.index_copy_(0, index, wire.to(dtype))
            elif rounded:  # a batched, casting copy: copy_ back ran a non-vectorized kernel
                foreach_copy_([flat[piece.start:piece.end]], [wire])
            if track_norm and wire.numel():
                at_least_fp32 = torch.promote_types(wire.dtype, torch.float32)  # bf16 summed in fp32
                squares.append(torch.linalg.vector_norm(wire, dtype=at_least_fp32).float().square())
        self._use_as_gradients(params, flat)

    def _count(self, sent: int, dense: int) -> None:
        self.sent += sent
        self.dense += dense

    @staticmethod
    def _copy_in(piece: _Piece, buffer: torch.Tensor) -> None:
        """The piece's gradient values into its range of ``buffer``, by one batched copy. Not torch.cat: its CUDA
        kernel gives every input the same number of thread blocks whatever its size (so the large gradients are
        copied at low occupancy), and copies one input at a time into another dtype."""
        targets = buffer[piece.start:piece.end].split([end - first for _, first, end in piece.segments])
        # reshape(-1) is a view of a contiguous gradient and a copy of a strided one
        sources = [param.grad.reshape(-1)[first:end] for param, first, end in piece.segments]
        foreach_copy_(list(targets), sources)

    @staticmethod
    def _use_as_gradients(params: list[nn.Parameter], flat: torch.Tensor) -> None:
        for param, values in zip(params, flat.split([param.numel() for param in params])):
            if param.is_contiguous():
                param.grad = values.view_as(param)
            else:  # a gradient with the parameter's own strides, which fused optimizers expect
                param.grad.copy_(values.view_as(param))

    def _all_reduce_mean(self, values: torch.Tensor) -> dist.Work:
        if self.nccl and nccl_average_is_exact(values.dtype, self.world):
            return dist.all_reduce(values, op=dist.ReduceOp.AVG, group=self.process_group, async_op=True)
        # the product of each value and 1 / world rounded once
        return dist.all_reduce(values.mul_(1.0 / self.world), group=self.process_group, async_op=True)

    def _plan(self, group_key: tuple[torch.dtype, torch.device], params: list[nn.Parameter], sparse: bool) -> _Plan:
        """The group's pieces, cut again when its parameters change, and on a sparse step the positions to send,
        rebuilt when the masks changed (one ``nonzero`` and one read of the pieces' index counts: host syncs,
        so never on a dense step)."""
        key = tuple(id(param) for param in params)
        plan = self._plans.get(group_key)
        if plan is None or plan.key != key:
            plan = self._plans[group_key] = _Plan(key=key, pieces=_cut(params, self.pieces))
        if sparse and plan.mask_version != self.controller.mask_version:
            self._index(plan, params, group_key[1])
            plan.mask_version = self.controller.mask_version
        return plan

    def _index(self, plan: _Plan, params: list[nn.Parameter], device: torch.device) -> None:
        """Each piece's active positions (None where every value of the piece is sent)."""
        for piece in plan.pieces:
            piece.index = None
        if not any(id(param) in self._names for param in params):
            return
        keep = torch.ones(plan.pieces[-1].end, dtype=torch.bool, device=device)
        for param, start, end in _ranges(params):
            name = self._names.get(id(param))
            if name is not None:  # mask and reshape(-1) both follow the parameter's logical (row-major) order
                keep[start:end] = self.controller.masks[name].reshape(-1)
        index = keep.nonzero().squeeze(1)
        ends = torch.searchsorted(index, torch.tensor([piece.end for piece in plan.pieces], device=device))
        first = 0
        for piece, last in zip(plan.pieces, ends.tolist()):
            every = last - first == piece.end - piece.start  # nothing masked in it: no gather needed
            piece.index, first = None if every else index[first:last], last


def _cut(params: list[nn.Parameter], pieces: int, align: int = 128) -> list[_Piece]:
    """Ranges of the flat buffer of ``params`` (a parameter may span two). With three pieces or more the first and
    the last take 1/8 of the values each and the rest is cut equally: the all-reduce starts after a short first
    copy and the step waits for a short last copy back, while the long middle pieces' copies overlap the
    all-reduce of their neighbours (each piece adds a fixed cost to the all-reduce beyond its bytes, so few pieces
    pay best).
    Two pieces: 1/8 and 7/8. Boundaries are rounded to ``align`` values (aligned vectorized copies)."""
    total = sum(param.numel() for param in params)
    if pieces == 1:
        shares = [1.0]
    elif pieces == 2:
        shares = [1 / 8, 7 / 8]
    else:
        shares = [1 / 8, *[(3 / 4) / (pieces - 2)] * (pieces - 2), 1 / 8]
    bounds, done = [], 0.0
    for share in shares[:-1]:
        done += share
        bounds.append(round(done * total / align) * align)
    bounds = sorted({b for b in bounds if 0 < b < total}) + [total]
    ranges = _ranges(params)
    cut, start = [], 0
    for end in bounds:
        segments = [(param, max(start, lo) - lo, min(end, hi) - lo) for param, lo, hi in ranges
                    if lo < end and hi > start]
        cut.append(_Piece(start, end, segments))
        start = end
    return cut


def _ranges(params: list[nn.Parameter]) -> list[tuple[nn.Parameter, int, int]]:
    """Each parameter's range of the flat buffer: (parameter, start, end)."""
    ranges, offset = [], 0
    for param in params:
        ranges.append((param, offset, offset + param.numel()))
        offset += param.numel()
    return ranges


def nccl_average_is_exact(dtype: torch.dtype, world: int) -> bool:
    """Whether NCCL's average equals DDP's multiplication by 1 / world before the sum. NCCL multiplies by 1 / world
    rounded to the values' dtype: the same reciprocal as DDP's in fp32 and fp64, exact at any power of two, but in
    a 16-bit dtype at other world sizes a biased one (bf16 averages over 3 ranks read high)."""
    return torch.finfo(dtype).bits >= 32 or world & (world - 1) == 0
