"""GLUE metrics against scikit-learn / scipy and by hand; the leaderboard submission files."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from sparsebert.errors import SparseBertError
from sparsebert.jobs.finetune.glue import (
    glue_leaderboard_filename,
    glue_metrics,
    write_glue_test_predictions,
)
from sparsebert.jobs.finetune.job import summarize


def test_metrics_cola_against_sklearn_and_by_hand():
    y = [1, 1, 1, 0, 0, 1, 0, 1]
    p = [1, 0, 1, 0, 1, 1, 0, 1]
    m = glue_metrics("cola", p, y)
    assert m["matthews_corr"] == pytest.approx(matthews_corrcoef(y, p))
    # tp=4 tn=2 fp=1 fn=1: (4*2 - 1*1) / sqrt(5*5*3*3)
    assert m["matthews_corr"] == pytest.approx(7 / 15)
    assert m["score"] == m["matthews_corr"] and set(m) == {"matthews_corr", "score"}


def test_metrics_mrpc_f1_accuracy():
    y = np.array([1, 1, 1, 0, 0, 1, 0, 1, 0, 0])
    p = np.array([1, 0, 1, 0, 1, 1, 1, 1, 0, 0])
    m = glue_metrics("mrpc", p, y)
    # tp=4 fp=2 fn=1 -> precision 2/3, recall 4/5, f1 = 8/11
    assert m["f1"] == pytest.approx(8 / 11) == f1_score(y, p)
    assert m["accuracy"] == pytest.approx(0.7) == accuracy_score(y, p)
    assert m["score"] == pytest.approx((8 / 11 + 0.7) / 2)
    # logits are reduced to class ids
    logits = np.stack([-p, p], axis=1).astype(float)
    assert glue_metrics("qqp", logits, y) == m


def test_metrics_stsb():
    y = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    p = y ** 2  # monotonic but not linear
    m = glue_metrics("stsb", p, y)
    assert m["spearman"] == pytest.approx(1.0)
    assert m["pearson"] == pytest.approx(pearsonr(p, y)[0]) and m["pearson"] < 0.99
    assert m["score"] == pytest.approx((m["pearson"] + 1.0) / 2)
    noisy = [0.5, 0.2, 2.5, 2.9, 4.8, 4.0]
    m2 = glue_metrics("stsb", np.array(noisy)[:, None], y)  # (n, 1) regression outputs
    assert m2["spearman"] == pytest.approx(spearmanr(noisy, y)[0])
    assert m2["spearman"] == pytest.approx(1 - 6 * 4 / (6 * 35))  # two swapped neighbours: sum d^2 = 4


def test_metrics_accuracy_tasks():
    for task in ("sst2", "mnli", "qnli", "rte", "wnli"):
        m = glue_metrics(task, [0, 1, 1, 0], [0, 1, 0, 0])
        assert m == {"accuracy": 0.75, "score": 0.75}
    with pytest.raises(ValueError):
        glue_metrics("rte", [0, 1], [0, 1, 1])


def test_leaderboard_files(tmp_path):
    assert [glue_leaderboard_filename(t) for t in ("cola", "sst2", "mrpc", "stsb", "qqp", "qnli", "rte", "wnli")] \
        == ["CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "QNLI.tsv", "RTE.tsv", "WNLI.tsv"]
    assert glue_leaderboard_filename("mnli", "test_matched") == "MNLI-m.tsv"
    assert glue_leaderboard_filename("mnli", "test_mismatched") == "MNLI-mm.tsv"
    with pytest.raises(SparseBertError):
        glue_leaderboard_filename("mnli")

    write_glue_test_predictions("rte", [0, 1, 2], [1, 0, 0], tmp_path / "RTE.tsv")
    assert (tmp_path / "RTE.tsv").read_text() == (
        "index\tprediction\n0\tnot_entailment\n1\tentailment\n2\tentailment\n")
    write_glue_test_predictions("mnli", [5, 6], np.array([2, 1]), tmp_path / "MNLI-m.tsv")
    assert (tmp_path / "MNLI-m.tsv").read_text() == "index\tprediction\n5\tcontradiction\n6\tneutral\n"
    write_glue_test_predictions("cola", [0, 1], [1, 0], tmp_path / "CoLA.tsv")
    assert (tmp_path / "CoLA.tsv").read_text() == "index\tprediction\n0\t1\n1\t0\n"
    write_glue_test_predictions("stsb", [0, 1, 2], [3.14159, -0.2, 5.4], tmp_path / "STS-B.tsv")
    assert (tmp_path / "STS-B.tsv").read_text() == "index\tprediction\n0\t3.142\n1\t0.000\n2\t5.000\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["CoLA.tsv", "MNLI-m.tsv", "RTE.tsv", "STS-B.tsv"]
    with pytest.raises(ValueError):
        write_glue_test_predictions("rte", [0], [2], tmp_path / "bad.tsv")


def test_summary_keeps_a_collapsed_stsb_seed_visible():
    # constant predictions (a model that collapsed at a high learning rate) have no correlation: scipy gives NaN,
    # and the task summary of the job used to end in an AttributeError from statistics.stdev
    y = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    with pytest.warns(Warning):  # scipy's ConstantInputWarning
        collapsed = glue_metrics("stsb", np.full(6, 2.5), y)
    good = glue_metrics("stsb", y ** 2, y)
    assert np.isnan(collapsed["pearson"]) and np.isnan(collapsed["score"])
    summary = summarize([good, collapsed])
    assert summary["runs"] == 2
    assert np.isnan(summary["pearson"]["mean"]) and np.isnan(summary["pearson"]["std"])
    assert summary["pearson"]["max"] == good["pearson"]
    assert summarize([good, good])["score"] == {"mean": good["score"], "std": 0.0, "max": good["score"]}
