"""The GLUE results table: one row per experiment group, one column per GLUE task plus averages.

Columns, in order: ``model`` (the row's group label), ``average_bert``, ``average_glue``, the nine tasks
``cola mnli mrpc qnli qqp rte sst2 stsb wnli``, ``perplexity`` and ``mlm_eval_loss``.

What goes into a row
    Only finished (``status == "done"``) records whose task is ``glue:<name>`` with a known GLUE name count;
    other records (mlm, squad, failed runs, ``glue:ax``, ...) are ignored, and a group with no such record
    has no row.  Rows keep the order in which their group first appears in ``records``.

Cells
    Metrics are fractions; cells show them x100 with one decimal.  Single-metric tasks show one number
    (cola: Matthews corr., qnli/rte/sst2/wnli: accuracy); pair tasks show ``a/b``: mnli ``m/mm``, mrpc and
    qqp ``f1/acc``, stsb ``pearson/spearman``.  Each task's leaderboard number is ``metrics["score"]``, or
    the mean of the shown pair when a record has no ``score``; the averages use it.  Missing task: ``-``.

Several runs (seeds) of one task in a group
    ``agg="max"``: the run with the best score is shown whole (its pair values stay together, rather than
        mixing the best f1 of one seed with the best accuracy of another).
    ``agg="mean"``: every shown value and the score are averaged over the runs (a run that scored NaN, a
        collapsed one, makes the cell ``nan``; ``max`` never picks such a run).  Single-metric cells with two
        or more runs show ``mean±std`` (sample std of the score); pair cells show only the means, because
        ``88.1±0.3/84.0±0.5`` is no longer readable.

Averages
    ``average_bert`` is the mean score over the present tasks except WNLI, ``average_glue`` over all present
    tasks. Both average each task's leaderboard score (pair tasks: the mean of the pair, MNLI as one task), so
    ``average_bert`` is not the 9-number average of the BERT paper's table (MNLI-m and -mm apart, F1 for MRPC
    and QQP, Spearman for STS-B); it follows the paper only in leaving WNLI out.  Since tasks may be missing, the output says which tasks each average covers (one line when all
    rows cover the same tasks, else one line per row).  Averages use unrounded scores, so they can differ
    in the last digit from an average of the printed cells.

perplexity / mlm_eval_loss
    ``pretrain_metrics["perplexity"]`` and ``pretrain_metrics["eval_loss"]`` of the pretrained model the
    group's runs started from (2 and 3 decimals); the mean over the group's records that carry them
    (normally they all started from the same model and agree).  ``-`` when absent.

Formats
    ``md``: GitHub markdown table, columns padded so the raw text is readable, coverage notes under it.
    ``csv``: one value per column for machine reading: pair tasks are split into two columns
        (``mnli_m, mnli_mm, mrpc_f1, mrpc_acc, qqp_f1, qqp_acc, stsb_pearson, stsb_spearman``), numbers
        formatted as in md but without ``±std``, missing values are empty cells, and the coverage is in
        two extra columns ``average_bert_tasks`` / ``average_glue_tasks`` (task names joined by spaces).
    ``latex``: a ``tabular`` (no package needed) with LaTeX special characters escaped and the coverage
        notes as full-width rows at the bottom.

Rendering: md and csv through pandas (``to_markdown``: tabulate's "pipe" format; ``to_csv``). LaTeX is ours:
pandas' ``to_latex`` draws booktabs rules (a package the document must load) and has no full-width note rows.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sparsebert.errors import SparseBertError
from sparsebert.results.run_registry import RunRecord
from sparsebert.results.stats import sample_std

TASKS = ("cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb", "wnli")

# The metrics a cell shows, in display order (one key, or a pair shown "a/b").
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews_corr",),
    "mnli": ("accuracy_matched", "accuracy_mismatched"),
    "mrpc": ("f1", "accuracy"),
    "qnli": ("accuracy",),
    "qqp": ("f1", "accuracy"),
    "rte": ("accuracy",),
    "sst2": ("accuracy",),
    "stsb": ("pearson", "spearman"),
    "wnli": ("accuracy",),
}
# CSV column suffixes of the pair tasks, matching TASK_METRICS order.
CSV_PAIR_SUFFIXES: dict[str, tuple[str, str]] = {
    "mnli": ("m", "mm"),
    "mrpc": ("f1", "acc"),
    "qqp": ("f1", "acc"),
    "stsb": ("pearson", "spearman"),
}
BERT_EXCLUDED = frozenset({"wnli"})  # the BERT paper's GLUE average leaves WNLI out
COLUMNS = ("model", "average_bert", "average_glue", *TASKS, "perplexity", "mlm_eval_loss")
AGGREGATIONS = ("max", "mean")
FORMATS = ("md", "csv", "latex")
MISSING = "-"


@dataclass
class _Cell:
    """One task of one group, aggregated over its runs."""

    values: tuple[float | None, ...]  # the shown metrics, in TASK_METRICS order (fractions)
    score: float
    score_std: float | None  # sample std of the score over runs (agg="mean" with >= 2 runs only)
    n_runs: int


@dataclass
class _Row:
    label: str
    cells: dict[str, _Cell]
    perplexity: float | None
    eval_loss: float | None

    @property
    def glue_tasks(self) -> list[str]:
        return [t for t in TASKS if t in self.cells]

    @property
    def bert_tasks(self) -> list[str]:
        return [t for t in self.glue_tasks if t not in BERT_EXCLUDED]

    def average(self, tasks: Sequence[str]) -> float | None:
        return statistics.fmean(self.cells[t].score for t in tasks) if tasks else None


def glue_table(records: list[RunRecord], agg: str = "max", fmt: str = "md") -> str:
    """Render the GLUE table of ``records`` (see the module docstring for every rule)."""
    if agg not in AGGREGATIONS:
        raise SparseBertError(f"unknown aggregation {agg!r}: use one of {', '.join(AGGREGATIONS)}")
    if fmt not in FORMATS:
        raise SparseBertError(f"unknown table format {fmt!r}: use one of {', '.join(FORMATS)}")
    rows = _build_rows(records, agg)
    if fmt == "csv":
        return _render_csv(rows)
    notes = _notes(rows, agg)
    return _render_md(rows, notes) if fmt == "md" else _render_latex(rows, notes)


# -- aggregation ---------------------------------------------------------------------------------------


def _glue_task(rec: RunRecord) -> str | None:
    prefix, _, name = rec.task.partition(":")
    name = name.lower()
    return name if prefix == "glue" and name in TASK_METRICS else None


def _run_values(rec: RunRecord, task: str) -> tuple[tuple[float | None, ...], float]:
    """A record's shown metrics and its score (falling back to the mean of the shown metrics)."""
    values = tuple(rec.metrics.get(key) for key in TASK_METRICS[task])
    score = rec.metrics.get("score")
    if score is None:
        missing = [key for key, v in zip(TASK_METRICS[task], values) if v is None]
        if missing:
            raise SparseBertError(
                f"run {rec.run_dir} ({rec.task}) has neither metrics['score'] nor {', '.join(missing)}: "
                "cannot place it in the GLUE table"
            )
        score = statistics.fmean(v for v in values if v is not None)
    return values, score


