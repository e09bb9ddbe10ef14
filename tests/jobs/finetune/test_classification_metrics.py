"""classification_metrics against scikit-learn and hand-computed values; the confusion-matrix plot."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import f1_score, matthews_corrcoef, precision_score, recall_score

from sparsebert.jobs.finetune.classification_metrics import classification_metrics, plot_confusion_matrix


def test_binary_by_hand():
    y = [1, 1, 1, 0, 0, 1, 0, 1, 0, 0]
    p = [1, 0, 1, 0, 1, 1, 1, 1, 0, 0]
    m = classification_metrics(y, p, num_labels=2)
    # tp=4 fn=1 fp=2 tn=3
    assert m["confusion_matrix"] == [[3, 2], [1, 4]]
    assert m["accuracy"] == pytest.approx(0.7)
    assert m["precision_binary"] == pytest.approx(4 / 6)
    assert m["recall_binary"] == pytest.approx(4 / 5)
    assert m["f1_binary"] == pytest.approx(8 / 11)
    # class 0: precision 3/4, recall 3/5, f1 2/3
    assert m["precision"] == pytest.approx((3 / 4 + 4 / 6) / 2)
    assert m["recall"] == pytest.approx((3 / 5 + 4 / 5) / 2)
    assert m["f1"] == pytest.approx((2 / 3 + 8 / 11) / 2)
    assert m["mcc"] == pytest.approx((4 * 3 - 2 * 1) / np.sqrt(6 * 5 * 5 * 4))


def test_multiclass_against_sklearn():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, size=200)
    p = np.where(rng.random(200) < 0.6, y, rng.integers(0, 4, size=200))
    m = classification_metrics(y, p, num_labels=4)
    assert m["precision"] == pytest.approx(precision_score(y, p, average="macro"))
    assert m["recall"] == pytest.approx(recall_score(y, p, average="macro"))
    assert m["f1"] == pytest.approx(f1_score(y, p, average="macro"))
    assert m["mcc"] == pytest.approx(matthews_corrcoef(y, p))
    assert "f1_binary" not in m
    cm = np.array(m["confusion_matrix"])
    assert cm.sum() == 200 and np.trace(cm) == int((y == p).sum())
    assert (cm.sum(axis=1) == np.bincount(y, minlength=4)).all()  # rows are the truth


def test_absent_class_keeps_matrix_shape():
    m = classification_metrics([0, 0, 1], [0, 1, 1], num_labels=3)
    assert m["confusion_matrix"] == [[1, 1, 0], [0, 1, 0], [0, 0, 0]]
    # class 2 has no support and no predictions: the macro averages leave it out (scikit-learn's default)
    assert m["f1"] == pytest.approx((2 / 3 + 2 / 3) / 2)
    perfect = classification_metrics([0, 0, 1, 1], [0, 0, 1, 1], num_labels=3)
    assert perfect["f1"] == perfect["precision"] == perfect["recall"] == perfect["accuracy"] == 1.0
    with pytest.raises(ValueError):
        classification_metrics([0, 1], [0], num_labels=2)


def test_plot_confusion_matrix(tmp_path):
    path = tmp_path / "plots" / "cm.png"
    plot_confusion_matrix([[3, 2], [1, 4]], ["negative", "positive"], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["cm.png"]  # no temp file left behind
    svg = tmp_path / "cm.svg"
    plot_confusion_matrix(np.eye(3, dtype=int), ["a", "b", "c"], svg)
    assert "<svg" in svg.read_text()
    with pytest.raises(ValueError):
        plot_confusion_matrix([[1, 0], [0, 1]], ["a", "b", "c"], tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


def test_without_matplotlib_the_plot_is_skipped_with_one_warning(tmp_path, monkeypatch, caplog):
    import sys

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] or ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # import matplotlib... raises ImportError
    with caplog.at_level("WARNING"):
        plot_confusion_matrix([[1, 0], [0, 1]], ["a", "b"], tmp_path / "confusion_matrix.png")
    assert not list(tmp_path.iterdir())
    assert [r.getMessage() for r in caplog.records] == [
        "matplotlib is not installed: confusion_matrix.png skipped (pip install matplotlib to get it)"]


def test_gap_and_csv_runs_import_matplotlib_only_to_plot():
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[3] / "src")
    code = (f"import sys; sys.path.insert(0, {src!r}); import sparsebert.jobs.finetune.gap, sparsebert.jobs.finetune.csv_task; "
            "print(sorted(m for m in sys.modules if m.startswith('matplotlib')))")
    # without WANDB_MODE, which an earlier test's training_arguments may have left set (transformers then prints
    # "Running in WANDB offline mode" on import)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
