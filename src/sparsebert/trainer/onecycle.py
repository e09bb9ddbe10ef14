"""One-cycle learning rate: torch's ``OneCycleLR``, built in place of the Trainer's scheduler (trainer.py)."""

from __future__ import annotations

import torch

from sparsebert.config.hook_sections import OneCycleConfig


def onecycle_scheduler(c: OneCycleConfig, optimizer, learning_rate: float,
                       num_training_steps: int) -> torch.optim.lr_scheduler.OneCycleLR:
    return torch.optim.lr_scheduler.OneCycleLR(
        optimizer,
        max_lr=c.max_lr or learning_rate,
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
