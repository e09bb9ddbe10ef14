"""GAP reading/validation on the real TSVs and the checked-in slices, token positions of the mentions, metrics
and output formats. Tests that need only the first rows of a file read the slice (the same bytes)."""

from __future__ import annotations

import csv
import logging

import pytest

from sparsebert.data.gap import COLUMNS, featurize_gap, read_gap
from sparsebert.errors import SparseBertError


@pytest.fixture(scope="module")
def gap_assets(asset_data_dir):
    """The checked-in slices: the header and first 10 rows of gap-development.tsv, first 5 of gap-validation.tsv."""
    return asset_data_dir / "gap"


def _raw_rows(path) -> list[list[str]]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def _write_rows(path, rows: list[list[str]]) -> None:
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")


def test_a_byte_order_mark_is_accepted(tmp_path, gap_assets):
    path = tmp_path / "bom.tsv"
    path.write_bytes(b"\xef\xbb\xbf" + (gap_assets / "gap-validation.tsv").read_bytes())
    assert read_gap(path) == read_gap(gap_assets / "gap-validation.tsv")


def test_read_real_files(gap_dev, gap_val):
    assert len(gap_dev) == 2000 and len(gap_val) == 454
    assert gap_dev[0].id == "development-1" and gap_val[-1].id == "validation-454"
    first = gap_dev[0]
    assert (first.pronoun, first.pronoun_offset, first.a, first.a_offset, first.b, first.b_offset) == (
        "her", 274, "Cheryl Cassidy", 191, "Pauline", 207,
    )  # fmt: skip
    assert first.a_coref and not first.b_coref and first.label == 0
    labels = [ex.label for ex in gap_dev]
    # labels agree with the coref columns, and all three classes occur
    assert labels.count(0) == sum(ex.a_coref for ex in gap_dev)
    assert labels.count(1) == sum(ex.b_coref for ex in gap_dev)
    assert labels.count(2) == sum(not ex.a_coref and not ex.b_coref for ex in gap_dev) > 100
    assert {ex.gender for ex in gap_dev + gap_val} == {"M", "F"}


def test_read_asset_files(gap_assets):
    dev, val = read_gap(gap_assets / "gap-development.tsv"), read_gap(gap_assets / "gap-validation.tsv")
    assert [ex.id for ex in dev] == [f"development-{i}" for i in range(1, 11)]
    assert [ex.id for ex in val] == [f"validation-{i}" for i in range(1, 6)]
    first = dev[0]
    assert (first.pronoun, first.pronoun_offset, first.a, first.a_offset, first.b, first.b_offset) == (
        "her", 274, "Cheryl Cassidy", 191, "Pauline", 207,
    )  # fmt: skip
    assert first.a_coref and not first.b_coref and first.label == 0
    # labels agree with the coref columns, and all three classes occur in the slice
    assert [ex.label for ex in dev] == [0 if ex.a_coref else 1 if ex.b_coref else 2 for ex in dev]
    assert {ex.label for ex in dev} == {0, 1, 2}
    assert {ex.gender for ex in dev + val} == {"M", "F"}


# (row id, max_seq_length, (p_idx, p_end), (a_idx, a_end), (b_idx, b_end)), checked by hand against the TSV:
# development-2: "His" at 284 is the 2nd "His" (token 31 is the 1st); A = MacKenzie, B = Bernard Leach.
# development-8: "his" in "In his list"; A = "Greg Kot" (greg ko ##t), B = "Robert Christgau" (3 pieces).
# validation-2: "She" starts the 3rd sentence; B = the 2nd "Kathleen" (token 1 is the 1st), A = Ellen.
HAND_ROWS = [
    ("development-2", "His", (61, 61), "MacKenzie", (51, 51), "Bernard Leach", (54, 55)),
    ("development-8", "his", (78, 78), "Greg Kot", (42, 44), "Robert Christgau", (87, 89)),
    ("validation-2", "She", (46, 46), "Ellen", (29, 29), "Kathleen", (40, 40)),
]


@pytest.mark.parametrize("head", ["concat", "segment"])
def test_hand_verified_token_positions(gap_assets, tokenizer, head):
    by_id = {ex.id: ex for name in ("gap-development.tsv", "gap-validation.tsv") for ex in read_gap(gap_assets / name)}
    rows = [by_id[r[0]] for r in HAND_ROWS]
    feats = featurize_gap(rows, tokenizer, 128, head)
    for i, (rid, p, p_span, a, a_span, b, b_span) in enumerate(HAND_ROWS):
        ids = feats["input_ids"][i]
        assert len(ids) == 128 and ids[0] == tokenizer.cls_token_id
        for key, name, span in (("p", p, p_span), ("a", a, a_span), ("b", b, b_span)):
            assert (feats[f"{key}_idx"][i], feats[f"{key}_end"][i]) == span, (rid, key)
            assert tokenizer.decode(ids[span[0] : span[1] + 1]) == name.lower()
        assert tokenizer.decode([ids[feats["p_idx"][i]]]) == p.lower()
        assert feats["labels"][i] == by_id[rid].label
        types = feats["token_type_ids"][i]
        if head == "segment":
            expect = [0] * 128
            for span, t in ((p_span, 1), (a_span, 2), (b_span, 3)):
                expect[span[0] : span[1] + 1] = [t] * (span[1] - span[0] + 1)
            assert types == expect
        else:
            assert set(types) == {0}
    assert feats["labels"] == [0, 1, 1]


