"""scripts/finetune_report.py: a collapsed seed stays visible; each variant is held to its own sparsity's targets."""

from __future__ import annotations

from pathlib import Path

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
