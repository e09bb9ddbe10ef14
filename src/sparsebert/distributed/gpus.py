"""``--gpus``: choose this node's GPUs before any worker starts.

``--gpus 2`` takes the 2 least busy GPUs (lowest utilization, then most free memory, read through NVML);
``--gpus 0,3`` takes those ids. The choice goes into ``CUDA_VISIBLE_DEVICES``; with more than one GPU, run.py
starts again under torchrun with one process per GPU, so the choice is made once, not by every worker.

Ids are NVML's, which number GPUs in PCI bus order; ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA number them the
same way. Where a scheduler already set ``CUDA_VISIBLE_DEVICES`` to numeric ids, the choice stays inside them.
``visible_gpus`` names the GPUs this process may hand to a child process (search trials, side-by-side runs), and
``least_used`` picks the one a new child gets.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from sparsebert.errors import SparseBertError


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` for a child names them; empty on CPU."""
    import torch

    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # a child's CUDA_VISIBLE_DEVICES counts all devices: pass on the names given here
        return [name.strip() for name in visible.split(",") if name.strip()][:count]
    return [str(i) for i in range(count)]


def least_used(gpus: Sequence[str], in_use: Sequence[str | None]) -> str | None:
    """The GPU a new child process gets: of ``gpus``, the one fewest of ``in_use`` (the running children's GPUs)
    name, the first of a tie; None unless there are several (the child then sees what this process sees)."""
    if len(gpus) < 2:
        return None
    return min(gpus, key=list(in_use).count)


@dataclass(frozen=True)
class GpuState:
    index: int
    free_mib: int
    utilization: int  # percent


def query_gpus() -> list[GpuState]:
    try:
        import pynvml
    except ImportError:
        raise SparseBertError("--gpus needs NVML: pip install nvidia-ml-py") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise SparseBertError(f"--gpus: cannot read the GPUs through NVML ({e}); is there an NVIDIA GPU?") from None
    try:
        states = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            free = pynvml.nvmlDeviceGetMemoryInfo(handle).free // 2**20
            try:
                busy = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except pynvml.NVMLError:  # not supported (MIG, some virtual GPUs): ranked by free memory alone
                busy = 0
            states.append(GpuState(i, int(free), busy))
        return states
    finally:
        pynvml.nvmlShutdown()


def allowed_gpus(gpus: list[GpuState], visible: str | None) -> list[GpuState]:
    """The GPUs a scheduler left to this job: all, or those its numeric ``CUDA_VISIBLE_DEVICES`` names."""
    if not visible or not visible.strip():
        return gpus
    try:
        ids = {int(x) for x in visible.split(",") if x.strip()}
    except ValueError:
        raise SparseBertError(f"--gpus: CUDA_VISIBLE_DEVICES={visible} names GPUs by UUID or MIG id, which --gpus "
                              "cannot choose among; drop --gpus and let that setting stand") from None
    return [g for g in gpus if g.index in ids]


def pick_gpus(spec: str, gpus: list[GpuState]) -> list[int]:
    """GPU ids for ``--gpus SPEC``: a count (least busy first) or a comma-separated list of ids."""
    known = {g.index for g in gpus}
    if "," in spec:
        try:
            ids = [int(x) for x in spec.split(",") if x.strip()]
        except ValueError:
            raise SparseBertError(f"--gpus {spec}: expected a count or comma-separated GPU ids") from None
        if not ids or len(set(ids)) != len(ids):
            raise SparseBertError(f"--gpus {spec}: expected distinct GPU ids")
        missing = sorted(set(ids) - known)
        if missing:
            raise SparseBertError(f"--gpus {spec}: GPU {missing[0]} is not available here "
                                  f"(available: {', '.join(map(str, sorted(known))) or 'none'})")
        return ids
    try:
        count = int(spec)
    except ValueError:
        raise SparseBertError(f"--gpus {spec}: expected a count or comma-separated GPU ids") from None
    if not 1 <= count <= len(gpus):
        raise SparseBertError(f"--gpus {count}: this node has {len(gpus)} GPU(s)")
    ranked = sorted(gpus, key=lambda g: (g.utilization, -g.free_mib, g.index))
    return sorted(g.index for g in ranked[:count])


def without_gpus_flag(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--gpus":
            skip = True
        elif not arg.startswith("--gpus="):
            out.append(arg)
    return out


def torchrun_command(script: str, argv: list[str], n: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), script,
            *without_gpus_flag(argv)]
