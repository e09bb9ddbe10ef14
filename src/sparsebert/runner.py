"""Running one experiment into ``<output root>/<name>/``.

Order matters for honesty: the settings are resolved (``finetune.gpu_fast_path`` for this machine, the masks of a
sparse run that pretraining continues) and checked, and data and model are prepared first (bad input fails before any
run directory exists), then ``config.json`` (what runs) and ``env.json`` (what runs it; a resume is added to it) are
written, training runs, ``metrics.json`` follows, and ``DONE`` is written last. A directory without ``DONE`` is never a
finished run; ``--resume`` continues it.
A run directory started afresh (new, or deleted by ``--overwrite``) first loses the registry rows of the runs it held,
so the results tables never report a run whose directory is gone.

One writer per run directory: from the first check to ``DONE``, the main process holds ``<output root>/.<name>.lock``
(:mod:`sparsebert.locks`), so a second process on the same experiment and output root (a double-submitted job,
an ``--overwrite`` while the run trains) is refused in one line naming the process that holds it. The other
processes of a multi-process job take no lock: they write only what the main process coordinates.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparsebert.config import ExperimentConfig, to_dict
from sparsebert.distributed import process_state, world_size
from sparsebert.env_info import environment, with_resume
from sparsebert.errors import SparseBertError
from sparsebert.io import atomic_write_json, atomic_write_text
from sparsebert.jobs.finetune.fast_path import gpu_runs_at_once, trains_on_gpu, with_gpu_fast_path
from sparsebert.locks import FileLock, LockHeld
from sparsebert.results import RunRegistry
from sparsebert.results.recording import finished, recorded_run, run_key, run_record
from sparsebert.results.runs import resolve_pretrained, with_masks_of_start

log = logging.getLogger(__name__)

DONE = "DONE"


@dataclass
class RunOptions:
    output_root: Path
    data_dir: Path | None
    resume: bool = False
    overwrite: bool = False


def is_finished(run_dir: Path) -> bool:
    return (run_dir / DONE).is_file()


def make_job(cfg: ExperimentConfig, opts: RunOptions, callbacks: list | None = None):
    if cfg.task == "mlm":
        from sparsebert.jobs.pretrain import PretrainJob

        return PretrainJob(cfg, opts.data_dir, opts.output_root, callbacks=list(callbacks or []))
    if cfg.task == "upstream":
        from sparsebert.jobs.upstream_pruning import UpstreamPruningJob

        return UpstreamPruningJob(cfg, opts.data_dir, opts.output_root, callbacks=list(callbacks or []))
    from sparsebert.jobs.finetune.job import FinetuneJob

    return FinetuneJob(cfg, opts.data_dir, opts.output_root, callbacks=list(callbacks or []))


def run_experiment(cfg: ExperimentConfig, opts: RunOptions, callbacks: list | None = None) -> dict[str, Any] | None:
    """Run ``cfg``; returns its metrics, or None when it had already finished."""
    run_dir = opts.output_root / cfg.name
    state = process_state()
    make_output_root(opts.output_root)
    try:
        with run_lock(run_dir) if state.is_main_process else nullcontext():
            return _run(cfg, opts, run_dir, callbacks)
    finally:
        # the finished job's trainer sits in reference cycles, and with it the training loader's worker processes
        # (they outlive epochs): collected now, not while the next experiment of a sequence trains
        gc.collect()


def make_output_root(root: Path) -> None:
    """The output root, created now: one that cannot be (a file in the way) fails before data and model are
    prepared."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        blocker = next((p for p in [root, *root.parents] if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file" if blocker is not None else e.strerror
        raise SparseBertError(f"--output-dir {root} cannot be created: {why}") from None


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """One process at a time writes ``run_dir``: another one holding it is a one-line error naming it."""
    lock = FileLock(run_dir.parent / f".{run_dir.name}.lock", f"run directory {run_dir}")
    try:
        lock.acquire()
    except LockHeld as e:  # two writers would mix two runs in one directory
        raise SparseBertError(f"{e}; wait for it to end, or stop it first") from None
    except OSError as e:
        raise SparseBertError(f"cannot write in the output root {run_dir.parent}: {e.strerror}") from None
    try:
        yield
    finally:
        lock.release()


