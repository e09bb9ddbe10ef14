"""``python run.py --predict RUN --input FILE``: a finished finetuning run's model on a file given later.

Each task reads the file with the reader its runner trains with (labels optional), featurizes it the same way
(the run's own settings from its config.json) and writes the task's own output format; when the file carries
labels, the task's metrics come back too. Every check (the run, the file, its columns and rows) happens before
the model loads and before anything is written; outputs are written atomically.

``--sparse24-kernel`` runs a 2:4 run's sparse encoder Linears through our CUTLASS kernel
(:func:`sparsebert.export.to_sparse24_kernel`): the model in bf16 on an sm90 GPU, the library built once with
``python -m sparsebert.kernels.build``. A run that is not 2:4, a machine without CUDA, another GPU or a missing
library is a one-line error before the model loads.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import (
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    default_data_collator,
)

from sparsebert.config import PRETRAINING_TASKS, from_dict
from sparsebert.config.sections import FinetuneConfig
from sparsebert.data.csv_task import (
    CsvTaskConfig,
    aggregate_folded,
    fold_dataset,
    read_csv_task,
)
from sparsebert.data.gap import LONG_ROWS, gap_features, long_gap_rows, read_gap
from sparsebert.data.glue import featurize_glue, glue_dataset, read_glue_file
from sparsebert.data.squad import postprocess_predictions, read_squad
from sparsebert.data.tokenizer import load_tokenizer
from sparsebert.errors import SparseBertError
from sparsebert.io import atomic_write_json, unwritable_reason
from sparsebert.sparsity.config import SparsityConfig
from sparsebert.trainer.finetune.classification_metrics import classification_metrics
from sparsebert.trainer.finetune.common import softmax
from sparsebert.trainer.finetune.csv_task import write_csv_predictions
from sparsebert.trainer.finetune.gap import (
    MODEL_INPUTS,
    gap_metrics,
    load_gap_model,
    write_gap_system_file,
    write_kaggle_submission,
)
from sparsebert.trainer.finetune.glue import glue_metrics, write_glue_test_predictions
from sparsebert.trainer.finetune.squad import squad_features, squad_metrics, write_predictions_json

log = logging.getLogger(__name__)

EXTENSIONS = {"glue": "tsv", "csv": "csv", "squad_v1": "json", "squad_v2": "json", "gap": "csv"}


@dataclass
class FinishedRun:
    """A finished finetuning run directory and what its config.json says about it."""

    path: Path
    config: dict[str, Any]
    kind: str  # a key of PREDICTORS
    glue_task: str | None  # "rte" for a run of task glue:rte
    sparse24_kernel: bool = False  # run the sparse encoder Linears through the 2:4 kernel (prepare)
    long_rows: str = "truncate"  # GAP rows whose mentions do not fit one window (predict_gap)
    kernel_layers: list[str] | None = None  # what prepare converted

    @property
    def finetune(self) -> FinetuneConfig:
        return from_dict(FinetuneConfig, self.config.get("finetune", {}), prefix="finetune")

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    @property
    def eval_batch_size(self) -> int:
        return int(self.config.get("train", {}).get("eval_batch_size", 128))

    def tokenizer(self):
        return load_tokenizer(str(self.model_dir))  # the runner saves the tokenizer beside the model

    def prepare(self, model: nn.Module) -> nn.Module:
        """The loaded model as predictions run it: as it is, or with ``--sparse24-kernel`` in bf16 on the GPU with
        its sparse Linears converted to the 2:4 kernel (their names kept in ``kernel_layers``)."""
        if not self.sparse24_kernel:
            return model
        model = model.to(device="cuda", dtype=torch.bfloat16).eval()
        self.kernel_layers = convert_to_sparse24(self, model)
        return model


def open_run(run: str | Path, output_root: Path) -> FinishedRun:
    """The finished finetuning run ``run`` names: a run directory, or its path under ``output_root``."""
    candidates = [Path(run)] + ([output_root / run] if not Path(run).is_absolute() else [])
    path = next((p for p in candidates if p.is_dir()), None)
    if path is None:
        raise SparseBertError(f"--predict {run}: no run directory {run}" + (
            f" (nor {output_root / run})" if len(candidates) > 1 else ""))
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    if not (path / "DONE").is_file():
        raise SparseBertError(f"--predict: run {path} has not finished (no DONE marker)")
    if not isinstance(config, dict) or "task" not in config:
        raise SparseBertError(f"--predict: {path} is not a finetuning run (no config.json with a task)")
    task = str(config["task"])
    kind, _, name = task.partition(":")
    if task in PRETRAINING_TASKS:
        raise SparseBertError(f"--predict: {path} is a pretraining run, not a finetuning run")
    if "experiment" not in config:  # finish_run adds it to a run's config; an experiment's own lacks it
        raise SparseBertError(f"--predict: {path} is an experiment directory; name one of its runs "
                              "(e.g. <experiment>/glue_rte/run0, <experiment>/gap/run0)")
    if kind not in PREDICTORS:
        raise SparseBertError(f"--predict: run {path} is of task {task}, which has no predict "
                              f"(tasks with one: {', '.join(sorted(PREDICTORS))})")
    if not (path / "model" / "model.safetensors").is_file():
        raise SparseBertError(f"--predict: run {path} exported no model (finetune.save_model=false?)")
    return FinishedRun(path, config, kind, name or None)


def default_output(run: FinishedRun, input_file: Path) -> Path:
    """``<run>/predict/<input stem>.<the task's extension>``."""
    return run.path / "predict" / f"{input_file.stem}.{EXTENSIONS[run.kind]}"


