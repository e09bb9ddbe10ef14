"""model.fast_gelu / model.fast_dropout: what the cheaper compiled kernels compute (CPU; timings in
bench/elementwise_kernels.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig

from sparsebert.config import Registry
from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.models.fast_kernels import (
    FastGELU,
    HashDropout,
    fitted_gelu,
    hash_dropout,
    use_fast_gelu,
    use_hash_dropout,
)
from sparsebert.trainer.arguments import training_arguments
from sparsebert.trainer.hooks import build_hooks
from sparsebert.trainer.trainer import SparseBertTrainer

REPO = Path(__file__).resolve().parents[2]
CONFIG = dict(vocab_size=90, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
              max_position_embeddings=32)


def test_fitted_gelu_is_exact_gelu_to_8e7_and_its_gradient_to_2e6():
    # fp64 reference; the fit evaluates in fp32 as it does on the GPU (beyond +-5.5 the cdf is clamped)
    x = torch.cat([torch.linspace(-12, 12, 240_001, dtype=torch.float64), torch.tensor([-300.0, 300.0]).double()])
    exact = x.clone().requires_grad_()
    F.gelu(exact).sum().backward()
    fast = x.float().requires_grad_()
    out = fitted_gelu(fast)
    out.sum().backward()
    assert out.dtype == torch.float32
    assert (out.double() - F.gelu(x)).abs().max() < 8e-7
    assert (fast.grad.double() - exact.grad).abs().max() < 2e-6
    # the tanh approximation, for scale: ~600 times further away
    assert (F.gelu(x, approximate="tanh") - F.gelu(x)).abs().max() > 4e-4


def test_fitted_gelu_in_bf16_rounds_like_exact_gelu():
    x = torch.randn(1_000_000, generator=torch.Generator().manual_seed(0)).bfloat16()
    fast, exact = fitted_gelu(x), F.gelu(x)
    assert fast.dtype == torch.bfloat16
    assert (fast != exact).float().mean() < 1e-3  # differ only at rounding ties, by one bf16 step
    torch.testing.assert_close(fast, exact, rtol=8e-3, atol=1e-6)


def test_fast_gelu_module_runs_torch_gelu_eagerly_and_the_fit_when_compiled():
    x = torch.randn(64, 48, dtype=torch.float64)
    module = FastGELU()
    assert torch.equal(module(x), F.gelu(x))
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)(x.float())
    torch._dynamo.reset()
    assert torch.equal(compiled, fitted_gelu(x.float()))
    assert not torch.equal(compiled, F.gelu(x.float()))  # the compiled path really is the fit


def _keep(p: float, seed: int, n: int = 1 << 20) -> torch.Tensor:
    out = hash_dropout(torch.ones(n), p, generator=torch.Generator().manual_seed(seed))
    return out != 0


def test_hash_dropout_keeps_1_minus_p_scaled_and_masks_the_gradient_alike():
    x = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out = hash_dropout(x, 0.1, generator=torch.Generator().manual_seed(0))
    keep = out != 0
    n = keep.numel()
    sd = (0.9 * 0.1 / n) ** 0.5
    assert abs(keep.float().mean().item() - 0.9) < 5 * sd
    torch.testing.assert_close(out[keep], x[keep] / 0.9)
    out.backward(torch.ones_like(out))
    # the backward recomputes the mask from the keys: the same positions, the same scale
    assert torch.equal(x.grad != 0, keep)
    torch.testing.assert_close(x.grad[keep], torch.full_like(x.grad[keep], 1 / 0.9))


@pytest.mark.parametrize("p", [0.02, 0.5])
def test_hash_dropout_keep_rate_follows_p(p):
    keep = _keep(p, 3)
    sd = (p * (1 - p) / keep.numel()) ** 0.5
    assert abs(keep.float().mean().item() - (1 - p)) < 5 * sd


def test_hash_dropout_masks_are_reproducible_and_independent():
    a, b, again = _keep(0.1, 0), _keep(0.1, 1), _keep(0.1, 0)
    assert torch.equal(a, again)  # the keys come from torch's generator: the seed decides the mask
    n = a.numel()
    sd = (0.81 * 0.19 / n) ** 0.5
    # two calls: both kept as often as independent Bernoulli(0.9) draws would be, position by position and
    # shifted by one (a keying that only permuted one pattern would tie neighbouring positions together)
    for other in (b, b.roll(1), b.roll(1 << 10)):
        assert abs((a & other).float().mean().item() - 0.81) < 5 * sd
    # neighbours within one mask are independent too
    assert abs((a & a.roll(1)).float().mean().item() - 0.81) < 5 * sd


def test_hash_dropout_checks_p():
    x = torch.ones(8)
    assert hash_dropout(x, 0.0) is x
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\), got 1.0"):
        hash_dropout(x, 1.0)


def _tiny_mlm(dropout: float):
    torch.manual_seed(0)
    model = BertForMaskedLMAtMasked(BertConfig(**CONFIG, hidden_dropout_prob=dropout,
                                               attention_probs_dropout_prob=dropout)).train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 90, (4, 16), generator=g)
    labels = torch.where(torch.rand(4, 16, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    return model, ids, labels


def test_swaps_keep_the_checkpoint_and_the_eager_model():
    plain, ids, labels = _tiny_mlm(0.1)
    fast = copy.deepcopy(plain)
    # one GELU per layer and the MLM head's transform; dropout: embeddings, 3 per layer (the attention's is only
    # read for its p, which sdpa applies)
    assert use_fast_gelu(fast) == 2 + 1
    assert use_hash_dropout(fast) == 1 + 2 * 3
    assert sum(isinstance(m, FastGELU) for m in fast.modules()) == 3
    assert list(fast.state_dict()) == list(plain.state_dict())
    torch.manual_seed(5)
    loss_plain = plain(input_ids=ids, labels=labels).loss
    torch.manual_seed(5)
    loss_fast = fast(input_ids=ids, labels=labels).loss
    assert torch.equal(loss_fast, loss_plain)  # eager: torch's own gelu and dropout, the same random stream


def test_compiled_model_with_both_is_one_graph_and_trains():
    """fullgraph: no graph break (CUDA graphs need one replay). Without dropout the compiled loss is the plain
    one's to the fit's accuracy; with it, the gradients are finite and the masked values really differ."""
    plain, ids, labels = _tiny_mlm(0.0)
    fast = copy.deepcopy(plain)
    use_fast_gelu(fast)
    use_hash_dropout(fast)
    torch._dynamo.reset()
    loss_fast = torch.compile(fast, backend="aot_eager", fullgraph=True)(input_ids=ids, labels=labels).loss
    torch._dynamo.reset()
    torch.testing.assert_close(loss_fast, plain(input_ids=ids, labels=labels).loss, rtol=1e-5, atol=0)

    dropped, _, _ = _tiny_mlm(0.1)
    use_fast_gelu(dropped)
    use_hash_dropout(dropped)
    encode = torch.compile(dropped.encode, backend="aot_eager", fullgraph=True)
    first, second = encode(ids), encode(ids)
    torch._dynamo.reset()
    assert not torch.equal(first, second)  # new keys each call
    first.float().pow(2).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in dropped.parameters() if p.grad is not None)


@pytest.mark.parametrize("on", [True, False])
def test_the_trainer_converts_the_model_it_trains(tmp_path, on):
    flag = str(on).lower()
    cfg = Registry.from_directory(REPO / "experiments").build(
        "bert_tiny_quick", [f"model.fast_gelu={flag}", f"model.fast_dropout={flag}"])
    model, _, _ = _tiny_mlm(0.1)
    args = training_arguments(cfg.train, tmp_path, cfg.seed, "x", finetune=True, evaluate=False)
    SparseBertTrainer(model=model, args=args, **build_hooks(cfg, model, 10, cfg.seed))
    assert any(isinstance(m, FastGELU) for m in model.modules()) == on
    assert any(isinstance(m, HashDropout) for m in model.modules()) == on
    assert any(type(m) is nn.Dropout for m in model.modules()) != on
