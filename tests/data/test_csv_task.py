"""CSV tasks on a renamed slice of the real SST-2 train file: reading, errors, splits, folding, outputs."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from sparsebert.data.csv_task import (
    CsvTaskConfig,
    aggregate_folded,
    build_csv_datasets,
    fold_texts,
    read_csv_task,
    stratified_split,
)
from sparsebert.errors import SparseBertError

N_ROWS = 1000


@pytest.fixture(scope="module")
def sst2_slice(data_dir) -> list[tuple[str, str]]:
    """The first N_ROWS (sentence, label) pairs of SST-2 train, read independently of the library."""
    with open(data_dir / "glue" / "SST-2" / "train.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert rows[0] == ["sentence", "label"]
    return [(s, lab) for s, lab in rows[1:N_ROWS + 1]]


def _write_csv(path: Path, header: list[str], rows: list[list[str]], delimiter: str = ",") -> Path:
    if delimiter == "\t":  # GLUE-style TSV: no quoting at all
        path.write_text("".join("\t".join(r) + "\n" for r in [header, *rows]), encoding="utf-8")
        return path
    with open(path, "w", encoding="utf-8", newline="") as f:
        csv.writer(f, delimiter=delimiter).writerows([header, *rows])
    return path


@pytest.fixture
def reviews_csv(tmp_path, sst2_slice) -> Path:
    # renamed columns and an explicit id column; labels spelled as words
    rows = [[f"r{i}", "pos" if lab == "1" else "neg", text] for i, (text, lab) in enumerate(sst2_slice)]
    return _write_csv(tmp_path / "reviews.csv", ["review_id", "sentiment", "review"], rows)


def _cfg(**kw) -> CsvTaskConfig:
    return CsvTaskConfig(**{"path": "reviews.csv", "text_column": "review", "label_column": "sentiment", **kw})


def test_read_renamed_slice(reviews_csv, sst2_slice):
    data = read_csv_task(reviews_csv, _cfg(id_column="review_id"))
    assert len(data.texts) == N_ROWS
    assert data.texts == [t for t, _ in sst2_slice]  # quoting round trip keeps texts exactly
    assert data.label_names == ["neg", "pos"]
    assert data.labels == [int(lab) for _, lab in sst2_slice]
    assert data.ids[:2] == ["r0", "r1"]
    # without an id column the id is the data row number
    assert read_csv_task(reviews_csv, _cfg()).ids[:3] == ["0", "1", "2"]


def test_tsv_by_extension(tmp_path, sst2_slice):
    rows = [[lab, text] for text, lab in sst2_slice[:50]]
    path = _write_csv(tmp_path / "s.tsv", ["y", "x"], rows, delimiter="\t")
    data = read_csv_task(path, CsvTaskConfig(path="s.tsv", text_column="x", label_column="y"))
    assert data.texts == [t for t, _ in sst2_slice[:50]] and data.label_names == ["0", "1"]


def test_labels_sorted_as_strings(tmp_path):
    path = _write_csv(tmp_path / "t.csv", ["text", "label"], [["a", "b"], ["c", "a"], ["d", "c"], ["e", "a"]])
    data = read_csv_task(path, CsvTaskConfig(path="t.csv"))
    assert data.label_names == ["a", "b", "c"] and data.labels == [1, 0, 2, 0]


@pytest.mark.parametrize("rows,cfg_kw,pattern", [
    ([["x", "1"], ["y", "0"]], {"text_column": "body"}, r"t\.csv: no column 'body' \(csv\.text_column\)"),
    ([["x", "1"], ["y", "0"]], {"id_column": "rid"}, r"no column 'rid' \(csv\.id_column\)"),
    ([["x", "1"], [" ", "0"]], {}, r"t\.csv: line 3: empty text in column 'text'"),
    ([["x", "1"], ["y", ""]], {}, r"t\.csv: line 3: missing label in column 'label'"),
    ([["x", "1"], ["y", "1"]], {}, r"t\.csv: column 'label' has only the value '1'; need at least 2 classes"),
    ([["x", "1"], ["y"]], {}, r"t\.csv: line 3: expected 2 fields, found 1"),
    # a line of delimiters only is a row with empty fields, not a blank line
    ([["x", "1"], ["", ""], ["y", "0"]], {}, r"t\.csv: line 3: empty text in column 'text'"),
])
def test_bad_input_errors(tmp_path, rows, cfg_kw, pattern):
    path = _write_csv(tmp_path / "t.csv", ["text", "label"], rows)
    with pytest.raises(SparseBertError, match=pattern) as err:
        read_csv_task(path, CsvTaskConfig(path="t.csv", **cfg_kw))
    assert "\n" not in str(err.value)


def test_duplicate_ids_and_missing_file(tmp_path):
    path = _write_csv(tmp_path / "t.csv", ["id", "text", "label"], [["a", "x", "1"], ["a", "y", "0"]])
    with pytest.raises(SparseBertError, match=r"line 3: duplicate id 'a'"):
        read_csv_task(path, CsvTaskConfig(path="t.csv", id_column="id"))
    with pytest.raises(SparseBertError, match="CSV file not found"):
        read_csv_task(tmp_path / "nope.csv", CsvTaskConfig(path="nope.csv"))


def test_non_utf8_csv_names_file_and_line(tmp_path, sst2_slice):
    # 300 real rows (more than one decoded block) and then a Latin-1 "é" on line 302
    path = _write_csv(tmp_path / "t.csv", ["text", "label"], [[t, lab] for t, lab in sst2_slice[:300]])
    path.write_bytes(path.read_bytes() + "caf\u00e9 au lait,1\n".encode("latin-1"))
    assert path.stat().st_size > 8192
    with pytest.raises(SparseBertError, match=r"t\.csv: line 302: not UTF-8 text \(byte 0xe9") as err:
        read_csv_task(path, CsvTaskConfig(path="t.csv"))
    assert "\n" not in str(err.value)


def test_unterminated_quote_names_file_and_line(tmp_path):
    """A quote that is never closed would swallow the rest of the file (here more than csv's default field limit)
    into one field: strict reading makes it an error at the line where the record starts, with what to set."""
    rows = "".join(f"review number {i} of many,{i % 2}\n" for i in range(6000))
    assert len(rows) > 1 << 17
    path = tmp_path / "t.csv"
    path.write_text('text,label\nfine,1\n"no closing quote,0\n' + rows, encoding="utf-8")
    with pytest.raises(SparseBertError, match=r"t\.csv: line 3: unexpected end of data .*csv\.quoting: none") as err:
        read_csv_task(path, CsvTaskConfig(path="t.csv"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["long.csv", "long.tsv"])
def test_text_longer_than_csv_field_limit(tmp_path, sst2_slice, name):
    """A text past csv's default field limit (131,072 characters) is read whole: the CSV task folds long texts."""
    sentences = [t for t, _ in sst2_slice]
    long_text = ""
    while len(long_text) < 200_000:
        long_text += " ".join(sentences)
    long_text = long_text[:200_000]
    rows = [[long_text, "1"], *([t, lab] for t, lab in sst2_slice[:20])]
    path = _write_csv(tmp_path / name, ["text", "label"], rows, delimiter="\t" if name.endswith(".tsv") else ",")
    data = read_csv_task(path, CsvTaskConfig(path=name))
    assert len(data.texts[0]) == 200_000 and data.texts == [r[0] for r in rows]


def _quoted_rows(sst2_slice) -> list[list[str]]:
    """Real rows plus the texts a writer must quote: quotes, a leading quote, a line break, a tab, a comma."""
    return [[t, lab] for t, lab in sst2_slice[:30]] + [
        ['He said "hi" to me', "1"],
        ['" The foodservice pie business does not fit our long-term growth strategy .', "0"],
        ["a first line\nand a second, after a line break", "1"],
        ["a windows line\r\nbreak and a\ttab", "0"],
    ]


@pytest.mark.parametrize("writer", ["csv.writer", "pandas"])
def test_quoted_tsv_reads_back_to_the_original_texts(tmp_path, sst2_slice, writer):
    """A .tsv from csv.writer(delimiter="\\t") or pandas' to_csv(sep="\\t") quotes fields as a .csv does."""
    rows = _quoted_rows(sst2_slice)
    path = tmp_path / "q.tsv"
    if writer == "pandas":
        import pandas as pd  # a dependency (--table)
        pd.DataFrame(rows, columns=["text", "label"]).to_csv(path, sep="\t", index=False)
    else:
        with open(path, "w", encoding="utf-8", newline="") as f:
            csv.writer(f, delimiter="\t").writerows([["text", "label"], *rows])
    assert '"He said ""hi"" to me"' in path.read_text(encoding="utf-8")
    data = read_csv_task(path, CsvTaskConfig(path="q.tsv"))
    assert data.texts == [t for t, _ in rows]
    assert data.labels == [int(lab) for _, lab in rows]


def test_quoting_none_reads_quotes_as_text(tmp_path, sst2_slice):
    """A hand-joined TSV whose text starts with a bare quote (as in GLUE's MRPC): standard quoting refuses it and
    names the setting; csv.quoting: none reads it as written."""
    rows = [[t, lab] for t, lab in sst2_slice[:30]] + [['" I have nothing to hide , " he said .', "1"],
                                                        ['" The foodservice pie business does not fit .', "0"]]
    path = _write_csv(tmp_path / "bare.tsv", ["text", "label"], rows, delimiter="\t")
    with pytest.raises(SparseBertError, match=r"bare\.tsv: line 32: '\\t' expected after '\"' .*csv\.quoting: none"
                       ) as err:
        read_csv_task(path, CsvTaskConfig(path="bare.tsv"))
    assert "\t" not in str(err.value)  # csv's raw tab is shown as \t
    path.write_text(path.read_text(encoding="utf-8").replace(rows[30][0], "He said so .", 1), encoding="utf-8")
    with pytest.raises(SparseBertError, match=r"bare\.tsv: line 33: unexpected end of data .*csv\.quoting: none"):
        read_csv_task(path, CsvTaskConfig(path="bare.tsv"))
    data = read_csv_task(path, CsvTaskConfig(path="bare.tsv", quoting="none"))
    assert data.texts == [t for t, _ in rows[:30]] + ["He said so .", rows[31][0]]


@pytest.mark.parametrize("line_end", ["\n", "\r\n"])
def test_blank_lines_are_skipped(tmp_path, sst2_slice, line_end):
    rows = [[t, lab] for t, lab in sst2_slice[:10]]
    lines = ["text\tlabel", *("\t".join(r) for r in rows)]
    path = tmp_path / "b.tsv"
    path.write_bytes((line_end.join(lines[:4] + ["", "  "] + lines[4:]) + line_end * 2).encode("utf-8"))
    assert read_csv_task(path, CsvTaskConfig(path="b.tsv")).texts == [t for t, _ in rows]


@pytest.mark.parametrize("kw,key", [
    ({"path": ""}, "csv.path must be set"),
    ({"text_column": ""}, "csv.text_column must be set"),
    ({"label_column": ""}, "csv.label_column must be set"),
    ({"val_fraction": 1.2}, "csv.val_fraction"),
    ({"test_fraction": -0.1}, "csv.test_fraction"),
    ({"test_fraction": 0.0}, "csv.test_fraction"),  # the metrics are measured on the test rows
    ({"val_fraction": 0.5, "test_fraction": 0.5}, "csv.val_fraction \\+ csv.test_fraction"),
    ({"fold_stride": -1}, "csv.fold_stride"),
    ({"delimiter": "::"}, "csv.delimiter"),
    ({"quoting": "QUOTE_NONE"}, "csv.quoting must be one of standard, none"),
])
def test_config_validate(kw, key):
    CsvTaskConfig(path="x.csv").validate()
    with pytest.raises(ValueError, match=key):
        CsvTaskConfig(**{"path": "x.csv", **kw}).validate()


def test_config_paths(tmp_path):
    cfg = CsvTaskConfig(path="sub/a.TSV")
    assert cfg.resolve_path(tmp_path) == tmp_path / "sub" / "a.TSV"
    assert cfg.resolve_delimiter(cfg.resolve_path(tmp_path)) == "\t"
    assert CsvTaskConfig(path=str(tmp_path / "b.csv")).resolve_path("/elsewhere") == tmp_path / "b.csv"
    assert CsvTaskConfig(path="b.txt", delimiter=";").resolve_delimiter("b.txt") == ";"


def test_stratified_split(reviews_csv):
    labels = read_csv_task(reviews_csv, _cfg()).labels
    train, val, test = stratified_split(labels, 0.1, 0.2, seed=13)
    assert sorted([*train, *val, *test]) == list(range(N_ROWS))  # disjoint and complete
    assert (len(val), len(test)) == (100, 200)
    counts = Counter(labels)
    for part, frac in ((val, 0.1), (test, 0.2), (train, 0.7)):
        part_counts = Counter(labels[i] for i in part)
        for cls, n in counts.items():
            assert abs(part_counts[cls] - frac * n) <= 1  # each class keeps its share
    again = stratified_split(labels, 0.1, 0.2, seed=13)
    assert all(np.array_equal(a, b) for a, b in zip((train, val, test), again))
    other = stratified_split(labels, 0.1, 0.2, seed=14)
    assert not np.array_equal(other[1], val)
    empty = stratified_split(labels, 0.0, 0.0, seed=0)
    assert len(empty[0]) == N_ROWS and len(empty[1]) == len(empty[2]) == 0


def test_stratified_split_keeps_every_class_in_train():
    labels = [0, 0] + [1] * 8
    for seed in range(20):
        train, val, test = stratified_split(labels, 0.3, 0.3, seed)
        assert sorted([*train, *val, *test]) == list(range(10))
        assert {labels[i] for i in train} == {0, 1}  # both class-0 rows used to go to val and test
        # class 1 gives round(2.4) rows to each; class 0 one to test (served first), none to val
        assert (len(val), len(test)) == (2, 3) and {labels[i] for i in val} == {1}
        again = stratified_split(labels, 0.3, 0.3, seed)
        assert all(np.array_equal(a, b) for a, b in zip((train, val, test), again))
        # a one-row class stays in train even when its rounded test share is the whole class
        train, val, test = stratified_split([0, 1, 1, 1, 1], 0.0, 0.6, seed)
        assert 0 in train and len(test) == 2


def test_fold_round_trip(tokenizer, sst2_slice):
    texts = [t for t, _ in sst2_slice[:200]]
    labels = [int(lab) for _, lab in sst2_slice[:200]]
    row_ids = [f"r{i}" for i in range(200)]
    tokens = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert max(len(t) for t in tokens) > 3 * 14  # some texts need several chunks
    for stride in (0, 4):
        out = fold_texts(texts, labels, row_ids, tokenizer, max_seq_length=16, stride=stride)
        assert len(out["input_ids"]) > 200
        for key in ("attention_mask", "token_type_ids", "labels", "row_id"):
            assert len(out[key]) == len(out["input_ids"])
        by_row: dict[str, list[list[int]]] = {}
        for ids, mask, types, label, rid in zip(out["input_ids"], out["attention_mask"],
                                                out["token_type_ids"], out["labels"], out["row_id"]):
            assert len(ids) <= 16 and ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
            assert mask == [1] * len(ids) and types == [0] * len(ids)
            assert label == labels[row_ids.index(rid)]
            by_row.setdefault(rid, []).append(ids[1:-1])
        assert list(by_row) == row_ids  # chunks of a row are consecutive and rows keep their order
        for rid, tok in zip(row_ids, tokens):
            chunks = by_row[rid]
            assert len(chunks) == max(1, -(-(len(tok) - stride) // (14 - stride)))
            # drop each later chunk's overlap with its predecessor: the text's tokens come back in order
            rebuilt = chunks[0] + [t for c in chunks[1:] for t in c[stride:]]
            assert rebuilt == tok
            for prev, cur in zip(chunks, chunks[1:]):
                assert prev[len(prev) - stride:] == cur[:stride]
        # aggregating per-chunk probabilities returns exactly the original rows
        probs = np.full((len(out["row_id"]), 2), 0.5)
        unique, mean = aggregate_folded(out["row_id"], probs)
        assert unique == row_ids and mean.shape == (200, 2)
    with pytest.raises(ValueError, match="stride"):
        fold_texts(texts, labels, row_ids, tokenizer, max_seq_length=16, stride=14)


def test_aggregate_math():
    row_ids = [7, 3, 7, 9, 3, 7]
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.5, 0.5], [0.4, 0.6], [0.3, 0.7]])
    unique, mean = aggregate_folded(row_ids, probs)
    assert unique == [7, 3, 9]  # order of first appearance
    np.testing.assert_allclose(mean, [[0.6, 0.4], [0.3, 0.7], [0.5, 0.5]])
    with pytest.raises(ValueError):
        aggregate_folded([1, 2], probs)


