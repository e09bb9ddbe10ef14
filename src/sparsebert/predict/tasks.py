"""Each task's prediction: the run's model on the input, read and featurized as the run trained, written in the
task's own format (with metrics when the input has labels)."""



from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import (
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    default_data_collator,
)

from sparsebert.config import from_dict
from sparsebert.data.csv_task import (
    CsvTaskConfig,
    aggregate_folded,
    fold_dataset,
    read_csv_task,
)
from sparsebert.data.gap import gap_features, long_gap_rows, read_gap
from sparsebert.data.glue import featurize_glue, glue_dataset, read_glue_file
from sparsebert.data.squad import postprocess_predictions, read_squad
from sparsebert.errors import SparseBertError
from sparsebert.io import atomic_write_all, atomic_write_json
from sparsebert.jobs.finetune.classification_metrics import classification_metrics
from sparsebert.jobs.finetune.common import softmax
from sparsebert.jobs.finetune.csv_task import write_csv_predictions
from sparsebert.jobs.finetune.gap import (
    MODEL_INPUTS,
    gap_metrics,
    load_gap_model,
    write_gap_system_file,
    write_kaggle_submission,
)
from sparsebert.jobs.finetune.glue import glue_metrics, write_glue_test_predictions
from sparsebert.jobs.finetune.squad import squad_features, squad_metrics, write_predictions_json
from sparsebert.predict.finished_run import FinishedRun

log = logging.getLogger(__name__)


@dataclass
class Prediction:
    """What a predict call wrote and, for a labelled input, the task's metrics on it."""

    written: list[Path]
    metrics: dict[str, Any] | None
    kernel_layers: list[str] | None = None  # with --sparse24-kernel: the Linears the 2:4 kernel ran


def infer(model, dataset, collator: Callable, batch_size: int, columns: Sequence[str],
          outputs: Sequence[str] = ("logits",)) -> list[np.ndarray]:
    """The model's ``outputs`` over ``dataset`` (its ``columns`` as inputs), batched, without gradients, on the
    GPU when there is one. Batches are the run's evaluation batches (same size, same collator), so a row
    gets the padding, and the logits, it got when the run evaluated it."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    loader = DataLoader(dataset.select_columns(list(columns)), batch_size=batch_size, collate_fn=collator)
    parts: list[list[np.ndarray]] = [[] for _ in outputs]
    with torch.inference_mode():
        for batch in loader:
            result = model(**{k: v.to(device) for k, v in batch.items()})
            for part, name in zip(parts, outputs):
                part.append(getattr(result, name).float().cpu().numpy())
    return [np.concatenate(p) if p else np.zeros((0,)) for p in parts]


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Around the write of ``path`` (or each step of it, as atomic_write_all's guard): an OSError there becomes a
    one-line error naming the file. The check before the model ran (check_output) cannot foresee every failure (a
    full disk, a directory such as /proc that takes no new files even from root), and a traceback after a long
    prediction would hide which file it was."""
    try:
        yield
    except OSError as e:
        raise SparseBertError(f"--predict: cannot write {path}: {e.strerror or e}") from None


CLASSIFIER_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]


def _classifier(run: FinishedRun):

    return AutoModelForSequenceClassification.from_pretrained(run.model_dir)


def _padding_collator(run: FinishedRun, tokenizer):

    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=run.finetune.pad_to_multiple_of)


def predict_glue(run: FinishedRun, input_file: Path, outputs: list[Path]) -> Prediction:
    """A GLUE TSV in the task's test (or dev) layout -> the leaderboard TSV ``index<TAB>prediction``."""
    (output,) = outputs
    rows = read_glue_file(input_file, run.glue_task, labeled=False)
    labeled = rows[0]["label"] is not None  # the reader gives every row a label or none
    tokenizer = run.tokenizer()
    features = featurize_glue(glue_dataset(run.glue_task, rows), tokenizer, run.finetune.max_seq_length)
    (logits,) = infer(run.prepare(_classifier(run)), features, _padding_collator(run, tokenizer), run.eval_batch_size,
                      CLASSIFIER_INPUTS)
    with writing(output):
        write_glue_test_predictions(run.glue_task, [r["idx"] for r in rows], logits, output)
    metrics = glue_metrics(run.glue_task, logits, [r["label"] for r in rows]) if labeled else None
    return Prediction(outputs, metrics)


