"""GAP metrics by hand and against scikit-learn; the Kaggle submission and the official scorer's system file."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, confusion_matrix, log_loss, precision_recall_fscore_support

from sparsebert.data.gap import GapExample
from sparsebert.errors import SparseBertError
from sparsebert.jobs.finetune.gap import gap_metrics, write_gap_system_file, write_kaggle_submission


def _raw_rows(path) -> list[list[str]]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def _ex(label: int, pronoun: str) -> GapExample:
    return GapExample("x", "", pronoun, 0, "A", 0, label == 0, "B", 0, label == 1, "")


def test_metrics_hand_values():
    examples = [_ex(0, "he"), _ex(1, "She"), _ex(2, "his"), _ex(0, "her")]
    probs = np.array([[0.5, 0.25, 0.25], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.0, 1.0, 0.0]])
    m = gap_metrics(probs, examples)
    assert m["accuracy"] == 0.5
    # pairs (pred, gold): 1:(A,A) 2:(A,B) 3:(-,-) 4:(B,A) → 1 TP, 3 predicted, 3 gold
    assert (
        math.isclose(m["precision"], 1 / 3)
        and math.isclose(m["recall"], 1 / 3)
        and math.isclose(m["f1"], 1 / 3)
    )
    assert m["f1_masculine"] == 1.0 and m["f1_feminine"] == 0.0 and m["bias"] == 0.0
    clipped_zero = -math.log(1e-15 / (1 + 1e-15))  # row 4: gold A has probability 0 → clipped, renormalized
    expect = (-math.log(0.5) - math.log(0.3) - math.log(0.6) + clipped_zero) / 4
    assert math.isclose(m["log_loss"], expect, rel_tol=1e-9)
    assert math.isnan(gap_metrics(probs[[0, 2]], [_ex(1, "he"), _ex(0, "his")])["bias"])
    # gold A predicted A, gold B predicted A, gold Neither predicted Neither, gold A predicted B
    assert m["confusion_matrix"] == [[1, 1, 0], [1, 0, 0], [0, 0, 1]]


def test_metrics_match_sklearn(gap_dev):
    rng = np.random.default_rng(0)
    probs = rng.dirichlet([1.0, 1.0, 1.0], size=len(gap_dev))
    labels = np.array([ex.label for ex in gap_dev])
    probs[labels == 0] += [0.5, 0, 0]  # a better-than-chance system
    probs /= probs.sum(axis=1, keepdims=True)
    m = gap_metrics(probs, gap_dev)
    pred = probs.argmax(axis=1)
    assert math.isclose(m["accuracy"], accuracy_score(labels, pred))
    assert m["confusion_matrix"] == confusion_matrix(labels, pred, labels=[0, 1, 2]).tolist()
    assert math.isclose(m["log_loss"], log_loss(labels, probs, labels=[0, 1, 2]), rel_tol=1e-9)

    def prf(rows):
        gold = np.concatenate([labels[rows] == 0, labels[rows] == 1])
        guess = np.concatenate([pred[rows] == 0, pred[rows] == 1])
        return precision_recall_fscore_support(gold, guess, average="binary")[:3]

    everyone = np.ones(len(gap_dev), bool)
    male = np.array([ex.pronoun.lower() in ("he", "him", "his") for ex in gap_dev])
    assert np.allclose([m["precision"], m["recall"], m["f1"]], prf(everyone))
    assert math.isclose(m["f1_masculine"], prf(male)[2])
    assert math.isclose(m["f1_feminine"], prf(~male)[2])
    assert math.isclose(m["bias"], prf(~male)[2] / prf(male)[2])
    with pytest.raises(SparseBertError, match="shape"):
        gap_metrics(probs[:, :2], gap_dev)


def test_writers_exact_format(tmp_path, gap_val, data_dir):
    probs = np.array([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7], [0.2, 0.7, 0.1]])
    write_kaggle_submission(tmp_path / "sub.csv", ["validation-1", "validation-2", "validation-3"], probs)
    assert (tmp_path / "sub.csv").read_text(encoding="utf-8") == (
        "ID,A,B,NEITHER\nvalidation-1,0.5,0.25,0.25\nvalidation-2,0.1,0.2,0.7\nvalidation-3,0.2,0.7,0.1\n"
    )
    write_gap_system_file(tmp_path / "sys.tsv", ["a", "b", "c"], probs)
    assert (tmp_path / "sys.tsv").read_text(
        encoding="utf-8"
    ) == "a\tTRUE\tFALSE\nb\tFALSE\tFALSE\nc\tFALSE\tTRUE\n"
    # one-hot gold probabilities reproduce the gold columns of the real file
    gold = np.eye(3)[[ex.label for ex in gap_val]]
    write_gap_system_file(tmp_path / "gold.tsv", [ex.id for ex in gap_val], gold)
    rows = [r.split("\t") for r in (tmp_path / "gold.tsv").read_text(encoding="utf-8").splitlines()]
    raw = _raw_rows(data_dir / "gap" / "gap-validation.tsv")[1:]
    assert rows == [[r[0], r[6], r[9]] for r in raw]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gold.tsv", "sub.csv", "sys.tsv"]  # no temp files
    with pytest.raises(SparseBertError):
        write_kaggle_submission(tmp_path / "bad.csv", ["only-one"], probs)
