"""What a finished ``tiny_glue`` run leaves, checked the same way on the real data and on the test assets."""

from __future__ import annotations

import csv
import json
from pathlib import Path


def check_tiny_glue_outputs(root: Path, eval_rows: int) -> None:
    """Runs rte 0-1 and stsb 0 are finished, with plausible metrics and ``eval_rows`` RTE dev predictions."""
    runs = sorted(p.relative_to(root).as_posix() for p in root.glob("*/run*") if (p / "DONE").is_file())
    assert runs == ["glue_rte/run0", "glue_rte/run1", "glue_stsb/run0"]
    rte = json.loads((root / "glue_rte/run0/metrics.json").read_text())
    assert 0.0 <= rte["accuracy"] <= 1.0 and rte["score"] == rte["accuracy"]
    stsb = json.loads((root / "glue_stsb/run0/metrics.json").read_text())
    assert {"pearson", "spearman", "score"} <= set(stsb)
    with open(root / "glue_rte/run0/predictions_dev.tsv") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["index", "prediction", "label"] and len(rows) == 1 + eval_rows