def _aggregate(runs: list[tuple[tuple[float | None, ...], float]], agg: str) -> _Cell:
    if agg == "max":
        # first run wins a tie; a NaN score (a collapsed run: constant STS-B predictions have no correlation)
        # never wins, since max() would keep a NaN that comes first against every later number
        values, score = max(runs, key=lambda run: (not math.isnan(run[1]), run[1]))
        return _Cell(values, score, None, len(runs))
    scores = [score for _, score in runs]
    means: list[float | None] = []
    for i in range(len(runs[0][0])):
        present = [values[i] for values, _ in runs if values[i] is not None]
        means.append(statistics.fmean(present) if present else None)
    # a NaN score (a collapsed run) makes the cell's mean and std NaN, shown as "nan"
    std = sample_std(scores) if len(scores) >= 2 else None
    return _Cell(tuple(means), statistics.fmean(scores), std, len(runs))


def _build_rows(records: list[RunRecord], agg: str) -> list[_Row]:
    groups: dict[str, list[tuple[str, RunRecord]]] = {}  # insertion order = first appearance
    for rec in records:
        task = _glue_task(rec)
        if task is not None and rec.status == "done":
            groups.setdefault(rec.label, []).append((task, rec))
    rows = []
    for label, members in groups.items():
        by_task: dict[str, list[tuple[tuple[float | None, ...], float]]] = {}
        for task, rec in members:
            by_task.setdefault(task, []).append(_run_values(rec, task))
        cells = {task: _aggregate(runs, agg) for task, runs in by_task.items()}
        recs = [rec for _, rec in members]
        rows.append(_Row(label, cells, _pretrain_mean(recs, "perplexity"), _pretrain_mean(recs, "eval_loss")))
    return rows


