"""GAP gendered pronoun resolution: reading and validating the TSVs, features for the GAP heads, metrics
(Kaggle log loss and the GAP paper's F1 / bias) and the two output formats.

Label: 0 = the pronoun refers to A, 1 = to B, 2 = to neither.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparsebert.data.delimited import csv_rows
from sparsebert.errors import SparseBertError

logger = logging.getLogger(__name__)

LABEL_NAMES = ("A", "B", "neither")  # the classes in label-id order: the pronoun refers to A, to B, to neither
COLUMNS = [
    "ID",
    "Text",
    "Pronoun",
    "Pronoun-offset",
    "A",
    "A-offset",
    "A-coref",
    "B",
    "B-offset",
    "B-coref",
    "URL",
]
# the Kaggle test file: no A-coref / B-coref, the answers being what a submission predicts
UNLABELLED_COLUMNS = [c for c in COLUMNS if not c.endswith("-coref")]
HEADS = ("concat", "mul", "segment")
MASCULINE = frozenset({"he", "him", "his", "himself"})
FEMININE = frozenset({"she", "her", "hers", "herself"})


@dataclass(frozen=True)
class GapExample:
    id: str
    text: str
    pronoun: str
    pronoun_offset: int
    a: str
    a_offset: int
    a_coref: bool | None  # None (with b_coref): a row of the unlabelled test file
    b: str
    b_offset: int
    b_coref: bool | None
    url: str

    @property
    def labelled(self) -> bool:
        return self.a_coref is not None

    @property
    def label(self) -> int:
        """0 = A, 1 = B, 2 = neither; -100 (the ignored index of cross-entropy) for an unlabelled row."""
        if not self.labelled:
            return -100
        return 0 if self.a_coref else 1 if self.b_coref else 2

    @property
    def gender(self) -> str | None:
        """ "M" / "F" by the pronoun, None for a pronoun in neither list."""
        p = self.pronoun.lower()
        return "M" if p in MASCULINE else "F" if p in FEMININE else None


def _parse_row(row: list[str], labelled: bool = True) -> GapExample:
    """One data row (11 fields, or the 9 of the unlabelled test file) → GapExample; raises ValueError with the
    problem (the caller adds file and ID)."""
    width = len(COLUMNS if labelled else UNLABELLED_COLUMNS)
    if len(row) != width:
        raise ValueError(f"expected {width} tab-separated fields, got {len(row)}")
    if labelled:
        rid, text, pron, p_off, a, a_off, a_coref, b, b_off, b_coref, url = row
    else:
        rid, text, pron, p_off, a, a_off, b, b_off, url = row
    offsets = {}
    for col, value in (("Pronoun-offset", p_off), ("A-offset", a_off), ("B-offset", b_off)):
        try:
            offsets[col] = int(value)
        except ValueError:
            raise ValueError(f"{col} {value!r} is not an integer") from None
    for col, name in (("Pronoun-offset", pron), ("A-offset", a), ("B-offset", b)):
        off = offsets[col]
        if not name:
            raise ValueError(f"empty mention for {col}")
        if not 0 <= off <= len(text) - len(name):
            raise ValueError(f"{col} {off} out of range for a text of {len(text)} characters")
        if text[off : off + len(name)] != name:
            raise ValueError(f"{col} {off}: text there is {text[off : off + len(name)]!r}, not {name!r}")
        # "he" at an offset inside "the" matches the text but points the head at the wrong word
        end = off + len(name)
        if (off > 0 and text[off - 1].isalnum()) or (end < len(text) and text[end].isalnum()):
            raise ValueError(f"{col} {off}: {name!r} there is part of the longer word "
                             f"{_word_around(text, off, end)!r}")
    if not labelled:
        return GapExample(rid, text, pron, offsets["Pronoun-offset"], a, offsets["A-offset"], None,
                          b, offsets["B-offset"], None, url)
    corefs = {}
    for col, value in (("A-coref", a_coref), ("B-coref", b_coref)):
        if value.upper() not in ("TRUE", "FALSE"):
            raise ValueError(f"{col} {value!r} is not TRUE/FALSE")
        corefs[col] = value.upper() == "TRUE"
    if corefs["A-coref"] and corefs["B-coref"]:
        raise ValueError("both A-coref and B-coref are TRUE")
    return GapExample(
        rid, text, pron, offsets["Pronoun-offset"], a, offsets["A-offset"], corefs["A-coref"],
        b, offsets["B-offset"], corefs["B-coref"], url,
    )  # fmt: skip


def read_gap(path: str | os.PathLike, on_bad_row: str = "error", allow_unlabelled: bool = False) -> list[GapExample]:
    """Read a GAP TSV (header + 11 columns). A bad row raises SparseBertError (file, ID, problem), or with
    ``on_bad_row="skip"`` is logged as a warning and left out — never kept with a guessed label.

    ``allow_unlabelled``: also accept the 9 columns of the Kaggle test file (no A-coref / B-coref); its rows come
    back with ``a_coref = b_coref = None`` (``labelled`` False)."""
    if on_bad_row not in ("error", "skip"):
        raise SparseBertError(f"read_gap: on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:  # a byte-order mark is not part of "ID"
            # csv_rows: a file in another encoding is a one-line error, not a bad row; blank lines are left out,
            # so rows keep their file line numbers
            rows = list(csv_rows(path, f, delimiter="\t", quoting=csv.QUOTE_NONE))
    except OSError as e:
        raise SparseBertError(f"{path}: cannot read: {e.strerror}") from None
    header = rows[0][1] if rows else []
    labelled = header == COLUMNS
    if not labelled and not (allow_unlabelled and header == UNLABELLED_COLUMNS):
        also = f", nor the test file's {'<TAB>'.join(UNLABELLED_COLUMNS)}" if allow_unlabelled else ""
        raise SparseBertError(f"{path}: header is not the GAP header {'<TAB>'.join(COLUMNS)}{also}")
    examples: list[GapExample] = []
    seen: set[str] = set()
    for line_no, row in rows[1:]:
        rid = row[0] if row and row[0] else f"(line {line_no})"
        try:
            if rid in seen:
                raise ValueError("duplicate ID")
            ex = _parse_row(row, labelled)
        except ValueError as e:
            msg = f"{path}: row {rid}: {e}"
            if on_bad_row == "error":
                raise SparseBertError(msg) from None
            logger.warning("skipping bad GAP row: %s", msg)
            continue
        seen.add(rid)
        examples.append(ex)
    return examples


# ---------------------------------------------------------------------------------------------- features


def _token_span(
    offsets: list[tuple[int, int]], start: int, end: int, ex: GapExample, what: str
) -> tuple[int, int]:
    """First and last token overlapping the character span [start, end)."""
    hit = [i for i, (s, e) in enumerate(offsets) if s < end and e > start and e > s]
    if not hit:
        raise SparseBertError(f"GAP row {ex.id}: {what} at character {start} maps to no token")
    return hit[0], hit[-1]


LONG_ROWS = ("truncate", "skip", "error")


def _mention_spans(ex: GapExample, offsets: list[tuple[int, int]]) -> dict[str, tuple[int, int]]:
    return {
        "p": _token_span(offsets, ex.pronoun_offset, ex.pronoun_offset + len(ex.pronoun), ex, "pronoun"),
        "a": _token_span(offsets, ex.a_offset, ex.a_offset + len(ex.a), ex, "A"),
        "b": _token_span(offsets, ex.b_offset, ex.b_offset + len(ex.b), ex, "B"),
    }


def long_gap_rows(examples: Sequence[GapExample], tokenizer: Any, max_seq_length: int) -> list[str]:
    """The IDs of the rows whose pronoun, A and B lie too far apart for one window of ``max_seq_length``
    tokens (what :func:`featurize_gap` truncates between the mentions, or refuses)."""
    enc = tokenizer([ex.text for ex in examples], add_special_tokens=False, return_offsets_mapping=True)
    long = []
    for ex, offsets in zip(examples, enc["offset_mapping"]):
        spans = _mention_spans(ex, offsets).values()
        if max(e for _, e in spans) - min(s for s, _ in spans) + 1 > max_seq_length - 2:
            long.append(ex.id)
    return long


def _around_mentions(spans: Sequence[tuple[int, int]], n_tokens: int, budget: int, ex: GapExample) -> list[int]:
    """The token positions kept of a row whose mentions do not fit one window: every mention's tokens, and
    context grown around each mention in turn (one token a side per round) until ``budget`` tokens are kept;
    the text between the pieces is left out."""
    kept = {i for s, e in spans for i in range(s, e + 1)}
    if len(kept) > budget:
        raise SparseBertError(f"GAP row {ex.id}: the pronoun, A and B alone are {len(kept)} tokens, more than "
                              f"max_seq_length - 2 = {budget}")
    edges = [[s, e] for s, e in spans]
    moved = True
    while len(kept) < budget and moved:
        moved = False
        for edge in edges:
            for side, step in ((0, -1), (1, 1)):
                i = edge[side] + step
                if len(kept) < budget and 0 <= i < n_tokens:
                    edge[side], moved = i, True
                    kept.add(i)
    return sorted(kept)


def featurize_gap(
    examples: Sequence[GapExample],
    tokenizer: Any,
    max_seq_length: int,
    head: str,
    pad_to_max_length: bool = True,
    long_rows: str = "error",
) -> dict[str, list]:
    """Token features for :class:`sparsebert.models.gap_heads.GapClassifier`.

    Keys: ``input_ids, attention_mask, token_type_ids, p_idx, a_idx, b_idx`` (first token of each mention,
    counting [CLS]), ``p_end, a_end, b_end`` (last token, inclusive) and ``labels``. A text longer than
    ``max_seq_length`` is cut to a window of tokens that keeps all three mentions (roughly centred on them).
    Mentions too far apart for one window: ``long_rows="error"`` raises SparseBertError; ``"truncate"`` keeps
    each mention with context around it and leaves out text between them (a prediction needs every row).
    For ``head="segment"`` token_type_ids are 1 on the pronoun's tokens, 2 on A's, 3 on B's (0 elsewhere; the
    pronoun wins if mentions overlap); for other heads all 0.
    """
    if head not in HEADS:
        raise SparseBertError(f"featurize_gap: unknown head {head!r}; choose one of {', '.join(HEADS)}")
    if long_rows not in ("truncate", "error"):  # "skip" leaves rows out before featurizing (long_gap_rows)
        raise SparseBertError(f"featurize_gap: long_rows must be 'truncate' or 'error', got {long_rows!r}")
    if not getattr(tokenizer, "is_fast", False):
        raise SparseBertError("featurize_gap needs a fast tokenizer (offset mapping)")
    budget = max_seq_length - 2  # room for [CLS] and [SEP]
    enc = tokenizer([ex.text for ex in examples], add_special_tokens=False, return_offsets_mapping=True)
    out: dict[str, list] = {k: [] for k in (
        "input_ids", "attention_mask", "token_type_ids", "p_idx", "a_idx", "b_idx", "p_end", "a_end", "b_end", "labels"
    )}  # fmt: skip
    for ex, ids, offsets in zip(examples, enc["input_ids"], enc["offset_mapping"]):
        spans = _mention_spans(ex, offsets)
        lo = min(s for s, _ in spans.values())
        hi = max(e for _, e in spans.values())
        if hi - lo + 1 <= budget:
            # window [w0, w0 + budget): centred on the mentions, clamped to the text
            w0 = 0
            if len(ids) > budget:
                w0 = max(0, min(lo - (budget - (hi - lo + 1)) // 2, len(ids) - budget))
            kept = list(range(w0, min(w0 + budget, len(ids))))
        elif long_rows == "truncate":
            kept = _around_mentions(list(spans.values()), len(ids), budget, ex)
        else:
            raise SparseBertError(
                f"GAP row {ex.id}: pronoun, A and B span {hi - lo + 1} tokens, more than max_seq_length "
                f"{max_seq_length} - 2 allows"
            )
        position = {i: n + 1 for n, i in enumerate(kept)}  # +1 for [CLS]
        spans = {key: (position[s], position[e]) for key, (s, e) in spans.items()}
        input_ids = [tokenizer.cls_token_id, *(ids[i] for i in kept), tokenizer.sep_token_id]
        types = [0] * len(input_ids)
        if head == "segment":
            for key, type_id in (("a", 2), ("b", 3), ("p", 1)):
                s, e = spans[key]
                types[s : e + 1] = [type_id] * (e - s + 1)
        pad = max_seq_length - len(input_ids) if pad_to_max_length else 0
        out["input_ids"].append(input_ids + [tokenizer.pad_token_id] * pad)
        out["attention_mask"].append([1] * len(input_ids) + [0] * pad)
        out["token_type_ids"].append(types + [0] * pad)
        for key, (s, e) in spans.items():
            out[f"{key}_idx"].append(s)
            out[f"{key}_end"].append(e)
        out["labels"].append(ex.label)
    return out


def gap_dataset(examples: Sequence[GapExample]):
    """GAP examples as a ``datasets.Dataset`` with one column per GapExample field (the featurizer's input)."""
    import datasets

    fields = [f.name for f in dataclasses.fields(GapExample)]
    return datasets.Dataset.from_dict({f: [getattr(ex, f) for ex in examples] for f in fields})


def featurize_gap_batch(batch: dict[str, list], tokenizer: Any, max_seq_length: int, head: str,
                        pad_to_max_length: bool = True, long_rows: str = "error") -> dict[str, list]:
    """:func:`featurize_gap` on one batch of :func:`gap_dataset` rows."""
    fields = [f.name for f in dataclasses.fields(GapExample)]
    examples = [GapExample(*values) for values in zip(*(batch[f] for f in fields))]
    return featurize_gap(examples, tokenizer, max_seq_length, head, pad_to_max_length, long_rows)


def gap_features(examples: Sequence[GapExample], tokenizer: Any, max_seq_length: int, head: str,
                 pad_to_max_length: bool = True, *, num_proc: int | None = None, cache_dir=None,
                 long_rows: str = "error"):
    """:func:`featurize_gap` as a ``datasets.Dataset`` (one row per example, in order), through the
    featurizer: parallel and cached by the examples' content, the tokenizer and the settings."""
    from sparsebert.data.featurize import featurize

    if head not in HEADS:  # fail here, before any worker starts, with featurize_gap's message
        raise SparseBertError(f"featurize_gap: unknown head {head!r}; choose one of {', '.join(HEADS)}")
    raw = gap_dataset(examples)
    return featurize(raw, featurize_gap_batch, name=f"gap-{head}", tokenizer=tokenizer,
                     fn_kwargs={"tokenizer": tokenizer, "max_seq_length": max_seq_length, "head": head,
                                "pad_to_max_length": pad_to_max_length, "long_rows": long_rows},
                     num_proc=num_proc, remove_columns=raw.column_names, cache_dir=cache_dir)


def _word_around(text: str, start: int, end: int) -> str:
    while start > 0 and text[start - 1].isalnum():
        start -= 1
    while end < len(text) and text[end].isalnum():
        end += 1
    return text[start:end]