def sibling(output: Path, suffix: str) -> Path:
    """A second output beside ``output``: ``<stem>_<suffix>``, e.g. dev_nbest_predictions.json."""
    return output.with_name(f"{output.stem}_{suffix}")


@dataclass
class Prediction:
    """What a predict call wrote and, for a labelled input, the task's metrics on it."""

    written: list[Path]
    metrics: dict[str, Any] | None
    kernel_layers: list[str] | None = None  # with --sparse24-kernel: the Linears the 2:4 kernel ran


KERNEL_HINT = "predict without --sparse24-kernel"


def check_two_four_run(run: FinishedRun) -> None:
    """``--sparse24-kernel`` needs a run trained with ``sparsity.pattern`` "2:4"."""
    sparsity = run.config.get("sparsity")
    if not isinstance(sparsity, dict):
        raise SparseBertError(f"--sparse24-kernel: run {run.path} is dense (no sparsity section); the kernel runs "
                              f"2:4 runs only (sparsity.pattern \"2:4\", e.g. tiny_glue_2to4); {KERNEL_HINT}")
    pattern = sparsity.get("pattern", "unstructured")
    if pattern != "2:4":
        raise SparseBertError(f"--sparse24-kernel: run {run.path} has sparsity.pattern {pattern!r}, not \"2:4\"; "
                              f"the kernel runs 2:4 runs only (e.g. tiny_glue_2to4); {KERNEL_HINT}")


def check_sparse24_device() -> None:
    """An sm90 GPU and the built kernel library, or the one-line error that says which is missing."""
    from sparsebert.export.sparse24_kernel import Library, Sparse24Error

    if not torch.cuda.is_available():
        raise SparseBertError("--sparse24-kernel needs an sm90 GPU (H100/H200); this machine has no CUDA device; "
                              + KERNEL_HINT)
    capability = torch.cuda.get_device_capability()
    if capability != (9, 0):
        raise SparseBertError(f"--sparse24-kernel needs an sm90 GPU (H100/H200); {torch.cuda.get_device_name()} "
                              f"is sm{capability[0]}{capability[1]}; {KERNEL_HINT}")
    try:
        Library.get()
    except Sparse24Error as e:  # not built, or built from another sparse24.cu
        raise SparseBertError(f"--sparse24-kernel: {' '.join(str(e).split())}") from None


def convert_to_sparse24(run: FinishedRun, model: nn.Module) -> list[str]:
    """Convert the run's sparse Linears (its ``sparsity`` selection) of ``model`` (bf16, on the GPU) to the 2:4
    kernel; every one must be 2:4 with dimensions the kernel takes. Returns the converted names."""
    from sparsebert.export import is_two_four, to_sparse24_kernel
    from sparsebert.export.sparse24_kernel import ALIGNMENT, Sparse24Error
    from sparsebert.sparsity.selection import select_parameters

    try:
        selected = select_parameters(model, from_dict(SparsityConfig, run.config["sparsity"], prefix="sparsity"))
    except ValueError as e:
        raise SparseBertError(f"--sparse24-kernel: run {run.path}: {e}") from None
    names = []
    for param_name, weight in selected.items():
        name = param_name.removesuffix(".weight")
        layer = model.get_submodule(name) if name != param_name else None
        if type(layer) is not nn.Linear:
            raise SparseBertError(f"--sparse24-kernel: {param_name} of run {run.path} is not an nn.Linear weight; "
                                  f"the kernel replaces Linears only; {KERNEL_HINT}")
        if layer.in_features % ALIGNMENT or layer.out_features % ALIGNMENT:
            raise SparseBertError(f"--sparse24-kernel: {name} of run {run.path} is {layer.out_features}x"
                                  f"{layer.in_features}; the kernel needs both multiples of {ALIGNMENT}; {KERNEL_HINT}")
        if not is_two_four(weight.detach()):
            raise SparseBertError(f"--sparse24-kernel: {name} of run {run.path} is not 2:4 (a group of four weights "
                                  f"holds more than 2 non-zeros); {KERNEL_HINT}")
        names.append(name)
    rows = (run.eval_batch_size * run.finetune.max_seq_length,)  # a full evaluation batch picks the tiles
    try:
        return to_sparse24_kernel(model, rows=rows, names=names)
    except (Sparse24Error, ValueError) as e:
        raise SparseBertError(f"--sparse24-kernel: {' '.join(str(e).split())}") from None


