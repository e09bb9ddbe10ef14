"""``run.py NAME --profile``: a torch.profiler trace of a few training steps after warm-up, in the run dir."""

from __future__ import annotations

import json
import logging
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch
from transformers import TrainerCallback

from sparsebert.io import atomic_write_text

log = logging.getLogger(__name__)

# the text of the warning torch issues for each synchronizing CUDA call under torch.cuda.set_sync_debug_mode("warn")
SYNC_WARNING = "called a synchronizing CUDA operation"


class HostSyncCounter(TrainerCallback):
    """Counts the host-GPU synchronizations in optimizer steps start+1 .. start+steps and where they come from
    (torch's CUDA sync debug mode). A step whose host waits for the GPU cannot queue the next step ahead: the
    GPU then idles for the host's per-step work, and under DDP each rank's host delay reaches every rank.
    ``result`` is None until the window has been counted; without CUDA nothing is counted.

    While counting, the sync debug mode and a warnings hook are process-wide. A run that raises inside the window
    never reaches ``on_train_end``; the next counter to start (or this one at its next ``on_train_begin``) puts
    them back first. Each counted sync costs some host time (a warning), so count outside timed steps."""

    _open: HostSyncCounter | None = None  # the counter whose window is open in this process

    def __init__(self, start: int, steps: int = 5):
        if start < 1 or steps < 1:
            raise ValueError(f"HostSyncCounter counts after step start >= 1 for steps >= 1, got {start}, {steps}")
        self.start, self.steps = start, steps
        self.sites: Counter[str] = Counter()
        self.stacks: dict[str, list[str]] = {}
        self.result: dict | None = None
        self._catch: warnings.catch_warnings | None = None
        self._previous_mode = 0

    def on_train_begin(self, args, state, control, **kwargs):
        if self._catch is not None:  # left open by an earlier run that raised inside the window
            self._close()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.start and self._catch is None and self.result is None:
            self._begin()
        elif self._catch is not None and state.global_step == self.start + self.steps:
            self._end(self.steps)

    def on_train_end(self, args, state, control, **kwargs):
        if self._catch is not None:  # training ended inside the window
            self._end(state.global_step - self.start)

    def _begin(self) -> None:
        if not torch.cuda.is_available():
            return
        if HostSyncCounter._open is not None:
            log.warning("a host-sync count left open by an earlier run is closed")
            HostSyncCounter._open._close()
        self._catch = warnings.catch_warnings()  # restores the filters and showwarning at the end
        self._catch.__enter__()
        warnings.filterwarnings("always", message=SYNC_WARNING)
        original = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            if SYNC_WARNING not in str(message):
                return original(message, category, filename, lineno, file, line)
            site = f"{filename}:{lineno}"
            self.sites[site] += 1
            if site not in self.stacks:  # the caller's frames, without this function and the warnings machinery
                self.stacks[site] = [f"{f.filename}:{f.lineno} {f.name}"
                                     for f in traceback.extract_stack(limit=9)[:-2]]

        warnings.showwarning = record
        self._previous_mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        HostSyncCounter._open = self

    def _close(self) -> None:
        torch.cuda.set_sync_debug_mode(self._previous_mode)
        self._catch.__exit__(None, None, None)
        self._catch = None
        HostSyncCounter._open = None

    def _end(self, steps: int) -> None:
        self._close()
        total = sum(self.sites.values())
        self.result = {"steps": steps, "syncs": total, "per_step": total / max(steps, 1),
                       "sites": [{"site": site, "count": n, "stack": self.stacks[site]}
                                 for site, n in self.sites.most_common()]}
        log.info("host-GPU synchronizations in %d steps: %d", steps, total)


class ProfilerCallback(TrainerCallback):
    """Profiles optimizer steps warmup+1 .. warmup+steps and writes ``trace.json`` (Chrome / Perfetto) and
    ``top_ops.txt`` (the most expensive operators) into ``out_dir`` (default: ``profile/`` in the run directory);
    on a GPU also ``gpu_time.json`` (:func:`gpu_time`: how much of the window the GPU computed, communicated,
    both at once, or idled), ``kernels.json`` (:func:`kernel_breakdown`: GPU time per kind of kernel) and
    ``host_syncs.json`` (:class:`HostSyncCounter` over as many steps just before the
    profiled ones, so that its warnings stay out of the trace)."""

    def __init__(self, warmup: int = 5, steps: int = 3, out_dir: Path | None = None):
        self.warmup, self.steps, self.out_dir = warmup, steps, out_dir
        self.profiler: torch.profiler.profile | None = None
        self.window: tuple[float, float] | None = None  # perf_counter at the profiled steps' start and end
        counted = min(steps, warmup - 1)  # the window ends with step `warmup`, before the profiler starts
        self.syncs = HostSyncCounter(warmup - counted, counted) if counted >= 1 else None

    def on_train_begin(self, args, state, control, **kwargs):
        if self.syncs is not None:
            self.syncs.on_train_begin(args, state, control, **kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        if self.syncs is not None:
            self.syncs.on_step_end(args, state, control, **kwargs)
        if state.global_step == self.warmup and self.profiler is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities, record_shapes=True)
            self.profiler.__enter__()
            started = time.perf_counter()
            self.window = (started, started)  # _finish sets the end
        elif self.profiler is not None and state.global_step == self.warmup + self.steps:
            self._finish(Path(args.output_dir))

    def on_train_end(self, args, state, control, **kwargs):
        if self.syncs is not None:
            self.syncs.on_train_end(args, state, control, **kwargs)
        if self.profiler is not None:  # training ended inside the window
            self._finish(Path(args.output_dir))

    def _finish(self, run_dir: Path) -> None:
        self.window = (self.window[0], time.perf_counter())
        profiler, self.profiler = self.profiler, None
        profiler.__exit__(None, None, None)
        out = self.out_dir or run_dir / "profile"
        out.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(out / "trace.json"))
        sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
        atomic_write_text(out / "top_ops.txt", profiler.key_averages().table(sort_by=sort, row_limit=30) + "\n")
        if torch.cuda.is_available():
            trace = json.loads((out / "trace.json").read_text())
            summary = gpu_time(trace)
            atomic_write_text(out / "gpu_time.json", json.dumps(summary, indent=2) + "\n")
            kernels = kernel_breakdown(trace)
            atomic_write_text(out / "kernels.json", json.dumps(kernels, indent=2) + "\n")
            log.info("GPU time in the profiled steps: %s", summary)
        if self.syncs is not None and self.syncs.result is not None:
            atomic_write_text(out / "host_syncs.json", json.dumps(self.syncs.result, indent=2) + "\n")
        log.info("profile of %d steps written to %s", self.steps, out)
        self.warmup = -1  # once per run


