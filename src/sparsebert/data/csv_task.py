"""Text classification from any CSV/TSV file with a text column and a label column.

Texts longer than the model's sequence length are *folded*: split into consecutive token chunks that all
carry the row's label; at evaluation the chunk probabilities are averaged back per row.
"""

from __future__ import annotations

import csv
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sparsebert.config.sections import CsvTaskConfig
from sparsebert.data.delimited import csv_rows
from sparsebert.errors import SparseBertError

if TYPE_CHECKING:
    import datasets


@dataclass
class CsvData:
    ids: list[str]  # the id column's values, or the 0-based data row number as a string
    texts: list[str]
    labels: list[int] | None  # index into label_names; None: a file to predict that has no label column
    label_names: list[str]  # distinct label strings, sorted


def read_csv_task(path: str | Path, cfg: CsvTaskConfig, label_names: Sequence[str] | None = None) -> CsvData:
    """Read a CSV/TSV; labels become ids in the sorted order of the distinct label strings.

    Args:
        path: the CSV/TSV file.
        cfg: the experiment's ``csv`` section (columns, delimiter, quoting).
        label_names: a trained model's classes: the file is one to predict, its label column is optional and
            its labels must be among these (their ids are the model's).
    """
    path = Path(path)
    if not path.is_file():
        raise SparseBertError(f"CSV file not found: {path}" + ("" if label_names is not None else " (csv.path)"))
    ids: list[str] = []
    texts: list[str] = []
    raw_labels: list[str] = []
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = csv_rows(path, f, **_reader_format(cfg, path))
        header = [h.strip() for h in next(rows, (1, []))[1]]
        if not header:
            raise SparseBertError(f"{path}: file is empty")
        labeled = label_names is None or cfg.label_column in header  # a file to predict may lack labels
        wanted = {"csv.text_column": cfg.text_column}
        if labeled:
            wanted["csv.label_column"] = cfg.label_column
        if cfg.id_column:
            wanted["csv.id_column"] = cfg.id_column
        for key, name in wanted.items():
            if name not in header:
                raise SparseBertError(f"{path}: no column {name!r} ({key}); columns are {header}")
        text_col = header.index(cfg.text_column)
        label_col = header.index(cfg.label_column) if labeled else None
        id_col = header.index(cfg.id_column) if cfg.id_column else None
        seen_ids: set[str] = set()
        for line, row in rows:  # blank lines are already left out
            where = f"{path}: line {line}"
            if len(row) != len(header):
                raise SparseBertError(f"{where}: expected {len(header)} fields, found {len(row)}")
            text = row[text_col]
            label = row[label_col].strip() if label_col is not None else ""
            if not text.strip():
                raise SparseBertError(f"{where}: empty text in column {cfg.text_column!r}")
            if label_col is not None and not label:
                raise SparseBertError(f"{where}: missing label in column {cfg.label_column!r}")
            if label and label_names is not None and label not in label_names:
                raise SparseBertError(f"{where}: label {label!r} is not one the model knows "
                                      f"({', '.join(label_names)})")
            row_id = row[id_col].strip() if id_col is not None else str(len(ids))
            if id_col is not None:
                # ids key the folded-chunk aggregation and the predictions file, so they must be unique
                if not row_id or row_id in seen_ids:
                    raise SparseBertError(f"{where}: {'duplicate' if row_id else 'empty'} id {row_id!r} "
                                          f"in column {cfg.id_column!r}")
                seen_ids.add(row_id)
            ids.append(row_id)
            texts.append(text)
            raw_labels.append(label)
    if label_names is not None:
        to_known = {name: i for i, name in enumerate(label_names)}
        if not ids:
            raise SparseBertError(f"{path}: no data rows")
        return CsvData(ids, texts, [to_known[label] for label in raw_labels] if labeled else None, list(label_names))
    label_names = sorted(set(raw_labels))
    if len(label_names) < 2:
        found = f"only the value {label_names[0]!r}" if label_names else "no rows"
        raise SparseBertError(f"{path}: column {cfg.label_column!r} has {found}; need at least 2 classes")
    to_id = {name: i for i, name in enumerate(label_names)}
    return CsvData(ids, texts, [to_id[label] for label in raw_labels], label_names)


