"""Which parameters become sparse."""

from __future__ import annotations

import pytest
from sparsity_helpers import make_tiny_bert

from sparsebert.sparsity import SparsityConfig, select_parameters

ENCODER_WEIGHTS = [
    f"bert.encoder.layer.{i}.{suffix}.weight"
    for i in range(2)
    for suffix in (
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
        "attention.output.dense",
        "intermediate.dense",
        "output.dense",
    )
]


def test_default_selects_exactly_the_encoder_linear_weights(tiny_bert):
    assert list(select_parameters(tiny_bert, SparsityConfig())) == ENCODER_WEIGHTS


def test_embeddings_and_head_on_request(tiny_bert):
    names = list(select_parameters(tiny_bert, SparsityConfig(include_embeddings=True, include_mlm_head=True)))
    assert names == [
        "bert.embeddings.word_embeddings.weight",
        *ENCODER_WEIGHTS,
        "cls.predictions.transform.dense.weight",
    ]
    # the decoder is tied to the word embeddings: one tensor, one mask
    assert not any("decoder" in n for n in names)
    assert list(select_parameters(tiny_bert, SparsityConfig(include_mlm_head=True)))[-1] == (
        "cls.predictions.transform.dense.weight"
    )


def test_exclude_wins_over_include(tiny_bert):
    names = select_parameters(tiny_bert, SparsityConfig(exclude=[r"layer\.0\.", r"\.query\."]))
    assert list(names) == [n for n in ENCODER_WEIGHTS if "layer.0." not in n and ".query." not in n]


def test_biases_and_layernorms_are_never_sparse(tiny_bert):
    names = select_parameters(tiny_bert, SparsityConfig(include=[".*"]))
    assert names and all(p.dim() >= 2 for p in names.values())
    assert not any(n.endswith("bias") or "LayerNorm" in n for n in names)


def test_default_patterns_match_bare_and_task_models():
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    bare = list(select_parameters(BertModel(config), SparsityConfig(include_embeddings=True)))
    assert bare == ["embeddings.word_embeddings.weight", *[n.removeprefix("bert.") for n in ENCODER_WEIGHTS]]
    assert list(select_parameters(BertForSequenceClassification(config), SparsityConfig())) == ENCODER_WEIGHTS


def test_nothing_selected_is_an_error():
    with pytest.raises(ValueError, match=r"^sparsity\.include/exclude select no weight"):
        select_parameters(make_tiny_bert(), SparsityConfig(include=["no_such_layer"]))
