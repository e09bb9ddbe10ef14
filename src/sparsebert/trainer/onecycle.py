"""One-cycle learning rate: torch's ``OneCycleLR``, created through the Trainer's scheduler hook."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class OneCycleConfig:
    max_lr: float | None = None  # None: train.learning_rate
    pct_start: float = 0.3
    div_factor: float = 25.0  # initial lr = max_lr / div_factor
    final_div_factor: float = 1e4  # final lr = initial lr / final_div_factor
    anneal_strategy: str = "cos"
    cycle_momentum: bool = True  # cycles AdamW's beta1 between base_momentum and max_momentum, as torch does
    base_momentum: float = 0.85
    max_momentum: float = 0.95
    three_phase: bool = False

    def validate(self) -> None:
        if self.max_lr is not None and self.max_lr <= 0:
            raise ValueError(f"onecycle.max_lr must be > 0, got {self.max_lr}")
        if not 0.0 < self.pct_start < 1.0:
            raise ValueError(f"onecycle.pct_start must be in (0, 1), got {self.pct_start}")
        if self.anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"onecycle.anneal_strategy must be cos or linear, got {self.anneal_strategy!r}")
        if self.div_factor <= 0 or self.final_div_factor <= 0:
            raise ValueError("onecycle.div_factor and onecycle.final_div_factor must be > 0")
        if self.base_momentum > self.max_momentum:
            # torch would cycle beta1 upside down (highest while the lr peaks) without a word
            raise ValueError(f"onecycle.base_momentum ({self.base_momentum}) must be <= onecycle.max_momentum "
                             f"({self.max_momentum})")


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
