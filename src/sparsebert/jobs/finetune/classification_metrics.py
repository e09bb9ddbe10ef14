"""Metrics and a confusion-matrix plot for single-label classification (CSV tasks, GLUE diagnostics)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sparsebert.io import atomic_path

log = logging.getLogger(__name__)


def classification_metrics(y_true: Any, y_pred: Any, num_labels: int) -> dict[str, Any]:
    """accuracy, macro precision/recall/f1, mcc and the confusion matrix (rows = truth, columns = prediction).

    With two classes, ``precision_binary``/``recall_binary``/``f1_binary`` are the positive-class (id 1)
    values as well. Macro averages run over the classes present in either array; classes absent from both
    still get a row and a column, so the matrix is always ``num_labels`` x ``num_labels``.
    """
    from sklearn.metrics import (
        accuracy_score,
        confusion_matrix,
        matthews_corrcoef,
        precision_recall_fscore_support,
    )

    y_true = np.asarray(y_true, dtype=np.int64).reshape(-1)
    y_pred = np.asarray(y_pred, dtype=np.int64).reshape(-1)
    if y_true.shape != y_pred.shape:
        raise ValueError(f"{y_pred.size} predictions for {y_true.size} labels")
    labels = list(range(num_labels))
    # macro averages over the classes that occur (in truth or predictions), as scikit-learn does by default: a
    # class with no test rows (a stratified split keeps a rare one in train) would otherwise count as 0
    present = np.union1d(y_true, y_pred).tolist()
    precision, recall, f1, _ = precision_recall_fscore_support(
        y_true, y_pred, labels=present, average="macro", zero_division=0
    )
    out: dict[str, Any] = {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "precision": float(precision),
        "recall": float(recall),
        "f1": float(f1),
    }
    if num_labels == 2:
        p, r, f, _ = precision_recall_fscore_support(
            y_true, y_pred, labels=labels, pos_label=1, average="binary", zero_division=0
        )
        out.update(precision_binary=float(p), recall_binary=float(r), f1_binary=float(f))
    out["mcc"] = float(matthews_corrcoef(y_true, y_pred))
    out["confusion_matrix"] = confusion_matrix(y_true, y_pred, labels=labels).tolist()
    return out


def plot_confusion_matrix(cm: Sequence[Sequence[int]], label_names: Sequence[str], path: str | Path) -> None:
    """Save a confusion-matrix heat map with counts; the format follows the file extension (png, pdf, svg).

    matplotlib is an optional extra: without it, one warning says the plot was skipped and nothing is written
    (the metrics hold the same matrix), so a GAP/CSV run still finishes."""
    # Figure + Agg canvas directly, not pyplot: no global backend switch and no figure left open.
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        log.warning("matplotlib is not installed: %s skipped (pip install matplotlib to get it)", Path(path).name)
        return

    m = np.asarray(cm)
    n = len(label_names)
    if m.shape != (n, n):
        raise ValueError(f"confusion matrix of shape {m.shape} for {n} label names")
    size = 2.0 + 0.6 * n
    fig = Figure(figsize=(size, size))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    im = ax.imshow(m, cmap="Blues")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set(xticks=range(n), yticks=range(n), xlabel="predicted", ylabel="true")
    ax.set_xticklabels(label_names, rotation=45, ha="right")
    ax.set_yticklabels(label_names)
    threshold = m.max() / 2 if m.size else 0
    for i in range(n):
        for j in range(n):
            ax.text(j, i, str(m[i, j]), ha="center", va="center",
                    color="white" if m[i, j] > threshold else "black")
    fig.tight_layout()

    path = Path(path)
    # a temp file with the same suffix, so savefig picks the format; the rename makes the write atomic
    with atomic_path(path, suffix=path.suffix or ".png") as tmp:
        fig.savefig(tmp, format=(path.suffix.lstrip(".") or "png"))
