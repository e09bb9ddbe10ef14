"""SQuAD metrics as the official v1.1 / v2.0 scripts compute them; the predictions JSON."""

from __future__ import annotations

import json
import math

from sparsebert.jobs.finetune.squad import (
    best_null_thresholds,
    normalize_answer,
    squad_metrics,
    write_predictions_json,
)


def test_normalize_answer():
    assert normalize_answer("  The  Denver-Broncos!! ") == "denverbroncos"
    assert normalize_answer("An apple, a pear and THE plum.") == "apple pear and plum"
    assert normalize_answer("theatre anthem") == "theatre anthem"  # articles only as whole words


def _ex(qid: str, *golds: str) -> dict:
    return {"id": qid, "answers": {"text": list(golds), "answer_start": [0] * len(golds)}}


def test_squad_metrics_hand_computed():
    examples = [
        _ex("a", "Denver Broncos"),  # exact after normalization
        _ex("b", "Denver Broncos"),  # partial: P = 1/2, R = 1/2 → F1 = 0.5
        _ex("c", "Carolina Panthers", "the Panthers"),  # max over golds: exact via 2nd
        _ex("d"),  # unanswerable, predicted "" → 1
        _ex("e"),  # unanswerable, answered → 0
        _ex("f", "Santa Clara"),  # answerable, predicted "" → 0
    ]
    preds = {"a": "the denver broncos.", "b": "Broncos team", "c": "Panthers", "d": "", "e": "Levi", "f": ""}
    m = squad_metrics(examples, preds, version_2=True)
    assert m["total"] == 6 and m["HasAns_total"] == 4 and m["NoAns_total"] == 2
    assert math.isclose(m["exact"], 100 * 3 / 6)
    assert math.isclose(m["f1"], 100 * (1 + 0.5 + 1 + 1 + 0 + 0) / 6)
    assert math.isclose(m["HasAns_exact"], 100 * 2 / 4)
    assert math.isclose(m["HasAns_f1"], 100 * 2.5 / 4)
    assert m["NoAns_exact"] == m["NoAns_f1"] == 50.0

    v1 = squad_metrics(examples[:3], {"a": "Denver", "b": "Mile High Denver", "c": "x"}, version_2=False)
    # a: P=1 R=1/2 → 2/3; b: P=1/3 R=1/2 → 0.4; c: 0
    assert set(v1) == {"exact", "f1", "total"}
    assert v1["exact"] == 0.0
    assert math.isclose(v1["f1"], 100 * (2 / 3 + 0.4) / 3)


def test_v1_keeps_gold_answers_that_normalize_to_empty_as_the_official_script_does():
    # dev-v1.1 has golds like "." : v1.1's script keeps them (a "." prediction is exact), v2's drops them
    ex = [_ex("p", ".")]
    assert squad_metrics(ex, {"p": "."}, version_2=False)["exact"] == 100.0
    assert squad_metrics(ex, {"p": "."}, version_2=True)["exact"] == 100.0  # both normalize to ""
    assert squad_metrics(ex, {"p": "x"}, version_2=False)["exact"] == 0.0
    # F1 differs: v1.1's script counts common tokens only (none here: 0); v2's rewards "no answer" for "no answer"
    assert squad_metrics(ex, {"p": "the"}, version_2=False)["f1"] == 0.0
    assert squad_metrics(ex, {"p": "the"}, version_2=True)["f1"] == 100.0


def test_missing_prediction_scores_zero():
    m = squad_metrics([_ex("a", "x"), _ex("b", "y")], {"a": "x"}, version_2=False)
    assert m == {"exact": 50.0, "f1": 50.0, "total": 2}


def test_write_predictions_json(tmp_path):
    path = tmp_path / "out" / "predictions.json"
    write_predictions_json(path, {"q1": "Denver Broncos", "q2": ""})
    assert json.loads(path.read_text(encoding="utf-8")) == {"q1": "Denver Broncos", "q2": ""}
    assert [p.name for p in path.parent.iterdir()] == ["predictions.json"]  # no temp file left behind


def test_best_null_thresholds_as_the_official_v2_script():
    def ex(qid, answer):
        return {"id": qid, "answers": {"text": [answer] if answer else [], "answer_start": []}}

    examples = [ex("q1", "cat"), ex("q2", None), ex("q3", "fish"), ex("q4", None)]
    spans = {"q1": "cat", "q2": "dog", "q3": "the fish!", "q4": "bird"}
    odds = {"q1": -2.0, "q2": 1.0, "q3": 3.0, "q4": 5.0}
    best = best_null_thresholds(examples, spans, odds)
    # answering only q1 (odds <= -2): 3 of 4 right; answering q1..q3 is 3 of 4 too, but not better
    assert best == {"best_exact": 75.0, "best_exact_thresh": -2.0, "best_f1": 75.0, "best_f1_thresh": -2.0}
    at_best = {q: "" if odds[q] > best["best_exact_thresh"] else spans[q] for q in spans}
    assert squad_metrics(examples, at_best, version_2=True)["exact"] == best["best_exact"]
    spans["q2"] = ""  # no span for q2 (stays ""): answering q1..q3 gets all 4 right
    again = best_null_thresholds(examples, spans, odds)
    assert (again["best_exact"], again["best_exact_thresh"]) == (100.0, 3.0)
