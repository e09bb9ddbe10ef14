"""GLUE finetuning: one task, one seed; dev metrics, dev predictions, leaderboard test files when present."""

from __future__ import annotations

import csv
import io
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding

from sparsebert.data.glue import (
    GlueTask,
    featurize_glue,
    get_glue_task,
    glue_leaderboard_filename,
    glue_metrics,
    load_glue,
    write_glue_test_predictions,
)
from sparsebert.io import atomic_write_text
from sparsebert.trainer.finetune.common import FinetuneContext, finish_run, limit, make_trainer


def load_classifier(source: str, num_labels: int, regression: bool, **kwargs):
    """``kwargs``: more ``from_pretrained`` arguments (the student's ``pretrained_kwargs``)."""
    return AutoModelForSequenceClassification.from_pretrained(
        source, num_labels=num_labels,
        problem_type="regression" if regression else "single_label_classification", **kwargs)


def _predictions(task, raw_predictions: np.ndarray) -> np.ndarray:
    return raw_predictions.reshape(-1) if task.is_regression else raw_predictions.argmax(axis=-1)


@dataclass
class GlueInputs:
    """Everything a GLUE run reads, checked before any run directory exists."""

    task: GlueTask
    features: Any  # datasets.DatasetDict: train, the eval splits and the test splits present
    ids: dict[str, list[int]]  # the GLUE idx of each eval and test row, for the prediction files
    teacher: str | None


def load_glue_task(ctx: FinetuneContext, name: str) -> GlueInputs:
    fcfg = ctx.cfg.finetune
    task = get_glue_task(name)
    teacher = ctx.teacher_source(f"glue_{task.name}")
    raw = load_glue(task.name, ctx.data_dir)
    raw["train"] = limit(raw["train"], fcfg.max_train_samples)
    for split in task.eval_splits:
        raw[split] = limit(raw[split], fcfg.max_eval_samples)
    features = featurize_glue(raw, ctx.tokenizer, fcfg.max_seq_length).remove_columns("idx")
    ids = {split: raw[split]["idx"] for split in [*task.eval_splits, *task.test_splits] if split in raw}
    return GlueInputs(task, features, ids, teacher)


def run_glue(ctx: FinetuneContext, inputs: GlueInputs, seed: int, run_dir: Path) -> dict[str, Any]:
    started = time.time()
    fcfg = ctx.cfg.finetune
    task, features = inputs.task, inputs.features
    model = load_classifier(ctx.model_source, task.num_labels, task.is_regression, **ctx.pretrained_kwargs)
    trainer = make_trainer(
        ctx, model, run_dir, seed, features["train"], features[task.eval_splits[0]],
        DataCollatorWithPadding(ctx.tokenizer, pad_to_multiple_of=fcfg.pad_to_multiple_of), ["labels"],
        compute_metrics=lambda p: glue_metrics(task.name, p.predictions, p.label_ids),
        teacher_source=inputs.teacher,
        load_teacher=lambda s: load_classifier(s, task.num_labels, task.is_regression),
    )
    trainer.train()

    metrics: dict[str, Any] = {}
    scores = []
    outputs = []
    for split in task.eval_splits:
        out = trainer.predict(features[split])
        m = glue_metrics(task.name, out.predictions, out.label_ids)
        scores.append(m["score"])
        suffix = {"dev_matched": "_matched", "dev_mismatched": "_mismatched"}.get(split, "")
        metrics.update({f"{k}{suffix}": v for k, v in m.items() if k != "score"})
        outputs.append(partial(_write_dev_predictions, run_dir / f"predictions_{split}.tsv", inputs.ids[split],
                               _predictions(task, out.predictions), out.label_ids))
    metrics["score"] = float(np.mean(scores))
    for split in task.test_splits:
        if split in features:
            out = trainer.predict(features[split])
            outputs.append(partial(write_glue_test_predictions, task.name, inputs.ids[split],
                                   _predictions(task, out.predictions),
                                   run_dir / "test" / glue_leaderboard_filename(task.name, split)))
    return finish_run(ctx, trainer, run_dir, f"glue:{task.name}", seed, metrics, started, outputs)


def _write_dev_predictions(path: Path, ids, predictions: np.ndarray, labels: np.ndarray) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter="\t", lineterminator="\n")
    writer.writerow(["index", "prediction", "label"])
    for i, p, y in zip(ids, predictions.tolist(), np.asarray(labels).reshape(len(ids), -1)[:, 0].tolist()):
        writer.writerow([i, round(p, 4) if isinstance(p, float) else p, y])
    atomic_write_text(path, buf.getvalue())
