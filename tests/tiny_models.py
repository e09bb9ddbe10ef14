"""The smallest model a Trainer trains: a linear regression whose forward returns the loss."""

from __future__ import annotations

import torch


class Regression(torch.nn.Module):
    """``x`` (n, features) -> one value, mean squared error against ``labels``."""

    def __init__(self, features: int = 4) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(features, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}
