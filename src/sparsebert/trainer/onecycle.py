"""One-cycle learning rate: torch's ``OneCycleLR``, created through the Trainer's scheduler hook."""

from __future__ import annotations

import torch

from sparsebert.config.hooks import OneCycleConfig


class OneCycleMixin:
    """Trainer mixin: ``onecycle=`` a OneCycleConfig, or None for the train section's scheduler."""

    def __init__(self, *args, onecycle: OneCycleConfig | None = None, **kwargs):
        self.onecycle = onecycle
        super().__init__(*args, **kwargs)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.onecycle is None:
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            c = self.onecycle
            self.lr_scheduler = torch.optim.lr_scheduler.OneCycleLR(
                optimizer if optimizer is not None else self.optimizer,
                max_lr=c.max_lr or self.args.learning_rate,
                total_steps=num_training_steps,
                pct_start=c.pct_start,
                anneal_strategy=c.anneal_strategy,
                cycle_momentum=c.cycle_momentum,
                base_momentum=c.base_momentum,
                max_momentum=c.max_momentum,
                div_factor=c.div_factor,
                final_div_factor=c.final_div_factor,
                three_phase=c.three_phase,
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler
