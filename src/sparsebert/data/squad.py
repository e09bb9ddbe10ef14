"""SQuAD v1.1 / v2.0: reading, article-level splitting, windowed features, span decoding and the metrics.

Windowing uses the fast tokenizer's overflow: ``doc_stride`` is the number of context tokens that two
consecutive windows of one example share (the tokenizer's ``stride``), not the step between them.
Features are padded to ``max_seq_length`` so any collator (and the Trainer's logit concatenation) works.
In eval features, ``offset_mapping`` holds ``None`` for every token that is not a context token
(question, special and padding tokens); postprocessing only ever picks spans of non-``None`` tokens.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from sparsebert.errors import SparseBertError

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- reading


def read_squad(path: str | os.PathLike, answers_optional: bool = False) -> list[dict[str, Any]]:
    """Flatten a SQuAD JSON file into one dict per question.

    Each dict: ``id, title, context, question, answers {"text": [...], "answer_start": [...]},
    is_impossible`` (False for v1.1 files, which have no such flag). With ``answers_optional`` (a file to
    predict) a question without an ``answers`` key is kept, with ``answers`` None.
    """
    try:
        with open(path, encoding="utf-8-sig") as f:  # json refuses a leading byte-order mark
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise SparseBertError(f"{path}: not valid JSON (truncated or corrupt?): {e}") from None
    except UnicodeDecodeError as e:
        raise SparseBertError(f"{path}: not UTF-8 text (byte {e.start}): {e.reason}") from None
    except OSError as e:
        raise SparseBertError(f"{path}: cannot read: {e.strerror}") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise SparseBertError(f"{path}: not a SQuAD file: expected a JSON object with a 'data' list")

    examples: list[dict[str, Any]] = []
    seen: set[str] = set()
    for a_i, article in enumerate(data["data"]):
        where = f"{path}: article {a_i}"
        try:
            title = _text(article["title"], "title", where, empty_ok=True)
            for p_i, paragraph in enumerate(article["paragraphs"]):
                context = _text(paragraph["context"], "context", f"{where}, paragraph {p_i}")
                for q_i, qa in enumerate(paragraph["qas"]):
                    examples.append(_read_question(qa, title, context, f"{where}, paragraph {p_i}, question {q_i}",
                                                   seen, answers_optional))
        except (KeyError, TypeError) as e:
            raise SparseBertError(f"{where}: missing or malformed key {e}") from None
    return examples


def _text(value: Any, field: str, where: str, empty_ok: bool = False) -> str:
    """``value`` if it is text (not blank, unless ``empty_ok``), else the one-line error naming ``field``: the
    tokenizer and the Arrow tables the features go into take text only, and fail deep inside otherwise."""
    if isinstance(value, str) and (empty_ok or value.strip()):
        return value
    got = "empty" if isinstance(value, str) else f"{type(value).__name__} {value!r:.40}, not text"
    raise SparseBertError(f"{where}: {field!r} is {got}")


def _read_question(qa: dict, title: str, context: str, where: str, seen: set[str],
                   answers_optional: bool = False) -> dict[str, Any]:
    if not isinstance(qa, dict):
        raise SparseBertError(f"{where}: a 'qas' entry is not an object: {qa!r:.60}")
    if "id" not in qa:
        raise SparseBertError(f"{where}: a question has no 'id'")
    qid = _text(qa["id"], "id", where)
    where = f"{where} (id {qid})"
    if qid in seen:
        raise SparseBertError(f"{where}: duplicate question id")
    seen.add(qid)
    if "question" not in qa:
        raise SparseBertError(f"{where}: missing 'question'")
    question = _text(qa["question"], "question", where)
    if answers_optional and "answers" not in qa:
        return {"id": qid, "title": title, "context": context, "question": question, "answers": None,
                "is_impossible": False}
    texts, starts = _answers(qa.get("answers"), where)
    is_impossible = qa.get("is_impossible", False)
    if not isinstance(is_impossible, bool):
        raise SparseBertError(f"{where}: 'is_impossible' is {type(is_impossible).__name__} {is_impossible!r:.40}, "
                              "not true or false")
    if is_impossible and texts:
        raise SparseBertError(f"{where}: is_impossible is true but the question has answers")
    if not is_impossible and not texts:
        raise SparseBertError(f"{where}: answerable question without answers")
    for text, start in zip(texts, starts):
        # a span that does not match the context would silently train on the wrong tokens; a negative start
        # would slice from the end of the context (both would train the question as unanswerable)
        if not 0 <= start <= len(context) - len(text) or context[start : start + len(text)] != text:
            raise SparseBertError(f"{where}: answer {text!r} not found at answer_start {start}")
    return {
        "id": qid,
        "title": title,
        "context": context,
        "question": question,
        "answers": {"text": texts, "answer_start": starts},
        "is_impossible": is_impossible,
    }


def _answers(answers: Any, where: str) -> tuple[list[str], list[int]]:
    """The answers' texts and start offsets, each checked: a list of objects with a non-empty ``text`` (an empty
    one matches anywhere) and an integer ``answer_start``."""
    if not isinstance(answers, list):
        got = "missing" if answers is None else f"{type(answers).__name__}, not a list"
        raise SparseBertError(f"{where}: 'answers' is {got}")
    texts, starts = [], []
    for k, answer in enumerate(answers):
        if not isinstance(answer, dict) or "text" not in answer or "answer_start" not in answer:
            raise SparseBertError(f"{where}: answer {k} is not an object with 'text' and 'answer_start'")
        text, start = answer["text"], answer["answer_start"]
        if isinstance(start, bool) or not isinstance(start, int):
            raise SparseBertError(f"{where}, answer {k}: 'answer_start' is {type(start).__name__} {start!r:.40}, "
                                  "not an integer")
        if isinstance(text, str) and not text.strip():
            raise SparseBertError(f"{where}: empty answer text at answer_start {start}")
        texts.append(_text(text, "text", f"{where}, answer {k}"))
        starts.append(start)
    return texts, starts


def split_by_article(
    examples: Sequence[dict[str, Any]], eval_fraction: float, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split questions so that every article (title) lies wholly on one side; order within sides is kept.

    ``round(eval_fraction * n_articles)`` articles (at least one, and at least one left for train) go to eval.
    Titles are sorted before the seeded shuffle, so the split does not depend on the input order.
    """
    if not 0.0 < eval_fraction < 1.0:
        raise SparseBertError(f"split_by_article: eval_fraction must be in (0, 1), got {eval_fraction}")
    titles = sorted({ex["title"] for ex in examples})
    if len(titles) < 2:
        raise SparseBertError(f"split_by_article: need at least 2 articles to split, got {len(titles)}")
    random.Random(seed).shuffle(titles)
    n_eval = min(max(1, round(eval_fraction * len(titles))), len(titles) - 1)
    eval_titles = set(titles[:n_eval])
    train = [ex for ex in examples if ex["title"] not in eval_titles]
    evals = [ex for ex in examples if ex["title"] in eval_titles]
    return train, evals


# ---------------------------------------------------------------------------------------------- features


def _tokenize_windows(
    batch: Mapping[str, list], tokenizer: Any, max_seq_length: int, doc_stride: int, max_query_length: int
) -> Any:
    if not getattr(tokenizer, "is_fast", False):
        raise SparseBertError("SQuAD features need a fast tokenizer (offset mapping)")
    if max_query_length + 3 >= max_seq_length or doc_stride >= max_seq_length - max_query_length - 3:
        raise SparseBertError(
            f"SQuAD features: max_seq_length {max_seq_length} leaves no room for windows with "
            f"max_query_length {max_query_length} and doc_stride {doc_stride}"
        )
    # Truncate questions by cutting the string after their max_query_length-th token: re-tokenizing the
    # prefix gives the same tokens, and the tokenizer then truncates only the context.
    questions = [q.lstrip() for q in batch["question"]]
    q_enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    questions = [
        q[: offs[max_query_length - 1][1]] if len(offs) > max_query_length else q
        for q, offs in zip(questions, q_enc["offset_mapping"])
    ]
    return tokenizer(
        questions,
        batch["context"],
        truncation="only_second",
        max_length=max_seq_length,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length",
    )


def _context_range(sequence_ids: list[int | None]) -> tuple[int, int]:
    """First and last token index of the context (sequence 1) in one window."""
    idx = [i for i, s in enumerate(sequence_ids) if s == 1]
    return idx[0], idx[-1]


def prepare_train_features(
    batch: Mapping[str, list],
    tokenizer: Any,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
) -> dict[str, list]:
    """Windows with ``start_positions`` / ``end_positions`` (token indices, inclusive) of the first answer.

    Both point at CLS (index 0) when the question is unanswerable or the answer is not wholly in the window.
    """
    enc = _tokenize_windows(batch, tokenizer, max_seq_length, doc_stride, max_query_length)
    sample_map = enc.pop("overflow_to_sample_mapping")
    offsets_all = enc.pop("offset_mapping")
    starts: list[int] = []
    ends: list[int] = []
    for i, offsets in enumerate(offsets_all):
        answers = batch["answers"][sample_map[i]]
        if not answers["text"]:
            starts.append(0)
            ends.append(0)
            continue
        start_char = answers["answer_start"][0]
        end_char = start_char + len(answers["text"][0])
        ctx_first, ctx_last = _context_range(enc.sequence_ids(i))
        if offsets[ctx_first][0] > start_char or offsets[ctx_last][1] < end_char:
            starts.append(0)
            ends.append(0)
            continue
        # first token ending after the answer start; last token starting before the answer end
        s = ctx_first
        while s <= ctx_last and offsets[s][1] <= start_char:
            s += 1
        e = ctx_last
        while e >= ctx_first and offsets[e][0] >= end_char:
            e -= 1
        starts.append(s)
        ends.append(e)
    enc["start_positions"] = starts
    enc["end_positions"] = ends
    return dict(enc)