def _reader_format(cfg: CsvTaskConfig, path: Path) -> dict[str, Any]:
    """csv_rows' settings for the file: its delimiter, and quoting by ``csv.quoting`` whatever the delimiter (a
    .tsv from csv.writer or pandas quotes fields as a .csv does)."""
    if cfg.quoting == "none":
        return {"delimiter": cfg.resolve_delimiter(path), "quoting": csv.QUOTE_NONE}
    # strict: an unclosed quote is an error instead of a field that swallows the rest of the file, and so is text
    # after a closing quote (a hand-joined text that starts with a quote), instead of quietly losing that quote
    hint = (" (a field that starts with a double quote is quoted up to the next one; csv.quoting: none reads "
            "quotes as text)")
    return {"delimiter": cfg.resolve_delimiter(path), "quoting": csv.QUOTE_MINIMAL, "strict": True, "hint": hint}


def stratified_split(labels: Sequence[int], val_fraction: float, test_fraction: float,
                     seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded per-class split into (train, val, test) row indices, each sorted.

    Each class contributes round(fraction * class size) rows to val and test, so every split keeps the class
    ratios, but always keeps at least one row in train (val gives way first, then test): the model sees every
    class, and a one-row class stays in train.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[], [], []]
    for cls in np.unique(labels):  # sorted, so the rng draws happen in a fixed order
        members = rng.permutation(np.flatnonzero(labels == cls))
        n_test = min(round(test_fraction * len(members)), len(members) - 1)
        n_val = min(round(val_fraction * len(members)), len(members) - 1 - n_test)
        parts[2].append(members[:n_test])
        parts[1].append(members[n_test:n_test + n_val])
        parts[0].append(members[n_test + n_val:])
    train, val, test = (np.sort(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, np.int64)
                        for p in parts)
    return train, val, test


def fold_texts(texts: Sequence[str], labels: Sequence[int], row_ids: Sequence[Any], tokenizer: Any,
               max_seq_length: int, stride: int = 0) -> dict[str, list]:
    """Tokenize texts into rows of at most ``max_seq_length`` tokens, splitting long texts into chunks.

    Each chunk is ``[CLS] tokens [SEP]``; consecutive chunks of a text overlap by ``stride`` tokens. Every
    chunk carries its text's label and ``row_id``. Returns input_ids/attention_mask/token_type_ids/labels/row_id.
    """
    body = max_seq_length - 2  # room left after [CLS] and [SEP]
    if body < 1:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for tokens")
    if not 0 <= stride < body:
        raise ValueError(f"fold stride {stride} must be in [0, {body}) for max_seq_length {max_seq_length}")
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls is None or sep is None:
        raise ValueError("folding needs a tokenizer with [CLS] and [SEP] tokens")
    if not len(texts) == len(labels) == len(row_ids):
        raise ValueError(f"{len(texts)} texts, {len(labels)} labels and {len(row_ids)} row ids")
    # verbose=False: long texts are expected here, the length warning would be noise
    tokens = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"] if texts else []
    out: dict[str, list] = {k: [] for k in ("input_ids", "attention_mask", "token_type_ids", "labels", "row_id")}
    for ids, label, row_id in zip(tokens, labels, row_ids):
        start = 0
        while True:
            chunk = [cls, *ids[start:start + body], sep]
            out["input_ids"].append(chunk)
            out["attention_mask"].append([1] * len(chunk))
            out["token_type_ids"].append([0] * len(chunk))
            out["labels"].append(label)
            out["row_id"].append(row_id)
            if start + body >= len(ids):
                break
            start += body - stride
    return out


