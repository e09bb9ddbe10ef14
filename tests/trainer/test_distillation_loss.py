"""The distillation terms themselves: a real signal for classification and for regression heads, and the
hidden-state term (kd.hidden_weight) on a tiny MLM student and teacher."""

import math

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertForSequenceClassification
from transformers.modeling_outputs import SequenceClassifierOutput

from sparsebert.config.hook_sections import DistillationConfig
from sparsebert.errors import SparseBertError
from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.trainer.distillation import (
    distillation_loss,
    distilled_loss,
    hidden_state_loss,
    student_inputs,
)


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


TINY_MLM = dict(vocab_size=90, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _mlm(seed: int, **overrides):
    torch.manual_seed(seed)
    return BertForMaskedLMAtMasked(BertConfig(**{**TINY_MLM, **overrides}))


def _mlm_batch() -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 90, (4, 16), generator=g)
    labels = torch.where(torch.rand(4, 16, generator=g) < 0.3, ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "labels": labels}


def test_hidden_term_is_its_weight_times_the_layer_distance_and_reaches_every_layer():
    student, teacher = _mlm(1), _mlm(2).eval()
    inputs = _mlm_batch()
    config = DistillationConfig(teacher="t", alpha=0.5, hidden_weight=0.25)
    assert student_inputs(inputs, DistillationConfig(teacher="t")) == inputs  # no hidden states asked for
    outputs = student(**student_inputs(inputs, config))
    with_hidden = distilled_loss(outputs.loss, outputs, teacher, inputs, config, step=0, max_steps=10, divisor=None)
    without = distilled_loss(outputs.loss, outputs, teacher, inputs, DistillationConfig(teacher="t", alpha=0.5),
                             step=0, max_steps=10, divisor=None)
    teacher_states = teacher(**inputs, output_hidden_states=True).hidden_states
    distance = hidden_state_loss(outputs.hidden_states, teacher_states)
    assert distance.item() > 0
    torch.testing.assert_close(with_hidden - without, 0.25 * distance)
    # by hand: mean over the two layers (not the embeddings) of the mean squared difference
    by_hand = sum(((s - t) ** 2).mean() for s, t in zip(outputs.hidden_states[1:], teacher_states[1:])) / 2
    torch.testing.assert_close(distance, by_hand)
    (0.25 * distance).backward()  # the term alone trains the first layer too
    assert student.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0


def test_hidden_distance_is_zero_for_the_same_model_and_ignores_padding():
    model = _mlm(1).eval()
    inputs = _mlm_batch()
    states = model(**inputs, output_hidden_states=True).hidden_states
    assert hidden_state_loss(states, states).item() == 0.0
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[0, 10:] = 0
    moved = tuple(s.clone() for s in states)
    for s in moved[1:]:
        s[0, 10:] += 5.0  # only padding positions differ
    assert hidden_state_loss(moved, states, mask).item() == 0.0
    assert hidden_state_loss(moved, states).item() > 0


def test_hidden_term_needs_a_teacher_of_the_student_s_shape():
    student, deeper = _mlm(1), _mlm(2, num_hidden_layers=3).eval()
    inputs = _mlm_batch()
    config = DistillationConfig(teacher="t", hidden_weight=1.0)
    outputs = student(**student_inputs(inputs, config))
    with pytest.raises(SparseBertError, match="kd.hidden_weight needs a teacher of the student's shape"):
        distilled_loss(outputs.loss, outputs, deeper, inputs, config, step=0, max_steps=10, divisor=None)
    with pytest.raises(ValueError, match="kd.hidden_weight must be >= 0"):
        DistillationConfig(teacher="t", hidden_weight=-1.0).validate()


def test_hidden_term_with_accumulation_and_padding_on_a_classifier():
    """Finetuning shape of the call: a padded batch (the mask comes from the inputs) and an accumulation divisor,
    which divides both teacher terms, not the task loss."""
    config = BertConfig(**TINY_MLM, num_labels=3)
    torch.manual_seed(1)
    student = BertForSequenceClassification(config)
    torch.manual_seed(2)
    teacher = BertForSequenceClassification(config).eval()
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[2, 9:] = 0
    inputs = {"input_ids": _mlm_batch()["input_ids"], "attention_mask": mask, "labels": torch.tensor([0, 1, 2, 1])}
    kd = DistillationConfig(teacher="t", alpha=0.3, hidden_weight=2.0)
    outputs = student(**student_inputs(inputs, kd))
    got = distilled_loss(outputs.loss, outputs, teacher, inputs, kd, step=0, max_steps=10, divisor=4)
    with torch.no_grad():
        t_out = teacher(**inputs, output_hidden_states=True)
    soft = distillation_loss(outputs.logits, t_out.logits, kd.temperature)
    hidden = hidden_state_loss(outputs.hidden_states, t_out.hidden_states, mask)
    assert hidden != hidden_state_loss(outputs.hidden_states, t_out.hidden_states)  # the mask counts
    torch.testing.assert_close(got, (0.3 * soft + 2.0 * hidden) / 4 + 0.7 * outputs.loss)


class _FixedArguments(nn.Module):
    """A teacher whose forward names its arguments, as the GAP heads' does: no output_hidden_states."""

    def forward(self, input_ids, labels=None):
        return SequenceClassifierOutput(logits=torch.ones(input_ids.shape[0], 2))


def test_without_the_hidden_term_the_teacher_call_is_unchanged():
    inputs = {"input_ids": torch.zeros(3, 4, dtype=torch.long)}
    student = SequenceClassifierOutput(logits=torch.zeros(3, 2))
    loss = distilled_loss(torch.tensor(1.0), student, _FixedArguments(), inputs,
                          DistillationConfig(teacher="t", alpha=0.5), step=0, max_steps=10, divisor=None)
    torch.testing.assert_close(loss, torch.tensor(0.5))  # equal logits: KL 0, half the task loss
