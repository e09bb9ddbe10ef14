"""What the trackers (W&B, TensorBoard) get beyond the Trainer's own logs.

The Trainer gives W&B the TrainingArguments and the model config, and TensorBoard the arguments as hparams; the
experiment's own sections (sparsity, rigl, gmp, kd, finetune, ...) reach neither. ``ExperimentTracking`` adds
them once training begins: the whole experiment config under ``experiment`` in the W&B run config, and as
TensorBoard hparams (flattened, ``sparsity.sparsity``) and a JSON text. The W&B project is the experiment's name
unless WANDB_PROJECT says otherwise (``wandb_project``); the run name is ``experiment/task/run``."""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

from transformers import TrainerCallback

# WANDB_PROJECT and WANDB_DIR as the user set them, read before any run of this process sets its own
USER_WANDB_PROJECT = os.environ.get("WANDB_PROJECT")
USER_WANDB_DIR = os.environ.get("WANDB_DIR")


def wandb_project(run_name: str) -> str:
    """The W&B project of a run: WANDB_PROJECT if the user set it, else the experiment's name (the run name's
    first part), with the characters W&B refuses in a project name (``/ \\ # ? % :``) as ``-``."""
    if USER_WANDB_PROJECT:
        return USER_WANDB_PROJECT
    return re.sub(r"[/\\#?%:]", "-", run_name.split("/")[0]) or "sparsebert"


def wandb_dir(run_dir: str | os.PathLike) -> str:
    """Where W&B writes its local files (its ``wandb/`` folder): WANDB_DIR if the user set it, else the run's
    directory, beside the run's other files (W&B's default is the current directory)."""
    return USER_WANDB_DIR or str(run_dir)


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"sparsity": {"sparsity": 0.8}}`` -> ``{"sparsity.sparsity": 0.8}``; values TensorBoard's hparams take
    (bool, int, float, str): None as "none", lists as their JSON text."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif value is None or isinstance(value, list | tuple):
            out[name] = json.dumps(value) if value is not None else "none"
        else:
            out[name] = value
    return out


class ExperimentTracking(TrainerCallback):
    """Hands the experiment config to the trackers the Trainer started (their callbacks run before this one:
    the Trainer adds report_to's callbacks first)."""

    def __init__(self, experiment: dict[str, Any], trainer) -> None:
        self.experiment = experiment
        self.trainer = trainer

    def on_init_end(self, args, state, control, **kwargs):
        # transformers' WandbCallback never finishes its W&B run, and reuses an open one: the next run of this
        # process (finetuning runs one per task and seed) would log into the previous run's. Finish it here,
        # before the new run's callback starts its own; the last one finishes at exit.
        wandb = sys.modules.get("wandb")
        if "wandb" in args.report_to and wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.finish()

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        from transformers.integrations import TensorBoardCallback, WandbCallback

        wandb = sys.modules.get("wandb")  # imported by WandbCallback when report_to has it
        for callback in self.trainer.callback_handler.callbacks:
            if isinstance(callback, WandbCallback) and getattr(wandb, "run", None) is not None:
                wandb.run.config.update({"experiment": self.experiment}, allow_val_change=True)
            if isinstance(callback, TensorBoardCallback) and callback.tb_writer is not None:
                callback.tb_writer.add_text("experiment", f"```\n{json.dumps(self.experiment, indent=2)}\n```")
                callback.tb_writer.add_hparams(flatten(self.experiment), metric_dict={}, run_name="experiment")