def aggregate_folded(row_ids: Sequence[Hashable], probs: Any) -> tuple[list, np.ndarray]:
    """Average chunk probabilities per original row; rows come out in order of first appearance."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[0] != len(row_ids):
        raise ValueError(f"probs of shape {probs.shape} for {len(row_ids)} chunks")
    position: dict[Hashable, int] = {}
    which = np.array([position.setdefault(r, len(position)) for r in row_ids], dtype=np.int64)
    sums = np.zeros((len(position), probs.shape[1]))
    np.add.at(sums, which, probs)
    counts = np.bincount(which, minlength=len(position))
    return list(position), sums / counts[:, None]


def fold_batch(batch: dict[str, list], tokenizer: Any, max_seq_length: int, stride: int) -> dict[str, list]:
    """:func:`fold_texts` on one batch of ``text``/``label``/``id`` rows (the featurizer's function)."""
    return fold_texts(batch["text"], batch["label"], batch["id"], tokenizer, max_seq_length, stride)


def build_csv_datasets(cfg: CsvTaskConfig, data_dir: str | Path, tokenizer: Any, max_seq_length: int,
                       seed: int, *, num_proc: int | None = None,
                       cache_dir: str | Path | None = None) -> tuple[datasets.DatasetDict, CsvData]:
    """Read, split (train/dev/test) and fold a CSV task; ``row_id`` holds the CsvData id of each chunk.

    A split whose fraction is 0 is left out (``val_fraction=0``: no dev split); one asked for that comes out
    empty (too few rows per class) is an error. Folding runs through the featurizer: parallel, cached by each
    split's content, the tokenizer and settings.
    """
    import datasets

    cfg.validate()
    path = cfg.resolve_path(data_dir)
    data = read_csv_task(path, cfg)
    fold_texts([], [], [], tokenizer, max_seq_length, cfg.fold_stride)  # bad settings fail here, not in a worker
    splits = {}
    for name, key, idx in zip(("train", "dev", "test"), (None, "val_fraction", "test_fraction"),
                              stratified_split(data.labels, cfg.val_fraction, cfg.test_fraction, seed)):
        # train always has rows: stratified_split keeps one of every class there
        if key is not None and getattr(cfg, key) == 0:
            continue
        if len(idx) == 0:
            raise SparseBertError(
                f"{path}: csv.{key}={getattr(cfg, key)} leaves the {name} split empty ({len(data.labels)} rows in "
                f"{len(data.label_names)} classes, each giving round({key} x its rows) and keeping one for "
                f"train); raise csv.{key}, add rows, or set it to 0 for no {name} split")
        splits[name] = fold_dataset([data.texts[i] for i in idx], [data.labels[i] for i in idx],
                                    [data.ids[i] for i in idx], tokenizer, max_seq_length, cfg.fold_stride,
                                    num_proc=num_proc, cache_dir=cache_dir)
    return datasets.DatasetDict(splits), data


def fold_dataset(texts: Sequence[str], labels: Sequence[int], ids: Sequence[str], tokenizer: Any,
                 max_seq_length: int, stride: int, *, num_proc: int | None = None,
                 cache_dir: str | Path | None = None) -> datasets.Dataset:
    """:func:`fold_texts` of these rows as a ``datasets.Dataset`` (input_ids, attention_mask, token_type_ids,
    labels, row_id), through the featurizer: parallel, cached by the rows' content, the tokenizer and settings."""
    import datasets

    from sparsebert.data.featurize import featurize

    features = datasets.Features({
        "input_ids": datasets.Sequence(datasets.Value("int64")),
        "attention_mask": datasets.Sequence(datasets.Value("int64")),
        "token_type_ids": datasets.Sequence(datasets.Value("int64")),
        "labels": datasets.Value("int64"),
        "row_id": datasets.Value("string"),
    })
    rows = datasets.Dataset.from_dict(
        {"text": list(texts), "label": list(labels), "id": list(ids)},
        features=datasets.Features({"text": datasets.Value("string"), "label": datasets.Value("int64"),
                                    "id": datasets.Value("string")}))
    return featurize(rows, fold_batch, name="csv-fold", tokenizer=tokenizer,
                     fn_kwargs={"tokenizer": tokenizer, "max_seq_length": max_seq_length, "stride": stride},
                     num_proc=num_proc, remove_columns=["text", "label", "id"], features=features,
                     cache_dir=cache_dir)
