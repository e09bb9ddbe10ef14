"""``python run.py --runs``: every run the registry holds, one row each, with its headline metric."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

from sparsebert.config import PRETRAINING_TASKS
from sparsebert.results.registry import RunRecord

# the headline metric of a run: pretraining's eval loss, else the first of these a finetuning run reports
FINETUNE_HEADLINES = ("score", "f1", "accuracy", "matthews_corr")
COLUMNS = ("run", "experiment", "task", "seed", "status", "metric", "value", "wall_time", "started", "error")


def headline(rec: RunRecord) -> tuple[str, float | None]:
    """(metric name, value) shown for ``rec``; the value is None while the run has not reported it."""
    keys = ("eval_loss",) if rec.task in PRETRAINING_TASKS else FINETUNE_HEADLINES
    for key in keys:
        if key in rec.metrics:
            return key, rec.metrics[key]
    return keys[0], None


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _run_name(rec: RunRecord, root: Path) -> str:
    """The run directory relative to the output root where it is under it (what --export takes)."""
    try:
        return Path(rec.run_dir).relative_to(root.resolve()).as_posix()
    except ValueError:
        return rec.run_dir


def runs_table(records: Sequence[RunRecord], root: Path, fmt: str = "md") -> str:
    """The runs as a Markdown table (``fmt="md"``) or CSV (``"csv"``), oldest first.

    Args:
        records: registry rows (any status).
        root: the output root; run directories under it are shown relative to it.
        fmt: ``"md"`` or ``"csv"``.
    Returns:
        the table text (a header only when there are no runs).
    """
    rows = []
    for rec in records:
        metric, value = headline(rec)
        rows.append([_run_name(rec, root), rec.experiment, rec.task, str(rec.seed), rec.status, metric,
                     "" if value is None else f"{value:.4g}", _duration(rec.wall_time_s),
                     rec.created_at[:19].replace("T", " "), rec.error or ""])
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(COLUMNS)
        writer.writerows(rows)
        return out.getvalue().rstrip("\n")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)
