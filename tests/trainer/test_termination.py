"""A SIGTERM swallowed inside a finalizer still stops training after the step it arrived in."""

from __future__ import annotations

import pytest
import torch
from signal_helpers import sigterm_inside_a_finalizer
from tiny_models import Regression
from transformers import Trainer, TrainerCallback, TrainingArguments

from sparsebert.errors import Terminated
from sparsebert.sigterm import terminate_on_sigterm
from sparsebert.trainer.termination import StopWhenTerminated


class _SigtermInStep(TrainerCallback):
    """At the end of step ``step``, a SIGTERM whose exception a finalizer swallows."""

    def __init__(self, step: int) -> None:
        self.step, self.swallowed = step, []

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.swallowed = sigterm_inside_a_finalizer()


def _trainer(tmp_path, callbacks: list[TrainerCallback]) -> Trainer:
    torch.manual_seed(0)
    rows = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(64)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=20, per_device_train_batch_size=4, report_to=[],
                             save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True)
    return Trainer(model=Regression(), args=args, train_dataset=rows, callbacks=callbacks)


def test_without_the_check_a_swallowed_sigterm_trains_on(tmp_path):
    """Why StopWhenTerminated exists: the handler's exception is lost and all 20 steps run."""
    sigterm = _SigtermInStep(step=3)
    with terminate_on_sigterm():
        trainer = _trainer(tmp_path, [sigterm])
        trainer.train()
    assert [type(e) for e in sigterm.swallowed] == [Terminated]
    assert trainer.state.global_step == 20


def test_a_swallowed_sigterm_stops_training_at_the_next_check(tmp_path):
    sigterm = _SigtermInStep(step=3)
    with terminate_on_sigterm() as raise_if_terminated:
        trainer = _trainer(tmp_path, [sigterm, StopWhenTerminated(raise_if_terminated)])
        with pytest.raises(Terminated, match="terminated by SIGTERM"):
            trainer.train()
    assert [type(e) for e in sigterm.swallowed] == [Terminated]
    assert trainer.state.global_step == 3
