"""Knowledge distillation: a frozen dense teacher's soft targets added to the task loss.

loss = alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * task loss

For MLM both models score only the masked positions (``BertForMaskedLMAtMasked`` returns one logits row per
masked token, in the same order for teacher and student); for classification (GLUE, CSV, GAP), every example;
for extractive QA (SQuAD), the start and the end distributions, averaged. A regression head (one output, e.g.
STS-B) has no distribution to match: a softmax over one value is always 1 and its KL always 0, so there the
distillation term is the mean squared error to the teacher's prediction instead. Distillation is off during
evaluation: eval loss is the task loss alone, comparable with a run without a teacher.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sparsebert.config.hooks import DistillationConfig


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * KL(teacher || student) per example (row), averaged; in float32 for a stable softmax.

    For a single output (regression) the mean squared error to the teacher's value; no temperature applies.
    """
    if student_logits.shape[-1] == 1:
        return F.mse_loss(student_logits.float(), teacher_logits.float())
    t = temperature
    student = F.log_softmax(student_logits.float() / t, dim=-1)
    teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)
    kl = F.kl_div(student, teacher, log_target=True, reduction="sum") / max(student.shape[0], 1)
    return kl * t * t


def output_logits(outputs) -> list[torch.Tensor]:
    """The distributions a model predicts: ``logits``, or QA's start and end logits."""
    if getattr(outputs, "start_logits", None) is not None:
        return [outputs.start_logits, outputs.end_logits]
    return [outputs.logits]


def match_teacher_rows(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """The student rows that have a teacher row. Under ``data.static_mask_count`` the student (training) scores a
    fixed number of MLM rows: one per masked token, in the row-major order the teacher's exact path (eval mode)
    also uses, then filler rows that score no token. Only the leading rows are compared; elsewhere the shapes
    already agree."""
    if student.dim() == 2 and teacher.dim() == 2 and student.shape[0] > teacher.shape[0]:
        return student[: teacher.shape[0]]
    return student


class DistillationMixin:
    """Trainer mixin: ``distillation=(config, teacher_model)`` or None."""

    def __init__(self, *args, distillation: tuple[DistillationConfig, nn.Module] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.kd_config, self.teacher = distillation if distillation is not None else (None, None)
        if self.teacher is not None:
            self.teacher.eval().requires_grad_(False)
            # the teacher runs in the training precision, on the student's device
            dtype = torch.bfloat16 if self.args.bf16 else torch.float16 if self.args.fp16 else torch.float32
            self.teacher.to(device=self.args.device, dtype=dtype)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.teacher is None or not model.training:
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        task_loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                  num_items_in_batch=num_items_in_batch)
        with torch.no_grad():
            teacher = output_logits(self.teacher(**inputs))
        alpha = self.kd_config.alpha_at(self.state.global_step, self.state.max_steps)
        student = [match_teacher_rows(s, t) for s, t in zip(output_logits(outputs), teacher)]
        kd = sum(distillation_loss(s, t, self.kd_config.temperature) for s, t in zip(student, teacher)) / len(student)
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            # The task loss came back already divided by the step's item count over every accumulated
            # micro-batch, so the Trainer will not divide by the accumulation steps: the micro-batch mean of the
            # distillation term must be (DDP then averages it over processes like any gradient).
            kd = kd / getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        loss = alpha * kd + (1.0 - alpha) * task_loss
        return (loss, outputs) if return_outputs else loss