def _pretrain_mean(records: list[RunRecord], key: str) -> float | None:
    values = [rec.pretrain_metrics[key] for rec in records if rec.pretrain_metrics.get(key) is not None]
    return statistics.fmean(values) if values else None


# -- formatting ----------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    if x is None:
        return MISSING
    text = f"{x * 100:.1f}"
    return "0.0" if text == "-0.0" else text  # a tiny negative Matthews corr. should not print as -0.0


def _num(x: float | None, decimals: int) -> str:
    return MISSING if x is None else f"{x:.{decimals}f}"


def _cell_text(cell: _Cell | None, pm: str) -> str:
    if cell is None:
        return MISSING
    text = "/".join(_pct(v) for v in cell.values)
    if cell.score_std is not None and len(cell.values) == 1:
        text += f"{pm}{_pct(cell.score_std)}"
    return text


def _row_texts(row: _Row, pm: str) -> list[str]:
    return [
        row.label,
        _pct(row.average(row.bert_tasks)),
        _pct(row.average(row.glue_tasks)),
        *(_cell_text(row.cells.get(task), pm) for task in TASKS),
        _num(row.perplexity, 2),
        _num(row.eval_loss, 3),
    ]


def _task_list(tasks: list[str]) -> str:
    if not tasks:
        return "none (0 tasks)"
    return f"{', '.join(tasks)} ({len(tasks)} task{'' if len(tasks) == 1 else 's'})"


def _coverage(row: _Row) -> str:
    return f"average_bert over: {_task_list(row.bert_tasks)}; average_glue over: {_task_list(row.glue_tasks)}"


def _notes(rows: list[_Row], agg: str) -> list[tuple[str | None, str]]:
    """(row label or None for all rows, text) lines printed under the table."""
    if not rows:
        return [(None, "no finished GLUE runs")]
    coverages = [_coverage(row) for row in rows]
    if len(set(coverages)) == 1:
        notes: list[tuple[str | None, str]] = [(None, coverages[0])]
    else:
        notes = [(row.label, cov) for row, cov in zip(rows, coverages)]
    if any(cell.n_runs > 1 for row in rows for cell in row.cells.values()):
        if agg == "max":
            text = "several runs of one task: the run with the best score is shown (agg=max)"
        else:
            text = "several runs of one task: mean over the runs; ± is the sample std of the score (agg=mean)"
        notes.append((None, text))
    if any(math.isnan(cell.score) for row in rows for cell in row.cells.values()):
        notes.append((None, "nan: a run scored NaN (a collapsed run: constant STS-B predictions have no "
                            "correlation), so its cell and the averages over it are NaN"))
    return notes


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]], align_first_left: bool = True) -> str:
    """A GitHub markdown table of text cells (pandas ``to_markdown``, i.e. tabulate's "pipe" format): the columns
    padded so the raw text reads as a table, the first column left-aligned and the rest right-aligned (numbers).

    Args:
        columns: the header.
        rows: the cells, already formatted (numbers are not re-parsed).
        align_first_left: False aligns every column left (a listing of names and text).
    Returns:
        the table, without a trailing newline."""
    import pandas as pd

    # "|" in a cell would end it early; GitHub reads "\|" as a literal bar
    frame = pd.DataFrame([[cell.replace("|", "\\|") for cell in row] for row in rows], columns=list(columns))
    align = ["left"] + ["right" if align_first_left else "left"] * (len(columns) - 1)
    return frame.to_markdown(index=False, tablefmt="pipe", colalign=align, disable_numparse=True)


