"""scripts/finetune_report.py: the GLUE average over seeds keeps a collapsed seed visible instead of raising."""

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
