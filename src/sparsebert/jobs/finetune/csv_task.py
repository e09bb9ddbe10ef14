"""CSV / TSV text classification: stratified split, token folding, per-row aggregation, full outputs (the
predictions CSV, the confusion matrix); reading, splitting and folding: ``data/csv_task.py``."""

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
from transformers import DataCollatorWithPadding

from sparsebert.data.csv_task import CsvData, aggregate_folded, build_csv_datasets
from sparsebert.io import atomic_write_text
from sparsebert.jobs.finetune.classification_metrics import classification_metrics, plot_confusion_matrix
from sparsebert.jobs.finetune.common import FinetuneContext, finish_run, limit, make_trainer, softmax
from sparsebert.jobs.finetune.glue import load_classifier


@dataclass
class CsvInputs:
    """Everything a CSV run reads, checked before any run directory exists."""

    splits: Any  # datasets.DatasetDict of folded rows: train, dev (unless csv.val_fraction=0), test
    data: CsvData
    teacher: str | None

    @property
    def train_rows(self) -> int:
        return len(self.splits["train"])


def load_csv(ctx: FinetuneContext, task: str) -> CsvInputs:
    cfg = ctx.cfg
    assert cfg.csv is not None  # validated with the experiment
    teacher = ctx.teacher_source("csv")
    # the split follows the experiment seed: every run of the experiment is measured on the same test rows
    splits, data = build_csv_datasets(cfg.csv, ctx.require_data_dir("task csv"), ctx.tokenizer,
                                      cfg.finetune.max_seq_length, cfg.seed)
    return CsvInputs(splits, data, teacher)


def run_csv(ctx: FinetuneContext, inputs: CsvInputs, seed: int, run_dir: Path) -> dict[str, Any]:
    started = time.time()
    fcfg = ctx.cfg.finetune
    splits, data = inputs.splits, inputs.data
    num_labels = len(data.label_names)
    train = limit(splits["train"], fcfg.max_train_samples).remove_columns("row_id")
    # csv.val_fraction=0: no dev split, so no per-epoch evaluation (the test rows are only for the end)
    dev = limit(splits["dev"], fcfg.max_eval_samples).remove_columns("row_id") if "dev" in splits else None
    test = splits["test"]

    model = load_classifier(ctx.model_source, num_labels, regression=False, label_names=data.label_names,
                            **ctx.pretrained_kwargs)
    collator = DataCollatorWithPadding(ctx.tokenizer, pad_to_multiple_of=fcfg.pad_to_multiple_of)
    trainer = make_trainer(ctx, model, run_dir, seed, train, dev, collator,
                           ["labels"], compute_metrics=lambda p: _chunk_accuracy(p),
                           teacher_source=inputs.teacher,
                           load_teacher=lambda s: load_classifier(s, num_labels, regression=False,
                                                                label_names=data.label_names))
    trainer.train()
    out = trainer.predict(test.remove_columns("row_id"))
    row_ids, probs = aggregate_folded(test["row_id"], softmax(out.predictions))
    label_of = dict(zip(data.ids, data.labels))
    truth = np.array([label_of[r] for r in row_ids])
    predicted = probs.argmax(axis=-1)
    metrics = classification_metrics(truth, predicted, num_labels)
    metrics.update({"label_names": data.label_names, "test_rows": len(row_ids), "test_chunks": len(test)})
    outputs = [partial(write_csv_predictions, run_dir / "test_predictions.csv", row_ids, truth, predicted, probs,
                       data.label_names),
               partial(plot_confusion_matrix, metrics["confusion_matrix"], data.label_names,
                       run_dir / "confusion_matrix.png")]
    return finish_run(ctx, trainer, run_dir, "csv", seed, metrics, started, outputs)


def _chunk_accuracy(p) -> dict[str, float]:
    return {"accuracy": float((np.asarray(p.predictions).argmax(-1) == p.label_ids).mean())}


# ---------------------------------------------------------------------------------------------- outputs


def write_csv_predictions(path: str | Path, row_ids: Sequence[Any], truth: Sequence[int] | None,
                          predictions: Sequence[int], probs: Any, label_names: Sequence[str]) -> None:
    """CSV of row_id, truth, prediction (as label strings) and one ``prob_<label>`` column per class; without
    ``truth`` (rows that have no label) the truth column is left out."""
    probs = np.asarray(probs, dtype=np.float64)
    n = len(row_ids)
    n_truth = n if truth is None else len(truth)
    if not n_truth == len(predictions) == probs.shape[0] == n or probs.shape[1] != len(label_names):
        raise ValueError(f"{n} row ids, {n_truth} truths, {len(predictions)} predictions, "
                         f"probs {probs.shape} for {len(label_names)} labels")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["row_id", *(["truth"] if truth is not None else []), "prediction",
                     *(f"prob_{name}" for name in label_names)])
    for i, (row_id, p, pr) in enumerate(zip(row_ids, predictions, probs)):
        t = [label_names[int(truth[i])]] if truth is not None else []
        writer.writerow([row_id, *t, label_names[int(p)], *(f"{x:.6f}" for x in pr)])
    atomic_write_text(path, buf.getvalue())