def test_wrong_offset_error_and_skip(tmp_path, gap_assets, caplog):
    rows = _raw_rows(gap_assets / "gap-validation.tsv")[:4]
    assert rows[0] == COLUMNS
    rows[2][COLUMNS.index("A-offset")] = str(int(rows[2][COLUMNS.index("A-offset")]) + 1)
    bad_id = rows[2][0]
    path = tmp_path / "bad.tsv"
    _write_rows(path, rows)
    with pytest.raises(SparseBertError, match=rf"bad\.tsv.*{bad_id}\b.*A-offset") as err:
        read_gap(path)
    assert "\n" not in str(err.value)
    with caplog.at_level(logging.WARNING, logger="sparsebert.data.gap"):
        kept = read_gap(path, on_bad_row="skip")
    assert [ex.id for ex in kept] == [rows[1][0], rows[3][0]]
    assert bad_id in caplog.text


def test_offset_inside_a_longer_word_is_an_error(tmp_path, gap_assets):
    # the row's text matches at the new offset ("he" inside "the"), but it is not the pronoun
    header, *rows = _raw_rows(gap_assets / "gap-validation.tsv")

    def inside_a_word(row):
        text, pronoun = row[COLUMNS.index("Text")], row[COLUMNS.index("Pronoun")]
        return next((i for i in range(1, len(text) - len(pronoun))
                     if text[i:i + len(pronoun)] == pronoun and text[i - 1].isalpha()), None)

    row, inside = next((r, i) for r in rows if (i := inside_a_word(r)) is not None)
    row[COLUMNS.index("Pronoun-offset")] = str(inside)
    _write_rows(tmp_path / "x.tsv", [header, row])
    with pytest.raises(SparseBertError, match=rf"{row[0]}.*Pronoun-offset {inside}"):
        read_gap(tmp_path / "x.tsv")


@pytest.mark.parametrize(
    ("col", "value", "problem"),
    [
        ("Pronoun-offset", "12x", "not an integer"),
        ("B-offset", "99999", "out of range"),
        ("B-coref", "YES", "TRUE/FALSE"),
        ("URL", None, "11 tab-separated fields"),
    ],
)
def test_bad_rows(tmp_path, gap_assets, col, value, problem):
    rows = _raw_rows(gap_assets / "gap-development.tsv")[:3]
    if value is None:
        rows[1] = rows[1][:-1]  # a missing column
    else:
        rows[1][COLUMNS.index(col)] = value
    path = tmp_path / "x.tsv"
    _write_rows(path, rows)
    with pytest.raises(SparseBertError, match=rf"{rows[1][0]}.*{problem}"):
        read_gap(path)
    assert [ex.id for ex in read_gap(path, on_bad_row="skip")] == [rows[2][0]]


@pytest.mark.parametrize("on_bad_row", ["error", "skip"])
def test_non_utf8_file_names_file_and_line(tmp_path, data_dir, on_bad_row):
    """A file in another encoding is not a bad row to skip: a one-line error with the line of the first bad byte,
    found exactly although the text layer decodes ahead in blocks (40 real rows are more than one block)."""
    rows = _raw_rows(data_dir / "gap" / "gap-development.tsv")[:41]
    path = tmp_path / "latin1.tsv"
    _write_rows(path, rows[:31])
    tail = "".join("\t".join(r) + "\n" for r in rows[31:])
    with open(path, "ab") as f:  # line 32 onwards in Latin-1, with an "é" in line 32's text
        f.write(tail.replace(rows[31][1], "Caf\u00e9 " + rows[31][1], 1).encode("latin-1"))
    assert path.stat().st_size > 8192
    with pytest.raises(SparseBertError, match=r"latin1\.tsv: line 32: not UTF-8 text \(byte 0xe9") as err:
        read_gap(path, on_bad_row=on_bad_row)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("line_end", ["\n", "\r\n"])
