"""The order of step 6 in trainer/step.py is executable: SparseBertTrainer adds the callbacks that act after
``optimizer.step()`` in ``AFTER_OPTIMIZER_STEP``'s order, and a real step calls them in it."""

from __future__ import annotations

import torch
from transformers import BertConfig, TrainingArguments

from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.sparsity import SparsityConfig, SparsityController
from sparsebert.trainer.sparse_training import SparsityCallback
from sparsebert.trainer.step import StepCallback
from sparsebert.trainer.trainer import AFTER_OPTIMIZER_STEP, SkippedSteps, SparseBertTrainer

# the step's order, stated once more here so that changing it anywhere is a decision, not an accident
STEP_6 = (SkippedSteps, StepCallback, SparsityCallback)


def tiny_trainer(tmp_path) -> SparseBertTrainer:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16)
    model = BertForMaskedLMAtMasked(config)
    ids = torch.randint(5, 40, (8, 12))
    labels = torch.where(torch.rand(8, 12) < 0.3, ids, torch.full_like(ids, -100))
    labels[:, 0] = ids[:, 0]
    data = [{"input_ids": i, "labels": lab} for i, lab in zip(ids, labels)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=8, report_to=[],
                             optim="adamw_torch_fused", use_cpu=True, save_strategy="no", logging_strategy="no")
    sparsity = SparsityController(model, SparsityConfig(sparsity=0.5))
    return SparseBertTrainer(model=model, args=args, train_dataset=data, sparsity=sparsity, clip_in_optimizer=True)


def test_the_callbacks_after_the_optimizer_step_are_added_and_called_in_the_steps_order(tmp_path, monkeypatch):
    assert AFTER_OPTIMIZER_STEP == STEP_6
    trainer = tiny_trainer(tmp_path)
    added = [type(cb) for cb in trainer.callback_handler.callbacks if type(cb) in STEP_6]
    assert added == list(STEP_6)
    called = []
    for stage in STEP_6:
        original = stage.on_optimizer_step
        monkeypatch.setattr(stage, "on_optimizer_step",
                            lambda self, *a, _original=original, **k: (called.append(type(self)), _original(self, *a, **k))[1])
    trainer.train()
    assert called == list(STEP_6)
