"""DDP communication hooks for scaling.py's diagnostic variants: what the unsplit step's exposed phase costs
without parts of DDP's per-step work. Not training settings; the bench registers them in place of
Accelerate's hook for one run.

- ``keep_bucket``: no all-reduce at all (the gradients stay per-rank): the rest of DDP's cost alone.
- ``view_allreduce`` / ``view_allreduce_bf16``, with gradients kept as bucket views between steps
  (``keep_gradients``): in torch 2.11 the reducer copies every parameter's fresh gradient into its bucket, one
  copy per parameter (202 for BERT-base); with torch's bf16 hook those copies were memcpys that started ~6 us
  apart on the GPU and spaced the bf16 all-reduces in the profile of call K (docs/benchmarks.md). Gradients
  that are already bucket views are accumulated in place by autograd (one add per parameter) and need no copy;
  the hook averages the bucket in place (NCCL's AVG: no division kernel), in fp32 or through one persistent
  bf16 buffer per bucket (one cast there, one back).

- ``compiled_autograd_reducer``: not a hook but the other way to overlap the all-reduce with a compiled
  backward (torch's experimental ``optimize_ddp="python_reducer"`` with compiled autograd), for the variants
  ``static_compiled_autograd`` / ``static_cudagraphs_compiled_autograd``.

``patched_ddp`` patches process-wide (Accelerate's hook registration, ``nn.Module.zero_grad``) for one run, and
its hook replaces whatever ``train.ddp.comm_hook`` a variant sets.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist


def keep_bucket(state, bucket):
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _average(tensor: torch.Tensor) -> torch.futures.Future:
    """All-reduce ``tensor`` in place to the mean over ranks; its future holds [tensor]."""
    if dist.get_backend() == "nccl":
        return dist.all_reduce(tensor, op=dist.ReduceOp.AVG, async_op=True).get_future()
    tensor.div_(dist.get_world_size())  # gloo (CPU smoke runs) has no AVG
    return dist.all_reduce(tensor, async_op=True).get_future()


def view_allreduce(state, bucket):
    return _average(bucket.buffer()).then(lambda f: f.value()[0])


def view_allreduce_bf16(state: dict, bucket):
    buffer = bucket.buffer()
    half = state.get(bucket.index())
    if half is None or half.numel() != buffer.numel():  # DDP rebuilds its buckets once, after the first step
        half = state[bucket.index()] = torch.empty_like(buffer, dtype=torch.bfloat16)
    half.copy_(buffer)

    def back(future):
        buffer.copy_(future.value()[0])
        return buffer

    return _average(half).then(back)


HOOKS = {"keep_bucket": keep_bucket, "view_allreduce": view_allreduce, "view_allreduce_bf16": view_allreduce_bf16}


@contextlib.contextmanager
def patched_ddp(hook: str | None, keep_gradients: bool = False):
    """While active: Accelerate registers ``HOOKS[hook]`` on the DDP model it wraps; with ``keep_gradients``,
    ``Module.zero_grad`` zeroes the gradients in place (one multi-tensor launch: 6 kernels, ~0.13 ms per
    BERT-base step in call O's profile) instead of dropping them, so after the first step they stay the bucket
    views DDP made them (gradient_as_bucket_view)."""
    if hook is None:
        yield
        return
    from accelerate.utils import DistributedDataParallelKwargs

    state: dict = {}  # per run: the bf16 hook's buffers
    original_register = DistributedDataParallelKwargs.register_comm_hook
    original_zero_grad = torch.nn.Module.zero_grad

    def zero_in_place(module, set_to_none: bool = True) -> None:
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        if grads:
            torch._foreach_zero_(grads)

    DistributedDataParallelKwargs.register_comm_hook = lambda self, model: model.register_comm_hook(state, HOOKS[hook])
    if keep_gradients:
        torch.nn.Module.zero_grad = zero_in_place
    try:
        yield
    finally:
        DistributedDataParallelKwargs.register_comm_hook = original_register
        torch.nn.Module.zero_grad = original_zero_grad


@contextlib.contextmanager
def compiled_autograd_reducer(enabled: bool, record: dict):
    """While active: DDP runs its Python reducer (``optimize_ddp="python_reducer"``) and each training step's
    forward and backward run under compiled autograd, so the backward is one Inductor graph with the bucket
    all-reduces traced into it (fused concatenations, functional collectives) instead of the C++ reducer's
    hooks after it: overlap without Dynamo's graph split. ``record`` gets the number of backward graphs captured
    and compiled and whether DDP ran the Python reducer (proof that the variant ran as named)."""
    if not enabled:
        yield
        return
    import functools

    import torch._dynamo
    import torch._dynamo.compiled_autograd as compiled_autograd
    from accelerate import Accelerator
    from transformers import Trainer

    original_prepare = Accelerator.prepare_model
    original_step = Trainer.training_step
    original_mode = torch._dynamo.config.optimize_ddp
    # not fullgraph: torch 2.11's trace of this backward meets a generator (2 x H200, 2026-11-26), and a
    # graph break beats a failed run; the breaks' reasons go into the record
    compiler = functools.partial(torch.compile, backend="inductor", dynamic=False)

    def prepare_model(self, *args, **kwargs):
        torch._dynamo.config.optimize_ddp = "python_reducer"  # read when DDP is built, here
        model = original_prepare(self, *args, **kwargs)
        ddp = getattr(model, "_orig_mod", model)
        record["python_reducer"] = bool(getattr(ddp, "_use_python_reducer", False))
        return model

    def training_step(self, *args, **kwargs):
        with compiled_autograd._enable(compiler):
            return original_step(self, *args, **kwargs)

    Accelerator.prepare_model = prepare_model
    Trainer.training_step = training_step
    before = dict(torch._dynamo.utils.counters["compiled_autograd"])
    breaks_before = dict(torch._dynamo.utils.counters["graph_break"])
    try:
        yield
    finally:
        Accelerator.prepare_model = original_prepare
        Trainer.training_step = original_step
        torch._dynamo.config.optimize_ddp = original_mode
    # only after a run that finished (an exception skips this); whether the traced all-reduces averaged the
    # gradients shows in scaling.py's per-run weights_agree_across_ranks
    after = torch._dynamo.utils.counters["compiled_autograd"]
    record.update({f"compiled_autograd_{k}": after[k] - before.get(k, 0) for k in ("captures", "compiles")})
    breaks = torch._dynamo.utils.counters["graph_break"]
    record["graph_breaks"] = {k[:300]: n - breaks_before.get(k, 0) for k, n in breaks.items()
                              if n > breaks_before.get(k, 0)}