def predict_csv(run: FinishedRun, input_file: Path, outputs: list[Path]) -> Prediction:
    """A CSV/TSV with the run's text column (label optional) -> row_id, [truth,] prediction, prob_<label>;
    texts longer than the run's sequence length are folded as in training and their chunks averaged back."""
    (output,) = outputs
    cfg = from_dict(CsvTaskConfig, run.config.get("csv") or {}, prefix="csv")
    label_names = _label_names(run)
    data = read_csv_task(input_file, cfg, label_names=label_names)
    tokenizer = run.tokenizer()
    # an unlabelled row still needs a label for the fold's labels column, which inference leaves out
    labels = data.labels if data.labels is not None else [0] * len(data.ids)
    folded = fold_dataset(data.texts, labels, data.ids, tokenizer, run.finetune.max_seq_length, cfg.fold_stride)
    (logits,) = infer(run.prepare(_classifier(run)), folded, _padding_collator(run, tokenizer), run.eval_batch_size,
                      CLASSIFIER_INPUTS)
    row_ids, probs = aggregate_folded(folded["row_id"], softmax(logits))
    predicted = probs.argmax(axis=-1)
    truth = None
    metrics = None
    if data.labels is not None:
        label_of = dict(zip(data.ids, data.labels))
        truth = np.array([label_of[r] for r in row_ids])
        metrics = classification_metrics(truth, predicted, len(label_names))
        metrics.update({"rows": len(row_ids), "chunks": len(folded)})
    with writing(output):
        write_csv_predictions(output, row_ids, truth, predicted, probs, label_names)
    return Prediction(outputs, metrics)


def _label_names(run: FinishedRun) -> list[str]:
    """The classes of a CSV run, in its label-id order (its metrics.json records them)."""
    try:
        names = json.loads((run.path / "metrics.json").read_text())["label_names"]
    except (OSError, ValueError, KeyError, TypeError):
        raise SparseBertError(f"--predict: run {run.path} has no label_names in metrics.json") from None
    return [str(n) for n in names]


def predict_squad(run: FinishedRun, input_file: Path, outputs: list[Path]) -> Prediction:
    """A SQuAD JSON (answers optional) -> ``{id: answer}`` JSON and ``<stem>_nbest_predictions.json``; for a
    v2 run also ``<stem>_null_odds.json`` (``outputs``, in that order)."""
    output, nbest_file, *null_odds_file = outputs
    fcfg = run.finetune
    version_2 = run.kind == "squad_v2"
    examples = read_squad(input_file, answers_optional=True)
    if not examples:
        raise SparseBertError(f"--input {input_file}: no questions")
    # only the fields windowing reads: answers may be missing, and they play no part in prediction
    questions = [{k: ex[k] for k in ("id", "title", "context", "question")} for ex in examples]
    features = squad_features(questions, run.tokenizer(), train=False, max_seq_length=fcfg.max_seq_length,
                              doc_stride=fcfg.doc_stride, max_query_length=fcfg.max_query_length)
    model = run.prepare(AutoModelForQuestionAnswering.from_pretrained(run.model_dir))
    start, end = infer(model, features, default_data_collator, run.eval_batch_size, CLASSIFIER_INPUTS,
                       outputs=("start_logits", "end_logits"))
    nbest: dict[str, list[dict[str, Any]]] = {}
    predictions, null_odds = postprocess_predictions(
        examples, features, start, end, n_best_size=fcfg.n_best_size, max_answer_length=fcfg.max_answer_length,
        version_2=version_2, null_score_diff_threshold=fcfg.null_score_diff_threshold, nbest=nbest)
    # all or none: predictions without their nbest file would pass for a whole prediction
    atomic_write_all([(output, lambda path: write_predictions_json(path, predictions)),
                      (nbest_file, lambda path: atomic_write_json(path, nbest)),
                      *((path, lambda tmp: atomic_write_json(tmp, null_odds)) for path in null_odds_file)],
                     guard=writing)
    labeled = all(ex["answers"] is not None for ex in examples)
    return Prediction(outputs, squad_metrics(examples, predictions, version_2) if labeled else None)


