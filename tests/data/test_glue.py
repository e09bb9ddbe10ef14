"""GLUE readers on the real files and the checked-in slices, malformed-input errors, featurization, metrics and
leaderboard files."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparsebert.data.glue import (
    GLUE_TASKS,
    available_glue_tasks,
    featurize_glue,
    get_glue_task,
    load_glue,
    read_glue_split,
)
from sparsebert.errors import SparseBertError

COUNTS = [
    ("cola", "train", 8551), ("cola", "dev", 1043),
    ("sst2", "train", 67349), ("sst2", "dev", 872),
    ("mrpc", "train", 3668), ("mrpc", "dev", 408),
    ("stsb", "train", 5749), ("stsb", "dev", 1500),
    ("qnli", "dev", 5463),
    ("rte", "train", 2490), ("rte", "dev", 277),
    ("wnli", "train", 635), ("wnli", "dev", 71),
]


@pytest.mark.parametrize("task,split,count", COUNTS)
def test_real_row_counts(data_dir, task, split, count):
    rows = read_glue_split(data_dir, task, split)
    assert len(rows) == count
    t = GLUE_TASKS[task]
    for r in rows:
        assert r["text_a"].strip()
        assert (r["text_b"] is None) == (t.text_b_column is None)
        if t.is_regression:
            assert 0.0 <= r["label"] <= 5.0
        else:
            assert r["label"] in range(t.num_labels)
    # every class occurs (a shifted column would collapse the labels)
    if not t.is_regression:
        assert {r["label"] for r in rows} == set(range(t.num_labels))


def test_cola_headerless_rows(data_dir):
    rows = read_glue_split(data_dir, "cola", "train")
    assert rows[0] == {"idx": 0, "text_a": "Our friends won't buy this analysis, let alone the next one we propose.",
                       "text_b": None, "label": 1}
    # file line 19: gj04 0 * They drank the pub.
    assert rows[18]["text_a"] == "They drank the pub." and rows[18]["label"] == 0
    assert rows[-1]["text_a"] == "What all did you get for Christmas?" and rows[-1]["label"] == 1
    dev = read_glue_split(data_dir, "cola", "dev")
    bad = [r["text_a"] for r in dev if r["label"] == 0]
    assert bad[:2] == ["As you eat the most, you want the least.", "The more you would want, the less you would eat."]


def test_sst2_dev_rows(data_dir):
    rows = read_glue_split(data_dir, "sst2", "dev")
    assert rows[0]["text_a"] == "it 's a charming and often affecting journey . " and rows[0]["label"] == 1
    assert rows[1]["text_a"] == "unflinchingly bleak and desperate " and rows[1]["label"] == 0
    assert rows[-1]["text_a"].endswith("could not be improved upon . ' ")
    assert sum(r["label"] for r in rows) == 444  # positives in the file


def test_mrpc_bom_and_bare_quotes(data_dir):
    path = data_dir / "glue" / "MRPC" / "train.tsv"
    assert path.read_bytes()[:3] == b"\xef\xbb\xbf"  # the fixture really has a BOM
    rows = read_glue_split(data_dir, "mrpc", "train")
    assert rows[0]["text_a"].startswith("Amrozi accused his brother , whom he called \" the witness \"")
    assert rows[0]["text_b"].startswith("Referring to him as only")
    assert rows[0]["label"] == 1
    assert rows[1]["text_a"].startswith("Yucaipa owned Dominick 's") and rows[1]["label"] == 0
    dev = read_glue_split(data_dir, "mrpc", "dev")
    # a field that starts with a bare quote must not swallow the following fields
    assert dev[0]["text_b"] == '" The foodservice pie business does not fit our long-term growth strategy .'


def test_stsb_nli_rows(data_dir):
    stsb = read_glue_split(data_dir, "stsb", "dev")
    assert stsb[0] == {"idx": 0, "text_a": "A man with a hard hat is dancing.",
                       "text_b": "A man wearing a hard hat is dancing.", "label": 5.0}
    assert stsb[1]["label"] == pytest.approx(4.75)
    assert stsb[98]["idx"] == 98 and stsb[98]["text_b"] == "A man is slicing a tomato." and stsb[98]["label"] == 0.0
    rte = read_glue_split(data_dir, "rte", "dev")
    assert rte[0]["text_b"] == "Christopher Reeve had an accident."
    assert GLUE_TASKS["rte"].label_names[rte[0]["label"]] == "not_entailment"
    qnli = read_glue_split(data_dir, "qnli", "dev")
    assert qnli[0]["text_a"] == "What came into force after the new constitution was herald?"
    assert [q["label"] for q in qnli[:2]] == [0, 1]  # entailment, not_entailment
    assert qnli[-1]["idx"] == 5462
    wnli = read_glue_split(data_dir, "wnli", "dev")
    assert [w["label"] for w in wnli[:2]] == [0, 1]
    assert GLUE_TASKS["wnli"].label_names[1] == "entailment"


def test_available_tasks_real(data_dir):
    assert available_glue_tasks(data_dir) == ["cola", "sst2", "mrpc", "stsb", "rte", "wnli"]
    # the glue directory itself works too
    assert available_glue_tasks(data_dir / "glue") == ["cola", "sst2", "mrpc", "stsb", "rte", "wnli"]


def test_asset_rows(asset_data_dir):
    """The checked-in slices (the header and first 20 rows of RTE and STS-B) read like the real files."""
    for task, split in [("rte", "train"), ("rte", "dev"), ("stsb", "train"), ("stsb", "dev")]:
        rows = read_glue_split(asset_data_dir, task, split)
        assert [r["idx"] for r in rows] == list(range(20))
        assert all(r["text_a"].strip() and r["text_b"].strip() for r in rows)
    stsb = read_glue_split(asset_data_dir, "stsb", "dev")
    assert stsb[0] == {"idx": 0, "text_a": "A man with a hard hat is dancing.",
                       "text_b": "A man wearing a hard hat is dancing.", "label": 5.0}
    assert stsb[1]["label"] == pytest.approx(4.75)
    assert all(0.0 <= r["label"] <= 5.0 for r in stsb)
    rte = read_glue_split(asset_data_dir, "rte", "train")
    assert rte[0]["text_a"] == "No Weapons of Mass Destruction Found in Iraq Yet."
    assert rte[0]["text_b"] == "Weapons of Mass Destruction Found in Iraq."
    assert GLUE_TASKS["rte"].label_names[rte[0]["label"]] == "not_entailment"
    assert {r["label"] for r in rte} == {0, 1}  # a shifted column would collapse the labels
    dev = read_glue_split(asset_data_dir, "rte", "dev")
    assert dev[0]["text_b"] == "Christopher Reeve had an accident."
    assert GLUE_TASKS["rte"].label_names[dev[0]["label"]] == "not_entailment"
    assert available_glue_tasks(asset_data_dir) == ["stsb", "rte"]


def test_load_glue_asset_stsb(asset_data_dir):
    ds = load_glue("stsb", asset_data_dir)
    assert list(ds) == ["train", "dev"] and (ds.num_rows["train"], ds.num_rows["dev"]) == (20, 20)
    assert ds["dev"].features["label"].dtype == "float32"
    assert ds["dev"][1]["label"] == pytest.approx(4.75)


def test_task_table():
    assert get_glue_task("SST-2") is GLUE_TASKS["sst2"] and get_glue_task("STS-B").name == "stsb"
    assert GLUE_TASKS["stsb"].num_labels == 1 and GLUE_TASKS["stsb"].is_regression
    assert GLUE_TASKS["mnli"].num_labels == 3
    assert GLUE_TASKS["mnli"].eval_splits == ("dev_matched", "dev_mismatched")
    assert {t.dir_name for t in GLUE_TASKS.values()} == {
        "CoLA", "SST-2", "MRPC", "QQP", "STS-B", "MNLI", "QNLI", "RTE", "WNLI"}
    with pytest.raises(SparseBertError, match="unknown GLUE task"):
        get_glue_task("squad")


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


RTE_HEADER = "index\tsentence1\tsentence2\tlabel"


@pytest.mark.parametrize("bad_line,problem", [
    ("1\tonly two columns", "columns"),
    ("1\tA premise.\tA hypothesis.\tmaybe", "'maybe'"),
    ("1\t  \tA hypothesis.\tentailment", "empty"),
    ("x\tA premise.\tA hypothesis.\tentailment", "'x'"),
])
def test_malformed_row_names_file_and_line(tmp_path, bad_line, problem):
    _write(tmp_path / "glue" / "RTE" / "train.tsv",
           [RTE_HEADER, "0\tA premise.\tA hypothesis.\tentailment", bad_line])
    with pytest.raises(SparseBertError) as err:
        read_glue_split(tmp_path, "rte", "train")
    msg = str(err.value)
    assert "RTE/train.tsv: line 3:" in msg and problem in msg and "\n" not in msg


def test_malformed_stsb_score_and_missing_header(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    _write(tmp_path / "STS-B" / "dev.tsv",
           [header, "0\tg\tf\ty\to\ts\ts\tA.\tB.\t2.5", "1\tg\tf\ty\to\ts\ts\tA.\tB.\t7.0"])
    with pytest.raises(SparseBertError, match=r"STS-B/dev.tsv: line 3:.*'7.0'"):
        read_glue_split(tmp_path, "stsb", "dev")
    _write(tmp_path / "RTE" / "dev.tsv", ["index\tpremise\thypothesis\tlabel"])
    with pytest.raises(SparseBertError, match=r"RTE/dev.tsv: line 1:.*'sentence1'"):
        read_glue_split(tmp_path, "rte", "dev")
    with pytest.raises(SparseBertError, match="GLUE file not found"):
        read_glue_split(tmp_path, "rte", "train")
    # a labeled split must have its label column (a test file may lack it)
    _write(tmp_path / "RTE" / "train.tsv", ["index\tsentence1\tsentence2", "0\tA.\tB."])
    with pytest.raises(SparseBertError, match=r"RTE/train.tsv: line 1:.*'label'"):
        read_glue_split(tmp_path, "rte", "train")


def _real_rte_dev_head(data_dir: Path, n: int) -> list[str]:
    """The header and first ``n`` rows of the real RTE dev file, as lines without their line breaks."""
    return (data_dir / "glue" / "RTE" / "dev.tsv").read_text(encoding="utf-8").splitlines()[:n + 1]


@pytest.mark.parametrize("layout", ["trailing_empty_line", "crlf_trailing_empty_line", "blank_lines_inside"])
def test_blank_lines_are_skipped(tmp_path, data_dir, layout):
    """An empty line (an editor's trailing newline, a CRLF file's extra line break) is no row of zero columns."""
    header, first, second = _real_rte_dev_head(data_dir, 2)
    text = {
        "trailing_empty_line": f"{header}\n{first}\n{second}\n\n",
        "crlf_trailing_empty_line": f"{header}\r\n{first}\r\n{second}\r\n\r\n",
        "blank_lines_inside": f"{header}\n\n{first}\n   \n{second}\n\n",
    }[layout]
    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE" / "dev.tsv").write_bytes(text.encode("utf-8"))
    rows = read_glue_split(tmp_path, "rte", "dev")
    assert rows == read_glue_split(data_dir, "rte", "dev")[:2]


def test_blank_line_keeps_line_numbers_and_empty_fields_stay_errors(tmp_path, data_dir):
    header, first, second = _real_rte_dev_head(data_dir, 2)
    # a line of tabs is a row with four empty fields, not a blank line; after a skipped line, the error still
    # names the line of the file
    _write(tmp_path / "RTE" / "dev.tsv", [header, first, "", second, "\t\t\t"])
    with pytest.raises(SparseBertError, match=r"RTE/dev.tsv: line 5: empty text"):
        read_glue_split(tmp_path, "rte", "dev")
    # headerless CoLA: after a blank first line, the first data row is line 2
    _write(tmp_path / "CoLA" / "dev.tsv", ["", "gj04\t1\t\t ", "gj04\t0\t*\tThey drank the pub."])
    with pytest.raises(SparseBertError, match=r"CoLA/dev.tsv: line 2: empty text"):
        read_glue_split(tmp_path, "cola", "dev")


def test_a_headerless_cola_file_too_narrow_for_its_layout_is_a_one_line_error(tmp_path):
    """The row width is taken from the first row: one of 2 columns was an IndexError, not a message."""
    _write(tmp_path / "CoLA" / "dev.tsv", ["gj04\tThey drank the pub.", "gj04\t0"])
    with pytest.raises(SparseBertError, match=r"CoLA/dev.tsv: first row has 2 tab-separated columns; a file without "
                                              r"a header has cola's original layout \(the label in column 2, the text "
                                              r"in column 4\)"):
        read_glue_split(tmp_path, "cola", "dev")


def test_header_only_file_is_a_one_line_error(tmp_path):
    """A split without data rows would reach datasets as an untyped empty list ("Keys mismatch")."""
    _write(tmp_path / "glue" / "RTE" / "train.tsv", [RTE_HEADER])
    _write(tmp_path / "glue" / "RTE" / "dev.tsv", [RTE_HEADER, "0\tA premise.\tA hypothesis.\tentailment"])
    for read in (lambda: read_glue_split(tmp_path, "rte", "train"), lambda: load_glue("rte", tmp_path)):
        with pytest.raises(SparseBertError, match=r"RTE/train.tsv: no data rows") as err:
            read()
        assert "\n" not in str(err.value)


def test_non_utf8_byte_names_file_and_line(tmp_path):
    path = _write(tmp_path / "RTE" / "dev.tsv", [RTE_HEADER, "0\tA premise.\tA hypothesis.\tentailment"])
    # a Latin-1 "é" on line 3
    path.write_bytes(path.read_bytes() + "1\tCaf\u00e9 premise.\tB.\tentailment\n".encode("latin-1"))
    with pytest.raises(SparseBertError, match=r"RTE/dev.tsv: line 3: not UTF-8 text \(byte 0xe9") as err:
        read_glue_split(tmp_path, "rte", "dev")
    assert "\n" not in str(err.value)


def test_mnli_qqp_layout_by_header_name(tmp_path):
    # MNLI dev files have 16 columns; text and label are found by header name, the label is the last column
    cols = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
            "sentence1_parse", "sentence2_parse", "sentence1", "sentence2",
            "label1", "label2", "label3", "label4", "label5", "gold_label"]
    row = ["7", "p", "q", "fiction", "(b1)", "(b2)", "(p1)", "(p2)", "The cat sat.", "A cat sat.",
           "neutral", "neutral", "contradiction", "neutral", "neutral", "contradiction"]
    for split in ("train", "dev_matched", "dev_mismatched"):
        _write(tmp_path / "MNLI" / f"{split}.tsv", ["\t".join(cols), "\t".join(row)])
    _write(tmp_path / "MNLI" / "test_matched.tsv", ["index\tsentence1\tsentence2", "0\tA.\tB."])
    rows = read_glue_split(tmp_path, "mnli", "dev_matched")
    assert rows == [{"idx": 7, "text_a": "The cat sat.", "text_b": "A cat sat.", "label": 2}]
    assert read_glue_split(tmp_path, "mnli", "test_matched")[0]["label"] is None

    _write(tmp_path / "QQP" / "train.tsv", ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
                                            "12\t1\t2\tHow?\tWhy?\t1", "13\t3\t4\tWho?\tWhom?\t0"])
    qqp = read_glue_split(tmp_path, "qqp", "train")
    assert [(r["idx"], r["text_a"], r["text_b"], r["label"]) for r in qqp] == [
        (12, "How?", "Why?", 1), (13, "Who?", "Whom?", 0)]
    assert available_glue_tasks(tmp_path) == ["mnli"]  # QQP has no dev file


def test_load_glue_local_with_test_split(tmp_path):
    _write(tmp_path / "glue" / "CoLA" / "train.tsv", ["s\t1\t\tGood sentence.", "s\t0\t*\tSentence bad."])
    _write(tmp_path / "glue" / "CoLA" / "dev.tsv", ["s\t1\t\tAnother one."])
    # CoLA's test file has a header although train/dev do not
    _write(tmp_path / "glue" / "CoLA" / "test.tsv", ["index\tsentence", "0\tFirst test.", "1\tSecond test."])
    ds = load_glue("cola", tmp_path)
    assert list(ds) == ["train", "dev", "test"]
    assert ds["train"]["label"] == [1, 0] and ds["train"]["text_a"] == ["Good sentence.", "Sentence bad."]
    assert ds["test"]["idx"] == [0, 1] and ds["test"]["label"] == [None, None]
    assert ds["test"]["text_b"] == [None, None]


def test_load_glue_real_stsb(data_dir):
    ds = load_glue("stsb", data_dir)
    assert list(ds) == ["train", "dev"]
    assert (ds.num_rows["train"], ds.num_rows["dev"]) == (5749, 1500)
    assert ds["dev"].features["label"].dtype == "float32"
    assert ds["dev"][1]["label"] == pytest.approx(4.75)


# the checked-in RTE dev slice has no pair under 32 tokens: at 64, 6 of its 20 pairs are truncated and 14 are not
@pytest.mark.parametrize("data,max_len", [("data_dir", 32), ("asset_data_dir", 64)])
def test_featurize_pairs(request, tokenizer, data, max_len):
    ds = load_glue("rte", request.getfixturevalue(data))["dev"]
    feats = featurize_glue(ds, tokenizer, max_seq_length=max_len)
    assert set(feats.column_names) == {"idx", "input_ids", "attention_mask", "token_type_ids", "labels"}
    lengths = [len(x) for x in feats["input_ids"]]
    assert max(lengths) == max_len  # long RTE premises were truncated
    assert len(set(lengths)) > 1  # no padding: rows keep their own length
    assert feats["labels"] == ds["label"]
    sep = tokenizer.sep_token_id
    for ids, types, mask in zip(feats["input_ids"], feats["token_type_ids"], feats["attention_mask"]):
        assert len(ids) == len(types) == len(mask) and set(mask) == {1}
        first_sep = ids.index(sep)
        # segment 0 is [CLS] text_a [SEP], segment 1 is text_b [SEP]
        assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == sep
    # a short pair is untouched: its second segment is exactly text_b's tokens
    short = next(i for i, x in enumerate(lengths) if x < max_len)
    ids, types = feats[short]["input_ids"], feats[short]["token_type_ids"]
    second = [t for t, ty in zip(ids, types) if ty == 1][:-1]
    assert second == tokenizer(ds[short]["text_b"], add_special_tokens=False)["input_ids"]


def test_featurize_single_sentence_and_test_split(tmp_path, data_dir, tokenizer):
    feats = featurize_glue(load_glue("sst2", data_dir)["dev"], tokenizer, max_seq_length=16)
    assert all(len(x) <= 16 for x in feats["input_ids"])
    assert all(set(t) == {0} for t in feats["token_type_ids"])
    _write(tmp_path / "SST-2" / "train.tsv", ["sentence\tlabel", "good film\t1"])
    _write(tmp_path / "SST-2" / "dev.tsv", ["sentence\tlabel", "bad film\t0"])
    _write(tmp_path / "SST-2" / "test.tsv", ["index\tsentence", "0\tok film"])
    out = featurize_glue(load_glue("sst2", tmp_path), tokenizer, max_seq_length=16)
    assert "labels" not in out["test"].column_names and out["train"]["labels"] == [1]
    assert out["test"]["input_ids"][0] == tokenizer("ok film")["input_ids"]
