"""``python run.py --runs``: every run the registry holds, one row each, with its headline metric."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sparsebert.config import PRETRAINING_TASKS
from sparsebert.console import duration
from sparsebert.errors import SparseBertError
from sparsebert.results.glue_table import FORMATS, csv_table, latex_tabular, markdown_table
from sparsebert.results.run_registry import RunRecord

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


def _run_name(rec: RunRecord, root: Path) -> str:
    """The run directory relative to the output root where it is under it (what --export takes)."""
    try:
        return Path(rec.run_dir).relative_to(root.resolve()).as_posix()
    except ValueError:
        return rec.run_dir


def runs_table(records: Sequence[RunRecord], root: Path, fmt: str = "md") -> str:
    """The runs as a Markdown table (``fmt="md"``), CSV (``"csv"``) or a LaTeX tabular (``"latex"``), oldest first.

    Args:
        records: registry rows (any status).
        root: the output root; run directories under it are shown relative to it.
        fmt: ``"md"``, ``"csv"`` or ``"latex"``.
    Returns:
        the table text (a header only when there are no runs).
    """
    if fmt not in FORMATS:
        raise SparseBertError(f"unknown table format {fmt!r}: use one of {', '.join(FORMATS)}")
    rows = []
    for rec in records:
        metric, value = headline(rec)
        rows.append([_run_name(rec, root), rec.experiment, rec.task, str(rec.seed), rec.status, metric,
                     "" if value is None else f"{value:.4g}",
                     "" if rec.wall_time_s is None else duration(rec.wall_time_s),
                     rec.created_at[:19].replace("T", " "), rec.error or ""])
    if fmt == "csv":
        return csv_table(COLUMNS, rows).rstrip("\n")
    if fmt == "latex":
        return latex_tabular(COLUMNS, rows, column_format="lllrllrrll").rstrip("\n")
    return markdown_table(COLUMNS, rows, align_first_left=False)
