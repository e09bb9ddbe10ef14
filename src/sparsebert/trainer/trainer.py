"""SparseBertTrainer: the one Trainer subclass, and the place hooks attach.

Capabilities that change what the Trainer computes are small mixins placed before ``Trainer`` in the MRO, each
taking one keyword argument (None = off) and passing everything else on:

- ``sparsity=``      SparseTrainingMixin (sparse_training.py): exact masks, RigL / GMP
- ``distillation=``  DistillationMixin (distillation.py): teacher soft targets
- ``onecycle=``      OneCycleMixin (onecycle.py): torch OneCycleLR
- ``ddp=``           DDPTuningMixin (ddp.py): DDP settings TrainingArguments cannot carry (train.ddp)
- ``compile_scope=``, ``compile_dynamic=``, ``tune_kernels=`` CompileOptionsMixin (compile_options.py):
  torch.compile per layer instead of the whole model; symbolic shapes from the first compile; Inductor's kernel
  tuning
- ``half_precision_residual=`` ResidualPrecisionMixin (residual_precision.py): LayerNorm outputs in the
  autocast dtype
- ``fast_dropout=`` FastDropoutMixin (trainer/fast_dropout.py): dropout with counter-hash random bits under
  torch.compile
- ``clip_in_optimizer=`` ClipInOptimizerMixin (clipping.py): the clip factor applied inside the fused AdamW step
- ``drop_last_batch=`` SparseBertTrainer itself: drop each epoch's short last training batch (train.drop_last_batch)
- always             ThroughputLoggingMixin (below): samples/s, tokens/s, NaN guard, hook metrics in the logs
"""

from __future__ import annotations

import math
import time

from transformers import PrinterCallback, ProgressCallback, Trainer, TrainerCallback

from sparsebert.errors import SparseBertError
from sparsebert.trainer.clipping import ClipInOptimizerMixin
from sparsebert.trainer.compile_options import CompileOptionsMixin
from sparsebert.trainer.ddp import DDPTuningMixin
from sparsebert.trainer.distillation import DistillationMixin
from sparsebert.trainer.fast_dropout import FastDropoutMixin
from sparsebert.trainer.onecycle import OneCycleMixin
from sparsebert.trainer.residual_precision import ResidualPrecisionMixin
from sparsebert.trainer.sparse_training import SparseTrainingMixin


class PendingLogs:
    """Metrics that hooks produce between logging steps; the next training log carries them."""

    def __init__(self) -> None:
        self._items: dict[str, float] = {}

    def add(self, metrics: dict[str, float]) -> None:
        self._items.update(metrics)

    def drain(self) -> dict[str, float]:
        items, self._items = self._items, {}
        return items


# per-tensor log values: trackers (tensorboard, wandb) keep them, the console shows only their totals
PER_TENSOR_PREFIXES = ("rigl/moved/",)


def console_logs(logs: dict[str, float]) -> dict[str, float]:
    """The logs without their per-tensor values (a RigL update moves weights in every one of BERT-base's 72
    tensors: one console line per log, not 72 numbers)."""
    return {k: v for k, v in logs.items() if not k.startswith(PER_TENSOR_PREFIXES)}


