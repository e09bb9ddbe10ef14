"""What every finetuning task shares: the run context, the Trainer, the per-run outputs and the registry row."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase, TrainerCallback

from sparsebert.config import ExperimentConfig, to_dict
from sparsebert.distributed import world_size
from sparsebert.env_info import environment
from sparsebert.errors import SparseBertError
from sparsebert.io import atomic_write_json, atomic_write_text, publish_tree
from sparsebert.models.prepare import prepare_model
from sparsebert.models.pretrained import pretrained_kwargs
from sparsebert.results import RunRegistry
from sparsebert.results.recording import finished, run_record
from sparsebert.results.runs import finetuning_experiment, resolve_pretrained
from sparsebert.trainer.arguments import batch_layout, training_arguments
from sparsebert.trainer.hooks import build_hooks
from sparsebert.trainer.trainer import SparseBertTrainer


@dataclass
class FinetuneContext:
    cfg: ExperimentConfig
    tokenizer: PreTrainedTokenizerBase
    data_dir: Path | None
    output_root: Path
    model_source: str  # what from_pretrained loads
    pretrain_metrics: dict[str, float]  # eval loss / perplexity of the pretraining run it starts from
    callbacks: list[TrainerCallback]

    @property
    def pretrained_kwargs(self) -> dict[str, Any]:
        """The model section's attention kernel and dropouts, for the student's ``from_pretrained``."""
        return pretrained_kwargs(self.cfg.model)

    def require_data_dir(self, what: str) -> Path:
        if self.data_dir is None:
            raise SparseBertError(f"{what} needs a local data directory: set --data-dir or $SPARSEBERT_DATA")
        return self.data_dir

    def data_file(self, relative: str) -> Path:
        path = self.require_data_dir(relative) / relative
        if not path.is_file():
            raise SparseBertError(f"data file {path} not found (data directory {self.data_dir})")
        return path

    def teacher_source(self, task_dir: str) -> str | None:
        """A finetuning teacher: the same task's first run of the named experiment, or any model it names."""
        if self.cfg.kd is None:
            return None
        teacher = self.cfg.kd.teacher
        run = self.output_root / teacher / task_dir / "run0"
        if (run / "model" / "config.json").is_file() or (run / "model" / "model.safetensors").is_file():
            if not (run / "DONE").is_file():
                raise SparseBertError(f"teacher run {run} has not finished")
            return str(run / "model")
        if finetuning_experiment(self.output_root / teacher):
            raise SparseBertError(f"kd.teacher {teacher}: {run} holds no model; run {teacher} on this task first")
        return resolve_pretrained(teacher, self.output_root, "kd.teacher")


def limit(dataset, n: int | None):
    """The first ``n`` rows of ``dataset``; None: all of them (config validation refuses an ``n`` below 1)."""
    return dataset if n is None else dataset.select(range(min(n, len(dataset))))


def _micro_batch_rows(cfg: ExperimentConfig) -> tuple[int, int]:
    """Rows per micro-batch over all processes, and micro-batches per optimizer step."""
    world = world_size()
    per_device, accumulation = batch_layout(cfg.train, world)
    return per_device * world, accumulation


def check_batches_fit(cfg: ExperimentConfig, n_train: int) -> None:
    """Refuse a training set that ``train.drop_last_batch`` would leave without a single batch (FinetuneJob.prepare
    calls this before any run directory exists)."""
    micro, _ = _micro_batch_rows(cfg)
    if cfg.train.epochs is not None and cfg.train.drop_last_batch and n_train < micro:
        raise SparseBertError(f"train.drop_last_batch: {n_train} training rows are fewer than one batch of {micro}, "
                              "so every batch would be dropped (on a GPU finetune.gpu_fast_path turns it on: set "
                              "finetune.gpu_fast_path=false or a smaller train.global_batch_size)")


def total_optimizer_steps(cfg: ExperimentConfig, n_train: int) -> int:
    """Optimizer steps of a finetuning run: the RigL / GMP schedules are laid out over them."""
    if cfg.train.epochs is None:
        return cfg.train.max_steps
    micro, accumulation = _micro_batch_rows(cfg)
    # as the Trainer counts: micro-batches per epoch (the short last one dropped, or not), then optimizer steps,
    # the last of which may accumulate fewer micro-batches
    micro_batches = n_train // micro if cfg.train.drop_last_batch else math.ceil(n_train / micro)
    return max(1, math.ceil(math.ceil(micro_batches / accumulation) * cfg.train.epochs))


