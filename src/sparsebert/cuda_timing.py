"""CUDA-event timing and CUDA-graph capture: what the library times itself with (the 2:4 kernel's tile choice)
and the GPU benches build on (``bench/cuda_timing.py``)."""

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


def graph_ms(fn: Callable[[], object], calls: int = 20, replays: int = 10) -> float:
    """ms per call of ``fn``: ``calls`` calls captured in one CUDA graph, replayed ``replays`` times (kernels only,
    for timing a single op below the host's launch rate)."""

    def many() -> None:
        for _ in range(calls):
            fn()

    replay = capture(many)
    replay()  # the first replay uploads the graph
    return ms_per_call(replay, replays) / calls
