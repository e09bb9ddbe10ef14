"""The steps, seconds and summed training loss behind a run's model, carried across ``--resume``.

A resumed process trains only the steps after its checkpoint; the steps before it were trained by the processes
that wrote the checkpoints, and their time and loss are gone with them unless the checkpoint keeps them. So every
checkpoint's ``trainer_state.json`` keeps these totals (as the Trainer keeps any ``ExportableState`` callback's),
and the run reports samples/s and train loss over all the steps that made its model, whether it ran in one
process or was resumed several times; the steps of a killed process after its last checkpoint, trained again by
the next, count once.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState


@dataclass(frozen=True)
class Totals:
    """Optimizer steps, training seconds (the Trainer's ``train_runtime``: evaluations and saves included) and the
    sum of the steps' training losses."""

    steps: int = 0
    seconds: float = 0.0
    loss_sum: float = 0.0

    def __add__(self, other: Totals) -> Totals:
        return Totals(self.steps + other.steps, self.seconds + other.seconds, self.loss_sum + other.loss_sum)

    @property
    def train_loss(self) -> float | None:
        """The mean training loss per step; None when no step was trained."""
        return self.loss_sum / self.steps if self.steps else None

    def samples_per_second(self, samples_per_step: int) -> float | None:
        return self.steps * samples_per_step / self.seconds if self.steps and self.seconds else None


class TrainingTotals(TrainerCallback, ExportableState):
    """Keeps :class:`Totals` in every checkpoint and reads them back from the one a resume starts from.

    The Trainer asks ``state()`` while it saves a checkpoint and stores the answer in its ``trainer_state.json``
    (``stateful_callbacks``); a resumed Trainer loads that file into ``state`` before ``on_train_begin``. (The
    Trainer's own ``restore_callback_states_from_checkpoint`` would build a new instance without the trainer; it
    is off, and not needed: the totals are read here.)

    Args:
        trainer: the UpstreamTrainer it is added to (its step count and running loss sum).
    """

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.carried = Totals()  # of the processes before this one, from the checkpoint resumed
        self._began: float | None = None  # this process's train() start
        self._first_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        # a checkpoint written before this callback existed has no entry: its steps are not counted (nothing says
        # how long they took), and the entry is added, or the Trainer's next save would fail looking it up
        saved = state.stateful_callbacks.setdefault(type(self).__name__, self.state())
        self.carried = Totals(**saved.get("attributes", {})) if state.global_step else Totals()
        self._began, self._first_step = time.perf_counter(), state.global_step

    def so_far(self) -> Totals:
        """The totals at this moment of training (what a checkpoint saved now keeps)."""
        if self._began is None:
            return self.carried
        trainer = self.trainer
        return self.carried + Totals(trainer.state.global_step - self._first_step, time.perf_counter() - self._began,
                                     trainer.loss_sum_since_train_began())

    def at_end(self, train_output) -> Totals:
        """The totals of the finished run, from what ``train()`` returned: the Trainer's mean loss over this
        process's steps (its running sum is no longer what it logged once training ends)."""
        steps = self.trainer.state.global_step - self._first_step
        return self.carried + Totals(steps, train_output.metrics["train_runtime"], train_output.training_loss * steps)

    def state(self) -> dict:
        return {"args": {}, "attributes": dataclasses.asdict(self.so_far())}
