"""GLUE tasks: task table, readers for the standard GLUE directory layout, featurization, metrics and
leaderboard submission files.

Every split is normalised to the columns ``idx`` (int), ``text_a`` (str), ``text_b`` (str or None for
single-sentence tasks) and ``label`` (int index into ``label_names``, float for STS-B, None for test files),
whether it comes from local TSV files or from the Hugging Face hub.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparsebert.config.experiment import glue_task_key
from sparsebert.data.delimited import csv_rows
from sparsebert.errors import SparseBertError

if TYPE_CHECKING:
    import datasets


@dataclass(frozen=True)
class GlueTask:
    name: str  # key in GLUE_TASKS and the hub config name
    dir_name: str  # directory under <data>/glue
    label_names: tuple[str, ...] | None  # None: regression (STS-B)
    # How labels are spelled in the TSV files (and in leaderboard files), in label-id order.
    file_labels: tuple[str, ...] | None
    eval_splits: tuple[str, ...]
    test_splits: tuple[str, ...]
    leaderboard_files: tuple[str, ...]  # one per test split
    metric_names: tuple[str, ...]
    # Header names of the text and label columns in the TSV files.
    text_a_column: str
    text_b_column: str | None
    label_column: str
    # Column names in the hub dataset (nyu-mll/glue).
    hub_text_a: str
    hub_text_b: str | None
    # (label column, text column) for files without a header row (CoLA train/dev).
    headerless: tuple[int, int] | None = None

    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        # HF convention: a regression head has one output
        return 1 if self.label_names is None else len(self.label_names)

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", *self.eval_splits)

    @staticmethod
    def metric_suffix(split: str) -> str:
        """How a run's metrics.json tells an evaluation split's metrics apart: ``_matched`` for MNLI's
        ``dev_matched`` (``accuracy_matched``), nothing for ``dev``."""
        return split.removeprefix("dev")

    @property
    def metric_keys(self) -> tuple[str, ...]:
        """The task's metrics as a run's metrics.json names them, every evaluation split's, and ``score``."""
        return (*(f"{m}{self.metric_suffix(s)}" for s in self.eval_splits for m in self.metric_names), "score")


_NLI = ("entailment", "not_entailment")
_BIN = ("0", "1")

# Label ids follow the hub dataset, so local files and the hub give the same ids.
GLUE_TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in [
        GlueTask("cola", "CoLA", ("unacceptable", "acceptable"), _BIN, ("dev",), ("test",), ("CoLA.tsv",),
                 ("matthews_corr",), "sentence", None, "label", "sentence", None, headerless=(1, 3)),
        GlueTask("sst2", "SST-2", ("negative", "positive"), _BIN, ("dev",), ("test",), ("SST-2.tsv",),
                 ("accuracy",), "sentence", None, "label", "sentence", None),
        GlueTask("mrpc", "MRPC", ("not_equivalent", "equivalent"), _BIN, ("dev",), ("test",), ("MRPC.tsv",),
                 ("f1", "accuracy"), "#1 String", "#2 String", "Quality", "sentence1", "sentence2"),
        GlueTask("qqp", "QQP", ("not_duplicate", "duplicate"), _BIN, ("dev",), ("test",), ("QQP.tsv",),
                 ("f1", "accuracy"), "question1", "question2", "is_duplicate", "question1", "question2"),
        GlueTask("stsb", "STS-B", None, None, ("dev",), ("test",), ("STS-B.tsv",),
                 ("pearson", "spearman"), "sentence1", "sentence2", "score", "sentence1", "sentence2"),
        GlueTask("mnli", "MNLI", ("entailment", "neutral", "contradiction"),
                 ("entailment", "neutral", "contradiction"), ("dev_matched", "dev_mismatched"),
                 ("test_matched", "test_mismatched"), ("MNLI-m.tsv", "MNLI-mm.tsv"),
                 ("accuracy",), "sentence1", "sentence2", "gold_label", "premise", "hypothesis"),
        GlueTask("qnli", "QNLI", _NLI, _NLI, ("dev",), ("test",), ("QNLI.tsv",),
                 ("accuracy",), "question", "sentence", "label", "question", "sentence"),
        GlueTask("rte", "RTE", _NLI, _NLI, ("dev",), ("test",), ("RTE.tsv",),
                 ("accuracy",), "sentence1", "sentence2", "label", "sentence1", "sentence2"),
        GlueTask("wnli", "WNLI", ("not_entailment", "entailment"), _BIN, ("dev",), ("test",), ("WNLI.tsv",),
                 ("accuracy",), "sentence1", "sentence2", "label", "sentence1", "sentence2"),
    ]
}

# Row-id columns, by header name; files without one (MRPC train/dev, CoLA train/dev) use the row number.
_ID_COLUMNS = ("index", "id")
# Hub split names -> local (file) split names.
_HUB_SPLITS = {"validation": "dev", "validation_matched": "dev_matched",
               "validation_mismatched": "dev_mismatched"}


