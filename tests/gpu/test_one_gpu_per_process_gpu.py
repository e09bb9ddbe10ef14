"""A process outside a launcher that sees several GPUs trains on the first alone, with the experiment's global
batch (the Transformers Trainer alone would wrap the model in nn.DataParallel over all of them); a job's runs side
by side each train on a GPU of their own.

Skipped, with the reason, where fewer than 2 CUDA GPUs are visible (CI has none).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sparsebert.config import ExperimentRegistry
from sparsebert.trainer.arguments import training_arguments
from sparsebert.trainer.hooks import build_hooks
from sparsebert.trainer.trainer import SparseBertTrainer

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs in one process")


def test_one_process_trains_on_one_gpu_with_the_experiment_s_batch(tmp_path):
    cfg = ExperimentRegistry.builtin().build("bert_tiny_quick", ["train.global_batch_size=8"])
    args = training_arguments(cfg.train, tmp_path, cfg.seed, "x", finetune=True, evaluate=False)
    assert args.n_gpu == 1 and args.train_batch_size == 8
    model = nn.Linear(4, 4)
    trainer = SparseBertTrainer(model=model, args=args, **build_hooks(cfg, model, 10, cfg.seed))
    wrapped = trainer._wrap_model(trainer.model)
    assert not isinstance(wrapped, nn.DataParallel)


def test_side_by_side_runs_each_compute_on_a_gpu_of_their_own(tmp_path):
    from parallel_helpers import call, record_cuda_device

    from sparsebert.distributed.gpus import visible_gpus
    from sparsebert.jobs.finetune.parallel import run_in_processes

    gpus = visible_gpus()[:2]
    seen = [tmp_path / f"run{i}" for i in range(2)]
    run_in_processes(call, [(record_cuda_device, str(path)) for path in seen], workers=2, names=["a", "b"],
                     gpus=gpus)
    counts, uuids = zip(*(path.read_text().split() for path in seen), strict=True)
    assert counts == ("1", "1") and uuids[0] != uuids[1]
