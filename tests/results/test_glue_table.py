"""The GLUE table against hand-checked golden files (md, csv, latex; agg max and mean).

The golden files were generated once and every number in them checked by hand; the arithmetic is spelled
out in the assertions below.  To regenerate after an intended change: ``SPARSEBERT_UPDATE_GOLDEN=1 pytest
tests/results/test_glue_table.py``, then read the diff and re-check the numbers before committing.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import pytest

from sparsebert.errors import SparseBertError
from sparsebert.results import RunRecord, glue_table
from sparsebert.results.glue_table import latex_escape

GOLDEN = Path(__file__).parent / "golden"

DENSE_PRETRAIN = {"perplexity": 4.5678, "eval_loss": 1.51904}


def _glue(group_fields: dict, task: str, seed: int = 0, status: str = "done", **metrics: float) -> RunRecord:
    return RunRecord(
        run_dir=f"runs/{group_fields['experiment']}/{task}-s{seed}",
        task=f"glue:{task}",
        model="base",
        seed=seed,
        status=status,
        metrics=dict(metrics),
        **group_fields,
    )


def records() -> list[RunRecord]:
    # Group 1: label falls back to the experiment name; has wnli, lacks qnli and qqp; stsb has no "score"
    # (the table must use the pair mean).  Group 2: explicit group label with LaTeX specials; lacks mnli,
    # stsb and wnli and has no pretrain metrics.  Both have three rte seeds.
    dense = {"experiment": "bert-base-dense", "pretrain_metrics": DENSE_PRETRAIN}
    sparse = {"experiment": "sparse90-run", "group": "sparse_90%"}
    return [
        _glue(dense, "cola", matthews_corr=0.5634, score=0.5634),
        _glue(sparse, "cola", matthews_corr=0.4123, score=0.4123),
        _glue(dense, "mnli", accuracy_matched=0.8412, accuracy_mismatched=0.8456, score=0.8434),
        _glue(sparse, "mnli", status="failed"),  # failed runs are ignored (and carry no metrics)
        _glue(dense, "mrpc", f1=0.8812, accuracy=0.8407, score=0.86095),
        _glue(sparse, "mrpc", f1=0.8534, accuracy=0.7921, score=0.82275),
        _glue(sparse, "qnli", accuracy=0.8867, score=0.8867),
        _glue(sparse, "qqp", f1=0.8612, accuracy=0.8947, score=0.87795),
        _glue(dense, "rte", seed=0, accuracy=0.6534, score=0.6534),
        _glue(dense, "rte", seed=1, accuracy=0.6718, score=0.6718),
        _glue(dense, "rte", seed=2, accuracy=0.6643, score=0.6643),
        _glue(sparse, "rte", seed=0, accuracy=0.5921, score=0.5921),
        _glue(sparse, "rte", seed=1, accuracy=0.6101, score=0.6101),
        _glue(sparse, "rte", seed=2, accuracy=0.6029, score=0.6029),
        _glue(dense, "sst2", accuracy=0.9232, score=0.9232),
        _glue(sparse, "sst2", accuracy=0.9011, score=0.9011),
        _glue(dense, "stsb", pearson=0.8851, spearman=0.8823),
        _glue(dense, "wnli", accuracy=0.5211, score=0.5211),
        # not GLUE: ignored
        RunRecord(
            "runs/bert-base-dense/mlm",
            "bert-base-dense",
            "mlm",
            "base",
            0,
            "done",
            metrics={"eval_loss": 1.5},
        ),
    ]


@pytest.mark.parametrize(
    "agg, fmt, name",
    [
        ("max", "md", "glue_max.md"),
        ("mean", "md", "glue_mean.md"),
        ("max", "csv", "glue_max.csv"),
        ("mean", "csv", "glue_mean.csv"),
        ("max", "latex", "glue_max.tex"),
        ("mean", "latex", "glue_mean.tex"),
    ],
)
def test_matches_golden(agg: str, fmt: str, name: str) -> None:
    text = glue_table(records(), agg=agg, fmt=fmt)
    path = GOLDEN / name
    if os.environ.get("SPARSEBERT_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        pytest.skip(f"rewrote {path}: check it by hand")
    assert text == path.read_text(encoding="utf-8")


def _csv_rows(agg: str) -> dict[str, dict[str, str]]:
    rows = csv.DictReader(io.StringIO(glue_table(records(), agg=agg, fmt="csv")))
    return {row["model"]: row for row in rows}


def test_averages_by_hand() -> None:
    # bert-base-dense task scores; stsb has no score, so (0.8851 + 0.8823) / 2 = 0.8837
    dense = {"cola": 0.5634, "mnli": 0.8434, "mrpc": 0.86095, "sst2": 0.9232, "stsb": 0.8837, "wnli": 0.5211}
    rte_max = 0.6718
    rte_mean = (0.6534 + 0.6718 + 0.6643) / 3  # 0.663167
    bert_max = (sum(dense.values()) - 0.5211 + rte_max) / 6  # 4.74645 / 6 = 0.791075 -> 79.1
    glue_max = (sum(dense.values()) + rte_max) / 7  # 5.26755 / 7 = 0.752507 -> 75.3
    bert_mean = (sum(dense.values()) - 0.5211 + rte_mean) / 6  # 4.737817 / 6 = 0.789636 -> 79.0
    glue_mean = (sum(dense.values()) + rte_mean) / 7  # 5.258917 / 7 = 0.751274 -> 75.1
    assert (round(bert_max, 6), round(glue_max, 6)) == (0.791075, 0.752507)
    assert (round(bert_mean, 6), round(glue_mean, 6)) == (0.789636, 0.751274)

    # sparse_90%: no wnli, so both averages cover the same six tasks
    sparse = 0.4123 + 0.82275 + 0.8867 + 0.87795 + 0.9011  # cola mrpc qnli qqp sst2 = 3.9008
    sparse_max = (sparse + 0.6101) / 6  # 4.5109 / 6 = 0.751817 -> 75.2
    sparse_mean = (sparse + (0.5921 + 0.6101 + 0.6029) / 3) / 6  # (3.9008 + 0.6017) / 6 = 0.750417 -> 75.0
    assert (round(sparse_max, 6), round(sparse_mean, 6)) == (0.751817, 0.750417)

    got = _csv_rows("max")
    assert (got["bert-base-dense"]["average_bert"], got["bert-base-dense"]["average_glue"]) == (
        "79.1",
        "75.3",
    )
    assert (got["sparse_90%"]["average_bert"], got["sparse_90%"]["average_glue"]) == ("75.2", "75.2")
    assert got["bert-base-dense"]["rte"] == "67.2" and got["sparse_90%"]["rte"] == "61.0"
    assert got["bert-base-dense"]["average_bert_tasks"] == "cola mnli mrpc rte sst2 stsb"
    assert got["bert-base-dense"]["average_glue_tasks"] == "cola mnli mrpc rte sst2 stsb wnli"
    assert got["sparse_90%"]["average_glue_tasks"] == "cola mrpc qnli qqp rte sst2"

    got = _csv_rows("mean")
    assert (got["bert-base-dense"]["average_bert"], got["bert-base-dense"]["average_glue"]) == (
        "79.0",
        "75.1",
    )
    assert (got["sparse_90%"]["average_bert"], got["sparse_90%"]["average_glue"]) == ("75.0", "75.0")
    assert got["bert-base-dense"]["rte"] == "66.3" and got["sparse_90%"]["rte"] == "60.2"


def test_md_cells_and_notes() -> None:
    md = glue_table(records(), agg="mean")
    lines = md.splitlines()
    dense_row = next(line for line in lines if line.startswith("| bert-base-dense"))
    cells = [c.strip() for c in dense_row.strip("|").split("|")]
    assert cells == [
        "bert-base-dense", "79.0", "75.1", "56.3", "84.1/84.6", "88.1/84.1", "-", "-",
        # rte std: deviations from 0.663167 are -0.009767, 0.008633, 0.001133 -> sqrt(1.7121e-4 / 2) = 0.0093
        "66.3±0.9", "92.3", "88.5/88.2", "52.1", "4.57", "1.519",
    ]  # fmt: skip
    assert "- bert-base-dense: average_bert over: cola, mnli, mrpc, rte, sst2, stsb (6 tasks); " in md
    assert "- sparse_90%: average_bert over: cola, mrpc, qnli, qqp, rte, sst2 (6 tasks); " in md
    # a blank line separates the table from the notes, or GitHub would render them as table rows
    assert lines[lines.index(dense_row) + 2] == ""


def test_single_coverage_line_when_rows_agree() -> None:
    recs = [
        RunRecord("a/rte", "a", "glue:rte", "base", 0, "done", metrics={"accuracy": 0.61, "score": 0.61}),
        RunRecord("a/wnli", "a", "glue:wnli", "base", 0, "done", metrics={"accuracy": 0.57, "score": 0.57}),
        RunRecord("b/rte", "b", "glue:rte", "base", 0, "done", metrics={"accuracy": 0.59, "score": 0.59}),
        RunRecord("b/wnli", "b", "glue:wnli", "base", 0, "done", metrics={"accuracy": 0.47, "score": 0.47}),
    ]
    md = glue_table(recs)
    assert md.endswith("\n\naverage_bert over: rte (1 task); average_glue over: rte, wnli (2 tasks)\n")
    assert "several runs" not in md  # no cell aggregates more than one run
    rows = [line for line in md.splitlines() if line.startswith("| a ") or line.startswith("| b ")]
    # average_bert = rte alone; average_glue = (rte + wnli) / 2: a (0.61 + 0.57) / 2, b (0.59 + 0.47) / 2
    assert [[c.strip() for c in r.split("|")[2:4]] for r in rows] == [["61.0", "59.0"], ["59.0", "53.0"]]


def test_missing_metrics_and_bad_arguments() -> None:
    bad = RunRecord("r", "e", "glue:mrpc", "base", 0, "done", metrics={"f1": 0.9})
    with pytest.raises(SparseBertError, match="accuracy"):
        glue_table([bad])
    with pytest.raises(SparseBertError, match="aggregation"):
        glue_table(records(), agg="median")
    with pytest.raises(SparseBertError, match="format"):
        glue_table(records(), fmt="html")


def test_empty() -> None:
    assert glue_table([], fmt="csv").count("\n") == 1  # header only
    assert "no finished GLUE runs" in glue_table([])


def test_latex_escape() -> None:
    assert (
        latex_escape(r"a\b{c}$_%&#~^")
        == r"a\textbackslash{}b\{c\}\$\_\%\&\#\textasciitilde{}\textasciicircum{}"
    )


def test_max_never_picks_a_nan_seed() -> None:
    # a collapsed STS-B seed (constant predictions) has NaN correlations; listed first, max() used to keep it
    group = {"experiment": "e"}
    nan = float("nan")
    runs = [_glue(group, "stsb", seed=1, pearson=nan, spearman=nan, score=nan),
            _glue(group, "stsb", seed=2, pearson=0.88, spearman=0.87, score=0.875)]
    for order in (runs, runs[::-1]):
        row = list(csv.DictReader(io.StringIO(glue_table(order, agg="max", fmt="csv"))))[0]
        assert (row["stsb_pearson"], row["stsb_spearman"], row["average_bert"]) == ("88.0", "87.0", "87.5")


def test_mean_with_a_nan_seed_is_nan_and_says_why() -> None:
    # a study lease's dense model collapsed on one STS-B seed at lr 2e-4; agg=mean raised AttributeError from
    # statistics.stdev, which ended scripts/pretrain_study_table.py with a traceback
    group = {"experiment": "e"}
    nan = float("nan")
    runs = [_glue(group, "stsb", seed=1, pearson=0.81, spearman=0.80, score=0.805),
            _glue(group, "stsb", seed=2, pearson=nan, spearman=nan, score=nan),
            _glue(group, "rte", seed=1, accuracy=0.6, score=0.6), _glue(group, "rte", seed=2, accuracy=0.5, score=0.5)]
    row = list(csv.DictReader(io.StringIO(glue_table(runs, agg="mean", fmt="csv"))))[0]
    assert (row["stsb_pearson"], row["stsb_spearman"], row["average_bert"], row["rte"]) == ("nan", "nan", "nan", "55.0")
    md = glue_table(runs, agg="mean")
    assert "55.0±7.1" in md and "nan: a run scored NaN" in md
    assert "nan:" not in glue_table(runs[:1] + runs[2:], agg="mean")