def predict_gap(run: FinishedRun, input_file: Path, outputs: list[Path]) -> Prediction:
    """A GAP TSV (the 11 labelled columns, or the Kaggle test file's 9) -> the Kaggle submission CSV and the GAP
    scorer's system file ``<stem>_gap_system.tsv`` (``outputs``, in that order).

    A row whose pronoun, A and B do not fit one window of the run's sequence length is, by ``run.long_rows``:
    truncated around them (the default: a submission lists every ID), left out (skip), or refused (error)."""
    output, system = outputs
    fcfg = run.finetune
    # every row must be predicted (a submission lists every ID), so a bad row is an error, never skipped
    examples = read_gap(input_file, allow_unlabelled=True)
    if not examples:
        raise SparseBertError(f"--input {input_file}: no data rows")
    tokenizer = run.tokenizer()
    long = long_gap_rows(examples, tokenizer, fcfg.max_seq_length)
    if long and run.long_rows == "error":
        raise SparseBertError(f"--input {input_file}: row {long[0]} ({len(long)} row(s) in all): its pronoun, A and "
                              f"B lie too far apart for max_seq_length {fcfg.max_seq_length}; --long-rows truncate "
                              "keeps each mention with its context, --long-rows skip leaves such rows out")
    if long and run.long_rows == "skip":
        skipped = set(long)
        examples = [ex for ex in examples if ex.id not in skipped]
        log.warning("--long-rows skip: %d row(s) left out of the predictions (their mentions lie too far apart for "
                    "max_seq_length %d): %s", len(long), fcfg.max_seq_length, ", ".join(long[:5])
                    + (", ..." if len(long) > 5 else ""))
        if not examples:
            raise SparseBertError(f"--input {input_file}: --long-rows skip left no row to predict")
    elif long:
        log.info("--long-rows truncate: %d row(s) keep each mention with context, the text between left out: %s",
                 len(long), ", ".join(long[:5]) + (", ..." if len(long) > 5 else ""))
    features = gap_features(examples, tokenizer, fcfg.max_seq_length, fcfg.gap_head, long_rows="truncate")
    inputs = [c for c in MODEL_INPUTS if c != "labels"]
    model = run.prepare(load_gap_model(run.model_dir, fcfg.gap_head, str(run.config.get("model_source", ""))))
    (logits,) = infer(model, features, default_data_collator, run.eval_batch_size, inputs)
    probs = softmax(logits)
    ids = [ex.id for ex in examples]
    # all or none: a submission without its system file would pass for a whole prediction
    atomic_write_all([(output, lambda path: write_kaggle_submission(path, ids, probs)),
                      (system, lambda path: write_gap_system_file(path, ids, probs))], guard=writing)
    metrics = gap_metrics(probs, examples) if all(ex.labelled for ex in examples) else None
    return Prediction(outputs, metrics)


# each predictor writes the files output_paths lists for its task (check_output has checked them), in that order;
# a task with several writes them all or none (atomic_write_all)
PREDICTORS: dict[str, Callable[[FinishedRun, Path, list[Path]], Prediction]] = {
    "glue": predict_glue, "csv": predict_csv, "squad_v1": predict_squad, "squad_v2": predict_squad,
    "gap": predict_gap,
}