# what --set may change for a prediction: how the input is read and featurized, and the batch size; the rest of
# the config is how the run trained (its model, head and labels), which a prediction must keep
PREDICT_KEYS = ("csv.", "finetune.max_seq_length", "finetune.pad_to_multiple_of", "finetune.doc_stride",
                "finetune.max_query_length", "finetune.n_best_size", "finetune.max_answer_length",
                "finetune.null_score_diff_threshold", "train.eval_batch_size")


def with_overrides(config: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """The run's config.json with ``--set key=value`` items applied (each key one of ``PREDICT_KEYS``), checked
    against the experiment schema."""
    from sparsebert.config import ConfigError
    from sparsebert.config.registry import apply_override

    config = copy.deepcopy(config)
    for item in overrides:
        key = item.partition("=")[0].strip()
        if not any(key == k or (k.endswith(".") and key.startswith(k)) for k in PREDICT_KEYS):
            raise ConfigError(f"--set {key}: --predict takes only csv.*, {', '.join(PREDICT_KEYS[1:])} (the rest "
                              "is how the run trained)")
        apply_override(config, item)
    return config


def predict(run: str | Path, input_file: str | Path, output: str | Path | None = None,
            output_root: Path = Path("runs"), sparse24_kernel: bool = False, overrides: Sequence[str] = (),
            long_rows: str | None = None) -> Prediction:
    """Predict ``input_file`` with the finished finetuning run ``run``.

    Args:
        run: the run directory, or its path relative to ``output_root``.
        input_file: a file in the task's format (GLUE TSV, CSV/TSV, SQuAD JSON, GAP TSV); labels optional.
        output: the predictions file; default ``<run>/predict/<input stem>.<ext>``.
        output_root: where relative run paths are looked up.
        sparse24_kernel: run a 2:4 run's sparse Linears through our 2:4 kernel (an sm90 GPU, the built library).
        overrides: ``--set key=value`` items for how the input is read (``PREDICT_KEYS``).
        long_rows: GAP runs only: truncate (None: the default), skip or error for rows whose mentions do not fit.

    Returns:
        The files written and, when the input has labels, the metrics (and the Linears the kernel ran).
    """
    finished = open_run(run, output_root)
    finished.config = with_overrides(finished.config, overrides)
    if long_rows is not None:
        if finished.kind != "gap":
            raise SparseBertError(f"--long-rows is for GAP runs; run {finished.path} is of task "
                                  f"{finished.config['task']} (its long inputs are windowed or folded)")
        if long_rows not in LONG_ROWS:
            raise SparseBertError(f"--long-rows {long_rows}: use one of {', '.join(LONG_ROWS)}")
        finished.long_rows = long_rows
    if sparse24_kernel:
        check_two_four_run(finished)
        finished.sparse24_kernel = True
    input_file = Path(input_file)
    check_readable(input_file)
    output = check_output(Path(output) if output is not None else None, finished, input_file)
    if sparse24_kernel:
        check_sparse24_device()
    result = PREDICTORS[finished.kind](finished, input_file, output)
    result.kernel_layers = finished.kernel_layers
    return result


def check_readable(input_file: Path) -> None:
    """``--input`` names a file this process can read."""
    if not input_file.is_file():
        raise SparseBertError(f"--input {input_file}: no such file")
    try:
        with open(input_file, "rb"):
            pass
    except OSError as e:
        raise SparseBertError(f"--input {input_file}: cannot read it: {e.strerror}") from None


def check_output(output: Path | None, run: FinishedRun, input_file: Path) -> Path:
    """The predictions file, ``--output`` or the run's default, checked to be writable: a destination that cannot
    take the predictions fails before the model loads and the input is featurized, not after."""
    given = output is not None
    output = output if given else default_output(run, input_file)
    if output.is_dir():
        raise SparseBertError(f"--output {output} is a directory; name the file to write")
    if output.resolve() == input_file.resolve():
        raise SparseBertError(f"--output {output} is the input file; name another file")
    problem = unwritable_reason(output)
    if problem is not None:
        where = f"--output {output}" if given else f"the predictions file {output} (in the run's directory)"
        raise SparseBertError(f"cannot write {where}: {problem}; pass --output FILE in a writable directory")
    return output


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


CLASSIFIER_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]


