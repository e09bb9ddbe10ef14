"""Sparse training in the Trainer: masks kept exact, RigL / GMP updates once per optimizer step.

Where this happens in the step, and why in that order: trainer/step.py, steps 3b and 6. Gradient accumulation
gives exactly one mask update per optimizer step, never one per micro-batch.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import torch
from transformers import TrainerCallback

from sparsebert.io import atomic_write_json
from sparsebert.sparsity import SparsityController, rewound_linear_factor

log = logging.getLogger(__name__)


def rewound_lr_scheduler(controller: SparsityController, optimizer, warmup_steps: int,
                         num_training_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """``gmp.rewind_lr``: the linear schedule starts again when pruning ends."""
    factor = partial(rewound_linear_factor, warmup_steps=warmup_steps, rewind_step=controller.gmp_end_step,
                     total_steps=num_training_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class SparsityCallback(TrainerCallback):
    """Mask upkeep after each optimizer step, masks saved with every checkpoint, ``sparsity.json`` at the end."""

    def __init__(self, controller: SparsityController, trainer):
        self.controller = controller
        self.trainer = trainer

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        # the model is on its device and the optimizer exists only now; RigL resets the AdamW state of
        # regrown weights through it
        self.controller.follow_model_device()
        self.controller.attach_optimizer(getattr(optimizer, "optimizer", optimizer))
        report = self.controller.report()
        log.info("sparsity: %s", report["headline"])

    def on_optimizer_step(self, args, state, control, **kwargs):
        # a step the fp16 scaler skipped is not a step for the mask schedules (SkippedSteps logs it)
        stats = self.controller.on_optimizer_step(skipped=self.trainer.skipped_steps.last_step_skipped())
        if stats:
            self.trainer.pending_logs.add(stats)

    def on_save(self, args, state, control, **kwargs):
        # the masks go with the optimizer state (SparseBertTrainer.after_optimizer_state_saved); save_only_model
        # saves none of it
        if state.is_world_process_zero and args.save_only_model:
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if checkpoint.is_dir():
                self.controller.save(checkpoint)

    def on_step_end(self, args, state, control, **kwargs):
        # GMP short of its target at the last step, after steps the fp16 scaler skipped (they count towards
        # max_steps, not towards the schedule): prune to the target here, before this step's evaluation and
        # checkpoint, so that they see the model the run exports. Not at a stop before max_steps
        # (train.stop_after_steps, a termination): the schedule spans max_steps, and its target without the
        # recovery steps would be a different model. On every rank: the masks must stay identical.
        if state.global_step < state.max_steps:
            return
        short = self.controller.gmp_end_step - self.controller.step if self.controller.gmp is not None else 0
        stats = self.controller.finish_schedule()
        if stats:
            log.warning("GMP ended %d optimizer steps short of its end step (skipped fp16 steps): pruned to the "
                        "target at the last step, before its evaluation (%s)", short, stats)
            self.trainer.pending_logs.add(stats)

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            write_sparsity_report(self.controller, Path(args.output_dir))


def write_sparsity_report(controller: SparsityController, run_dir: Path) -> dict:
    report = controller.report()
    report["optimizer_steps"] = controller.step
    atomic_write_json(run_dir / "sparsity.json", report)
    log.info("sparsity: %s", report["headline"])
    return report
