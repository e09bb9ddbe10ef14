"""model.fused_qkv compiled by Inductor for CUDA under bf16 autocast: one graph, and the loss and every gradient
agree with transformers' three projections (to bf16 rounding: the fused product sums in another order).

Skipped, with the reason, where there is no CUDA GPU with bf16 (CI has none).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig

from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.models.fused_qkv import use_fused_qkv

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not torch.cuda.is_bf16_supported(),
                                reason="needs a CUDA GPU with bf16")


def test_compiled_fused_step_matches_the_three_projections():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=1024, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        attn_implementation="sdpa")
    plain = BertForMaskedLMAtMasked(config).cuda().train()
    plain.static_mlm_probability = 0.15  # a fixed number of decoder rows, as in pretraining: one graph
    fused = copy.deepcopy(plain)
    assert use_fused_qkv(fused) == 2
    ids = torch.randint(5, 1000, (16, 128), device="cuda")
    labels = torch.where(torch.rand(16, 128, device="cuda") < 0.15, ids, -100)
    losses = []
    for model in (plain, fused):
        torch._dynamo.reset()
        step = torch.compile(model, fullgraph=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step(input_ids=ids, labels=labels).loss
        loss.backward()
        losses.append(loss.item())
    torch._dynamo.reset()
    assert abs(losses[1] - losses[0]) < 1e-2
    # the key bias's gradient is zero up to rounding (softmax ignores a shift shared by all keys): an absolute
    # floor from the whole gradient's norm
    total = torch.norm(torch.stack([p.grad.norm() for p in plain.parameters()])).item()
    for (name, p), f in zip(plain.named_parameters(), fused.parameters(), strict=True):
        assert (f.grad - p.grad).norm().item() <= 2e-2 * p.grad.norm().item() + 1e-4 * total, name
