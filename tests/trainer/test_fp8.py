"""train.precision=fp8 on CPU: the setting's validation and errors, and the swap itself under torchao's emulation
(FP8 casts, fp32 products): which layers, the same Parameters, masked weights that stay zero, a loss near fp32's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchao.float8.float8_linear import Float8Linear
from transformers import BertConfig, BertForMaskedLM

from sparsebert.config import ConfigError, Registry
from sparsebert.errors import SparseBertError
from sparsebert.runner import check_train_settings
from sparsebert.trainer.fp8 import use_fp8_matmuls

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.from_directory(REPO / "experiments")


def tiny_mlm(seed: int = 0) -> BertForMaskedLM:
    torch.manual_seed(seed)
    return BertForMaskedLM(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=32))


def test_fp8_is_refused_on_a_machine_without_fp8_matrix_products(registry):
    cfg = registry.build("tiny_glue", ["train.precision=fp8"])
    with pytest.raises(SparseBertError, match="train.precision=fp8 needs a CUDA GPU with FP8 matrix products"):
        check_train_settings(cfg)


def test_an_unknown_fp8_recipe_is_refused_with_the_choices(registry):
    with pytest.raises(ConfigError, match="train.fp8_recipe must be one of tensorwise, rowwise"):
        registry.build("tiny_glue", ["train.precision=fp8", "train.fp8_recipe=blockwise"])


def test_only_the_encoder_linears_multiply_in_fp8_and_keep_their_parameters(tmp_path):
    model = tiny_mlm()
    before = {name: p for name, p in model.named_parameters()}
    keys = list(model.state_dict())
    swapped = use_fp8_matmuls(model, emulate=True)
    # 6 Linears per layer (Q, K, V, attention output, FFN in, FFN out) x 2 layers; heads and pooler stay as they are
    assert len(swapped) == 12 and all(".encoder.layer." in n for n in swapped)
    modules = dict(model.named_modules())
    assert all(isinstance(modules[n], Float8Linear) for n in swapped)
    assert not isinstance(modules["cls.predictions.transform.dense"], Float8Linear)
    # the same Parameter objects: what the masks, the optimizer and DDP hold is what the FP8 layers multiply
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)
    # and the checkpoint is a plain BERT one: the same keys, loaded back into nn.Linear
    assert list(model.state_dict()) == keys
    model.save_pretrained(tmp_path)
    loaded = BertForMaskedLM.from_pretrained(tmp_path)
    assert type(loaded.bert.encoder.layer[0].attention.self.query) is torch.nn.Linear
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


def test_masked_weights_stay_zero_and_the_loss_stays_near_fp32():
    reference, model = tiny_mlm(seed=1), tiny_mlm(seed=1)
    use_fp8_matmuls(model, emulate=True)
    masks = {}
    for name, p in model.named_parameters():  # 80 % of each encoder weight masked, as the sparsity core would
        if ".encoder.layer." in name and name.endswith("weight") and p.dim() == 2:
            masks[name] = torch.rand_like(p) > 0.8
    for net in (reference, model):
        params = dict(net.named_parameters())
        with torch.no_grad():
            for name, mask in masks.items():
                params[name].mul_(mask)
    torch.manual_seed(2)
    ids = torch.randint(0, 100, (4, 16))
    losses = []
    for net in (reference, model):
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
        loss = net(input_ids=ids, labels=ids).loss
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in net.named_parameters() if n in masks)
        optimizer.step()
        params = dict(net.named_parameters())
        with torch.no_grad():
            for name, mask in masks.items():
                params[name].mul_(mask)
        losses.append(loss.item())
    params = dict(model.named_parameters())
    for name, mask in masks.items():
        assert torch.count_nonzero(params[name][~mask]) == 0, name
    # e4m3 keeps 3 mantissa bits: the loss of a tiny model moves by well under 1 % of itself
    assert losses[1] == pytest.approx(losses[0], rel=1e-2)
    assert losses[1] != losses[0]  # and it did go through FP8