def _union_ms(intervals: list[tuple[float, float]]) -> tuple[float, list[tuple[float, float]]]:
    """Total length of a union of [start, end) intervals, and the merged intervals."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return sum(e - s for s, e in merged), merged


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    total, j = 0.0, 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            total += min(end, b[k][1]) - max(start, b[k][0])
            k += 1
    return total


def gpu_time(trace: dict) -> dict:
    """From a Chrome trace of the profiler: over the window from the first to the last GPU kernel, the time
    (ms, on any stream of the trace's devices taken together) the GPU ran compute kernels (copies and memsets
    included), collective communication kernels (NCCL), both at once, and nothing. Exposed communication (NCCL
    running while no compute kernel does) and idle time are what multi-GPU scaling loses."""
    compute, comm = [], []
    for event in _gpu_events(trace):
        span = (event["ts"] / 1000, (event["ts"] + event["dur"]) / 1000)  # trace times are microseconds
        (comm if "nccl" in event.get("name", "").lower() else compute).append(span)
    if not compute and not comm:
        return {}
    start = min(s for s, _ in compute + comm)
    end = max(e for _, e in compute + comm)
    busy, _ = _union_ms(compute + comm)
    compute_ms, compute_merged = _union_ms(compute)
    comm_ms, comm_merged = _union_ms(comm)
    both = _overlap(compute_merged, comm_merged)
    return {"window_ms": round(end - start, 3), "compute_ms": round(compute_ms, 3), "comm_ms": round(comm_ms, 3),
            "comm_overlapped_ms": round(both, 3), "comm_exposed_ms": round(comm_ms - both, 3),
            "idle_ms": round(end - start - busy, 3)}


def _gpu_events(trace: dict):
    """The trace's GPU work: kernels, copies and memsets (host events left out)."""
    return (event for event in trace.get("traceEvents", [])
            if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in event)


# kernel-name patterns (lower case) of each kind of GPU work, tried in this order: a cuDNN attention kernel's name
# also holds "gemm"-like words (and cuDNN's attention backward runs helper kernels, "cudnn::fusion::..."), Adam's
# fused kernel runs through multi_tensor_apply. Elementwise ATen kernels (a mask multiply, fills) are "other":
# their names do not say what they are for
KERNEL_KINDS = (
    ("copy / memset", ("memcpy", "memset")),
    ("communication", ("nccl",)),
    ("attention", ("flash", "fmha", "sdpa", "attention", "attn", "cudnn")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "sm90_", "sm100_")),
    ("optimizer", ("adam",)),
    ("foreach (gradient norms and scaling)", ("multi_tensor", "foreach")),
    ("generated reduction (LayerNorm, softmax, loss)", ("triton_per", "triton_red")),
    ("generated pointwise (GELU, dropout, casts, adds)", ("triton_poi", "triton_")),
)


def kernel_kind(name: str) -> str:
    """The kind of GPU work a kernel (or copy) name stands for (:data:`KERNEL_KINDS`; else "other")."""
    lowered = name.lower()
    for kind, patterns in KERNEL_KINDS:
        if any(p in lowered for p in patterns):
            return kind
    return "other"


def kernel_breakdown(trace: dict, top: int = 30) -> dict:
    """Where the GPU's time goes in a profiled window, from a Chrome trace: per kind of kernel
    (:func:`kernel_kind`) its summed duration (ms), kernel count and share of all kernel time, and the ``top``
    kernels by summed duration. Kernels on different streams that overlap are both counted, so the sum can
    exceed the window; this says which work costs what, :func:`gpu_time` how busy the GPU was."""
    kernels: dict[str, dict] = {}  # per kernel name: its kind, summed ms, count
    for event in _gpu_events(trace):
        name = event.get("name", "")
        entry = kernels.setdefault(name, {"kind": kernel_kind(name), "ms": 0.0, "count": 0})
        entry["ms"] += event["dur"] / 1000
        entry["count"] += 1
    kinds: dict[str, dict] = {}
    for entry in kernels.values():
        summed = kinds.setdefault(entry["kind"], {"ms": 0.0, "count": 0})
        summed["ms"] += entry["ms"]
        summed["count"] += entry["count"]
    total = sum(e["ms"] for e in kinds.values())
    by_kind = {kind: {"ms": round(e["ms"], 3), "count": e["count"], "share": round(e["ms"] / total, 4)}
               for kind, e in sorted(kinds.items(), key=lambda item: -item[1]["ms"])}
    ranked = sorted(kernels.items(), key=lambda item: -item[1]["ms"])[:top]
    return {"kernel_ms": round(total, 3), "by_kind": by_kind,
            "top_kernels": [{"name": name[:200], "kind": e["kind"], "ms": round(e["ms"], 3), "count": e["count"]}
                            for name, e in ranked]}
