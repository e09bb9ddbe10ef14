"""CUDA-event timing, CUDA-graph capture and a per-kernel GPU-time profile shared by the GPU benches."""

from __future__ import annotations

from collections.abc import Callable

import torch


def ms_per_call(fn: Callable[[], object], calls: int) -> float:
    """GPU milliseconds per call of ``fn`` over ``calls`` back-to-back calls (CUDA events around the loop)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def capture(fn: Callable[[], object], warmup: int = 3) -> Callable[[], None]:
    """``fn`` captured in a CUDA graph; returns its replay, which launches the recorded kernels and nothing else
    (host work between kernels drops out of the time). The graph reads the tensors ``fn`` used in place. The
    warm-up calls run outside the capture, on a side stream: lazy initialisation must not be recorded."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def kernel_profile(step: Callable[[], object], calls: int = 5, top: int = 12) -> dict:
    """GPU time per call of ``step`` by kernel (torch.profiler; CUDA graph replays show their kernels too)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    kernels = sorted(((e.key, e.device_time_total / calls / 1000, e.count // calls)
                      for e in prof.key_averages() if e.device_time_total > 0), key=lambda k: -k[1])
    return {"total_ms": sum(k[1] for k in kernels),
            "top": [{"kernel": name[:120], "ms": ms, "calls": n} for name, ms, n in kernels[:top]]}
