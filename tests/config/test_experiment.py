"""Experiment-level checks of values that would otherwise fail only once training starts: they are refused when the
config is built (``--show`` too), in one line, before any run directory or registry row exists."""

from __future__ import annotations

import pytest

from sparsebert.cli import main


def refusal(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("seed", ["-1", "4294967296"])
def test_a_seed_set_seed_cannot_take_is_refused(seed, capsys):
    assert refusal(["--show", "bert_tiny_quick", "--set", f"seed={seed}"], capsys) == \
        f"error: seed must be in [0, 2**32 - 1], got {seed}"


def test_the_last_run_of_a_finetuning_job_needs_a_seed_too(capsys):
    """Run k of a finetuning task trains with seed + k: the largest runs_per_task value must stay in range."""
    three_runs = ["--set", 'finetune.runs_per_task={"rte": 3}']
    assert main(["--show", "tiny_glue", "--set", "seed=4294967293", *three_runs]) == 0
    capsys.readouterr()
    assert refusal(["--show", "tiny_glue", "--set", "seed=4294967294", *three_runs], capsys) == \
        "error: seed must be in [0, 2**32 - 3] (its 3 runs per task take seeds seed .. seed + 2), got 4294967294"


@pytest.mark.parametrize("key", ["max_train_samples", "max_eval_samples"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_finetuning_sample_limit_below_one_is_refused(key, value, capsys):
    """0 used to mean no limit at all, and a negative one crashed after the run directory was written."""
    line = refusal(["--show", "tiny_glue", "--set", f"finetune.{key}={value}"], capsys)
    assert line.endswith(f"finetune.{key} must be >= 1 or null (no limit), got {value}")


def test_an_empty_glue_task_list_is_refused_rather_than_read_as_every_task(capsys):
    line = refusal(["--show", "tiny_glue", "--set", "finetune.glue_tasks=[]"], capsys)
    assert line.endswith("finetune.glue_tasks=[] names no task; name some, or leave it unset for every task present")


def test_name_equals_nothing_is_refused_rather_than_starting_from_the_default_model(capsys):
    assert refusal(["--show", "glue_from="], capsys) == \
        "error: glue_from=: name the run to start from after '=', e.g. glue_from=bert_100k"
