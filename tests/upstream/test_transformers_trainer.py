"""Every private Transformers Trainer / TrainingArguments name sparsebert touches (upstream/transformers_trainer.py) still
exists: an upgrade that renames one fails here, by name, instead of silently inside a training run."""

from __future__ import annotations

import pytest
import torch
from tiny_models import Regression
from transformers import Trainer, TrainingArguments

from sparsebert.upstream.transformers_trainer import PRIVATE_NAMES, UpstreamTrainer, train_on_one_gpu

SEE = "see sparsebert/upstream/transformers_trainer.py"


@pytest.mark.parametrize("name", PRIVATE_NAMES["Trainer methods"])
def test_the_trainer_hooks_we_override_exist(name):
    assert callable(getattr(Trainer, name, None)), f"Trainer.{name} is gone: {SEE}"
    assert name in vars(UpstreamTrainer)  # and upstream/transformers_trainer.py is where they are overridden


def test_the_trainer_and_argument_attributes_exist(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    trainer = Trainer(model=torch.nn.Linear(2, 2), args=args)
    for name in PRIVATE_NAMES["Trainer attributes"]:
        assert hasattr(trainer, name), f"Trainer.{name} is gone: {SEE}"
    for name in PRIVATE_NAMES["TrainingArguments attributes"]:
        assert hasattr(args, name), f"TrainingArguments.{name} is gone: {SEE}"
    train_on_one_gpu(args)
    assert args.n_gpu == 1  # the public property reads the private attribute


def test_the_per_device_batch_is_the_trainers(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, per_device_train_batch_size=3)
    trainer = UpstreamTrainer(model=torch.nn.Linear(2, 2), args=args)
    assert trainer.per_device_train_batch == 3


def test_the_training_loop_attributes_exist(tmp_path):
    """Set by ``train()``: checked on a Trainer that trained, and read as the loss sum they make up."""
    rows = [{"x": torch.ones(2) * i, "labels": torch.tensor(float(i))} for i in range(8)]
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=2,
                             per_device_train_batch_size=4, save_strategy="no", logging_steps=1, disable_tqdm=True)
    trainer = UpstreamTrainer(model=Regression(features=2), args=args, train_dataset=rows)
    result = trainer.train()
    for name in PRIVATE_NAMES["Trainer attributes while training"]:
        assert hasattr(trainer, name), f"Trainer.{name} is gone: {SEE}"
    # every step was logged (logging_steps=1): nothing is left unlogged for the end of train() to add twice
    assert trainer.loss_sum_since_train_began() == pytest.approx(result.training_loss * 2)
