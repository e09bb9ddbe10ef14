"""What a finished ``tiny_glue`` run leaves, checked the same way on the real data and on the test assets."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from sparsebert.data.glue import read_glue_split


def dev_predictions(run_dir: Path) -> dict[int, tuple[float, float]]:
    """``predictions_dev.tsv`` of one run: dev index -> (prediction, label)."""
    with open(run_dir / "predictions_dev.tsv") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["index", "prediction", "label"]
    return {int(i): (float(p), float(y)) for i, p, y in rows[1:]}


def check_tiny_glue_outputs(root: Path, eval_rows: int, data_dir: Path) -> None:
    """Runs rte 0-1 and stsb 0 are finished; each run's dev predictions carry the dev file's labels of ``eval_rows``
    rows, and its metrics are those of its predictions."""
    runs = sorted(p.relative_to(root).as_posix() for p in root.glob("*/run*") if (p / "DONE").is_file())
    assert runs == ["glue_rte/run0", "glue_rte/run1", "glue_stsb/run0"]
    for task in ("rte", "stsb"):
        predicted = dev_predictions(root / f"glue_{task}/run0")
        gold = {row["idx"]: float(row["label"]) for row in read_glue_split(data_dir, task, "dev")}
        assert len(predicted) == eval_rows
        # STS-B's labels pass through float32
        assert [y for _, y in predicted.values()] == pytest.approx([gold[i] for i in predicted], rel=1e-6)

    rte = json.loads((root / "glue_rte/run0/metrics.json").read_text())
    pairs = dev_predictions(root / "glue_rte/run0").values()
    assert rte["accuracy"] == pytest.approx(sum(p == y for p, y in pairs) / eval_rows)
    assert rte["score"] == rte["accuracy"]
    # (STS-B's correlations are not recomputed here: the file rounds predictions to 4 decimals, and a model of two
    # optimizer steps predicts nearly one value, whose correlation that rounding changes)
    stsb = json.loads((root / "glue_stsb/run0/metrics.json").read_text())
    assert -1 <= stsb["pearson"] <= 1 and stsb["score"] == pytest.approx((stsb["pearson"] + stsb["spearman"]) / 2)