def _run(cfg: ExperimentConfig, opts: RunOptions, run_dir: Path, callbacks: list | None) -> dict[str, Any] | None:
    state = process_state()
    if os.path.lexists(run_dir) and not run_dir.is_dir():  # --overwrite deletes run directories, not other files
        raise SparseBertError(f"a file is in the way of the run directory: {run_dir} is not a directory; move it "
                              "away, or use another --output-dir")
    # what a finetuning experiment trains with on this machine: checked against a finished run and written as such
    cfg = with_gpu_fast_path(cfg, *gpu_and_runs_at_once(cfg, callbacks or []))
    cfg = with_masks_of_start(cfg, opts.output_root)  # likewise: written as such, checked on --resume
    if is_finished(run_dir) and not opts.overwrite:
        _check_same_config(run_dir, cfg, f"{run_dir} holds a finished run of {cfg.name} with other settings")
        log.warning("%s already finished in %s; skipping (pass --overwrite to run it again)", cfg.name, run_dir)
        return None
    if run_dir.exists() and not (opts.resume or opts.overwrite):
        raise SparseBertError(f"{run_dir} holds an unfinished run of {cfg.name}; pass --resume to continue it "
                              "or --overwrite to start over")
    if run_dir.exists() and opts.resume:
        _check_same_config(run_dir, cfg, f"--resume of {run_dir}: the experiment changed since it started")

    if cfg.model.init_from:  # a mistyped model fails now, not after the Trainer's imports and the data
        resolve_pretrained(cfg.model.init_from, opts.output_root, "model.init_from")
    check_train_settings(cfg)
    from transformers import set_seed

    # seeded before anything random happens (model init, masks): the same seed gives the same run on CPU
    set_seed(cfg.seed)
    job = make_job(cfg, opts, callbacks)
    job.prepare()

    if state.is_main_process:
        if opts.overwrite or not run_dir.exists():
            forget_runs(opts.output_root, run_dir)
        if opts.overwrite and run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(run_dir / "config.json", to_dict(cfg))
        write_environment(run_dir, cfg.seed)
    state.wait_for_everyone()

    # a pretraining run is one registry row (running, then done or failed); a finetuning job records each of
    # its task runs itself
    row = (run_record(run_dir, cfg.name, cfg.task, cfg.seed, cfg.model.init_from or cfg.model.size)
           if not cfg.is_finetuning else None)
    with recorded_run(opts.output_root, row, write=state.is_main_process) if row else nullcontext():
        start = time.time()
        metrics = job.train(run_dir, resume=opts.resume)
        metrics["wall_time_s"] = time.time() - start
        if state.is_main_process:
            atomic_write_json(run_dir / "metrics.json", metrics)
            if row is not None:  # before DONE, as finetuning runs do: a finished run is never missing from it
                RunRegistry.in_output_root(opts.output_root).record(finished(row, metrics))
            atomic_write_text(run_dir / DONE, time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")
    state.wait_for_everyone()
    return metrics


def write_environment(run_dir: Path, seed: int) -> None:
    """``env.json``: this invocation's environment for a run it starts; for one it resumes, this invocation is added
    to the environment that started it (:func:`sparsebert.env_info.with_resume`). Rewriting it would make the run
    look as if the resume's command and commit had made all of it."""
    path = run_dir / "env.json"
    try:
        started = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet (a new run, or one stopped before it wrote it), or damaged
        started = None
    now = environment(seed)
    atomic_write_json(path, with_resume(started, now) if isinstance(started, dict) and started else now)


def forget_runs(output_root: Path, run_dir: Path) -> None:
    """Drop the registry rows of every run in ``run_dir`` (the experiment's own, a finetuning job's task runs) as it
    starts afresh: the runs there are deleted (--overwrite) or already gone. First, in one transaction: a table never
    reports a deleted run, nor one a smaller ``finetune.runs_per_task`` no longer makes, even if this process dies
    before the new runs are recorded."""
    removed = RunRegistry.in_output_root(output_root).forget_tree(run_key(run_dir))
    if removed:
        log.info("removed %d run(s) under %s from the registry", removed, run_dir)


def gpu_and_runs_at_once(cfg: ExperimentConfig, callbacks: list) -> tuple[bool, int]:
    """Whether this process trains on a GPU, and how many runs of a finetuning job it could train there side by
    side (1 where the job's runs cannot leave this process)."""
    on_gpu = trains_on_gpu()
    if not (on_gpu and cfg.is_finetuning and cfg.finetune.gpu_fast_path and cfg.finetune.parallel_runs is None):
        return on_gpu, 1
    from sparsebert.jobs.finetune.parallel import side_by_side_blocker

    return on_gpu, 1 if side_by_side_blocker(callbacks) else gpu_runs_at_once()


def check_train_settings(cfg: ExperimentConfig) -> None:
    """Refuse what TrainingArguments would refuse on this machine (precision, the batch layout at this world size)
    now: they are built only when training starts, and a run refused after config.json was written would leave a
    directory the next run takes for an unfinished one."""
    # imported here, not at the top: the Trainer's imports take seconds, and a run that is refused (its directory
    # in use, finished, unfinished without --resume) should fail fast
    from sparsebert.models.precision import resolve_precision
    from sparsebert.trainer.arguments import batch_layout

    resolve_precision(cfg.train.precision)
    batch_layout(cfg.train, world_size())


# how many of a job's runs train at once changes none of them: a resume may change it (4 at once ran out of memory)
SCHEDULING_KEYS = {"finetune.parallel_runs"}


def _check_same_config(run_dir: Path, cfg: ExperimentConfig, problem: str) -> None:
    """Resuming with different settings would silently mix two experiments in one run directory, and skipping
    a finished run with different settings would silently produce nothing for the new ones."""
    saved = saved_config(run_dir)
    if saved is None:
        return
    current = json.loads(json.dumps(to_dict(cfg)))
    # a key missing from the saved config (a setting added since the run was made) stands for that setting's
    # default, which the older code ran with: no difference unless the current value differs from it
    defaults = json.loads(json.dumps(_field_defaults(cfg)))
    diff = sorted(set(_diff_keys(saved, current, defaults)) - SCHEDULING_KEYS)
    if diff:
        raise SparseBertError(f"{problem} ({', '.join(diff[:5])}); use --overwrite or another --output-dir")


def saved_config(run_dir: Path) -> dict | None:
    """The settings the run in ``run_dir`` started with (its ``config.json``), or None where the directory holds
    nothing yet (a run stopped before it wrote it: ``config.json`` is the first file a run writes, so nothing ran).
    A directory that holds anything else without a readable ``config.json`` (damaged, deleted) is refused: its
    settings cannot be compared with these, and resuming it or skipping it as finished would be blind."""
    path = run_dir / "config.json"
    cannot_compare = "so its settings cannot be compared with these: pass --overwrite to start over, or use " \
                     "another --output-dir"
    if not path.exists():
        if not any(not p.name.startswith(".") for p in run_dir.iterdir()):  # dot files: temp files of a write
            return None
        raise SparseBertError(f"{run_dir} holds a run without its config.json, {cannot_compare}")
    try:
        saved = json.loads(path.read_text())
    except OSError as e:
        raise SparseBertError(f"{path} cannot be read ({e.strerror}), {cannot_compare}") from None
    except ValueError:  # not JSON, or not text
        saved = None
    if not isinstance(saved, dict):
        raise SparseBertError(f"{path} is damaged (not a JSON object of settings), {cannot_compare}")
    return saved


def _field_defaults(obj: Any) -> dict:
    """Each dataclass field's default, nested like ``to_dict(obj)``; a nested section that is set is walked."""
    out: dict = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out[f.name] = _field_defaults(value)
        elif f.default is not dataclasses.MISSING:
            out[f.name] = to_dict(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = to_dict(f.default_factory())
    return out


def _diff_keys(saved: Any, current: Any, defaults: Any, prefix: str = "") -> list[str]:
    if isinstance(saved, dict) and isinstance(current, dict):
        out: list[str] = []
        for k in set(saved) | set(current):
            default = defaults.get(k) if isinstance(defaults, dict) else None
            out += _diff_keys(saved.get(k, default), current.get(k), default, f"{prefix}.{k}" if prefix else k)
        return out
    return [] if saved == current else [prefix]
