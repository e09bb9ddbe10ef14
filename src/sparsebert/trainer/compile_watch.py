"""Counting torch.compile's graphs during training: a recompile after warm-up costs as long as the first compile.

A new input shape (the short last batch of an epoch, an evaluation batch of another size) or a guard that fails
makes Dynamo compile another graph and, under ``reduce-overhead``, record another CUDA graph: a minute of a
BERT-base run each time. Warm-up ends at the first evaluation after training started (the training graph and the
evaluation graph both exist by then); every graph compiled after that is counted, logged and reported in the run's
metrics as ``recompiles_after_warmup``.
"""

from __future__ import annotations

import logging

from transformers import TrainerCallback

from sparsebert.upstream.torch_ops import compiled_graphs

log = logging.getLogger(__name__)

__all__ = ["CompileWatch", "compiled_graphs"]  # read in upstream/torch_ops.py (a private Dynamo counter)


class CompileWatch(TrainerCallback):
    """Records the graph count when warm-up ends and the graphs compiled after it."""

    def __init__(self) -> None:
        self.at_warmup_end: int | None = None
        self.recompiles = 0

    def on_evaluate(self, args, state, control, **kwargs):
        if self.at_warmup_end is None and state.global_step > 0:
            self.at_warmup_end = compiled_graphs()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.at_warmup_end is None or logs is None:
            return
        recompiles = compiled_graphs() - self.at_warmup_end
        if recompiles > self.recompiles:
            log.warning("torch.compile compiled %d new graph(s) after warm-up (by step %d): a new input shape or a "
                        "failed guard; each costs as long as the first compile", recompiles - self.recompiles,
                        state.global_step)
        self.recompiles = recompiles

    def on_train_end(self, args, state, control, **kwargs):
        if self.at_warmup_end is not None:
            self.recompiles = compiled_graphs() - self.at_warmup_end