def _classifier(run: FinishedRun):

    return AutoModelForSequenceClassification.from_pretrained(run.model_dir)


def _padding_collator(run: FinishedRun, tokenizer):

    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=run.finetune.pad_to_multiple_of)


def predict_glue(run: FinishedRun, input_file: Path, output: Path) -> Prediction:
    """A GLUE TSV in the task's test (or dev) layout -> the leaderboard TSV ``index<TAB>prediction``."""
    rows = read_glue_file(input_file, run.glue_task, labeled=False)
    labeled = rows[0]["label"] is not None  # the reader gives every row a label or none
    tokenizer = run.tokenizer()
    features = featurize_glue(glue_dataset(run.glue_task, rows), tokenizer, run.finetune.max_seq_length)
    (logits,) = infer(run.prepare(_classifier(run)), features, _padding_collator(run, tokenizer), run.eval_batch_size,
                      CLASSIFIER_INPUTS)
    write_glue_test_predictions(run.glue_task, [r["idx"] for r in rows], logits, output)
    metrics = glue_metrics(run.glue_task, logits, [r["label"] for r in rows]) if labeled else None
    return Prediction([output], metrics)


def predict_csv(run: FinishedRun, input_file: Path, output: Path) -> Prediction:
    """A CSV/TSV with the run's text column (label optional) -> row_id, [truth,] prediction, prob_<label>;
    texts longer than the run's sequence length are folded as in training and their chunks averaged back."""
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
    write_csv_predictions(output, row_ids, truth, predicted, probs, label_names)
    return Prediction([output], metrics)


def _label_names(run: FinishedRun) -> list[str]:
    """The classes of a CSV run, in its label-id order (its metrics.json records them)."""
    try:
        names = json.loads((run.path / "metrics.json").read_text())["label_names"]
    except (OSError, ValueError, KeyError, TypeError):
        raise SparseBertError(f"--predict: run {run.path} has no label_names in metrics.json") from None
    return [str(n) for n in names]


def predict_squad(run: FinishedRun, input_file: Path, output: Path) -> Prediction:
    """A SQuAD JSON (answers optional) -> ``{id: answer}`` JSON and ``<stem>_nbest_predictions.json``; for a
    v2 run also ``<stem>_null_odds.json``."""
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
    written = [output, sibling(output, "nbest_predictions.json")]
    write_predictions_json(output, predictions)
    atomic_write_json(written[1], nbest)
    if version_2:
        written.append(sibling(output, "null_odds.json"))
        atomic_write_json(written[2], null_odds)
    labeled = all(ex["answers"] is not None for ex in examples)
    return Prediction(written, squad_metrics(examples, predictions, version_2) if labeled else None)


def predict_gap(run: FinishedRun, input_file: Path, output: Path) -> Prediction:
    """A GAP TSV (the 11 labelled columns, or the Kaggle test file's 9) -> the Kaggle submission CSV and the GAP
    scorer's system file ``<stem>_gap_system.tsv``.

    A row whose pronoun, A and B do not fit one window of the run's sequence length is, by ``run.long_rows``:
    truncated around them (the default: a submission lists every ID), left out (skip), or refused (error)."""
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
    system = sibling(output, "gap_system.tsv")
    write_kaggle_submission(output, ids, probs)
    write_gap_system_file(system, ids, probs)
    metrics = gap_metrics(probs, examples) if all(ex.labelled for ex in examples) else None
    return Prediction([output, system], metrics)


PREDICTORS: dict[str, Callable[[FinishedRun, Path, Path], Prediction]] = {
    "glue": predict_glue, "csv": predict_csv, "squad_v1": predict_squad, "squad_v2": predict_squad,
    "gap": predict_gap,
}