def _render_md(rows: list[_Row], notes: list[tuple[str | None, str]]) -> str:
    lines = [markdown_table(COLUMNS, [_row_texts(row, "±") for row in rows])]
    # A blank line ends the table; otherwise GitHub renders the next line as another table row.
    lines.append("")
    # Per-row notes form a list, so each keeps its own line when rendered; shared notes are paragraphs.
    per_row = [f"- {label}: {text}" for label, text in notes if label is not None]
    blocks = ["\n".join(per_row)] if per_row else []
    blocks += [text for label, text in notes if label is None]
    lines.append("\n\n".join(blocks))
    return "\n".join(lines) + "\n"


def _csv_header() -> list[str]:
    header = ["model", "average_bert", "average_glue"]
    for task in TASKS:
        suffixes = CSV_PAIR_SUFFIXES.get(task)
        header += [f"{task}_{s}" for s in suffixes] if suffixes else [task]
    return [*header, "perplexity", "mlm_eval_loss", "average_bert_tasks", "average_glue_tasks"]


def csv_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """CSV of text cells (pandas ``to_csv``: quoted only where a cell needs it), with a trailing newline."""
    import pandas as pd

    return pd.DataFrame([list(row) for row in rows], columns=list(columns)).to_csv(index=False, lineterminator="\n")


def _render_csv(rows: list[_Row]) -> str:
    def blank(text: str) -> str:
        return "" if text == MISSING else text  # empty cells read as missing values (NaN in pandas)

    lines = []
    for row in rows:
        values = [row.label, _pct(row.average(row.bert_tasks)), _pct(row.average(row.glue_tasks))]
        for task in TASKS:
            cell = row.cells.get(task)
            n = len(TASK_METRICS[task])
            values += [_pct(v) for v in cell.values] if cell else [MISSING] * n
        values += [_num(row.perplexity, 2), _num(row.eval_loss, 3)]
        lines.append([values[0], *(blank(v) for v in values[1:]), " ".join(row.bert_tasks),
                      " ".join(row.glue_tasks)])
    return csv_table(_csv_header(), lines)


_LATEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def latex_escape(text: str) -> str:
    """Escape LaTeX special characters (one character at a time, so replacements are never re-escaped)."""
    return "".join(_LATEX_ESCAPES.get(ch, ch) for ch in text)


def latex_tabular(columns: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str] = (),
                  column_format: str | None = None) -> str:
    r"""A LaTeX ``tabular`` (no package needed: ``\hline`` rules, not booktabs') of text cells, LaTeX specials
    escaped and ``±`` written ``$\pm$``; ``notes`` are full-width rows under the table.

    Args:
        columns: the header.
        rows: the cells, already formatted.
        notes: lines under the table.
        column_format: the tabular's column spec (default: the first column left, the others right-aligned).
    Returns:
        the table with a trailing newline."""

    def escaped(text: str) -> str:
        # ± is swapped for $\pm$ after escaping, so its $ and \ are not escaped themselves
        return latex_escape(text.replace("±", "\x00")).replace("\x00", r"$\pm$")

    def line(cells: Sequence[str]) -> str:
        return " & ".join(escaped(c) for c in cells) + r" \\"

    spec = column_format or "l" + "r" * (len(columns) - 1)
    lines = [r"\begin{tabular}{" + spec + "}", r"\hline", line(columns), r"\hline"]
    lines += [line(row) for row in rows]
    lines.append(r"\hline")
    lines += [rf"\multicolumn{{{len(columns)}}}{{l}}{{{escaped(note)}}} \\" for note in notes]
    lines.append(r"\end{tabular}")
    return "\n".join(lines) + "\n"


def _render_latex(rows: list[_Row], notes: list[tuple[str | None, str]]) -> str:
    return latex_tabular(COLUMNS, [_row_texts(row, "±") for row in rows],
                         [f"{label}: {text}" if label is not None else text for label, text in notes])
