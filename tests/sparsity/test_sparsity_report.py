"""The sparsity report on a hand-checkable model, and the BERT layer types."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from sparsebert.sparsity import SparsityConfig, SparsityController, layer_type


def _hand_model() -> nn.Module:
    model = nn.Module()
    model.embeddings = nn.Module()
    model.embeddings.word_embeddings = nn.Embedding(10, 4)  # 40
    layer = nn.Module()
    layer.intermediate = nn.Module()
    layer.intermediate.dense = nn.Linear(4, 8)  # 32 + 8
    layer.output = nn.Module()
    layer.output.dense = nn.Linear(8, 4)  # 32 + 4
    model.encoder = nn.Module()
    model.encoder.layer = nn.ModuleList([layer])
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(1.0)
        layer.intermediate.dense.bias[0] = 0.0  # a real zero outside the masks is counted too
    return model


def test_report_numbers_by_hand():
    model = _hand_model()
    report = SparsityController(model, SparsityConfig(sparsity=0.75)).report()
    assert report["layers"] == [
        {
            "name": "encoder.layer.0.intermediate.dense.weight",
            "type": "intermediate",
            "shape": [8, 4],
            "active": 8,
            "total": 32,
            "nonzero": 8,
            "sparsity": 0.75,
        },
        {
            "name": "encoder.layer.0.output.dense.weight",
            "type": "output",
            "shape": [4, 8],
            "active": 8,
            "total": 32,
            "nonzero": 8,
            "sparsity": 0.75,
        },
    ]
    assert report["by_type"]["output"] == {
        "tensors": 1,
        "total": 32,
        "active": 8,
        "nonzero": 8,
        "sparsity": 0.75,
    }
    assert report["selected"] == {"tensors": 2, "total": 64, "active": 16, "nonzero": 16, "sparsity": 0.75}
    # whole model: 116 parameters, 48 masked zeros + 1 zero bias
    assert report["model"] == {"total": 116, "nonzero": 67, "sparsity": pytest.approx(49 / 116)}
    assert report["model_excluding_embeddings"] == {
        "total": 76,
        "nonzero": 27,
        "sparsity": pytest.approx(49 / 76),
    }
    assert report["headline"] == (
        "75.0% sparse encoder linear layers (2 tensors); embeddings dense; "
        "whole model 42.2% sparse (64.5% excluding embeddings)"
    )
    json.dumps(report)


def test_report_counts_actual_zeros_not_mask_bits():
    model = _hand_model()
    controller = SparsityController(model, SparsityConfig(sparsity=0.75))
    with torch.no_grad():
        model.encoder.layer[0].output.dense.weight.zero_()
    layer = controller.report()["layers"][1]
    assert (layer["active"], layer["nonzero"], layer["sparsity"]) == (8, 0, 1.0)


def test_bert_report_with_embeddings(tiny_bert):
    report = SparsityController(tiny_bert, SparsityConfig(sparsity=0.8, include_embeddings=True)).report()
    assert report["by_type"]["word_embeddings"]["total"] == 100 * 32
    assert {k: v["tensors"] for k, v in report["by_type"].items()} == {
        "word_embeddings": 1,
        "query": 2,
        "key": 2,
        "value": 2,
        "attention_output": 2,
        "intermediate": 2,
        "output": 2,
    }
    assert report["headline"].startswith(
        "80.0% sparse encoder linear layers + word embeddings (13 tensors); whole"
    )
    assert report["model"]["total"] == sum(p.numel() for p in tiny_bert.parameters())
    json.dumps(report)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("bert.encoder.layer.3.attention.self.query.weight", "query"),
        ("encoder.layer.0.attention.self.value.weight", "value"),
        ("bert.encoder.layer.3.attention.output.dense.weight", "attention_output"),
        ("bert.encoder.layer.3.output.dense.weight", "output"),
        ("bert.encoder.layer.3.intermediate.dense.weight", "intermediate"),
        ("bert.embeddings.word_embeddings.weight", "word_embeddings"),
        ("cls.predictions.transform.dense.weight", "mlm_head"),
        ("classifier.weight", "other"),
    ],
)
def test_layer_types(name, kind):
    assert layer_type(name) == kind
