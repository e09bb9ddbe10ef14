"""train.clip_in_optimizer: the clip factor applied inside torch's fused AdamW step (fused AdamW on CPU stands in
for CUDA's; both run the same grad_scale contract). A tiny BERT learns masked tokens of real SST-2 sentences."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import TrainLogs
from transformers import BertConfig

from sparsebert.config import ExperimentRegistry
from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.trainer.arguments import training_arguments
from sparsebert.trainer.clipping import total_norm
from sparsebert.trainer.hooks import build_hooks
from sparsebert.trainer.trainer import SparseBertTrainer

STEPS = 6


@pytest.fixture(scope="module")
def sentences(data_dir, tokenizer) -> list[dict]:
    """48 SST-2 dev sentences, padded to 24 tokens, 15 % of the real tokens as MLM labels (fixed seed)."""
    lines = (data_dir / "glue/SST-2/dev.tsv").read_text().splitlines()[1:49]
    enc = tokenizer([line.split("\t")[0] for line in lines], padding="max_length", truncation=True, max_length=24,
                    return_tensors="pt")
    g = torch.Generator().manual_seed(0)
    chosen = (torch.rand(enc.input_ids.shape, generator=g) < 0.15) & enc.attention_mask.bool()
    chosen[:, 1] = True  # every row has a label
    labels = torch.where(chosen, enc.input_ids, torch.full_like(enc.input_ids, -100))
    inputs = torch.where(chosen, torch.full_like(enc.input_ids, tokenizer.mask_token_id), enc.input_ids)
    return [{"input_ids": i, "attention_mask": m, "labels": lab}
            for i, m, lab in zip(inputs, enc.attention_mask, labels)]


def _train(tmp_path, sentences, vocab: int, *overrides: str):
    cfg = ExperimentRegistry.builtin().build("bert_tiny_quick", [
        f"train.max_steps={STEPS}", "train.global_batch_size=8", "train.logging_steps=1", "train.report_to=[]",
        "train.dataloader_workers=0", "train.learning_rate=1e-3", *overrides])
    torch.manual_seed(0)
    model = BertForMaskedLMAtMasked(BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=2, intermediate_size=64, max_position_embeddings=32))
    args = training_arguments(cfg.train, tmp_path, cfg.seed, "x", finetune=True, evaluate=False)
    logs = TrainLogs()
    trainer = SparseBertTrainer(model=model, args=args, train_dataset=sentences, callbacks=[logs],
                                **build_hooks(cfg, model, STEPS, cfg.seed))
    trainer.train()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return weights, [entry["grad_norm"] for entry in logs.logs], trainer


def test_clipping_inside_fused_adamw_is_the_trainer_s_clipping(tmp_path, sentences, tokenizer):
    """Clipped at 0.05 (every step's norm is far above it): the same weights as the Trainer's own clipping up to
    rounding, the same logged norms, and far from the unclipped run, so the factor really reaches the update."""
    fused = ["train.optim=adamw_torch_fused", "train.max_grad_norm=0.05"]
    ours, our_norms, trainer = _train(tmp_path / "a", sentences, len(tokenizer), *fused)
    theirs, their_norms, _ = _train(tmp_path / "b", sentences, len(tokenizer), *fused, "train.clip_in_optimizer=false")
    unclipped, _, _ = _train(tmp_path / "c", sentences, len(tokenizer), *fused, "train.max_grad_norm=1e9")
    inner = trainer.optimizer.optimizer
    assert trainer.clipping.target is inner and type(inner) is torch.optim.AdamW and inner.defaults["fused"]
    assert not hasattr(inner, "grad_scale")  # taken off after each step: nothing reads it as a loss scale
    assert len(our_norms) == STEPS and min(our_norms) > 20 * 0.05
    assert our_norms == pytest.approx(their_norms, rel=1e-5)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    # Adam normalizes the gradient, so clipping changes the course through the ratio of steps only, but by far
    # more than the rounding above
    assert (ours - unclipped).abs().max() > 2e-4


@pytest.mark.parametrize("optim", ["adamw_torch", "sgd"])
def test_other_optimizers_clip_as_the_trainer_does(tmp_path, sentences, tokenizer, optim):
    """Without a fused Adam / AdamW step there is no grad_scale to use: the Trainer clips, bit for bit as with the
    option off."""
    clip = [f"train.optim={optim}", "train.max_grad_norm=0.05"]
    ours, _, trainer = _train(tmp_path / "a", sentences, len(tokenizer), *clip)
    theirs, _, _ = _train(tmp_path / "b", sentences, len(tokenizer), *clip, "train.clip_in_optimizer=false")
    assert trainer.clipping.target is None and trainer.clipping.checked
    assert torch.equal(ours, theirs)


def test_total_norm_is_clip_grad_norm_s():
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in [(7, 3), (11,), (2, 2, 5)]]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    ours = total_norm([p.grad for p in params])
    assert torch.equal(ours, torch.nn.utils.clip_grad_norm_(params, float("inf")))
    assert torch.equal(total_norm([]), torch.tensor(0.0))
