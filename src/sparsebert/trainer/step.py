"""One optimizer step of sparsebert's training, top to bottom, and the stage objects that make it.

The Trainer's loop runs the step; SparseBertTrainer (trainer.py) hands each stage to ``TrainingStep`` here:

1. forward and loss, per micro-batch (``SparseBertTrainer.compute_loss``): the task loss, plus the teacher's
   soft-target term under distillation (``TrainingStep.loss``, distillation.py);
2. backward, per micro-batch (the Trainer's ``training_step``), inside ``TrainingStep.backward``: DDP's reducer
   all-reduces during the last one, unless sparsebert's flat / sparse all-reduce replaces it (then no reducer);
3. after the last micro-batch, ``TrainingStep.after_backward``:
   a. gradient sync (``GradientSync``, ddp.py): the flat all-reduce returns a ``SyncResult``: the averaged
      gradients' norm when clipping asked for it, and whether they arrived masked (the sparse mode);
   b. masking (``SparsityController.before_optimizer_step(grads_masked=...)``): the dense gradient kept when a
      RigL update is due, then masked gradients zeroed unless the sync already did;
4. clipping (``TrainingStep.clip``, from the Trainer's clipping hook): the clip factor goes into the fused AdamW
   step (``ClipInOptimizer``, clipping.py) with the sync's norm when it is that of the gradients the optimizer
   sees, else the Trainer clips;
5. ``optimizer.step()`` (the Trainer);
6. after it, callbacks in the order of ``AFTER_OPTIMIZER_STEP`` (trainer.py, which adds them in that order; a
   test holds it): the fp16 skipped-step verdict (``SkippedSteps``), the clip factor taken off the optimizer
   (``StepCallback``), mask upkeep (``SparsityCallback``, sparse_training.py: masked weights kept at 0, RigL /
   GMP on schedule, never on a skipped step); at the last step, before its evaluation, GMP pruned to its target
   if skipped steps left it short (``SparsityCallback.on_step_end``);
7. logging: stages add their values to ``PendingLogs``; the next training log carries them with throughput.

Each stage takes what it needs as arguments and returns what the next one needs: nothing sets a flag on
another object to be read later. With gradient accumulation, 3 to 6 run once per optimizer step, so masks
change once per optimizer step, never once per micro-batch.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from transformers import TrainerCallback

from sparsebert.config.hook_sections import DistillationConfig
from sparsebert.distributed.all_reduce import SyncResult
from sparsebert.sparsity import SparsityController
from sparsebert.trainer.clipping import ClipInOptimizer
from sparsebert.trainer.ddp import GradientSync
from sparsebert.trainer.distillation import distilled_loss


def norm_for_clipping(result: SyncResult | None, sparse: bool) -> torch.Tensor | None:
    """The sync's norm where it is that of the gradients the optimizer will see: always in dense runs; in sparse
    runs only when the sync left zeros at masked positions (otherwise masking comes after it)."""
    if result is None or result.norm is None:
        return None
    return result.norm if not sparse or result.masked else None


class TrainingStep:
    """The stages of one optimizer step, in order; SparseBertTrainer calls them from the Trainer's hooks."""

    def __init__(self, sparsity: SparsityController | None, sync: GradientSync | None, clipping: ClipInOptimizer,
                 teacher: nn.Module | None = None, kd_config: DistillationConfig | None = None):
        self.sparsity = sparsity
        self.sync = sync
        self.clipping = clipping
        self.teacher = teacher
        self.kd_config = kd_config
        # handed from 3 to 4 of the same step, and taken there: a step whose sync did not run never reuses it
        self._norm_from_sync: torch.Tensor | None = None

    # 1. forward and loss
    def loss(self, task_loss: torch.Tensor, outputs, inputs: dict, step: int, max_steps: int,
             divisor: int | None) -> torch.Tensor:
        if self.teacher is None:
            return task_loss
        return distilled_loss(task_loss, outputs, self.teacher, inputs, self.kd_config, step, max_steps, divisor)

    # 2. backward
    def backward(self, model):
        return self.sync.backward(model) if self.sync is not None else contextlib.nullcontext()

    # 3. sync, then masking
    def after_backward(self) -> None:
        result = self.sync(track_norm=self.clipping.wants_norm) if self.sync is not None else None
        if self.sparsity is not None:
            self.sparsity.before_optimizer_step(grads_masked=result is not None and result.masked)
        self._norm_from_sync = norm_for_clipping(result, sparse=self.sparsity is not None)

    # 4. clipping
    def clip(self, model, optimizer, accelerator, max_norm: float, trainer_clip):
        """Returns the pre-clip norm; ``trainer_clip(model)`` is the Trainer's own clipping."""
        target = self.clipping.choose(optimizer, accelerator, model)
        if target is None:
            return trainer_clip(model)
        norm, self._norm_from_sync = self._norm_from_sync, None
        return self.clipping.clip(model, max_norm, norm)


class StepCallback(TrainerCallback):
    """The clip-in-optimizer stage's upkeep: chosen again at each ``train()``; the factor taken off the optimizer
    after its step, so nothing else reads it as a loss scale."""

    def __init__(self, clipping: ClipInOptimizer):
        self.clipping = clipping

    def on_train_begin(self, args, state, control, **kwargs):
        self.clipping.reset()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.clipping.after_optimizer_step()
