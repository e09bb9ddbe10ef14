"""model.half_precision_residual: LayerNorm outputs in the autocast dtype (CPU autocast bf16 stands in for CUDA's)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import BertConfig

from sparsebert.config import ExperimentRegistry
from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.models.prepare import prepare_model
from sparsebert.models.residual_precision import (
    AutocastDtypeLayerNorm,
    apply_half_precision_residual,
    use_half_precision_residual,
)
from sparsebert.trainer.arguments import training_arguments
from sparsebert.trainer.hooks import build_hooks
from sparsebert.trainer.trainer import SparseBertTrainer

CONFIG = dict(vocab_size=90, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
              max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _model_and_batch():
    torch.manual_seed(0)
    model = BertForMaskedLMAtMasked(BertConfig(**CONFIG)).train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 90, (4, 16), generator=g)
    labels = torch.where(torch.rand(4, 16, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    return model, ids, labels


def _residual_dtypes(model) -> list[tuple[torch.dtype, torch.dtype]]:
    """(input, output) dtype of every LayerNorm call of the next forward."""
    seen = []
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            m.register_forward_hook(lambda mod, inp, out: seen.append((inp[0].dtype, out.dtype)))
    return seen


def test_residual_stream_is_bf16_under_autocast_and_the_loss_stays_close():
    plain, ids, labels = _model_and_batch()
    half = copy.deepcopy(plain)
    assert use_half_precision_residual(half) == 2 * 2 + 2  # 2 per layer, embeddings, MLM head transform
    plain_dtypes, half_dtypes = _residual_dtypes(plain), _residual_dtypes(half)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_plain = plain(input_ids=ids, labels=labels).loss
        loss_half = half(input_ids=ids, labels=labels).loss
    # plain: the embeddings' and the layers' LayerNorms (the residual stream) return fp32 (the head's follows its
    # bf16 input on CPU; CUDA autocast runs every LayerNorm in fp32)
    assert {out for _, out in plain_dtypes[:1 + 2 * 2]} == {torch.float32}
    assert {out for _, out in half_dtypes} == {torch.bfloat16}
    # after the embeddings, every residual sum (a LayerNorm's input) is bf16 too
    assert {inp for inp, _ in half_dtypes[1:]} == {torch.bfloat16}
    torch.testing.assert_close(loss_half, loss_plain, rtol=2e-2, atol=0)
    loss_half.backward()
    ln = half.bert.encoder.layer[0].output.LayerNorm
    assert ln.weight.dtype == torch.float32 and ln.weight.grad.dtype == torch.float32
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in half.parameters())


def test_without_autocast_nothing_changes():
    plain, ids, labels = _model_and_batch()
    half = copy.deepcopy(plain)
    use_half_precision_residual(half)
    assert torch.equal(half(input_ids=ids, labels=labels).loss, plain(input_ids=ids, labels=labels).loss)
    assert list(half.state_dict()) == list(plain.state_dict())  # checkpoints are interchangeable


@pytest.mark.parametrize("on", [True, False])
def test_the_trainer_converts_the_model_it_trains(tmp_path, on):
    cfg = ExperimentRegistry.builtin().build(
        "bert_tiny_quick", [f"model.half_precision_residual={str(on).lower()}"])
    model, _, _ = _model_and_batch()
    args = training_arguments(cfg.train, tmp_path, cfg.seed, "x", finetune=True, evaluate=False)
    SparseBertTrainer(model=prepare_model(model, cfg), args=args, **build_hooks(cfg, model, 10, cfg.seed))
    kinds = {type(m) for m in model.modules() if isinstance(m, nn.LayerNorm)}
    assert kinds == ({AutocastDtypeLayerNorm} if on else {nn.LayerNorm})


def test_converted_model_compiles_to_one_graph_that_keeps_the_cast():
    """No graph break from the autocast queries (a break would cost CUDA graphs their single replay), and the
    compiled encoder still hands back bf16 (the last LayerNorm's output); unconverted, fp32."""
    model, ids, _ = _model_and_batch()
    plain = copy.deepcopy(model)
    use_half_precision_residual(model)
    dtypes = []
    for m in (model, plain):
        torch._dynamo.reset()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            dtypes.append(torch.compile(m.encode, backend="aot_eager", fullgraph=True)(ids).dtype)
    torch._dynamo.reset()
    assert dtypes == [torch.bfloat16, torch.float32]


@pytest.mark.parametrize("precision, converted", [("bf16", True), ("fp32", True), ("fp16", False)])
def test_fp16_training_keeps_an_fp32_residual_stream(precision, converted):
    """A pretraining default must not put an fp16 residual stream (which can overflow) into an fp16 run; in fp32
    the converted LayerNorms compute as before (no autocast)."""
    model, _, _ = _model_and_batch()
    assert (apply_half_precision_residual(model, precision) > 0) == converted
    kinds = {type(m) for m in model.modules() if isinstance(m, nn.LayerNorm)}
    assert kinds == ({AutocastDtypeLayerNorm} if converted else {nn.LayerNorm})
