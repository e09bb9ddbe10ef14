"""minilm_glue's GPU default (finetune.gpu_fast_path, here on tiny_glue): one batch shape, compiled with CUDA graphs,
gives the losses of the same run in eager mode with the same shapes, and each run's config.json says which path it
took.

Skipped, with the reason, where there is no CUDA GPU (CI has none; tests/jobs/finetune/test_fast_path.py covers the
settings on CPU). MiniLM: ``minilm_dir`` (tests/gpu/conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from sparsebert.config import ExperimentRegistry
from sparsebert.runner import RunOptions, run_experiment

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# RTE, 44 rows at batch 8: five full steps and a short last batch, which the fast path drops; dropout off
ONE_EPOCH = ['finetune.glue_tasks=["rte"]', "finetune.runs_per_task={}", "finetune.max_train_samples=44",
             "finetune.max_eval_samples=8", "finetune.save_model=false", "train.global_batch_size=8",
             "train.epochs=1", "train.logging_steps=1", "model.hidden_dropout=0", "model.attention_dropout=0"]


class Losses(TrainerCallback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def _run(data_dir: Path, minilm_dir: str, out: Path, extra: list[str]) -> tuple[list[float], dict]:
    logs = Losses()
    cfg = ExperimentRegistry.builtin().build("tiny_glue", [*ONE_EPOCH, f"model.init_from={minilm_dir}", *extra])
    run_experiment(cfg, RunOptions(output_root=out, data_dir=data_dir), callbacks=[logs])
    return logs.losses, json.loads((out / "tiny_glue" / "glue_rte" / "run0" / "config.json").read_text())


def test_the_gpu_fast_path_trains_like_eager_with_the_same_shapes(data_dir, minilm_dir, tmp_path):
    fast, fast_cfg = _run(data_dir, minilm_dir, tmp_path / "fast", ["finetune.gpu_fast_path=true"])
    eager, eager_cfg = _run(data_dir, minilm_dir, tmp_path / "eager", [
        "finetune.pad_to_multiple_of=128", "train.drop_last_batch=true"])
    assert (fast_cfg["train"]["torch_compile"], fast_cfg["train"]["torch_compile_mode"]) == (True, "reduce-overhead")
    assert fast_cfg["finetune"]["pad_to_multiple_of"] == 128 and fast_cfg["train"]["drop_last_batch"]
    assert not eager_cfg["train"]["torch_compile"]
    assert len(fast) == len(eager) == 5
    # bf16 matrix products, fused differently by Inductor
    assert fast == pytest.approx(eager, rel=2e-2, abs=2e-2)