def get_glue_task(task: str | GlueTask) -> GlueTask:
    """Look a task up by name; accepts spellings like ``SST-2``, ``sts_b``, ``MNLI``."""
    if isinstance(task, GlueTask):
        return task
    key = glue_task_key(task)
    if key not in GLUE_TASKS:
        raise SparseBertError(f"unknown GLUE task {task!r}: expected one of {', '.join(GLUE_TASKS)}")
    return GLUE_TASKS[key]


def glue_dir(data_dir: str | Path) -> Path:
    """The GLUE root: ``<data_dir>/glue`` when it exists, else ``data_dir`` itself."""
    data_dir = Path(data_dir)
    return data_dir / "glue" if (data_dir / "glue").is_dir() else data_dir


def glue_split_path(data_dir: str | Path, task: str | GlueTask, split: str) -> Path:
    return glue_dir(data_dir) / get_glue_task(task).dir_name / f"{split}.tsv"


def available_glue_tasks(data_dir: str | Path) -> list[str]:
    """Tasks whose train file and every eval-split file exist locally, in GLUE order."""
    return [
        name for name, t in GLUE_TASKS.items()
        if all(glue_split_path(data_dir, t, s).is_file() for s in t.splits)
    ]


def read_glue_split(data_dir: str | Path, task: str | GlueTask, split: str) -> list[dict[str, Any]]:
    """Read ``<glue>/<Task>/<split>.tsv`` into rows of idx/text_a/text_b/label (at least one)."""
    t = get_glue_task(task)
    path = glue_split_path(data_dir, t, split)
    if not path.is_file():
        raise SparseBertError(f"GLUE file not found: {path}")
    # only test files may lack labels: a train/dev file without its label column is an error
    return read_glue_file(path, t, labeled=split not in t.test_splits)


def read_glue_file(path: str | Path, task: str | GlueTask, labeled: bool) -> list[dict[str, Any]]:
    """Read one GLUE TSV of ``task`` into rows of idx/text_a/text_b/label (at least one).

    Args:
        path: a file in the layout of the task's train, dev or test files.
        labeled: whether the label column must be there; if not, a file that has it still gets its labels.

    Returns:
        One dict per data row; ``label`` is None where the file has no label column.
    """
    t = get_glue_task(task)
    path = Path(path)
    # utf-8-sig strips the BOM at the start of the MRPC files; QUOTE_NONE because texts contain bare quotes.
    # csv_rows leaves out blank lines (a trailing empty line), so the first row is the header or first data row.
    with open(path, encoding="utf-8-sig", newline="") as f:
        lines = csv_rows(path, f, delimiter="\t", quoting=csv.QUOTE_NONE)
        first_line, first = next(lines, (1, None))
        if first is None:
            raise SparseBertError(f"{path}: file is empty")
        cols, has_header = _locate_columns(t, path, first, labeled=labeled)
        rows = [] if has_header else [_parse_row(t, path, first_line, first, cols, 0)]
        for line, row in lines:
            rows.append(_parse_row(t, path, line, row, cols, len(rows)))
    if not rows:  # an empty split would only fail later, inside datasets, without naming the file
        raise SparseBertError(f"{path}: no data rows, only a header")
    return rows


def _locate_columns(t: GlueTask, path: Path, first: list[str], labeled: bool) -> tuple[dict[str, Any], bool]:
    """Column positions for text_a/text_b/label/idx (label None for a test file without labels)."""
    if t.text_a_column not in first and t.headerless is not None:
        label_col, text_col = t.headerless
        if len(first) <= max(label_col, text_col):  # the width every row must have is taken from this one
            raise SparseBertError(f"{path}: first row has {len(first)} tab-separated columns; a file without a header "
                                  f"has {t.name}'s original layout (the label in column {label_col + 1}, the text in "
                                  f"column {text_col + 1})")
        return {"a": text_col, "b": None, "label": label_col, "idx": None, "width": len(first)}, False

    def find(name: str) -> int:
        if name not in first:
            raise SparseBertError(f"{path}: line 1: header has no column {name!r} (columns: {first})")
        return first.index(name)

    idx_col = next((first.index(c) for c in _ID_COLUMNS if c in first), None)
    return {
        "a": find(t.text_a_column),
        "b": find(t.text_b_column) if t.text_b_column else None,
        "label": find(t.label_column) if labeled or t.label_column in first else None,
        "idx": idx_col,
        "width": len(first),
    }, True


def _parse_row(t: GlueTask, path: Path, line: int, row: list[str], cols: dict[str, Any], n: int) -> dict:
    where = f"{path}: line {line}"
    if len(row) != cols["width"]:
        raise SparseBertError(f"{where}: expected {cols['width']} tab-separated columns, found {len(row)}")
    text_a = row[cols["a"]]
    text_b = row[cols["b"]] if cols["b"] is not None else None
    for text in (text_a, text_b):
        if text is not None and not text.strip():
            raise SparseBertError(f"{where}: empty text")
    label: int | float | None = None
    if cols["label"] is not None:
        raw = row[cols["label"]].strip()
        if t.file_labels is None:
            try:
                label = float(raw)
            except ValueError:
                label = math.nan
            if not 0.0 <= label <= 5.0:  # also rejects nan
                raise SparseBertError(f"{where}: similarity score {raw!r} is not a number in [0, 5]")
        elif raw in t.file_labels:
            label = t.file_labels.index(raw)
        else:
            raise SparseBertError(f"{where}: unknown label {raw!r} (expected one of {list(t.file_labels)})")
    idx = n
    if cols["idx"] is not None:
        try:
            idx = int(row[cols["idx"]])
        except ValueError:
            raise SparseBertError(f"{where}: row id {row[cols['idx']]!r} is not an integer") from None
    return {"idx": idx, "text_a": text_a, "text_b": text_b, "label": label}


