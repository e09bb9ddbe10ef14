"""model.fused_qkv: Q, K and V from one matrix product compute what transformers' three products compute (CPU;
timings in bench/pretrain_throughput.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM
from transformers.models.bert.modeling_bert import BertSelfAttention

from sparsebert.config import Registry
from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.models.fused_qkv import FusedQKVSelfAttention, use_fused_qkv
from sparsebert.trainer.prepare import prepare_model

REPO = Path(__file__).resolve().parents[2]
CONFIG = dict(vocab_size=90, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _pair(model_class=BertForMaskedLM, **config):
    torch.manual_seed(0)
    plain = model_class(BertConfig(**CONFIG, **config, attn_implementation="sdpa"))
    fused = copy.deepcopy(plain)
    assert use_fused_qkv(fused) == CONFIG["num_hidden_layers"]
    return plain, fused


def _batch(padded: bool):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 90, (3, 12), generator=g)
    labels = torch.where(torch.rand(3, 12, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 7:] = 0  # a padded row: the mask must reach attention through the fused path too
    return ids, mask, labels


@pytest.mark.parametrize("padded", [False, True])
def test_fused_attention_gives_the_same_outputs_and_gradients(padded):
    plain, fused = _pair()
    assert list(fused.state_dict()) == list(plain.state_dict())
    ids, mask, labels = _batch(padded)
    out = [m(input_ids=ids, attention_mask=mask, labels=labels) for m in (plain, fused)]
    torch.testing.assert_close(out[1].logits, out[0].logits, rtol=1e-5, atol=1e-5)
    for o in out:
        o.loss.backward()
    for (name, p), f in zip(plain.named_parameters(), fused.parameters(), strict=True):
        assert f.grad is not None and p.grad is not None, name
        torch.testing.assert_close(f.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_masked_position_model_without_a_mask_and_a_decoder_with_a_cache():
    plain, fused = _pair(BertForMaskedLMAtMasked)  # sparsebert's pretraining path: the encoder gets no mask
    ids, _, labels = _batch(False)
    torch.testing.assert_close(fused(input_ids=ids, labels=labels).loss, plain(input_ids=ids, labels=labels).loss)
    # a decoder with a key/value cache runs transformers' own forward, with the same result
    plain, fused = _pair(is_decoder=True)
    out = [m(input_ids=ids, use_cache=True) for m in (plain, fused)]
    torch.testing.assert_close(out[1].logits, out[0].logits, rtol=1e-5, atol=1e-5)


def test_compiles_without_a_graph_break():
    _, fused = _pair()
    attention = fused.bert.encoder.layer[0].attention.self
    assert type(attention) is FusedQKVSelfAttention
    hidden = torch.randn(2, 8, CONFIG["hidden_size"])
    torch._dynamo.reset()
    compiled = torch.compile(attention, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(hidden)[0], attention(hidden)[0])
    torch._dynamo.reset()


def test_projections_without_bias_keep_transformers_forward():
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(**CONFIG))
    model.bert.encoder.layer[0].attention.self.key.bias = None
    assert use_fused_qkv(model) == 1
    assert type(model.bert.encoder.layer[0].attention.self) is BertSelfAttention


@pytest.mark.parametrize("on", [True, False])
def test_the_experiment_setting_swaps_the_trained_model(on):
    cfg = Registry.from_directory(REPO / "experiments").build("bert_tiny_quick", [f"model.fused_qkv={str(on).lower()}"])
    model, _ = _pair()
    prepare_model(model, cfg)
    assert any(type(m) is FusedQKVSelfAttention for m in model.modules()) == on
