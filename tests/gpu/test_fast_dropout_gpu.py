"""model.fast_dropout compiled by Inductor for CUDA: the forward and, above all, the backward compute what the CPU
tests check (a first version, a custom autograd Function, gave zero gradients through the dropout in its compiled
CUDA backward, which no CPU test could see).

Skipped, with the reason, where there is no CUDA GPU with bf16 (CI has none).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig

from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.models.fast_dropout import HashDropout, _keep_mask, hash_dropout, use_hash_dropout

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not torch.cuda.is_bf16_supported(),
                                reason="needs a CUDA GPU with bf16")


def test_compiled_hash_dropout_masks_the_gradient_like_the_output():
    torch._dynamo.reset()
    x = torch.randn(4096, 768, device="cuda", requires_grad=True)
    out = torch.compile(lambda t: hash_dropout(t, 0.1))(x)
    keep = out != 0
    out.backward(torch.ones_like(out))
    torch._dynamo.reset()
    assert abs(keep.float().mean().item() - 0.9) < 5 * (0.09 / keep.numel()) ** 0.5
    torch.testing.assert_close(out[keep], x.detach()[keep] / 0.9)
    assert torch.equal(x.grad != 0, keep)
    torch.testing.assert_close(x.grad[keep], torch.full_like(x.grad[keep], 1 / 0.9))


def test_triton_integer_code_gives_eagers_masks():
    keys = torch.tensor([-123456789, 2**31 - 1], dtype=torch.int32, device="cuda")
    shape = torch.Size([4096, 768])
    torch._dynamo.reset()
    compiled = torch.compile(_keep_mask, fullgraph=True)(shape, 0.1, keys, "cuda")
    torch._dynamo.reset()
    assert torch.equal(compiled, _keep_mask(shape, 0.1, keys, "cuda"))


def test_cuda_graph_replays_draw_new_masks():
    """Under CUDA graphs (reduce-overhead, as the sparse bench rows run) every replay must draw new keys."""
    module = HashDropout(0.1).train()
    torch._dynamo.reset()
    compiled = torch.compile(module, mode="reduce-overhead", fullgraph=True)
    x = torch.ones(1024, 768, device="cuda")
    masks = [(compiled(x) != 0).clone() for _ in range(6)]  # warm-up, recording, then replays
    torch._dynamo.reset()
    assert all(not torch.equal(masks[i], masks[j]) for i in range(6) for j in range(i))
    assert all(abs(m.float().mean().item() - 0.9) < 0.005 for m in masks)


def test_compiled_bert_step_gets_every_gradient():
    torch.manual_seed(0)
    plain = BertForMaskedLMAtMasked(BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4,
                                               num_attention_heads=4, intermediate_size=1024)).cuda().train()
    fast = copy.deepcopy(plain)
    use_hash_dropout(fast)
    ids = torch.randint(5, 1000, (16, 64), device="cuda")
    labels = torch.where(torch.rand(16, 64, device="cuda") < 0.15, ids, -100)
    norms = []
    for model in (plain, fast):
        torch._dynamo.reset()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.compile(model)(input_ids=ids, labels=labels).loss
        loss.backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum()]
        assert missing == []
        norms.append(torch.norm(torch.stack([p.grad.norm() for p in model.parameters()])).item())
    torch._dynamo.reset()
    # a smoke test (the checks above are the exact ones): other dropout masks, the same model, gradient norms
    # within a few per cent, not a factor of two
    assert abs(norms[1] / norms[0] - 1) < 0.15
