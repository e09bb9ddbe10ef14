"""kd.student_from_teacher: the student holds the teacher's weights before its sparsity controller is built, so its
magnitude masks come from the teacher's weights."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from sparsebert.config import ExperimentRegistry
from sparsebert.errors import SparseBertError
from sparsebert.trainer.hooks import build_hooks

TINY = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  num_labels=2)


@pytest.fixture(scope="module")
def cfg():

    registry = ExperimentRegistry.builtin()
    return registry.build("tiny_glue_sparse80")


def _model(seed: int, config: BertConfig = TINY) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    return BertForSequenceClassification(config)


def test_the_student_starts_as_the_pruned_teacher(cfg):
    teacher, student = _model(1), _model(2)
    hooks = build_hooks(cfg, student, total_steps=10, seed=0, teacher_source="teacher", load_teacher=lambda _: teacher)
    controller = hooks["sparsity"]
    assert controller.report()["selected"]["sparsity"] == 0.0  # GMP from initial sparsity 0: not pruned yet
    for name, param in student.named_parameters():
        assert torch.equal(param, teacher.state_dict()[name]), name


def test_a_teacher_of_another_shape_is_one_error(cfg):
    wider = BertConfig(**{**TINY.to_dict(), "hidden_size": 64, "intermediate_size": 128})
    with pytest.raises(SparseBertError, match="kd.student_from_teacher"):
        build_hooks(cfg, _model(2), total_steps=10, seed=0, teacher_source="teacher",
                    load_teacher=lambda _: _model(1, wider))


def test_hidden_state_distillation_checks_the_teacher_s_shape_before_training():

    registry = ExperimentRegistry.builtin()
    cfg = registry.build("tiny_glue_sparse80", ["kd.hidden_weight=1.0"])
    deeper = BertConfig(**{**TINY.to_dict(), "num_hidden_layers": 3})
    with pytest.raises(SparseBertError, match=r"kd.hidden_weight needs a teacher of the student's shape .*\(2, 32\)"):
        build_hooks(cfg, _model(2), total_steps=10, seed=0, teacher_source="teacher",
                    load_teacher=lambda _: _model(1, deeper))