def test_blank_lines_are_skipped(tmp_path, gap_assets, line_end):
    """A trailing empty line (or a CRLF file's extra line break), here after the Kaggle test file's 9 columns
    that --predict reads, is no row of zero fields."""
    header, *rows = _raw_rows(gap_assets / "gap-validation.tsv")[:4]
    keep = [i for i, c in enumerate(COLUMNS) if not c.endswith("-coref")]
    lines = ["\t".join(header[i] for i in keep), *("\t".join(r[i] for i in keep) for r in rows)]
    path = tmp_path / "test_stage_1.tsv"
    path.write_bytes((line_end.join(lines[:2] + [""] + lines[2:]) + line_end * 2).encode("utf-8"))
    examples = read_gap(path, allow_unlabelled=True)
    assert [ex.id for ex in examples] == [r[0] for r in rows]
    assert not any(ex.labelled for ex in examples)
    # labelled: the same rows as without the blank lines
    _write_rows(path, [header, *rows])
    path.write_text(path.read_text(encoding="utf-8") + "\n\n", encoding="utf-8")
    assert read_gap(path) == read_gap(gap_assets / "gap-validation.tsv")[:3]


def test_row_of_empty_fields_is_an_error_named_by_its_line(tmp_path, gap_assets):
    # a line of tabs is not blank: 11 empty fields; after a skipped blank line the message still names its line
    rows = _raw_rows(gap_assets / "gap-development.tsv")[:3]
    path = tmp_path / "x.tsv"
    path.write_text("\n".join(["\t".join(rows[0]), "\t".join(rows[1]), "", "\t" * 10, "\t".join(rows[2])]) + "\n",
                    encoding="utf-8")
    with pytest.raises(SparseBertError, match=r"x\.tsv: row \(line 4\): Pronoun-offset '' is not an integer"):
        read_gap(path)
    assert [ex.id for ex in read_gap(path, on_bad_row="skip")] == [rows[1][0], rows[2][0]]


def test_both_coref_true_is_an_error(tmp_path, gap_assets):
    rows = _raw_rows(gap_assets / "gap-development.tsv")[:2]
    rows[1][COLUMNS.index("A-coref")] = rows[1][COLUMNS.index("B-coref")] = "TRUE"
    _write_rows(tmp_path / "x.tsv", rows)
    with pytest.raises(SparseBertError, match="development-1.*both"):
        read_gap(tmp_path / "x.tsv")


def test_truncation_keeps_all_mentions(gap_dev, tokenizer):
    ex = next(e for e in gap_dev if e.id == "development-210")  # the longest text: 346 tokens
    full = featurize_gap([ex], tokenizer, 512, "segment", pad_to_max_length=False)
    assert len(full["input_ids"][0]) == 348
    lo = min(full[k][0] for k in ("p_idx", "a_idx", "b_idx"))
    hi = max(full[k][0] for k in ("p_end", "a_end", "b_end"))
    assert hi - lo + 1 == 40
    for max_len in (42, 64, 128):
        cut = featurize_gap([ex], tokenizer, max_len, "segment")
        ids = cut["input_ids"][0]
        assert len(ids) == max_len and sum(cut["attention_mask"][0]) == max_len
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        for key, name in (("p", ex.pronoun), ("a", ex.a), ("b", ex.b)):
            s, e = cut[f"{key}_idx"][0], cut[f"{key}_end"][0]
            assert tokenizer.decode(ids[s : e + 1]) == name.lower()
            # the same tokens as without truncation, shifted
            shift = s - full[f"{key}_idx"][0]
            assert ids[s : e + 1] == full["input_ids"][0][s - shift : e - shift + 1]
        assert cut["token_type_ids"][0].count(1) == 1
    with pytest.raises(SparseBertError, match="development-210"):
        featurize_gap([ex], tokenizer, 41, "concat")


def test_mentions_too_far_apart_are_truncated_around_them(gap_dev, tokenizer):
    """--predict's --long-rows truncate: a row whose pronoun, A and B span more than one window keeps every mention
    with context around it, in text order, and leaves out text between them; the heads still find each mention."""
    from sparsebert.data.gap import long_gap_rows

    ex = next(e for e in gap_dev if e.id == "development-210")  # its mentions span 40 tokens
    assert long_gap_rows([ex], tokenizer, 42) == [] and long_gap_rows([ex], tokenizer, 41) == [ex.id]
    full = featurize_gap([ex], tokenizer, 512, "segment", pad_to_max_length=False)["input_ids"][0][1:-1]
    for max_len in (16, 30):
        cut = featurize_gap([ex], tokenizer, max_len, "segment", long_rows="truncate")
        ids = cut["input_ids"][0]
        assert len(ids) == max_len and sum(cut["attention_mask"][0]) == max_len
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        kept = iter(full)
        assert all(token in kept for token in ids[1:-1])  # a subsequence of the row's tokens, in order
        for key, name, type_id in (("p", ex.pronoun, 1), ("a", ex.a, 2), ("b", ex.b, 3)):
            s, e = cut[f"{key}_idx"][0], cut[f"{key}_end"][0]
            assert tokenizer.decode(ids[s : e + 1]) == name.lower()
            assert set(cut["token_type_ids"][0][s : e + 1]) == {type_id}
    with pytest.raises(SparseBertError, match="development-210"):
        featurize_gap([ex], tokenizer, 41, "concat", long_rows="error")
