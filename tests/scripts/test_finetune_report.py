"""scripts/finetune_report.py: a collapsed seed stays visible; each variant is held to its own sparsity's targets."""

from __future__ import annotations

from pathlib import Path

import pytest
from module_loading import load_module

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "finetune_report.py"


def test_mean_std_of_seeds_shows_a_collapsed_seed_as_nan():
    report = load_module(SCRIPT)
    assert report.mean_std([80.0, 82.0]) == "81.0 ± 1.4"
    assert report.mean_std([81.0]) == "81.0 ± 0.0"
    # a seed whose STS-B collapsed (NaN correlation) used to end the report with statistics.stdev's AttributeError
    assert report.mean_std([80.0, float("nan")]) == "nan ± nan"


def test_each_variant_is_held_to_the_targets_of_its_sparsity():
    report = load_module(SCRIPT)
    assert report.TARGETS["_from_upstream80_obs"] == report.AT_80
    # "cap90" names a per-tensor cap, not the sparsity: the model is 80 % sparse
    assert report.TARGETS["_from_upstream80_obs_cap90"] == report.AT_80
    assert report.TARGETS["_from_upstream90_obs"] == report.AT_90
    assert report.TARGETS["_downstream90"] == report.AT_90
    assert "" not in report.TARGETS and "_fast" not in report.TARGETS


def record(experiment: str, task: str, seed: int, **metrics: float):
    from sparsebert.results import RunRecord

    return RunRecord(run_dir=f"{experiment}/{task}/{seed}", experiment=experiment, task=task, model="minilm",
                     seed=seed, status="done", metrics=metrics)


def test_a_variant_of_one_seed_is_compared_with_dense_at_that_seed():
    report = load_module(SCRIPT)
    dense_by_seed = {42: 0.70, 43: 0.60, 44: 0.50}  # every small task scores this at each seed
    runs = [record("minilm_glue", f"glue:{task}", seed, score=score)
            for task in ("cola", "mrpc", "rte", "stsb") for seed, score in dense_by_seed.items()]
    runs += [record("minilm_glue", "glue:sst2", 42, score=0.90)]  # one run: it counts for every seed
    # the downstream recipe runs seed 42 only
    runs += [record("minilm_glue_downstream80_obs", f"glue:{task}", 42, score=0.65) for task in report.BERT_TASKS]
    runs += [record("minilm_squad_v1", "squad_v1", seed, f1=f1) for seed, f1 in ((42, 66.0), (43, 67.0), (44, 70.0))]
    runs += [record("minilm_squad_v1_from_upstream90", "squad_v1", 44, f1=60.0)]

    assert report.glue_average_by_seed(runs, "_downstream80_obs") == {42: 65.0}
    assert report.glue_average_by_seed(runs, "")[42] == 100 * (4 * 0.70 + 0.90) / 5  # 74.0
    text = report.report(runs)
    downstream = next(line for line in text.splitlines() if line.startswith("| 80 %, downstream oBERT"))
    # against dense at seed 42 (74.0), not against dense's mean over seeds (66.0)
    assert "| 65.0 ± 0.0 | -9.0 (n1) |" in downstream
    upstream = next(line for line in text.splitlines() if line.startswith("| 90 %, upstream GMP"))
    assert "| 60.0 ± 0.0 | -10.0 (n1) |" in upstream  # seed 44's dense is 70.0
    assert "- 90 %, upstream GMP, transfer + KD, squad: -10.0 (n1) against a limit of −5.0: not met" in text
    assert report.delta_cell([1.0, -1.0]) == "+0.0 ± 1.4 (n2)" and report.delta_cell([]) == "-"


def test_a_seed_a_task_lacks_has_no_glue_average_and_two_runs_of_one_seed_are_refused():
    report = load_module(SCRIPT)
    runs = [record("minilm_glue", f"glue:{task}", seed, score=0.5) for task in ("cola", "mrpc", "stsb")
            for seed in (42, 43, 44)]
    # RTE's seed-44 lane did not finish: seed 44 has no average (not one made of RTE's seed-42 run)
    runs += [record("minilm_glue", "glue:rte", seed, score=0.5) for seed in (42, 43)]
    runs += [record("minilm_glue", "glue:sst2", 42, score=0.5)]
    assert sorted(report.glue_average_by_seed(runs, "")) == [42, 43]
    # one run a task at different seeds: no seed has all five tasks
    scattered = [record("minilm_glue_downstream80", f"glue:{task}", seed, score=0.5)
                 for task, seed in zip(report.BERT_TASKS, (42, 42, 43, 42, 42), strict=True)]
    assert report.glue_average_by_seed(scattered, "_downstream80") == {}
    twice = [record("minilm_squad_v1", "squad_v1", 42, f1=60.0), record("minilm_squad_v1", "squad_v1", 42, f1=61.0)]
    twice[1].run_dir = "rerun/" + twice[1].run_dir
    with pytest.raises(ValueError, match="two runs of minilm_squad_v1 at seed 42"):
        report.single(twice, "minilm_squad_v1", "", "f1")