def prepare_eval_features(
    batch: Mapping[str, list],
    tokenizer: Any,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
) -> dict[str, list]:
    """Windows plus ``example_id`` and ``offset_mapping`` (``None`` for non-context tokens)."""
    enc = _tokenize_windows(batch, tokenizer, max_seq_length, doc_stride, max_query_length)
    sample_map = enc.pop("overflow_to_sample_mapping")
    enc["example_id"] = [batch["id"][j] for j in sample_map]
    enc["offset_mapping"] = [
        [tuple(o) if s == 1 else None for o, s in zip(offsets, enc.sequence_ids(i))]
        for i, offsets in enumerate(enc["offset_mapping"])
    ]
    return dict(enc)


# ---------------------------------------------------------------------------------------------- decoding


def postprocess_predictions(
    examples: Iterable[Mapping[str, Any]],
    features: Mapping[str, Sequence] | Any,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2: bool = False,
    null_score_diff_threshold: float = 0.0,
    nbest: dict[str, list[dict[str, Any]]] | None = None,
) -> tuple[dict[str, str], dict[str, float]]:
    """Best answer text per example id, from the start/end logits of all its windows.

    Candidates: the ``n_best_size`` best starts x ends of each window, kept when both tokens are context
    tokens, end >= start and the span has at most ``max_answer_length`` tokens; score = start + end logit.
    ``null_odds[id]`` = (lowest CLS score over the example's windows) - (best span score); for v2 the
    prediction is "" when it exceeds ``null_score_diff_threshold``. An example with no valid span gets ""
    and null odds ``inf``.

    ``nbest``, when given, receives per example id its ``n_best_size`` best candidates, best first, as
    ``nbest_predictions.json`` holds them: text, probability (softmax over the kept scores), start_logit,
    end_logit; for v2 the empty answer (the lowest CLS score) is one of them.
    """
    start_logits = np.asarray(start_logits)
    end_logits = np.asarray(end_logits)
    example_ids = list(features["example_id"])
    offset_maps = list(features["offset_mapping"])
    if not len(example_ids) == len(start_logits) == len(end_logits):
        raise SparseBertError(
            f"postprocess_predictions: {len(example_ids)} features but {len(start_logits)} start / "
            f"{len(end_logits)} end logit rows"
        )
    by_example: dict[str, list[int]] = collections.defaultdict(list)
    for i, eid in enumerate(example_ids):
        by_example[eid].append(i)

    predictions: dict[str, str] = {}
    null_odds: dict[str, float] = {}
    for ex in examples:
        context = ex["context"]
        best_score, best_text = -np.inf, ""
        null_score = np.inf
        null_logits = (0.0, 0.0)
        candidates: list[tuple[float, float, float, str]] = []  # score, start, end logit, text; for nbest
        for i in by_example.get(ex["id"], []):
            s_log, e_log, offsets = start_logits[i], end_logits[i], offset_maps[i]
            if float(s_log[0] + e_log[0]) < null_score:
                null_score, null_logits = float(s_log[0] + e_log[0]), (float(s_log[0]), float(e_log[0]))
            top_s = np.argsort(s_log)[::-1][:n_best_size]
            top_e = np.argsort(e_log)[::-1][:n_best_size]
            for s in top_s:
                for e in top_e:
                    if (
                        s >= len(offsets)
                        or e >= len(offsets)
                        or offsets[s] is None
                        or offsets[e] is None
                        or e < s
                        or e - s + 1 > max_answer_length
                    ):
                        continue
                    score = float(s_log[s] + e_log[e])
                    if nbest is not None:
                        candidates.append((score, float(s_log[s]), float(e_log[e]),
                                           context[offsets[s][0] : offsets[e][1]]))
                    if score > best_score:
                        best_score, best_text = score, context[offsets[s][0] : offsets[e][1]]
        if null_score == np.inf:
            raise SparseBertError(f"postprocess_predictions: example {ex['id']} has no features")
        odds = null_score - best_score
        null_odds[ex["id"]] = float(odds)
        predictions[ex["id"]] = "" if version_2 and odds > null_score_diff_threshold else best_text
        if nbest is not None:
            if version_2:
                candidates.append((null_score, *null_logits, ""))
            nbest[ex["id"]] = _nbest_entries(candidates, n_best_size)
    return predictions, null_odds


def _nbest_entries(candidates: list[tuple[float, float, float, str]], n: int) -> list[dict[str, Any]]:
    """The ``n`` best (score, start logit, end logit, text) candidates as n-best entries with probabilities."""
    kept = sorted(candidates, key=lambda c: c[0], reverse=True)[:n]
    if not kept:
        return [{"text": "", "probability": 1.0, "start_logit": 0.0, "end_logit": 0.0}]
    scores = np.array([c[0] for c in kept])
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    return [{"text": text, "probability": float(p), "start_logit": s, "end_logit": e}
            for (_, s, e, text), p in zip(kept, probs)]
