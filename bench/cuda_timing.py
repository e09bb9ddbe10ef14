"""CUDA-graph timing of alternating variants and a per-kernel GPU-time profile shared by the GPU benches; the
basic timers (``ms_per_call``, ``capture``, ``graph_ms``) live in ``sparsebert.cuda_timing``."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from sparsebert.cuda_timing import capture, graph_ms, ms_per_call  # noqa: F401 (the benches import them from here)


def alternating_graph_ms(fns: dict[str, Callable[[], object]], repeats: int,
                         calls: int = 20) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Each function's median ``graph_ms`` over ``repeats`` rounds, the functions alternating within a round (to
    spread clock drift); and every round's time."""
    runs: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            runs[key].append(graph_ms(fn, calls))
    return {k: statistics.median(v) for k, v in runs.items()}, runs


def kernel_profile(step: Callable[[], object], calls: int = 5, top: int = 12) -> dict:
    """GPU time per call of ``step`` by kernel (torch.profiler; CUDA graph replays show their kernels too).

    Also the GPU's timeline over the ``calls`` back-to-back calls, per call: ``span_ms`` from the first kernel's
    start to the last one's end, ``idle_ms`` the gaps in it where no kernel ran (including those between one
    call's last kernel and the next call's first), ``overlap_ms`` the time kernels ran alongside an earlier one
    (programmatic dependent launch), and ``idle_before`` the gaps summed by the name of the kernel that ran after
    them, over all its calls: which kernels wait to start. Memsets count as kernels here. All of it is measured
    under the profiler's tracing, and over a short burst, so it need not match a sustained run's time per call."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    kernels = sorted(((e.key, e.device_time_total / calls / 1000, e.count // calls)
                      for e in prof.key_averages() if e.device_time_total > 0), key=lambda k: -k[1])
    timeline = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA),
                      key=lambda e: e.time_range.start)
    idle, overlap, idle_before = 0.0, 0.0, {}
    busy_until = timeline[0].time_range.end if timeline else 0.0  # the latest end so far, in microseconds
    for kernel in timeline[1:]:
        gap = kernel.time_range.start - busy_until
        if gap > 0:
            idle += gap
            idle_before[kernel.name[:120]] = idle_before.get(kernel.name[:120], 0.0) + gap
        else:
            overlap += min(-gap, kernel.time_range.end - kernel.time_range.start)
        busy_until = max(busy_until, kernel.time_range.end)
    span = busy_until - timeline[0].time_range.start if timeline else 0.0
    to_ms = 1 / calls / 1000
    return {"total_ms": sum(k[1] for k in kernels), "span_ms": span * to_ms, "idle_ms": idle * to_ms,
            "overlap_ms": overlap * to_ms,
            "top": [{"kernel": name[:120], "ms": ms, "calls": n} for name, ms, n in kernels[:top]],
            "idle_before": [{"kernel": name, "ms": us * to_ms}
                            for name, us in sorted(idle_before.items(), key=lambda kv: -kv[1])[:top]]}
