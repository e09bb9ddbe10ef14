"""Every private Transformers / torch name sparsebert touches (trainer/upstream.py) still exists: an upgrade that
renames one fails here, by name, instead of silently inside a training run."""

from __future__ import annotations

import importlib

import pytest
import torch
from transformers import Trainer, TrainingArguments

from sparsebert.trainer.upstream import PRIVATE_NAMES, UpstreamTrainer


@pytest.mark.parametrize("name", PRIVATE_NAMES["Trainer methods"])
def test_the_trainer_hooks_we_override_exist(name):
    assert callable(getattr(Trainer, name, None)), f"Trainer.{name} is gone: see sparsebert/trainer/upstream.py"
    assert name in vars(UpstreamTrainer)  # and upstream.py is where they are overridden


def test_the_trainer_and_argument_attributes_exist(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    trainer = Trainer(model=torch.nn.Linear(2, 2), args=args)
    for name in PRIVATE_NAMES["Trainer attributes"]:
        assert hasattr(trainer, name), f"Trainer.{name} is gone: see sparsebert/trainer/upstream.py"
    for name in PRIVATE_NAMES["TrainingArguments attributes"]:
        assert hasattr(args, name), f"TrainingArguments.{name} is gone: see sparsebert/trainer/upstream.py"


@pytest.mark.parametrize("path", PRIVATE_NAMES["torch"])
def test_the_torch_names_exist(path):
    module_path, _, attribute = path.rpartition(".")
    owner = None
    parts = module_path.split(".")
    for cut in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            owner = getattr(owner, part)
        break
    if attribute == "_orig_mod":  # an instance attribute of a compiled module
        owner = torch.compile(torch.nn.Linear(2, 2), backend="eager")
    assert hasattr(owner, attribute), f"{path} is gone: see sparsebert/trainer/upstream.py"
