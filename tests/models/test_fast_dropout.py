"""model.fast_dropout: what the counter-hash dropout computes (CPU; the compiled CUDA kernels in
tests/gpu/test_fast_dropout_gpu.py, timings in bench/pretrain_throughput.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import BertConfig

from sparsebert.config import ExperimentRegistry
from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.models.fast_dropout import HashDropout, _keep_mask, hash_dropout, use_hash_dropout
from sparsebert.models.prepare import prepare_model
from sparsebert.trainer.arguments import training_arguments
from sparsebert.trainer.hooks import build_hooks
from sparsebert.trainer.trainer import SparseBertTrainer

CONFIG = dict(vocab_size=90, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
              max_position_embeddings=32)


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
    # the gradient is masked and scaled like the output
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


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_module_draws_the_hash_masks_bit_for_bit(backend):
    """The compiled HashDropout runs the hash (not torch's Philox dropout), with the same keys from the same seed,
    and the compiler's integer code (int32 products that wrap, masked shifts) gives eager's bits."""
    x = torch.randn(64, 300)
    module = HashDropout(0.1).train()
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend, fullgraph=True)
    torch.manual_seed(7)
    out = compiled(x)
    torch.manual_seed(7)
    expected = hash_dropout(x, 0.1)
    keys = torch.tensor([-123456789, 2**31 - 1], dtype=torch.int32)
    masks = torch.compile(_keep_mask, backend=backend, fullgraph=True)(torch.Size([4096, 64]), 0.25, keys, "cpu")
    torch._dynamo.reset()
    assert torch.equal(out, expected)
    assert torch.equal(masks, _keep_mask(torch.Size([4096, 64]), 0.25, keys, "cpu"))


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


def test_the_swap_keeps_the_checkpoint_and_the_eager_model():
    plain, ids, labels = _tiny_mlm(0.1)
    fast = copy.deepcopy(plain)
    # embeddings, 3 per layer (the attention's is only read for its p, which sdpa applies)
    assert use_hash_dropout(fast) == 1 + 2 * 3
    assert list(fast.state_dict()) == list(plain.state_dict())
    torch.manual_seed(5)
    loss_plain = plain(input_ids=ids, labels=labels).loss
    torch.manual_seed(5)
    loss_fast = fast(input_ids=ids, labels=labels).loss
    assert torch.equal(loss_fast, loss_plain)  # eager: torch's own dropout, the same random stream


def test_compiled_model_is_one_graph_and_every_weight_gets_its_gradient():
    """fullgraph: no graph break (CUDA graphs need one replay); new masks every call; and the gradient reaches
    every weight, with a norm close to torch's dropout's (other masks, the same model). aot_eager: the graph as
    the compiler sees it (Inductor's integer code is checked above, and on CUDA in tests/gpu)."""
    plain, ids, labels = _tiny_mlm(0.1)
    fast = copy.deepcopy(plain)
    use_hash_dropout(fast)
    norms = []
    for model in (plain, fast):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        model.zero_grad()
        compiled(input_ids=ids, labels=labels).loss.backward()
        assert [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum()] == []
        norms.append(torch.norm(torch.stack([p.grad.norm() for p in model.parameters()])).item())
    encode = torch.compile(fast.encode, backend="aot_eager", fullgraph=True)
    assert not torch.equal(encode(ids), encode(ids))  # new keys each call
    torch._dynamo.reset()
    assert abs(norms[1] / norms[0] - 1) < 0.15


@pytest.mark.parametrize("on", [True, False])
def test_the_trainer_converts_the_model_it_trains(tmp_path, on):
    flag = str(on).lower()
    cfg = ExperimentRegistry.builtin().build("bert_tiny_quick", [f"model.fast_dropout={flag}"])
    model, _, _ = _tiny_mlm(0.1)
    args = training_arguments(cfg.train, tmp_path, cfg.seed, "x", finetune=True, evaluate=False)
    SparseBertTrainer(model=prepare_model(model, cfg), args=args, **build_hooks(cfg, model, 10, cfg.seed))
    assert any(isinstance(m, HashDropout) for m in model.modules()) == on
    assert any(type(m) is nn.Dropout for m in model.modules()) != on
