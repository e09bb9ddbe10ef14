"""train.precision=fp8 on a GPU with FP8 matrix products (sm89+): a compiled, 80 %-masked training step in FP8
keeps the masked weights exactly zero and follows the bf16 step's loss.

Skipped, with the reason, where there is no such GPU (CI has none; tests/models/test_fp8.py covers the swap on
CPU under emulation).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig

from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.models.fp8 import fp8_unavailable_reason, use_fp8_matmuls
from sparsebert.models.fused_qkv import use_fused_qkv

REASON = fp8_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def masked_copy(model: torch.nn.Module, masks: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, mask in masks.items():
            params[name].mul_(mask)


@pytest.mark.parametrize("fused_qkv, recipe", [(False, "tensorwise"), (True, "tensorwise_with_gw_hp"),
                                               (True, "rowwise_with_gw_hp")])
def test_compiled_fp8_step_keeps_masked_weights_zero_and_follows_bf16(fused_qkv, recipe):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=1024, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=1024, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        attn_implementation="sdpa")
    bf16 = BertForMaskedLMAtMasked(config).cuda().train()
    bf16.static_mlm_probability = 0.15
    masks = {n: torch.rand_like(p) > 0.8 for n, p in bf16.named_parameters()
             if ".encoder.layer." in n and n.endswith("weight") and p.dim() == 2}
    masked_copy(bf16, masks)
    fp8 = copy.deepcopy(bf16)
    if fused_qkv:  # one FP8 product for Q, K and V (FP8FusedQKVSelfAttention), the defaults' layout
        assert use_fused_qkv(fp8) == 2
    assert len(use_fp8_matmuls(fp8, recipe=recipe)) == 12
    ids = torch.randint(5, 1024, (64, 128), device="cuda")
    labels = torch.where(torch.rand(64, 128, device="cuda") < 0.15, ids, -100)
    curves = []
    for model in (bf16, fp8):
        torch._dynamo.reset()
        step = torch.compile(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        losses = []
        for _ in range(20):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = step(input_ids=ids, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            masked_copy(model, masks)  # what the sparsity controller does after each optimizer step
            losses.append(loss.item())
        curves.append(losses)
    torch._dynamo.reset()
    params = dict(fp8.named_parameters())
    for name, mask in masks.items():
        assert torch.count_nonzero(params[name][~mask]) == 0, name
    # the same descent: every step's loss within 2 % (+ 0.02 once it is small) of bf16's (FP8 rounds inputs to 3
    # mantissa bits), not the same numbers (the products did run in FP8), and it learned
    for step_number, (a, b) in enumerate(zip(*curves, strict=True)):
        assert abs(b - a) <= 2e-2 * a + 2e-2, f"step {step_number}: bf16 {a:.4f}, fp8 {b:.4f}"
    assert curves[1] != curves[0]
    assert curves[1][-1] < curves[1][0] - 0.5


def test_sparse_pretraining_and_dynamic_padding_finetuning_run_in_fp8(data_dir, minilm_dir, tmp_path):
    """Through the Trainer: a compiled RigL run (masks, dense gradients, fused AdamW) and a finetuning run whose
    batches pad to multiples of 8 (a weight gradient's inner dimension is then 8 x odd: padded to 16 by torchao)."""
    import json

    from safetensors.torch import load_file

    from sparsebert.config import ExperimentRegistry
    from sparsebert.runner import RunOptions, run_experiment

    registry = ExperimentRegistry.builtin()
    opts = RunOptions(output_root=tmp_path, data_dir=data_dir)
    fp8 = ["train.precision=fp8", "train.torch_compile=true", f"model.tokenizer={minilm_dir}"]
    run_experiment(registry.build("sparse_tiny_rigl", fp8), opts)
    run = tmp_path / "sparse_tiny_rigl"
    report = json.loads((run / "sparsity.json").read_text())
    assert report["selected"]["sparsity"] == pytest.approx(0.8, abs=1e-3)
    weights = load_file(str(run / "model" / "model.safetensors"))
    zeros = sum(int((t == 0).sum()) for n, t in weights.items() if ".encoder.layer." in n and t.dim() == 2)
    total = sum(t.numel() for n, t in weights.items() if ".encoder.layer." in n and t.dim() == 2)
    assert zeros / total == pytest.approx(0.8, abs=1e-3)  # the masked weights are exact zeros after FP8 training
    assert json.loads((run / "metrics.json").read_text())["eval_loss"] < 10
    run_experiment(registry.build("tiny_glue", [*fp8, 'finetune.glue_tasks=["rte"]', f"model.init_from={minilm_dir}"]),
                   opts)
    metrics = json.loads(next(tmp_path.glob("tiny_glue/glue_rte/run0/metrics.json")).read_text())
    assert 0 <= metrics["accuracy"] <= 1
