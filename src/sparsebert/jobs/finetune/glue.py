"""GLUE finetuning: one task, one seed; dev metrics, dev predictions, leaderboard test files when present; the
task's metrics and its leaderboard writer (reading the files: ``data/glue.py``)."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Sequence
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
    load_glue,
)
from sparsebert.errors import SparseBertError
from sparsebert.io import atomic_write_text
from sparsebert.jobs.finetune.common import FinetuneContext, finish_run, limit, make_trainer


def load_classifier(source: str, num_labels: int, regression: bool, label_names: Sequence[str] | None = None,
                    **kwargs):
    """``label_names``: the task's classes in label-id order, saved in the model's config (``id2label``), so that
    a ``pipeline`` on the saved model answers them, not ``LABEL_1``. ``kwargs``: more ``from_pretrained``
    arguments (the student's ``pretrained_kwargs``)."""
    if label_names is not None:
        kwargs.update(id2label=dict(enumerate(label_names)), label2id={n: i for i, n in enumerate(label_names)})
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

    @property
    def train_rows(self) -> int:
        return len(self.features["train"])


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
    model = load_classifier(ctx.model_source, task.num_labels, task.is_regression, task.label_names,
                            **ctx.pretrained_kwargs)
    trainer = make_trainer(
        ctx, model, run_dir, seed, features["train"], features[task.eval_splits[0]],
        DataCollatorWithPadding(ctx.tokenizer, pad_to_multiple_of=fcfg.pad_to_multiple_of), ["labels"],
        compute_metrics=lambda p: glue_metrics(task.name, p.predictions, p.label_ids),
        teacher_source=inputs.teacher,
        load_teacher=lambda s: load_classifier(s, task.num_labels, task.is_regression, task.label_names),
    )
    trainer.train()

    metrics: dict[str, Any] = {}
    scores = []
    outputs = []
    for split in task.eval_splits:
        out = trainer.predict(features[split])
        m = glue_metrics(task.name, out.predictions, out.label_ids)
        scores.append(m["score"])
        metrics.update({f"{k}{task.metric_suffix(split)}": v for k, v in m.items() if k != "score"})
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


# ---------------------------------------------------------------------------------------------- metrics, outputs


def glue_leaderboard_filename(task: str | GlueTask, split: str | None = None) -> str:
    """The file name the GLUE leaderboard expects for a test split (``MNLI-m.tsv`` for test_matched)."""
    t = get_glue_task(task)
    if split is None:
        if len(t.test_splits) != 1:
            raise SparseBertError(f"GLUE task {t.name} has several test splits: name one of {t.test_splits}")
        split = t.test_splits[0]
    if split not in t.test_splits:
        raise SparseBertError(f"GLUE task {t.name} has no test split {split!r}: expected one of {t.test_splits}")
    return t.leaderboard_files[t.test_splits.index(split)]


def _as_predictions(t: GlueTask, predictions: Any) -> np.ndarray:
    p = np.asarray(predictions)
    if t.is_regression:
        return p.reshape(-1).astype(np.float64)  # (n, 1) regression head outputs are fine
    if p.ndim == 2:  # logits or probabilities: take the class with the highest score
        p = p.argmax(axis=-1)
    return p.astype(np.int64)


def glue_metrics(task: str | GlueTask, predictions: Any, labels: Any) -> dict[str, float]:
    """The task's GLUE metrics plus ``score``, the leaderboard's number for the task."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    t = get_glue_task(task)
    p = _as_predictions(t, predictions)
    y = np.asarray(labels).reshape(-1) if t.is_regression else np.asarray(labels).astype(np.int64)
    if p.shape != y.shape:
        raise ValueError(f"{t.name}: {p.shape[0]} predictions for {y.shape[0]} labels")
    out: dict[str, float] = {}
    for name in t.metric_names:
        if name == "matthews_corr":
            out[name] = float(matthews_corrcoef(y, p))
        elif name == "accuracy":
            out[name] = float(accuracy_score(y, p))
        elif name == "f1":
            out[name] = float(f1_score(y, p, pos_label=1, average="binary", zero_division=0))
        elif name == "pearson":
            out[name] = float(pearsonr(p, y.astype(np.float64))[0])
        elif name == "spearman":
            out[name] = float(spearmanr(p, y.astype(np.float64))[0])
    out["score"] = float(np.mean([out[m] for m in t.metric_names]))
    return out


def write_glue_test_predictions(task: str | GlueTask, ids: Sequence[int], predictions: Any,
                                path: str | Path) -> None:
    """Write a leaderboard submission TSV (``index\\tprediction``).

    Labels are spelled as in the GLUE files: label strings for MNLI/QNLI/RTE, 0/1 for the binary tasks
    and WNLI; STS-B scores are clipped to [0, 5] and written with three decimals.
    """
    t = get_glue_task(task)
    p = _as_predictions(t, predictions)
    if len(ids) != len(p):
        raise ValueError(f"{t.name}: {len(ids)} ids for {len(p)} predictions")
    buf = io.StringIO()
    buf.write("index\tprediction\n")
    for i, pred in zip(ids, p):
        if t.file_labels is None:
            value = f"{min(max(float(pred), 0.0), 5.0):.3f}"
        else:
            if not 0 <= pred < len(t.file_labels):
                raise ValueError(f"{t.name}: prediction {pred} is not a class id")
            value = t.file_labels[pred]
        buf.write(f"{int(i)}\t{value}\n")
    atomic_write_text(path, buf.getvalue())