class CompactProgressCallback(ProgressCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        super().on_log(args, state, control, logs=console_logs(logs or {}), **kwargs)


class CompactPrinterCallback(PrinterCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        super().on_log(args, state, control, logs=console_logs(logs or {}), **kwargs)


class SkippedSteps(TrainerCallback):
    """Which optimizer steps the fp16 loss scaler skipped (inf/nan gradients); their count goes into the training
    logs as ``fp16_skipped_steps``.

    Accelerate's ``step_was_skipped`` is always False for torch's fused Adam / AdamW (the GPU default): GradScaler
    hands such an optimizer the inf check and calls its ``step`` either way (the kernel skips the update), and
    Accelerate takes "step was called" for "step was taken". The scaler is the one reliable witness: it lowers its
    scale exactly when it skipped a step. Reading the scale syncs with the GPU, so only runs with a scaler pay it.
    """

    def __init__(self, trainer, pending: PendingLogs):
        self.trainer = trainer
        self.pending = pending
        self.count = 0
        self._scale_before: float | None = None

    def _scaler(self):
        scaler = getattr(self.trainer.accelerator, "scaler", None)
        return scaler if scaler is not None and scaler.is_enabled() else None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        scaler = self._scaler()
        self._scale_before = scaler.get_scale() if scaler is not None else None

    def last_step_skipped(self) -> bool:
        """Whether the optimizer step just taken was skipped (valid from ``optimizer.step()`` to the next step)."""
        return self._scale_before is not None and self._scaler().get_scale() < self._scale_before

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self.last_step_skipped():
            self.count += 1
            self.pending.add({"fp16_skipped_steps": self.count})


class ThroughputLoggingMixin:
    """Adds samples/s and tokens/s since the previous training log, and stops on a NaN or infinite loss.

    Both are computed only at logging steps, so there is no extra host-device sync per step. The Trainer's FLOP
    count (6 x tokens x non-embedding parameters) walks every module to count the parameters at every step, host
    time on every step; the count never changes, so it is taken once.
    """

    def __init__(self, *args, tokens_per_sample: int = 0, **kwargs):
        self.tokens_per_sample = tokens_per_sample
        self._non_embedding_parameters: int | None = None
        self.pending_logs = PendingLogs()
        self._last_log: tuple[float, int] | None = None
        super().__init__(*args, **kwargs)
        self.skipped_steps = SkippedSteps(self, self.pending_logs)
        self.add_callback(self.skipped_steps)

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs:
            loss = logs["loss"]
            if not math.isfinite(loss):
                raise SparseBertError(f"training loss is {loss} at step {self.state.global_step}; "
                                      "lower train.learning_rate or check the data")
            now, step = time.perf_counter(), self.state.global_step
            if self._last_log is not None and step > self._last_log[1]:
                samples = (step - self._last_log[1]) * self.args.train_batch_size \
                    * self.args.gradient_accumulation_steps * self.args.world_size
                seconds = now - self._last_log[0]
                logs["samples_per_second"] = round(samples / seconds, 2)
                if self.tokens_per_sample:
                    logs["tokens_per_second"] = round(samples * self.tokens_per_sample / seconds, 1)
            self._last_log = (now, step)
            logs.update(self.pending_logs.drain())
        super().log(logs, *args, **kwargs)

    def floating_point_ops(self, inputs) -> int:
        main_input = getattr(self.model, "main_input_name", "input_ids")
        if main_input not in inputs or not hasattr(self.model, "num_parameters"):
            return 0
        if self._non_embedding_parameters is None:
            self._non_embedding_parameters = self.model.num_parameters(exclude_embeddings=True)
        return 6 * inputs[main_input].numel() * self._non_embedding_parameters

    def evaluate(self, *args, **kwargs):
        metrics = super().evaluate(*args, **kwargs)
        self._last_log = None  # evaluation time is not training throughput
        return metrics


class SparseBertTrainer(SparseTrainingMixin, DistillationMixin, OneCycleMixin, DDPTuningMixin, ClipInOptimizerMixin,
                        CompileOptionsMixin, ResidualPrecisionMixin, FastDropoutMixin, ThroughputLoggingMixin,
                        Trainer):
    """The Trainer every sparsebert job runs."""

    def __init__(self, *args, drop_last_batch: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.drop_last_batch = drop_last_batch
        for plain, compact in ((ProgressCallback, CompactProgressCallback), (PrinterCallback, CompactPrinterCallback)):
            if self.pop_callback(plain) is not None:
                self.add_callback(compact)

    def _issue_warnings_after_load(self, load_result) -> None:
        # A checkpoint stores each tied tensor once (the MLM decoder's weight is the word embeddings, its bias the
        # head's bias), so a resume reports the decoder's names as missing although their tensors were loaded under
        # the other name. Only keys whose tensor nothing loaded are worth a warning.
        missing = set(load_result.missing_keys) - loaded_through_a_tie(self.model, load_result.missing_keys)
        super()._issue_warnings_after_load(
            load_result._replace(missing_keys=[k for k in load_result.missing_keys if k in missing]))

    def get_train_dataloader(self):
        # TrainingArguments.dataloader_drop_last would drop rows of the evaluation sets as well
        if not self.drop_last_batch:
            return super().get_train_dataloader()
        kept, self.args.dataloader_drop_last = self.args.dataloader_drop_last, True
        try:
            loader = super().get_train_dataloader()
        finally:
            self.args.dataloader_drop_last = kept
        if len(loader) == 0:  # the Trainer would run no step at all and report success
            raise SparseBertError(f"train.drop_last_batch: {len(self.train_dataset)} training rows are fewer than one "
                                  f"batch of {self._train_batch_size} per device x {self.args.world_size} "
                                  "process(es); use more data or a smaller batch")
        return loader


def loaded_through_a_tie(model, missing_keys: list[str]) -> set[str]:
    """The names among ``missing_keys`` whose parameter is the same tensor as one under a name that was loaded."""
    names: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    missing = set(missing_keys)
    return {name for aliases in names.values() if not set(aliases) <= missing for name in aliases if name in missing}
