"""train.precision=fp8 on CPU: the setting's validation and errors, its wiring into the model transforms, and the
swap itself under torchao's emulation (FP8 casts, fp32 products): which layers, the same Parameters, a plain BERT
checkpoint, and gradients that follow fp32's."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torchao.float8.float8_linear import Float8Linear
from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification

import sparsebert.models.prepare as prepare
from sparsebert.config import ConfigError, ExperimentRegistry
from sparsebert.errors import SparseBertError
from sparsebert.models.fp8 import FP8FusedQKVSelfAttention, use_fp8_matmuls
from sparsebert.models.fused_qkv import FusedQKVSelfAttention, use_fused_qkv
from sparsebert.runner import check_train_settings


@pytest.fixture(scope="module")
def registry() -> ExperimentRegistry:
    return ExperimentRegistry.builtin()


def tiny_bert(cls=BertForMaskedLM, seed: int = 0, hidden: int = 32, intermediate: int = 64, layers: int = 2):
    torch.manual_seed(seed)
    return cls(BertConfig(vocab_size=100, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                          intermediate_size=intermediate, max_position_embeddings=32, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0))  # no dropout: both passes see the same network


def test_fp8_is_refused_without_a_gpu(registry, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = registry.build("tiny_glue", ["train.precision=fp8"])
    with pytest.raises(SparseBertError, match="train.precision=fp8 needs a CUDA GPU with FP8 matrix products"):
        check_train_settings(cfg)


def test_fp8_is_refused_on_a_gpu_before_sm89(registry, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA A100")
    with pytest.raises(SparseBertError, match="NVIDIA A100 is sm80: use bf16"):
        check_train_settings(registry.build("tiny_glue", ["train.precision=fp8"]))


@pytest.mark.parametrize("key, value", [("fp8_recipe", "blockwise"), ("fp8_layers", "all")])
def test_unknown_fp8_settings_are_refused_with_the_choices(registry, key, value):
    with pytest.raises(ConfigError, match=f"train.{key} must be one of"):
        registry.build("tiny_glue", ["train.precision=fp8", f"train.{key}={value}"])


def test_the_model_transforms_swap_the_encoder_and_fuse_qkv_in_fp8(registry, monkeypatch):
    monkeypatch.setattr(prepare, "use_fp8_matmuls", partial(use_fp8_matmuls, emulate=True))
    cfg = registry.build("tiny_glue", ["train.precision=fp8", "model.fused_qkv=true"])
    model = prepare.prepare_model(tiny_bert(BertForSequenceClassification), cfg)
    kinds = [type(m) for m in model.modules()]
    assert kinds.count(Float8Linear) == 12 and kinds.count(FP8FusedQKVSelfAttention) == 2
    assert FusedQKVSelfAttention not in kinds  # every fused product multiplies in FP8
    assert type(model.classifier) is torch.nn.Linear


def test_the_fused_product_runs_in_fp8_and_follows_its_three_fp8_projections():
    model = tiny_bert(seed=3)
    assert use_fused_qkv(model) == 2
    use_fp8_matmuls(model, emulate=True)
    attention = model.bert.encoder.layer[0].attention.self
    assert type(attention) is FP8FusedQKVSelfAttention
    projections = (attention.query, attention.key, attention.value)
    weight, bias = torch.cat([p.weight for p in projections]), torch.cat([p.bias for p in projections])
    hidden = torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        fused = attention.project(hidden, weight, bias)
        exact = torch.nn.functional.linear(hidden, weight, bias)
        separate = torch.cat([p(hidden) for p in projections], dim=-1)  # each its own FP8 scale

    def off(a: torch.Tensor, b: torch.Tensor) -> float:
        return ((a - b).norm() / b.norm()).item()

    # through FP8 (3 mantissa bits: not the fp32 product), and what the three FP8 projections give to FP8's rounding
    assert 0 < off(fused, exact) < 0.05 and off(fused, separate) < 0.05


def test_fused_qkv_in_fp8_trains_its_three_projections():
    reference, fused = tiny_bert(seed=3), tiny_bert(seed=3)
    use_fused_qkv(fused)
    use_fp8_matmuls(fused, emulate=True)
    ids = torch.randint(0, 100, (4, 16), generator=torch.Generator().manual_seed(4))
    losses = []
    for net in (reference, fused):
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-2)
    grads = {n: p.grad for n, p in reference.named_parameters()}
    for name, p in fused.named_parameters():
        if ".attention.self." in name and name.endswith("weight"):  # the three Parameters the fused product reads
            cosine = torch.nn.functional.cosine_similarity(p.grad.flatten(), grads[name].flatten(), dim=0)
            assert cosine > 0.99, (name, cosine.item())


def test_auto_layers_with_rowwise_gw_hp_are_refused(registry):
    # torchao's shape heuristic knows no rule for this recipe: refused when the experiment is built, not at the swap
    with pytest.raises(ConfigError, match="train.fp8_layers=auto has no shape rule for .*rowwise_with_gw_hp"):
        registry.build("tiny_glue", ["train.precision=fp8", "train.fp8_layers=auto",
                                     "train.fp8_recipe=rowwise_with_gw_hp"])


@pytest.mark.parametrize("recipe, exact", [("tensorwise_with_gw_hp", True), ("tensorwise", False)])
def test_tensorwise_with_gw_hp_leaves_the_weight_gradient_in_high_precision(recipe, exact):
    torch.manual_seed(5)
    model = BertForMaskedLM(BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=32))
    layer = model.bert.encoder.layer[0].output.dense
    linear = torch.nn.Linear(64, 64)
    linear.load_state_dict(layer.state_dict())
    use_fp8_matmuls(model, recipe=recipe, emulate=True)
    fp8 = model.bert.encoder.layer[0].output.dense
    x, g = torch.randn(40, 64), torch.randn(40, 64)
    for net in (linear, fp8):
        (net(x) * g).sum().backward()  # the output gradient is g itself: nothing upstream went through FP8
    # the weight gradient is g^T x: in high precision it is exactly fp32's; through FP8 casts it is not
    assert torch.allclose(fp8.weight.grad, linear.weight.grad, rtol=1e-5, atol=1e-5) is exact
    assert torch.allclose(fp8.bias.grad, linear.bias.grad)


def test_only_the_encoder_linears_multiply_in_fp8_and_keep_their_parameters(tmp_path):
    model = tiny_bert()
    before = dict(model.named_parameters())
    keys = list(model.state_dict())
    swapped = use_fp8_matmuls(model, emulate=True)
    # 6 Linears per layer (Q, K, V, attention output, FFN in, FFN out) x 2 layers; heads and pooler stay as they are
    assert len(swapped) == 12 and all(".encoder.layer." in n for n in swapped)
    assert not isinstance(dict(model.named_modules())["cls.predictions.transform.dense"], Float8Linear)
    # the same Parameter objects: what the masks, the optimizer and DDP hold is what the FP8 layers multiply
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)
    # and the checkpoint is a plain BERT one: the same keys, loaded back into nn.Linear
    assert list(model.state_dict()) == keys
    model.save_pretrained(tmp_path)
    loaded = BertForMaskedLM.from_pretrained(tmp_path)
    assert type(loaded.bert.encoder.layer[0].attention.self.query) is torch.nn.Linear
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_upstream_distillation_swaps_the_student_and_leaves_its_teacher():
    """Upstream pruning trains EncoderDistillation(student, teacher) as one model: the FP8 swap reaches the
    student's encoder through the wrapper and leaves the teacher (held outside the module tree) as it was."""
    from transformers import BertModel

    from sparsebert.jobs.upstream_pruning import EncoderDistillation

    student, teacher = (BertModel(tiny_bert(seed=s).config, add_pooling_layer=False) for s in (0, 1))
    swapped = use_fp8_matmuls(EncoderDistillation(student, teacher), emulate=True)
    assert len(swapped) == 12 and all(n.startswith("student.encoder.layer.") for n in swapped)
    assert not any(isinstance(m, Float8Linear) for m in teacher.modules())


def test_auto_layers_keep_only_the_shapes_torchao_expects_to_gain():
    # BERT-base's shapes (768 / 3072): of the tensorwise recipe's candidates only the FFN up-projection
    # (N = 3072 > 1024) is large enough to gain
    model = tiny_bert(hidden=768, intermediate=3072, layers=1)
    assert use_fp8_matmuls(model, layers="auto", emulate=True) == ["bert.encoder.layer.0.intermediate.dense"]


def test_fp8_gradients_follow_fp32():
    reference, model = tiny_bert(seed=1), tiny_bert(seed=1)
    swapped = use_fp8_matmuls(model, emulate=True)
    torch.manual_seed(2)
    ids = torch.randint(0, 100, (3, 21))  # 63 tokens: the padded inner dimension of the weight gradients
    losses = []
    for net in (reference, model):
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-2) and losses[1] != losses[0]  # it went through FP8
    grads = {n: p.grad for n, p in reference.named_parameters()}
    for name, p in model.named_parameters():
        if name.removesuffix(".weight") in swapped:
            cosine = torch.nn.functional.cosine_similarity(p.grad.flatten(), grads[name].flatten(), dim=0)
            assert cosine > 0.99, (name, cosine.item())
