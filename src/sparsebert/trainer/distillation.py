"""Knowledge distillation: a frozen dense teacher's soft targets added to the task loss.

loss = alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * task loss

For MLM both models score only the masked positions (``BertForMaskedLMAtMasked`` returns one logits row per
masked token, in the same order for teacher and student); for classification (GLUE, CSV, GAP), every example;
for extractive QA (SQuAD), the start and the end distributions, averaged. A regression head (one output, e.g.
STS-B) has no distribution to match: a softmax over one value is always 1 and its KL always 0, so there the
distillation term is the mean squared error to the teacher's prediction instead. Distillation is off during
evaluation: eval loss is the task loss alone, comparable with a run without a teacher.

With ``kd.hidden_weight`` > 0 a second term is added: ``hidden_weight * mean over layers of MSE(student layer
output, teacher layer output)`` (TinyBERT's intermediate-layer loss), which needs a teacher of the student's shape.
It supervises every token at every layer, where the soft targets reach only the output (masked tokens in MLM).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sparsebert.config.hook_sections import DistillationConfig
from sparsebert.errors import SparseBertError


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


def hidden_state_loss(student: tuple[torch.Tensor, ...], teacher: tuple[torch.Tensor, ...],
                      attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over the encoder layers of the mean squared distance between the two models' outputs, in float32.

    Args:
        student, teacher: the models' ``hidden_states``: the embeddings' output, then one (batch, seq, hidden)
            tensor per layer. The embeddings are left out: they take no sparsity, and the layers above see any
            difference in them anyway.
        attention_mask: (batch, seq), 1 on real tokens; padding positions do not count. None: every position.
    Returns:
        a scalar; 0 when the two models compute the same layers.
    """
    if len(student) != len(teacher) or student[-1].shape != teacher[-1].shape:
        raise SparseBertError(
            f"kd.hidden_weight needs a teacher of the student's shape: the student has {len(student) - 1} layers "
            f"of {tuple(student[-1].shape)}, the teacher {len(teacher) - 1} of {tuple(teacher[-1].shape)}")
    weights = None if attention_mask is None else attention_mask.float() / attention_mask.sum().clamp_min(1)
    total = student[-1].new_zeros((), dtype=torch.float32)
    for s, t in zip(student[1:], teacher[1:]):
        per_token = (s.float() - t.float()).square().mean(dim=-1)  # (batch, seq)
        total = total + (per_token.mean() if weights is None else (per_token * weights).sum())
    return total / (len(student) - 1)


def attention_loss(student: tuple[torch.Tensor, ...], teacher: tuple[torch.Tensor, ...],
                   attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over layers, heads and query tokens of KL(teacher || student) between the attention distributions
    (MiniLM's self-attention distribution transfer, Wang et al. 2020), in float32.

    Args:
        student, teacher: the models' ``attentions``: one (batch, heads, query, key) tensor of probabilities per
            layer (eager attention: sdpa returns none).
        attention_mask: (batch, seq), 1 on real tokens; padded query rows do not count (padded keys already have
            probability 0 in both). None: every query row.
    Returns:
        a scalar; 0 when the two models attend alike.
    """
    if not student or student[0] is None or len(student) != len(teacher):
        raise SparseBertError("kd.attention_weight needs the attention probabilities of both models "
                              "(model.attn_implementation=eager) and a teacher with the student's layers")
    weights = None if attention_mask is None else attention_mask.float() / attention_mask.sum().clamp_min(1)
    total = student[0].new_zeros((), dtype=torch.float32)
    for s, t in zip(student, teacher):
        t_prob = t.float()
        # KL per query row; clamp: a probability of exactly 0 (a padded key) would give log 0
        kl = (t_prob * (t_prob.clamp_min(1e-12).log() - s.float().clamp_min(1e-12).log())).sum(-1)
        per_token = kl.mean(dim=1)  # over heads: (batch, query)
        total = total + (per_token.mean() if weights is None else (per_token * weights).sum())
    return total / len(student)


def match_teacher_rows(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """The student rows that have a teacher row. Under ``data.static_mask_count`` the student (training) scores a
    fixed number of MLM rows: one per masked token, in the row-major order the teacher's exact path (eval mode)
    also uses, then filler rows that score no token. Only the leading rows are compared; elsewhere the shapes
    already agree."""
    if student.dim() == 2 and teacher.dim() == 2 and student.shape[0] > teacher.shape[0]:
        return student[: teacher.shape[0]]
    return student


def student_inputs(inputs: dict, config: DistillationConfig) -> dict:
    """The student's forward arguments: with ``kd.hidden_weight`` it returns its hidden states too."""
    return {**inputs, "output_hidden_states": True} if config.hidden_weight > 0 else inputs


def prepare_teacher(teacher: nn.Module, device, bf16: bool, fp16: bool) -> nn.Module:
    """Frozen, in eval mode, in the training precision, on the student's device."""
    teacher.eval().requires_grad_(False)
    dtype = torch.bfloat16 if bf16 else torch.float16 if fp16 else torch.float32
    return teacher.to(device=device, dtype=dtype)


def distilled_loss(task_loss: torch.Tensor, outputs, teacher: nn.Module, inputs: dict, config: DistillationConfig,
                   step: int, max_steps: int, divisor: int | None) -> torch.Tensor:
    """The training loss with the teacher's terms: ``alpha * kd + hidden_weight * hidden + (1 - alpha) * task_loss``
    (``hidden``: :func:`hidden_state_loss`, left out at weight 0). ``outputs`` must hold the student's
    ``hidden_states`` when ``config.hidden_weight`` > 0 (``student_inputs`` asks for them).

    ``divisor``: the step's accumulation count where the task loss came back already divided by the item count
    over every accumulated micro-batch (the Trainer then does not divide by the accumulation steps, so the
    micro-batch mean of the distillation term must be; DDP then averages it over processes like any gradient);
    None otherwise.
    """
    wants_hidden = config.hidden_weight > 0
    with torch.no_grad():  # (some teachers, the GAP heads, take no output_hidden_states argument)
        teacher_outputs = teacher(**inputs, output_hidden_states=True) if wants_hidden else teacher(**inputs)
    teacher_logits = output_logits(teacher_outputs)
    alpha = config.alpha_at(step, max_steps)
    student = [match_teacher_rows(s, t) for s, t in zip(output_logits(outputs), teacher_logits)]
    kd = sum(distillation_loss(s, t, config.temperature) for s, t in zip(student, teacher_logits)) / len(student)
    distill = alpha * kd
    if wants_hidden:
        if getattr(outputs, "hidden_states", None) is None:
            raise SparseBertError("kd.hidden_weight: the student returned no hidden states")
        distill = distill + config.hidden_weight * hidden_state_loss(
            outputs.hidden_states, teacher_outputs.hidden_states, inputs.get("attention_mask"))
    if divisor is not None:
        distill = distill / divisor
    return distill + (1.0 - alpha) * task_loss
