"""The distillation term itself: a real signal for classification and for regression heads."""

import math

import torch

from sparsebert.trainer.distillation import distillation_loss


def test_classification_term_is_zero_only_when_the_distributions_agree():
    teacher = torch.tensor([[2.0, -1.0], [0.5, 0.5]])
    assert distillation_loss(teacher.clone(), teacher, temperature=2.0).item() == 0.0
    # one row, hand-computed: T^2 * sum p_t (log p_t - log p_s) at T = 1
    student = torch.tensor([[0.0, 0.0]])
    p = torch.softmax(teacher[:1], -1)[0]
    expected = float((p * (p.log() - math.log(0.5))).sum())
    assert math.isclose(distillation_loss(student, teacher[:1], temperature=1.0).item(), expected, rel_tol=1e-6)


def test_regression_head_is_distilled_by_squared_error():
    # A softmax over one value is constant, so a KL term would always be 0 and the student learn nothing.
    teacher = torch.tensor([[3.0], [1.0]])
    student = torch.tensor([[2.0], [1.5]], requires_grad=True)
    loss = distillation_loss(student, teacher, temperature=2.0)
    assert math.isclose(loss.item(), (1.0 + 0.25) / 2, rel_tol=1e-6)
    loss.backward()
    assert student.grad is not None and student.grad.abs().sum() > 0
