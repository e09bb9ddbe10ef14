"""Shared by the trainer tests: a callback that keeps the Trainer's training logs."""

from __future__ import annotations

from transformers import TrainerCallback


class TrainLogs(TrainerCallback):
    """Every training log entry (the ones with a ``loss``), in order."""

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.logs.append(dict(logs))

    @property
    def losses(self) -> list[float]:
        return [float(entry["loss"]) for entry in self.logs]
