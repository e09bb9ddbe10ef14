"""SparseBertTrainer: the one Trainer subclass, and the place hooks attach.

Capabilities that change what the Trainer computes (a distillation loss, a one-cycle schedule) are small mixins
placed before ``Trainer`` in the MRO; capabilities that observe or adjust training between steps (sparse masks,
RigL, pruning) are callbacks. This class itself only adds throughput logging and a NaN guard.
"""

from __future__ import annotations

import math
import time

from transformers import Trainer

from sparsebert.errors import SparseBertError


class ThroughputLoggingMixin:
    """Adds samples/s and tokens/s since the previous training log, and stops on a NaN or infinite loss.

    Both are computed only at logging steps, so there is no extra host-device sync per step.
    """

    tokens_per_sample: int = 0
    _last_log: tuple[float, int] | None = None

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if "loss" in logs:
            loss = logs["loss"]
            if not math.isfinite(loss):
                raise SparseBertError(f"training loss is {loss} at step {self.state.global_step}; "
                                      "lower train.learning_rate or check the data (no checkpoint is trusted "
                                      "past the last finite one)")
            now, step = time.perf_counter(), self.state.global_step
            if self._last_log is not None and step > self._last_log[1]:
                samples = (step - self._last_log[1]) * self.args.train_batch_size \
                    * self.args.gradient_accumulation_steps * self.args.world_size
                seconds = now - self._last_log[0]
                logs["samples_per_second"] = round(samples / seconds, 2)
                if self.tokens_per_sample:
                    logs["tokens_per_second"] = round(samples * self.tokens_per_sample / seconds, 1)
            self._last_log = (now, step)
        super().log(logs, *args, **kwargs)

    def evaluate(self, *args, **kwargs):
        metrics = super().evaluate(*args, **kwargs)
        self._last_log = None  # evaluation time is not training throughput
        return metrics


class SparseBertTrainer(ThroughputLoggingMixin, Trainer):
    """The Trainer every sparsebert job runs; see ``sparsebert.trainer.hooks`` for what attaches to it."""

    def __init__(self, *args, tokens_per_sample: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.tokens_per_sample = tokens_per_sample