def _features(t: GlueTask) -> datasets.Features:
    import datasets

    return datasets.Features({
        "idx": datasets.Value("int64"),
        "text_a": datasets.Value("string"),
        "text_b": datasets.Value("string"),
        "label": datasets.Value("float32" if t.is_regression else "int64"),
    })


def glue_dataset(task: str | GlueTask, rows: list[dict[str, Any]]) -> datasets.Dataset:
    """Rows of :func:`read_glue_file` as a ``datasets.Dataset`` with the task's column types."""
    import datasets

    return datasets.Dataset.from_list(rows, features=_features(get_glue_task(task)))


def load_glue(task: str | GlueTask, data_dir: str | Path | None) -> datasets.DatasetDict:
    """Splits train + eval splits (+ test splits when present) as a DatasetDict of idx/text_a/text_b/label.

    With ``data_dir`` the local GLUE files are read; without it the hub dataset ``nyu-mll/glue`` is
    downloaded and mapped onto the same columns and split names.
    """
    import datasets

    t = get_glue_task(task)
    features = _features(t)
    if data_dir is not None:
        splits = list(t.splits) + [s for s in t.test_splits if glue_split_path(data_dir, t, s).is_file()]
        return datasets.DatasetDict({
            s: datasets.Dataset.from_list(read_glue_split(data_dir, t, s), features=features) for s in splits
        })

    hub = datasets.load_dataset("nyu-mll/glue", t.name)
    wanted = set(t.splits) | set(t.test_splits)
    out = {}
    for hub_split, ds in hub.items():
        split = _HUB_SPLITS.get(hub_split, hub_split)
        if split not in wanted:
            continue
        is_test = split in t.test_splits

        def convert(ex: dict, is_test: bool = is_test) -> dict:
            # the hub marks missing (test) labels with -1
            label = None if is_test or ex["label"] == -1 else ex["label"]
            return {"idx": ex["idx"], "text_a": ex[t.hub_text_a],
                    "text_b": ex[t.hub_text_b] if t.hub_text_b else None, "label": label}

        out[split] = ds.map(convert, remove_columns=ds.column_names, features=features)
    missing = [s for s in t.splits if s not in out]
    if missing:
        raise SparseBertError(f"hub dataset nyu-mll/glue/{t.name} lacks splits {missing}")
    return datasets.DatasetDict({s: out[s] for s in [*t.splits, *t.test_splits] if s in out})


def encode_glue_batch(batch: dict[str, list], tokenizer: Any, max_seq_length: int, labeled: bool) -> dict:
    """One batch of featurize_glue: text_a (+ text_b) -> input_ids/attention_mask/token_type_ids (+ labels)."""
    pairs = any(b is not None for b in batch["text_b"])
    enc = tokenizer(batch["text_a"], batch["text_b"] if pairs else None, truncation=True,
                    max_length=max_seq_length, return_token_type_ids=True, return_attention_mask=True)
    out = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    if labeled:
        out["labels"] = batch["label"]
    return out


def featurize_glue(dataset: datasets.Dataset | datasets.DatasetDict, tokenizer: Any, max_seq_length: int,
                   *, num_proc: int | None = None,
                   cache_dir: str | Path | None = None) -> datasets.Dataset | datasets.DatasetDict:
    """Tokenize text_a (+ text_b) into input_ids/attention_mask/token_type_ids/labels, keeping ``idx``.

    Truncates to ``max_seq_length`` but does not pad: the collator pads each batch to its longest row.
    Splits whose labels are all None (test files) get no ``labels`` column. Runs through the featurizer
    (:mod:`sparsebert.data.featurize`): parallel, cached by the split's content, tokenizer and settings.
    """
    import datasets

    from sparsebert.data.featurize import featurize

    if isinstance(dataset, datasets.DatasetDict):
        return datasets.DatasetDict({k: featurize_glue(v, tokenizer, max_seq_length, num_proc=num_proc,
                                                       cache_dir=cache_dir) for k, v in dataset.items()})

    labeled = any(label is not None for label in dataset["label"])
    return featurize(dataset, encode_glue_batch, name="glue", tokenizer=tokenizer,
                     fn_kwargs={"tokenizer": tokenizer, "max_seq_length": max_seq_length, "labeled": labeled},
                     num_proc=num_proc, remove_columns=["text_a", "text_b", "label"], cache_dir=cache_dir)
