"""Gradient accumulation leaves the step's loss and gradient unchanged (same global batch, split into
micro-batches), for a finetuning head and for MLM pretraining with distillation. Dropout is off so that the
two layouts compute the same thing.

Transformers' Trainer divides by the accumulation steps only for models that do not normalize the loss by the
step's item count themselves, and it guesses which from the forward's signature; a wrong guess scales the
gradient by the accumulation steps (and, under DDP, by the number of processes).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import TrainLogs

from sparsebert.config import ExperimentRegistry
from sparsebert.runner import RunOptions, run_experiment

NO_DROPOUT = ["model.hidden_dropout=0", "model.attention_dropout=0"]

pytestmark = pytest.mark.slow


def first_step(data_dir: Path, out: Path, name: str, overrides: list[str]) -> dict:
    cfg = ExperimentRegistry.builtin().build(name, overrides)
    log = TrainLogs()
    run_experiment(cfg, RunOptions(output_root=out, data_dir=data_dir), callbacks=[log])
    return log.logs[0]


def test_finetuning_loss_and_gradient_do_not_grow_with_accumulation(data_dir, tmp_path):
    # one optimizer step (the one compared) of 16 rows; 8 dev rows, since evaluation plays no part here
    base = [*NO_DROPOUT, 'finetune.glue_tasks=["rte"]', "finetune.runs_per_task={}", "finetune.max_train_samples=16",
            "finetune.max_eval_samples=8", "finetune.save_model=false", "train.logging_steps=1",
            "train.global_batch_size=16"]
    whole = first_step(data_dir, tmp_path / "a", "tiny_glue", [*base, "train.per_device_batch_size=16"])
    split = first_step(data_dir, tmp_path / "b", "tiny_glue", [*base, "train.per_device_batch_size=4"])
    # same 16 examples, same weights: the same mean loss and gradient up to float rounding (micro-batches pad
    # to their own longest row, which attention masks make irrelevant)
    assert split["loss"] == pytest.approx(whole["loss"], rel=1e-3)
    assert split["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-3)


def test_distillation_term_does_not_grow_with_accumulation(data_dir, tmp_path):
    fast = [*NO_DROPOUT, "data.max_files=1", "data.eval_documents=4", "data.max_eval_samples=16",
            "data.max_seq_length=64", "train.eval_at_start=false", "train.eval_steps=100", "train.save_steps=100",
            "train.report_to=[]", "train.logging_steps=1", "train.warmup_steps=0", "train.max_steps=2"]
    run_experiment(ExperimentRegistry.builtin().build("bert_tiny_quick", fast),
                   RunOptions(output_root=tmp_path / "teacher", data_dir=data_dir))
    teacher = str(tmp_path / "teacher" / "bert_tiny_quick")
    kd = [*fast, f"kd.teacher={teacher}", "kd.alpha=1.0", "train.global_batch_size=16"]
    whole = first_step(data_dir, tmp_path / "a", "bert_tiny_quick", [*kd, "train.per_device_batch_size=16"])
    split = first_step(data_dir, tmp_path / "b", "bert_tiny_quick", [*kd, "train.per_device_batch_size=4"])
    # The collator draws masks per batch, so the two layouts mask different positions: the terms agree only
    # statistically (a few %), while a term not divided by the 4 accumulation steps is 4x as large.
    assert split["loss"] == pytest.approx(whole["loss"], rel=0.25)
    assert split["grad_norm"] == pytest.approx(whole["grad_norm"], rel=0.25)
