"""What the trackers get beyond the Trainer's logs: project names, flattened hparams, one W&B run per run."""

from __future__ import annotations

import os
import sys
import types

from transformers import TrainerControl, TrainerState, TrainingArguments

import sparsebert.trainer.tracking as tracking


def test_the_wandb_project_is_the_experiments_unless_the_user_named_one(monkeypatch):
    monkeypatch.setattr(tracking, "USER_WANDB_PROJECT", None)
    assert tracking.wandb_project("tiny_glue/glue_rte/run0") == "tiny_glue"
    assert tracking.wandb_project("glue_from=a:b") == "glue_from=a-b"  # W&B refuses ':' in a project name
    monkeypatch.setattr(tracking, "USER_WANDB_PROJECT", "mine")
    assert tracking.wandb_project("tiny_glue/glue_rte/run0") == "mine"


def test_wandb_writes_its_files_into_the_run_unless_the_user_named_a_folder(monkeypatch, tmp_path):
    from sparsebert.config.sections import TrainConfig
    from sparsebert.trainer.arguments import training_arguments

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "")  # restored after the test: training_arguments sets it
    for user_dir, expected in ((None, tmp_path / "run"), (str(tmp_path / "mine"), tmp_path / "mine")):
        monkeypatch.setattr(tracking, "USER_WANDB_DIR", user_dir)
        monkeypatch.delenv("WANDB_DIR", raising=False)
        training_arguments(TrainConfig(report_to=["wandb"]), tmp_path / "run", seed=0, run_name="tiny/run0")
        assert os.environ["WANDB_DIR"] == str(expected)


def test_hparams_are_flat_values_tensorboard_takes():
    flat = tracking.flatten({"sparsity": {"sparsity": 0.8, "include": ["query"], "layers": None}, "seed": 3})
    assert flat == {"sparsity.sparsity": 0.8, "sparsity.include": '["query"]', "sparsity.layers": "none", "seed": 3}


def test_a_new_trainer_finishes_the_previous_wandb_run(monkeypatch, tmp_path):
    """transformers' WandbCallback reuses an open W&B run: each finetuning run of a process must start its own."""
    finished = []
    fake = types.SimpleNamespace(run=object(), finish=lambda: finished.append(True))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    callback = tracking.ExperimentTracking({}, trainer=None)
    for report_to, count in ((["tensorboard"], 0), (["wandb"], 1)):
        args = TrainingArguments(output_dir=str(tmp_path), report_to=report_to)
        callback.on_init_end(args, TrainerState(), TrainerControl())
        assert len(finished) == count
