"""The real training step on a GPU does not wait for the GPU: with the static MLM decoder and the asynchronous
batch copy, steady-state steps have no host-GPU synchronization (torch's CUDA sync debug mode counts them), so the
host queues the next step while the GPU computes this one. The Trainer's blocking copy is the control.

Skipped, with the reason, where there is no CUDA GPU (CI has none). The tokenizer: ``tokenizer_dir``
(tests/gpu/conftest.py); without one, the tests fail and say so.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from sparsebert.config import ExperimentRegistry
from sparsebert.data.mlm_data import MLMCollator
from sparsebert.data.tokenizer import load_tokenizer
from sparsebert.models.bert import build_mlm_model
from sparsebert.models.prepare import prepare_model
from sparsebert.trainer.arguments import training_arguments
from sparsebert.trainer.hooks import build_hooks
from sparsebert.trainer.profiling import HostSyncCounter
from sparsebert.trainer.trainer import SparseBertTrainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _syncs_per_step(async_copy: bool, tokenizer: str) -> dict:
    import datasets

    path = tokenizer
    tokenizer = load_tokenizer(path)
    # a tiny sparse model (the mask hooks run every step) on full-length random blocks
    cfg = ExperimentRegistry.builtin().build("sparse_80_static", [
        "model.size=tiny", f"model.tokenizer={path}", "data.static_mask_count=true",
        f"train.async_batch_copy={str(async_copy).lower()}", "train.max_steps=16", "train.global_batch_size=32",
        "train.warmup_steps=2", "train.eval_at_start=false", "train.eval_steps=1000", "train.save_steps=1000",
        "train.logging_steps=1000", "train.report_to=[]"])
    ids = torch.randint(1000, len(tokenizer), (16 * 32, 128), generator=torch.Generator().manual_seed(0))
    ids[:, 0], ids[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
    data = datasets.Dataset.from_dict({"input_ids": ids.tolist()})
    torch.manual_seed(0)
    model = prepare_model(build_mlm_model(cfg.model, tokenizer, cfg.data), cfg)
    counter = HostSyncCounter(start=5, steps=8)
    with tempfile.TemporaryDirectory() as tmp:
        SparseBertTrainer(model=model, args=training_arguments(cfg.train, Path(tmp), cfg.seed, "syncs"),
                          train_dataset=data, eval_dataset=data.select(range(8)),
                          data_collator=MLMCollator.for_data(cfg.data, tokenizer),
                          processing_class=tokenizer, callbacks=[counter],
                          **build_hooks(cfg, model, cfg.train.max_steps, cfg.seed)).train()
    return counter.result


def test_static_step_with_async_copy_never_waits_for_the_gpu(tokenizer_dir):
    result = _syncs_per_step(async_copy=True, tokenizer=tokenizer_dir)
    assert result["steps"] == 8 and result["syncs"] == 0, result["sites"]


def test_blocking_copy_waits_every_step(tokenizer_dir):
    result = _syncs_per_step(async_copy=False, tokenizer=tokenizer_dir)
    assert result["per_step"] >= 1, result
    assert any("send_to_device" in " ".join(site["stack"]) or "operations.py" in site["site"]
               for site in result["sites"]), result["sites"]
