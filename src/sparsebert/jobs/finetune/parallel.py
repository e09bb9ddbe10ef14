"""Several runs of one finetuning job at once (``finetune.parallel_runs``), each in a process of its own.

MiniLM at batch 32 leaves a GPU mostly idle: its step is bound by the host's Python and kernel launches
(docs/performance.md), so runs side by side on one GPU finish a job of many small runs (GLUE: every task, three
seeds) sooner than one after another. Each run is a spawned process (CUDA cannot be forked) that trains it exactly
as the job's own loop would: same seed, run directory, files and registry row. On a machine with several GPUs (and
one process: torchrun's ranks each span every run) each run gets one of them, the one with the fewest runs.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from multiprocessing.queues import SimpleQueue

from sparsebert.config import ConfigError
from sparsebert.data.featurize import available_cores
from sparsebert.distributed import world_size
from sparsebert.distributed.gpus import least_used
from sparsebert.environ import environ
from sparsebert.errors import SparseBertError, Terminated
from sparsebert.results.recording import one_line_error
from sparsebert.trainer.termination import StopWhenTerminated

log = logging.getLogger(__name__)
# a worker's error as it reaches the parent: one line, short (the parent reads the queue once a process has ended,
# and a pipe holds 64 KiB)
MAX_ERROR_CHARS = 2000


def side_by_side_blocker(callbacks: Sequence[object]) -> str | None:
    """Why this process cannot hand its job's runs to worker processes, or None where it can.

    Args:
        callbacks: the job's Trainer callbacks (a worker gets only the SIGTERM one).

    Returns:
        the reason, to end a sentence "finetune.parallel_runs=N trains runs in ...".
    """
    if world_size() > 1:
        return (f"processes of their own on one machine; under accelerate launch / torchrun ({world_size()} "
                "processes) each run spans them all")
    if any(not isinstance(c, StopWhenTerminated) for c in callbacks):
        return "worker processes, which this job's callbacks (--profile) cannot follow"
    return None


def run_in_processes(target: Callable[..., None], calls: Sequence[tuple], workers: int,
                     names: Sequence[str], gpus: Sequence[str] = ()) -> None:
    """Call ``target(*call)`` for every call, each in a spawned process, at most ``workers`` at once.

    Args:
        target: a module-level function (the spawned process imports it by name).
        calls: the arguments of each call (picklable).
        workers: processes at once.
        names: what each call is, for the error and the log.
        gpus: where there are several, ``CUDA_VISIBLE_DEVICES`` names to spread the processes over: each starts
            seeing only the one with the fewest processes. Otherwise each sees what this process sees.

    Raises:
        SparseBertError: a call failed on bad input (or ``Terminated``: its process got SIGTERM; another error:
            RuntimeError, its traceback in the log). No call starts after that; the ones running beside it end
            first, and the error is that of the first failure, in one line.
        BaseException: whatever interrupts this process (SIGTERM's ``Terminated``, Ctrl-C) after it has ended
            the running processes.
    """
    context = multiprocessing.get_context("spawn")
    errors = context.SimpleQueue()
    threads = max(1, available_cores() // workers)  # each process's torch CPU threads: the cores shared out
    # a spawned process makes spawn its own default: its DataLoader workers would each import torch again (20 s an
    # epoch on 2 cores); they start as this process's do
    children_start = multiprocessing.get_start_method()
    queued = list(range(len(calls)))
    running: dict[int, BaseProcess] = {}
    placed: dict[int, str | None] = {}  # call -> the GPU it was given
    reported: dict[int, tuple[str, str]] = {}  # call -> (kind of error, its line)
    failed: int | None = None
    try:
        while running or (queued and failed is None):
            while queued and failed is None and len(running) < workers:
                i = queued.pop(0)
                placed[i] = least_used(gpus, [placed[j] for j in running])
                log.info("starting %s in a process of its own (%d at once)%s", names[i], workers,
                         f" on GPU {placed[i]}" if placed[i] is not None else "")
                process = context.Process(target=_call, name=names[i],
                                          args=(target, calls[i], i, errors, threads, children_start))
                # the GPU goes into the environment the process starts with: the child starts CUDA's driver
                # (which reads CUDA_VISIBLE_DEVICES once) while it imports the target's modules, before _call runs
                gpu = placed[i]
                with environ(CUDA_VISIBLE_DEVICES=gpu) if gpu is not None else contextlib.nullcontext():
                    process.start()
                running[i] = process
            ready = set(wait([p.sentinel for p in running.values()]))
            for i in [i for i, p in running.items() if p.sentinel in ready]:
                process = running.pop(i)
                process.join()
                while not errors.empty():
                    index, kind, message = errors.get()
                    reported[index] = (kind, message)
                if process.exitcode != 0 and failed is None:
                    failed = i
                    reported.setdefault(i, ("crash", f"its process ended with exit code {process.exitcode}"))
    except BaseException:
        _end(list(running.values()))
        raise
    if failed is not None:
        kind, message = reported[failed]
        error = {"input": SparseBertError, "terminated": Terminated}.get(kind, RuntimeError)
        raise error(f"{names[failed]} failed: {message}")


def _end(processes: list[BaseProcess]) -> None:
    """SIGTERM (each run records itself failed), then SIGKILL for a process that has not ended within a minute."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=60)
        if process.exitcode is None:
            process.kill()
            process.join()


def _call(target: Callable[..., None], args: tuple, index: int, errors: SimpleQueue, threads: int,
          children_start: str) -> None:
    """The spawned process: ``target(*args)``; its error, as one line, goes back to the parent."""
    import torch

    torch.set_num_threads(threads)
    multiprocessing.set_start_method(children_start, force=True)
    try:
        target(*args)
    except BaseException as e:
        kind = ("input" if isinstance(e, SparseBertError | ConfigError)
                else "terminated" if isinstance(e, Terminated | KeyboardInterrupt) else "crash")
        if kind == "crash":
            log.exception("%s failed", multiprocessing.current_process().name)
        errors.put((index, kind, one_line_error(e)[:MAX_ERROR_CHARS]))
        raise SystemExit(1) from None
