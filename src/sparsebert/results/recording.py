"""RunRegistry rows over a run's life: ``running`` from its start, then ``done`` or ``failed`` with the error.

A run killed outright (SIGKILL, a node lost) cannot record anything and stays ``running``; ``--runs`` shows it so,
and ``--resume`` or ``--overwrite`` records it again when it restarts. Only the main process of a multi-process
job writes rows (the callers check it): one row per run, not one per rank.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sparsebert.results.run_registry import RunRecord, RunRegistry

log = logging.getLogger(__name__)


def one_line_error(e: BaseException) -> str:
    """The error as one line: our own errors are already one sentence; others get their type in front."""
    from sparsebert.config import ConfigError
    from sparsebert.errors import SparseBertError, Terminated

    text = " ".join(str(e).split()) or "(no message)"
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    return text if isinstance(e, SparseBertError | ConfigError | Terminated) else f"{type(e).__name__}: {text}"


@contextmanager
def recorded_run(output_root: Path, record: RunRecord, write: bool = True) -> Iterator[None]:
    """Record ``record`` as ``running`` now, and as ``failed`` (with the error) if the block raises.

    The block itself records ``done`` with its metrics (what it knows, this context does not).

    Args:
        output_root: the registry's output root.
        record: the run's row (status is set here).
        write: False on processes other than the main one: nothing is recorded.
    """
    if not write:
        yield
        return
    registry = RunRegistry.in_output_root(output_root)
    registry.record(dataclasses.replace(record, status="running", error=None))
    try:
        yield
    except BaseException as e:
        try:
            registry.record(dataclasses.replace(record, status="failed", error=one_line_error(e)))
        except Exception as inner:  # the run's own error is the one to report
            log.warning("could not record %s as failed: %s", record.run_dir, inner)
        raise


def run_key(run_dir: Path) -> str:
    """A run's registry key: its absolute directory (the same from any working directory)."""
    return str(Path(run_dir).resolve())


def find_run_record(run_dir: Path, roots: list[Path] | None = None) -> RunRecord | None:
    """The registry row of the run in ``run_dir``: from the registry of the first of ``roots``, or else of the
    directories above the run (the output root it lies in), that has one; an unreadable registry says nothing.

    Args:
        run_dir: the run's directory.
        roots: output roots to look in first (e.g. ``--output-dir``'s).
    """
    from sparsebert.errors import SparseBertError
    from sparsebert.results import REGISTRY_FILENAME

    for directory in [*(roots or []), *Path(run_dir).resolve().parents]:
        registry = directory / REGISTRY_FILENAME
        if not registry.is_file():
            continue
        try:
            record = RunRegistry(registry, read_only=True).get(run_key(run_dir))
        except SparseBertError:
            continue
        if record is not None:
            return record
    return None


def run_record(run_dir: Path, experiment: str, task: str, seed: int, model: str,
               pretrain_metrics: dict[str, float] | None = None) -> RunRecord:
    """A run's row as it starts (``running``), the same for pretraining and finetuning runs."""
    from sparsebert.env_info import git_commit

    return RunRecord(run_dir=run_key(run_dir), experiment=experiment, task=task, model=model, seed=seed,
                     status="running", git_commit=git_commit(), pretrain_metrics=pretrain_metrics or {},
                     group=experiment)


def finished(record: RunRecord, metrics: dict[str, Any]) -> RunRecord:
    """``record`` as ``done``, with the run's numeric metrics and the figures the tables show."""
    numbers = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return dataclasses.replace(record, status="done", error=None, metrics=numbers, sparsity=numbers.get("sparsity"),
                               steps=numbers.get("global_step"), wall_time_s=numbers.get("wall_time_s"),
                               samples_per_second=numbers.get("train_samples_per_second"))