def test_build_csv_datasets(tmp_path, reviews_csv, tokenizer):
    cfg = _cfg(id_column="review_id", fold_stride=2)
    ds, data = build_csv_datasets(cfg, tmp_path, tokenizer, max_seq_length=16, seed=1)
    assert list(ds) == ["train", "dev", "test"]
    rows = {split: set(ds[split]["row_id"]) for split in ds}
    assert sum(len(r) for r in rows.values()) == N_ROWS and not rows["dev"] & rows["test"]
    assert len(rows["dev"]) == len(rows["test"]) == 100
    assert max(len(x) for x in ds["train"]["input_ids"]) == 16
    label_of = dict(zip(data.ids, data.labels))
    assert all(label_of[r] == y for r, y in zip(ds["dev"]["row_id"], ds["dev"]["labels"]))


def test_zero_val_fraction_means_no_dev_split(tmp_path, reviews_csv, tokenizer):
    ds, _ = build_csv_datasets(_cfg(val_fraction=0.0), tmp_path, tokenizer, max_seq_length=16, seed=1,
                               cache_dir=tmp_path / "cache")
    assert list(ds) == ["train", "test"]
    assert len(set(ds["train"]["row_id"])) + len(set(ds["test"]["row_id"])) == N_ROWS
    assert len(set(ds["test"]["row_id"])) == 100


def test_required_split_that_comes_out_empty_is_an_error(tmp_path, sst2_slice, tokenizer):
    # two rows per class: test takes one of each (round(0.8)), val would take round(0.2) = 0
    neg, pos = ([[t, lab] for t, lab in sst2_slice if lab == want][:2] for want in ("0", "1"))
    _write_csv(tmp_path / "tiny.csv", ["text", "label"], neg + pos)
    cfg = CsvTaskConfig(path="tiny.csv", val_fraction=0.1, test_fraction=0.4)
    pattern = r"tiny\.csv: csv\.val_fraction=0\.1 leaves the dev split empty"
    with pytest.raises(SparseBertError, match=pattern) as err:
        build_csv_datasets(cfg, tmp_path, tokenizer, max_seq_length=16, seed=0, cache_dir=tmp_path / "cache")
    assert "\n" not in str(err.value)
