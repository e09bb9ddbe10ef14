"""SparseBertTrainer: the one Trainer subclass. Its overrides hand each part of the training step to
``TrainingStep`` (step.py, which shows the step top to bottom); private Trainer hooks reach it through
``UpstreamTrainer`` (upstream/transformers_trainer.py: private names are touched in sparsebert/upstream/ only).

Keyword arguments (None / False = off), from ``build_hooks`` (hooks.py):

- ``sparsity=``      a SparsityController: exact masks, RigL / GMP (sparse_training.py)
- ``distillation=``  (config, teacher): teacher soft targets (distillation.py)
- ``onecycle=``      torch OneCycleLR (onecycle.py)
- ``ddp=``           DDP settings TrainingArguments cannot carry, sparsebert's flat all-reduce (ddp.py)
- ``compile_scope=``, ``compile_dynamic=``, ``compile_tune_kernels=``: Accelerate's compile plugin (per-layer
  compile, symbolic shapes) and Inductor's kernel tuning
  (compile_options.py)
- ``clip_in_optimizer=``: the clip factor applied inside the fused AdamW step (clipping.py)
- ``drop_last_batch=``: drop each epoch's short last training batch (train.drop_last_batch)
- ``tokens_per_sample=``: tokens/s in the logs; always: samples/s, NaN guard, the stages' values in the logs
  (with ``sparsity``: the masks' density, overall and per tensor)
- ``experiment=``    the experiment config as a dict: the W&B run config and TensorBoard hparams (tracking.py)

Model transforms (fast dropout, half-precision residual, kernel tuning) are applied before the Trainer is built
(prepare.py).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from sparsebert.console import duration
from sparsebert.errors import SparseBertError
from sparsebert.models.ties import loaded_through_a_tie
from sparsebert.trainer.clipping import ClipInOptimizer
from sparsebert.trainer.compile_options import apply_compile_plugin_options, apply_kernel_tuning
from sparsebert.trainer.ddp import FlatAllReduceCallback, GradientSync, apply_ddp_settings
from sparsebert.trainer.distillation import prepare_teacher, student_inputs
from sparsebert.trainer.onecycle import onecycle_scheduler
from sparsebert.trainer.sparse_training import SparsityCallback, rewound_lr_scheduler
from sparsebert.trainer.step import StepCallback, TrainingStep
from sparsebert.trainer.tracking import ExperimentTracking
from sparsebert.upstream.torch_ops import stop_loader_workers
from sparsebert.upstream.transformers_trainer import UpstreamTrainer


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
PER_TENSOR_PREFIXES = ("rigl/moved/", "density/")


def console_logs(logs: dict[str, float]) -> dict[str, float]:
    """The logs without their per-tensor values (a RigL update moves weights in every one of BERT-base's 72
    tensors: one console line per log, not 72 numbers)."""
    return {k: v for k, v in logs.items() if not k.startswith(PER_TENSOR_PREFIXES)}


class CompactProgressCallback(ProgressCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        super().on_log(args, state, control, logs=console_logs(logs or {}), **kwargs)


class CompactPrinterCallback(PrinterCallback):
    """The log lines of a run without progress bars (piped into a log file, see ``sparsebert.console``): each one
    starts with what the bar would have shown, the step, the time so far and the time left."""

    def __init__(self) -> None:
        self._began: tuple[float, int] | None = None  # (monotonic time, global step) when training (re)started

    def on_train_begin(self, args, state, control, **kwargs):
        self._began = (time.monotonic(), state.global_step)  # a resumed run's rate counts from its resume step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_local_process_zero:
            shown = {k: (f"{v:.4g}" if isinstance(v, float) else v)
                     for k, v in console_logs(logs or {}).items() if k != "total_flos"}
            print(f"{self.progress(state)}: {shown}", flush=True)

    def progress(self, state) -> str:
        """``step 120/1000 (12%), 0:42 elapsed, 5:08 left``; the times once training has taken a step."""
        text = f"step {state.global_step}"
        if state.max_steps:
            text += f"/{state.max_steps} ({100 * state.global_step / state.max_steps:.0f}%)"
        if self._began is None:
            return text
        began, first_step = self._began
        elapsed, done = time.monotonic() - began, state.global_step - first_step
        text += f", {duration(elapsed)} elapsed"
        if done > 0 and state.max_steps:
            text += f", {duration(elapsed / done * max(state.max_steps - state.global_step, 0))} left"
        return text


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
        self._skipped: bool | None = None  # the verdict on the step just taken, read once per step

    def _scaler(self):
        scaler = getattr(self.trainer.accelerator, "scaler", None)
        return scaler if scaler is not None and scaler.is_enabled() else None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        scaler = self._scaler()
        self._scale_before = scaler.get_scale() if scaler is not None else None
        self._skipped = None

    def last_step_skipped(self) -> bool:
        """Whether the optimizer step just taken was skipped (valid from ``optimizer.step()`` to the next step;
        the scale is read once however many stages ask)."""
        if self._skipped is None:
            self._skipped = self._scale_before is not None and self._scaler().get_scale() < self._scale_before
        return self._skipped

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self.last_step_skipped():
            self.count += 1
            self.pending.add({"fp16_skipped_steps": self.count})


# what acts after optimizer.step() (step.py, step 6), in this order: whether the fp16 scaler skipped the step
# (the others ask), the clip factor taken off the optimizer, then the masks (kept at 0, moved on schedule)
AFTER_OPTIMIZER_STEP = (SkippedSteps, StepCallback, SparsityCallback)


class SparseBertTrainer(UpstreamTrainer):
    """The Trainer every sparsebert job runs.

    Throughput: samples/s and tokens/s since the previous training log, and a stop on a NaN or infinite loss,
    both computed only at logging steps, so there is no extra host-device sync per step. The Trainer's FLOP count
    (6 x tokens x non-embedding parameters) walks every module to count the parameters at every step, host time
    on every step; the count never changes, so it is taken once.
    """

    def __init__(self, *args, sparsity=None, distillation=None, onecycle=None, ddp=None,
                 clip_in_optimizer: bool = False, compile_scope: str | None = None,
                 compile_dynamic: bool | None = None, compile_tune_kernels: bool | None = None, drop_last_batch: bool = False, tokens_per_sample: int = 0,
                 experiment: dict | None = None, **kwargs):
        self.onecycle = onecycle
        self.tokens_per_sample = tokens_per_sample
        self._non_embedding_parameters: int | None = None
        self.pending_logs = PendingLogs()
        self._last_log: tuple[float, int] | None = None
        super().__init__(*args, **kwargs)
        self.skipped_steps = SkippedSteps(self, self.pending_logs)
        # Accelerate's compile plugin exists only now; it compiles at the start of training
        apply_compile_plugin_options(self.accelerator, compile_scope, compile_dynamic)
        apply_kernel_tuning(compile_tune_kernels)  # Inductor's, process-wide: before train() compiles
        clipping = ClipInOptimizer(clip_in_optimizer)
        sync = None
        if ddp is not None:
            sync = GradientSync.from_config(ddp, sparsity)
            if sync is not None:
                self.add_callback(FlatAllReduceCallback(sync, self))
            apply_ddp_settings(ddp, self.accelerator, self.args.torch_compile)
        self.kd_config, self.teacher = distillation if distillation is not None else (None, None)
        if self.teacher is not None:
            prepare_teacher(self.teacher, self.args.device, self.args.bf16, self.args.fp16)
        self.sparsity = sparsity
        # step 6 of step.py: what acts after optimizer.step(), in AFTER_OPTIMIZER_STEP's order (the Trainer calls
        # callbacks in the order they were added)
        after_step = {SkippedSteps: self.skipped_steps,
                      StepCallback: StepCallback(clipping) if clip_in_optimizer else None,
                      SparsityCallback: SparsityCallback(sparsity, self) if sparsity is not None else None}
        for stage in AFTER_OPTIMIZER_STEP:
            if after_step[stage] is not None:
                self.add_callback(after_step[stage])
        self.step = TrainingStep(sparsity, sync, clipping, self.teacher, self.kd_config)
        self.drop_last_batch = drop_last_batch
        for plain, compact in ((ProgressCallback, CompactProgressCallback), (PrinterCallback, CompactPrinterCallback)):
            if self.pop_callback(plain) is not None:
                self.add_callback(compact)
        if experiment is not None:
            self.add_callback(ExperimentTracking(experiment, self))

    @property
    def gradient_sync(self):
        """sparsebert's flat all-reduce, once training has started under DDP with ``train.ddp.comm_hook`` flat /
        flat_bf16 / sparse; else None."""
        sync = self.step.sync
        return None if sync is None else sync.flat

    @property
    def clipping(self) -> ClipInOptimizer:
        return self.step.clipping

    # step 1: forward and loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.teacher is None or not model.training:  # distillation is off during evaluation
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        task_loss, outputs = super().compute_loss(model, student_inputs(inputs, self.step.kd_config),
                                                  return_outputs=True, num_items_in_batch=num_items_in_batch)
        divisor = None
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            divisor = getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        loss = self.step.loss(task_loss, outputs, inputs, self.state.global_step, self.state.max_steps, divisor)
        return (loss, outputs) if return_outputs else loss

    # step 2 (backward) and 3 (sync, masking)
    def training_step(self, model, inputs, *args, **kwargs):
        with self.step.backward(model):
            loss = super().training_step(model, inputs, *args, **kwargs)
        if self.accelerator.sync_gradients:  # the last micro-batch of an optimizer step
            self.step.after_backward()
        return loss

    # step 4: clipping
    def clip_gradients(self, model):
        return self.step.clip(model, self.optimizer, self.accelerator, self.args.max_grad_norm,
                              self.trainer_clip_grad_norm)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        gmp = self.sparsity.gmp if self.sparsity is not None else None
        rewind = gmp is not None and gmp.rewind_lr
        if not rewind and self.onecycle is None:
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            optimizer = optimizer if optimizer is not None else self.optimizer
            if rewind:
                scheduler = rewound_lr_scheduler(self.sparsity, optimizer,
                                                 self.args.get_warmup_steps(num_training_steps), num_training_steps)
            else:
                scheduler = onecycle_scheduler(self.onecycle, optimizer, self.args.learning_rate, num_training_steps)
            self.adopt_lr_scheduler(scheduler)
        return self.lr_scheduler

    def after_optimizer_state_saved(self, output_dir) -> None:
        # the masks go into the checkpoint with the optimizer state, before trainer_state.json marks it complete
        # and before the Trainer deletes older checkpoints (with save_total_limit=1, masks written afterwards in
        # on_save left a window in which no complete checkpoint existed)
        if self.sparsity is not None and output_dir and self.is_world_process_zero():
            self.sparsity.save(Path(output_dir))

    # step 7: logging
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
            if self.sparsity is not None:  # the masks' density over time, overall and per layer (one sync per log)
                logs.update(self.sparsity.density_logs())
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

    def skip_epoch(self) -> bool:
        # a resume from the checkpoint of the final step (a run killed while it evaluated or exported): the
        # Trainer checks for the end only after a step, so it would train one step past max_steps and save it
        return self.state.global_step >= self.state.max_steps

    def filter_load_result(self, load_result):
        # A checkpoint stores each tied tensor once (the MLM decoder's weight is the word embeddings, its bias the
        # head's bias), so a resume reports the decoder's names as missing although their tensors were loaded under
        # the other name. Only keys whose tensor nothing loaded are worth a warning.
        missing = set(load_result.missing_keys) - loaded_through_a_tie(self.model, load_result.missing_keys)
        return load_result._replace(missing_keys=[k for k in load_result.missing_keys if k in missing])

    def train(self, *args, **kwargs):
        try:
            return super().train(*args, **kwargs)
        finally:
            self.close_train_workers()

    def close_train_workers(self) -> None:
        """Stop the training loader's worker processes now. They outlive epochs (get_train_dataloader), and left to
        the garbage collector each one waits out its shutdown timeout, at the end of every run."""
        loader = getattr(self, "_train_loader", None)
        if loader is not None:
            # Accelerate's loader wraps torch's (base_dataloader) and forwards attribute reads to it
            stop_loader_workers(getattr(loader, "base_dataloader", loader))

    def get_train_dataloader(self):
        # Two loader settings for training only (TrainingArguments' flags reach the evaluation loaders too):
        # - the short last batch dropped when asked (dataloader_drop_last would drop rows of the evaluation sets);
        # - worker processes that outlive an epoch: starting new ones at every epoch boundary stalled the step, and a
        #   multi-GPU run over a small corpus ends its epochs N times as often (docs/performance.md). (Persistent
        #   evaluation loaders are cached by the Trainer under one name, whatever dataset evaluate() is given.)
        saved = self.args.dataloader_drop_last, self.args.dataloader_persistent_workers
        self.args.dataloader_drop_last = saved[0] or self.drop_last_batch
        self.args.dataloader_persistent_workers = self.args.dataloader_num_workers > 0
        try:
            loader = super().get_train_dataloader()
        finally:
            self.args.dataloader_drop_last, self.args.dataloader_persistent_workers = saved
        self._train_loader = loader
        if self.drop_last_batch and len(loader) == 0:  # the Trainer would run no step at all and report success
            raise SparseBertError(f"train.drop_last_batch: {len(self.train_dataset)} training rows are fewer than one "
                                  f"batch of {self.per_device_train_batch} per device x {self.args.world_size} "
                                  "process(es); use more data or a smaller batch")
        return loader
