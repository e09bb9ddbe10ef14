"""model.half_precision_residual on CUDA autocast: every LayerNorm returns bf16 (without it, fp32), and a
training step's loss and gradients stay close to the fp32-residual model's.

Skipped, with the reason, where there is no CUDA GPU with bf16 (CI has none).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import BertConfig

from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.models.residual_precision import use_half_precision_residual

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not torch.cuda.is_bf16_supported(),
                                reason="needs a CUDA GPU with bf16")


def test_layernorms_return_bf16_and_the_step_stays_close():
    torch.manual_seed(0)
    plain = BertForMaskedLMAtMasked(BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4,
                                               num_attention_heads=4, intermediate_size=1024,
                                               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    plain = plain.cuda().train()
    half = copy.deepcopy(plain)
    use_half_precision_residual(half)
    ids = torch.randint(5, 1000, (8, 128), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    labels = torch.where(ids % 7 == 0, ids, torch.full_like(ids, -100))
    losses, dtypes = [], []
    for model in (plain, half):
        seen = []
        hooks = [m.register_forward_hook(lambda mod, inp, out, seen=seen: seen.append(out.dtype))
                 for m in model.modules() if isinstance(m, nn.LayerNorm)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        for h in hooks:
            h.remove()
        losses.append(loss.detach())
        dtypes.append(set(seen))
    assert dtypes == [{torch.float32}, {torch.bfloat16}]
    torch.testing.assert_close(losses[1], losses[0], rtol=2e-2, atol=0)
    g_plain = torch.cat([p.grad.flatten() for p in plain.parameters()])
    g_half = torch.cat([p.grad.flatten() for p in half.parameters()])
    assert torch.isfinite(g_half).all()
    assert torch.nn.functional.cosine_similarity(g_half, g_plain, dim=0) > 0.99