def make_trainer(ctx: FinetuneContext, model, run_dir: Path, seed: int, train_ds, eval_ds, collator,
                 label_names: list[str], compute_metrics=None, teacher_source: str | None = None,
                 load_teacher=None) -> SparseBertTrainer:
    cfg = ctx.cfg
    # The finetuning heads return a plain mean over their micro-batch. Transformers' Trainer takes any model whose
    # forward has **kwargs for one that normalizes by the whole step's item count itself, and then neither
    # divides by the accumulation steps nor undoes its multiply by the number of processes: the gradient would be
    # accumulation x processes times too large (and clipped accordingly). Say what these models do.
    model.accepts_loss_kwargs = False
    prepare_model(model, cfg)
    hooks = build_hooks(cfg, model, total_optimizer_steps(cfg, len(train_ds)), seed, teacher_source, load_teacher)
    args = training_arguments(cfg.train, run_dir, seed, f"{cfg.name}/{run_dir.parent.name}/{run_dir.name}",
                              label_names=label_names, finetune=True,
                              evaluate=eval_ds is not None and compute_metrics is not None)
    return SparseBertTrainer(
        model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds, data_collator=collator,
        processing_class=ctx.tokenizer, compute_metrics=compute_metrics, callbacks=ctx.callbacks,
        tokens_per_sample=0, **hooks,
    )


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def epoch_stats(trainer) -> list[dict[str, Any]]:
    """Per-epoch train loss and validation metrics, from the Trainer's log history."""
    rows: dict[float, dict[str, Any]] = {}
    for h in trainer.state.log_history:
        if "epoch" not in h:
            continue
        row = rows.setdefault(round(math.ceil(h["epoch"] - 1e-9), 6), {"epoch": math.ceil(h["epoch"] - 1e-9)})
        if "loss" in h:
            row["train_loss"] = h["loss"]
        row.update({k: v for k, v in h.items() if k.startswith("eval_")})
    return [rows[k] for k in sorted(rows)]


def finish_run(ctx: FinetuneContext, trainer, run_dir: Path, task: str, seed: int, metrics: dict[str, Any],
               started: float, outputs: Sequence[Callable[[], None]] = ()) -> dict[str, Any]:
    """Everything a finished run leaves: model, the task's ``outputs`` (prediction files, plots: written by the
    main process only, every rank having computed the same gathered predictions), metrics, epochs, config, env,
    sparsity; a registry row; DONE last."""
    cfg = ctx.cfg
    train_metrics = next((h for h in reversed(trainer.state.log_history) if "train_runtime" in h), {})
    metrics = {k: float(v) if isinstance(v, np.floating | np.integer) else v for k, v in metrics.items()}
    metrics.update({
        "global_step": trainer.state.global_step,
        "train_samples_per_second": train_metrics.get("train_samples_per_second"),
        "train_runtime_s": train_metrics.get("train_runtime"),
        "wall_time_s": time.time() - started,
    })
    sparsity, report = None, None
    if trainer.sparsity is not None:
        report = trainer.sparsity.report()
        sparsity = report["selected"]["sparsity"]
        metrics["sparsity"] = sparsity
    if cfg.finetune.save_model:
        trainer.save_model(str(run_dir / "model"))  # every rank calls it; the Trainer writes from the main one
    # the model is on disk before anyone writes DONE, and only the main process writes the run's files
    trainer.accelerator.wait_for_everyone()
    if not trainer.is_world_process_zero():
        return metrics
    if cfg.finetune.save_model:
        publish_tree(run_dir / "model")  # safetensors writes model.safetensors 0600: a shared model must be readable
    for write in outputs:
        write()
    if report is not None:
        atomic_write_json(run_dir / "sparsity.json", report)
    atomic_write_json(run_dir / "epochs.json", epoch_stats(trainer))
    atomic_write_json(run_dir / "log_history.json", trainer.state.log_history)  # --plot loss, per logged step
    run_cfg = to_dict(cfg)
    run_cfg.update({"task": task, "seed": seed, "experiment": cfg.name, "model_source": ctx.model_source})
    atomic_write_json(run_dir / "config.json", run_cfg)
    # the invocation that trained this run, which a resume of its experiment at another commit would not be
    atomic_write_json(run_dir / "env.json", environment(seed))
    atomic_write_json(run_dir / "metrics.json", metrics)
    # the registry row first (an upsert by run_dir): a crash before DONE leaves a run that --resume redoes,
    # never a finished run the results table misses
    RunRegistry.in_output_root(ctx.output_root).record(finished(
        run_record(run_dir, cfg.name, task, seed, cfg.model.init_from or "", ctx.pretrain_metrics), metrics))
    atomic_write_text(run_dir / "DONE", time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")
    return metrics


def read_metrics(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "metrics.json").read_text())
