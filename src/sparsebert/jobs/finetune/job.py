"""Finetuning jobs: every task of an experiment, each run with its own seed and run directory.

``<output root>/<experiment>/<task>/run<k>/`` holds one run (seed = experiment seed + k): metrics.json, env.json,
predictions, config.json, epochs.json, the model and DONE, and a row in the results registry. Finished runs
are skipped, so ``--resume`` continues an experiment where it stopped. The experiment directory's own
metrics.json summarizes its runs (mean, std and max per task and metric).
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, set_seed

from sparsebert.config import ExperimentConfig
from sparsebert.console import configure_logging, quiet_progress_bars
from sparsebert.data.glue import available_glue_tasks, get_glue_task
from sparsebert.data.tokenizer import load_tokenizer
from sparsebert.distributed import process_state
from sparsebert.distributed.gpus import visible_gpus
from sparsebert.errors import SparseBertError
from sparsebert.jobs.finetune.common import FinetuneContext, check_batches_fit, read_metrics
from sparsebert.jobs.finetune.csv_task import load_csv, run_csv
from sparsebert.jobs.finetune.gap import load_gap, run_gap
from sparsebert.jobs.finetune.glue import load_glue_task, run_glue
from sparsebert.jobs.finetune.parallel import run_in_processes, side_by_side_blocker
from sparsebert.jobs.finetune.squad import load_squad, run_squad
from sparsebert.results.recording import recorded_run, run_record
from sparsebert.results.runs import pretrain_metrics_of, resolve_pretrained, sparsity_of_run
from sparsebert.results.stats import sample_std
from sparsebert.sigterm import terminate_on_sigterm
from sparsebert.trainer.termination import StopWhenTerminated

log = logging.getLogger(__name__)


def task_list(cfg: ExperimentConfig, data_dir: Path | None) -> list[str]:
    """The (task kind, name) pairs an experiment runs, e.g. glue -> every GLUE task present."""
    if cfg.task == "glue":
        if cfg.finetune.glue_tasks:
            return [f"glue:{get_glue_task(t).name}" for t in cfg.finetune.glue_tasks]
        if data_dir is None:
            raise SparseBertError("task glue without finetune.glue_tasks needs a local data directory to see "
                                  "which tasks are present; name them in finetune.glue_tasks to use the hub")
        tasks = available_glue_tasks(data_dir)
        if not tasks:
            raise SparseBertError(f"no GLUE task with train and dev files under {data_dir}/glue")
        return [f"glue:{t}" for t in tasks]
    return [cfg.task]


def task_dir(task: str) -> str:
    return task.replace(":", "_")


def check_positions(source: str, max_seq_length: int) -> None:
    """Refuse a model whose config does not load (a hub id mistyped, the hub out of reach) and
    finetune.max_seq_length beyond its position embeddings before any run directory exists (the forward pass
    would fail on the first long batch)."""
    from transformers import AutoConfig

    try:
        positions = AutoConfig.from_pretrained(source).max_position_embeddings
    except OSError as e:
        raise SparseBertError(f"cannot load model '{source}': {str(e).splitlines()[0]}") from None
    except (ValueError, AttributeError):
        return  # a config of another kind: loading the model reports what is wrong with it
    if max_seq_length > positions:
        raise SparseBertError(f"finetune.max_seq_length={max_seq_length} is beyond the {positions} position "
                              f"embeddings of {source}")


# per task kind: what reads and checks its inputs (data, teacher) in prepare(), and what trains one run on them
LOADERS = {"glue": load_glue_task, "squad_v1": load_squad, "squad_v2": load_squad, "gap": load_gap, "csv": load_csv}
RUNNERS = {"glue": run_glue, "squad_v1": run_squad, "squad_v2": run_squad, "gap": run_gap, "csv": run_csv}


@dataclass
class FinetuneJob:
    cfg: ExperimentConfig
    data_dir: Path | None
    output_root: Path
    callbacks: list[TrainerCallback] = field(default_factory=list)

    def prepare(self, tasks: list[str] | None = None) -> None:
        """Resolve the model, read and check every task's inputs (``tasks``: these of the job's tasks only, as a
        worker process of ``finetune.parallel_runs`` does for its run)."""
        cfg = self.cfg
        self.tasks = tasks or task_list(cfg, self.data_dir)
        self._check_parallel_runs()
        source = resolve_pretrained(cfg.model.init_from, self.output_root, "model.init_from")
        check_positions(source, cfg.finetune.max_seq_length)
        inherited = sparsity_of_run(cfg.model.init_from, self.output_root)
        if cfg.sparsity is None and inherited is not None:
            # finetuning a sparse pretraining run keeps its masks fixed: the zeros of its exported weights. The
            # runs get a copy with that section; self.cfg stays what was asked for, since the experiment's
            # config.json and the --resume comparison against it are made from self.cfg
            cfg = replace(cfg, sparsity=inherited)
            log.info("%s starts from a sparse run: its masks stay fixed while finetuning", cfg.model.init_from)
        self.ctx = FinetuneContext(
            cfg=cfg,
            tokenizer=self._tokenizer(source),
            data_dir=self.data_dir, output_root=self.output_root, model_source=source,
            pretrain_metrics=pretrain_metrics_of(cfg.model.init_from, self.output_root),
            callbacks=self.callbacks,
        )
        # every task's data and teacher are read and checked here, before the runner creates a run directory: a
        # bad row or a missing teacher must not leave a directory that the fixed command takes for an unfinished run
        self.inputs = {task: self._inputs(task) for task in self.tasks}
        for task, inputs in self.inputs.items():
            check_batches_fit(self.task_context(task).cfg, inputs.train_rows)

    def _check_parallel_runs(self) -> None:
        runs_at_once = self.cfg.finetune.parallel_runs or 1
        if runs_at_once > 1 and (blocker := side_by_side_blocker(self.callbacks)):
            raise SparseBertError(f"finetune.parallel_runs={runs_at_once} trains runs in {blocker}: set "
                                  "finetune.parallel_runs=1")

    def _inputs(self, task: str) -> Any:
        kind, _, name = task.partition(":")  # "glue:rte" -> the GLUE loader on rte; else the task itself
        return LOADERS[kind](self.ctx, name or task)

    def _tokenizer(self, source: str):
        """The tokenizer saved with the model (our runs and the MiniLM ship one), else model.tokenizer."""
        try:
            return load_tokenizer(source)
        except SparseBertError:
            return load_tokenizer(self.cfg.model.tokenizer, self.output_root)

    def runs(self, task: str) -> int:
        name = task.split(":", 1)[-1]
        return self.cfg.finetune.runs_per_task.get(name, self.cfg.finetune.num_runs)

    def work(self, task: str) -> float:
        """How many rows one run of ``task`` trains on: its training rows times its epochs, or, for a run counted in
        steps (``train.max_steps``), its steps times the global batch."""
        train = self.task_context(task).cfg.train
        if train.epochs is None:
            return train.max_steps * train.global_batch_size
        return self.inputs[task].train_rows * train.epochs

    def task_context(self, task: str) -> FinetuneContext:
        """The context of one task: ``finetune.epochs_per_task`` may give it its own number of epochs."""
        epochs = self.ctx.cfg.finetune.epochs_per_task.get(task.split(":", 1)[-1])
        if epochs is None:
            return self.ctx
        cfg = self.ctx.cfg
        return replace(self.ctx, cfg=replace(cfg, train=replace(cfg.train, epochs=epochs)))

    def train(self, run_dir: Path, resume: bool) -> dict[str, Any]:
        """Train every run that has not finished (``finetune.parallel_runs`` at once) and summarize each task."""
        metrics: dict[tuple[str, int], dict[str, Any]] = {}
        pending = []
        for task in self.tasks:
            for k in range(self.runs(task)):
                sub = run_dir / task_dir(task) / f"run{k}"
                if (sub / "DONE").is_file():
                    log.info("%s %s run%d already finished; reading its metrics", self.cfg.name, task, k)
                    metrics[task, k] = read_metrics(sub)
                else:
                    pending.append((task, k, sub))
        workers = min(self.cfg.finetune.parallel_runs or 1, len(pending))
        if workers > 1:
            # the longest runs first (rows x epochs), so the short ones fill the gaps beside them and the job does
            # not end with one long run alone on the GPU
            pending.sort(key=lambda run: self.work(run[0]), reverse=True)
            run_in_processes(train_in_worker, [(self.cfg, self.data_dir, self.output_root, task, k, sub)
                                               for task, k, sub in pending], workers,
                             [f"{self.cfg.name} {task} run{k}" for task, k, _ in pending], gpus=visible_gpus())
            metrics.update({(task, k): read_metrics(sub) for task, k, sub in pending})
        else:
            metrics.update({(task, k): self.train_run(task, k, sub) for task, k, sub in pending})
        return {task: summarize([metrics[task, k] for k in range(self.runs(task))]) for task in self.tasks}

    def train_run(self, task: str, k: int, sub: Path) -> dict[str, Any]:
        """Run ``k`` of ``task`` (seed = the experiment's seed + k) into ``sub``, with its registry row."""
        seed = self.cfg.seed + k
        set_seed(seed)
        log.info("finetuning %s on %s, run %d (seed %d) -> %s", self.cfg.name, task, k, seed, sub)
        # running now; finish_run records done, an exception failed; a killed run stays running
        row = run_record(sub, self.cfg.name, task, seed, self.cfg.model.init_from or "", self.ctx.pretrain_metrics)
        with recorded_run(self.output_root, row, write=process_state().is_main_process):
            return RUNNERS[task.partition(":")[0]](self.task_context(task), self.inputs[task], seed, sub)


def train_in_worker(cfg: ExperimentConfig, data_dir: Path | None, output_root: Path, task: str, k: int,
                    sub: Path) -> None:
    """One run of a job in a worker process of its own (``finetune.parallel_runs``): the job is prepared for its
    task alone (the features come from the cache the parent filled) and the run trained as the parent would."""
    configure_logging(logging.INFO)
    quiet_progress_bars()
    with terminate_on_sigterm() as raise_if_terminated:
        job = FinetuneJob(cfg, data_dir, output_root, callbacks=[StopWhenTerminated(raise_if_terminated)])
        job.prepare([task])
        job.train_run(task, k, sub)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """mean / std / max of every numeric metric over the runs of one task. A NaN value (a collapsed run: constant
    STS-B predictions have no correlation) makes that metric's mean and std NaN; max is over the other runs."""
    keys = [k for k, v in runs[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    out: dict[str, Any] = {"runs": len(runs)}
    for k in keys:
        values = [r[k] for r in runs if isinstance(r.get(k), int | float)]
        numbers = [v for v in values if not math.isnan(v)]
        std = sample_std(values) if len(values) > 1 else 0.0
        out[k] = {"mean": statistics.fmean(values), "std": std, "max": max(numbers, default=math.nan)}
    return out
