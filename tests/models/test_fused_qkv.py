"""model.fused_qkv: Q, K and V from one matrix product compute what transformers' three products compute (CPU;
timings in bench/pretrain_throughput.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM
from transformers.models.bert.modeling_bert import BertSelfAttention

from sparsebert.config import ExperimentRegistry
from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.models.fused_qkv import FusedQKVSelfAttention, use_fused_qkv
from sparsebert.models.prepare import prepare_model

CONFIG = dict(vocab_size=90, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _pair(model_class=BertForMaskedLM, attn="sdpa", **config):
    torch.manual_seed(0)
    plain = model_class(BertConfig(**{**CONFIG, **config}, attn_implementation=attn))
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


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("padded", [False, True])
def test_fused_attention_gives_the_same_outputs_and_gradients(padded, attn):
    plain, fused = _pair(attn=attn)
    assert list(fused.state_dict()) == list(plain.state_dict())
    ids, mask, labels = _batch(padded)
    kwargs = {"output_attentions": True} if attn == "eager" else {}  # eager attention returns its probabilities
    out = [m(input_ids=ids, attention_mask=mask, labels=labels, **kwargs) for m in (plain, fused)]
    torch.testing.assert_close(out[1].logits, out[0].logits, rtol=1e-5, atol=1e-5)
    if attn == "eager":
        for a, b in zip(out[0].attentions, out[1].attentions, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    for o in out:
        o.loss.backward()
    for (name, p), f in zip(plain.named_parameters(), fused.parameters(), strict=True):
        assert f.grad is not None and p.grad is not None, name
        torch.testing.assert_close(f.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_attention_dropout_only_in_training(attn):
    """Eval: no dropout, the same output. Training: the same dropout draws from the same seed (sdpa and eager
    attention both draw theirs inside the attention function, which the fused path calls as transformers does)."""
    plain, fused = _pair(attn=attn, attention_probs_dropout_prob=0.3)
    ids, mask, _ = _batch(True)
    for training in (False, True):
        out = []
        for model in (plain, fused):
            model.train(training)
            torch.manual_seed(3)
            out.append(model(input_ids=ids, attention_mask=mask).logits)
        torch.testing.assert_close(out[1], out[0], rtol=1e-5, atol=1e-5)
    plain.eval()
    torch.manual_seed(3)
    assert not torch.allclose(plain(input_ids=ids, attention_mask=mask).logits, out[0])  # dropout was on


def test_masked_position_model_without_a_mask():
    plain, fused = _pair(BertForMaskedLMAtMasked)  # sparsebert's pretraining path: the encoder gets no mask
    ids, _, labels = _batch(False)
    torch.testing.assert_close(fused(input_ids=ids, labels=labels).loss, plain(input_ids=ids, labels=labels).loss)


class ScaledLinear(torch.nn.Linear):
    """A projection with its own forward (as a 2:4 kernel export's), which the fused product would skip."""

    def forward(self, x):
        return 2 * super().forward(x)


def test_decoders_and_replaced_projections_keep_transformers_attention():
    torch.manual_seed(0)
    decoder = BertForMaskedLM(BertConfig(**CONFIG, is_decoder=True))
    assert use_fused_qkv(decoder) == 0  # a key/value cache: transformers' own forward
    model = BertForMaskedLM(BertConfig(**CONFIG))
    attention = model.bert.encoder.layer[0].attention.self
    attention.value.__class__ = ScaledLinear
    assert use_fused_qkv(model) == 1
    assert type(attention) is BertSelfAttention


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
    cfg = ExperimentRegistry.builtin().build("bert_tiny_quick", [f"model.fused_qkv={str(on).lower()}"])
    model, _ = _pair()
    prepare_model(model, cfg)
    assert any(type(m) is FusedQKVSelfAttention for m in model.modules()) == on
