"""Tiny models, their fixtures and the training loop shared by the sparsity, export and all-reduce tests (all CPU, a
few seconds in total); a directory's conftest.py imports the fixtures it uses."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from sparsebert.sparsity import SparsityController

VOCAB = 100


def make_tiny_bert(seed: int = 0) -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    return BertForMaskedLM(config)


def make_mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def bert_loss(model: nn.Module, generator: torch.Generator) -> torch.Tensor:
    ids = torch.randint(0, VOCAB, (4, 12), generator=generator)
    return model(input_ids=ids, labels=ids).loss


def mlp_loss(model: nn.Module, generator: torch.Generator) -> torch.Tensor:
    x = torch.randn(8, 16, generator=generator)
    return model(x).pow(2).mean() + model(x).sum() * 0.01


def train(
    model: nn.Module,
    controller: SparsityController,
    optimizer: torch.optim.Optimizer,
    steps: int,
    loss_fn: Callable[[nn.Module, torch.Generator], torch.Tensor],
    on_step: Callable[[dict[str, float] | None], None] | None = None,
    data_seed: int = 0,
) -> None:
    """The loop the Trainer runs: backward, step, then the controller (gradients still present), then zero_grad."""
    generator = torch.Generator().manual_seed(data_seed)
    for _ in range(steps):
        loss_fn(model, generator).backward()
        optimizer.step()
        stats = controller.on_optimizer_step()
        if on_step is not None:
            on_step(stats)
        optimizer.zero_grad(set_to_none=True)


def assert_masked_weights_zero(controller: SparsityController) -> None:
    for name, param in controller.params.items():
        assert torch.all(param.detach()[~controller.masks[name]] == 0), name


@pytest.fixture
def one_thread():
    """Tiny tensors run several times faster on one thread than with intra-op threads fighting for 2 cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_bert() -> nn.Module:
    return make_tiny_bert()


@pytest.fixture
def mlp() -> nn.Sequential:
    return make_mlp()
