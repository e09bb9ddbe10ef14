"""Task ``upstream``: prune a pretrained encoder on the pretraining corpus while it distils from its dense self.

Upstream pruning (Zafrir et al. 2021, "Prune Once for All") moves the pruning from the small task sets to the
corpus, where data is plentiful; every task then finetunes the pruned model with its masks fixed (a finetuning
experiment whose ``model.init_from`` is such a run reads the masks from its zeros, see ``FinetuneJob``). The
package MiniLM has no MLM head, so there are no soft targets: the student learns to compute the teacher's layers
(:class:`EncoderDistillation`) on unmasked blocks of the corpus. Everything else (data, schedules, sparsity,
checkpoints, ``--resume``) is the MLM job's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import BertModel, EvalPrediction, default_data_collator
from transformers.utils import ModelOutput

from sparsebert.data.mlm_data import build_pretrain_data
from sparsebert.data.tokenizer import load_tokenizer
from sparsebert.distributed import process_state
from sparsebert.errors import SparseBertError
from sparsebert.jobs.pretrain import PretrainJob
from sparsebert.models.prepare import prepare_model
from sparsebert.models.pretrained import pretrained_kwargs
from sparsebert.results.runs import resolve_pretrained
from sparsebert.trainer.distillation import attention_loss, hidden_state_loss, prepare_teacher
from sparsebert.trainer.hooks import build_hooks
from sparsebert.trainer.trainer import SparseBertTrainer


class EncoderDistillation(nn.Module):
    """``student`` trained to reproduce the layers of a frozen ``teacher`` of the same shape.

    The loss is TinyBERT's intermediate-layer loss, the mean squared distance between the two models' layer
    outputs, plus, with ``attention_weight``, the KL divergence between their attention distributions (MiniLM's
    self-attention transfer). It is the model's own output, so the stock Trainer trains and evaluates it like any
    model: the eval loss is the same distance on held-out text (0 before the first step). With the attention term
    the eval loss is the weighted sum; each term also comes back, unweighted, as the output ``terms`` (a row per
    example), which :func:`distillation_terms` turns into the eval metrics ``layer_distance`` and ``attention_kl``.

    The teacher is held outside the module tree: it is not in ``state_dict``, checkpoints, the optimizer, the
    sparsity selection or DDP. Parameter names are the student's with a ``student.`` prefix, which the default
    sparsity patterns match.
    """

    def __init__(self, student: BertModel, teacher: BertModel, hidden_weight: float = 1.0,
                 attention_weight: float = 0.0) -> None:
        super().__init__()
        self.student = student
        self._teacher = (teacher.eval().requires_grad_(False),)  # in a tuple, nn.Module does not register it
        self.hidden_weight = hidden_weight
        self.attention_weight = attention_weight

    @property
    def teacher(self) -> BertModel:
        return self._teacher[0]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, return_loss: bool = True) -> ModelOutput:
        """``loss`` = hidden_weight x layer distance + attention_weight x attention KL; with the attention term
        also ``terms``, the two unweighted, detached, repeated for each example of the batch (the Trainer gathers
        outputs by example).

        ``return_loss``: unused; the Trainer computes the loss of evaluation batches, which carry no labels, only
        for a model whose forward has that argument.
        """
        wants_attention = self.attention_weight > 0
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                  "output_hidden_states": True, "output_attentions": wants_attention}
        student = self.student(**inputs)
        with torch.no_grad():
            teacher = self.teacher(**inputs)
        distance = hidden_state_loss(student.hidden_states, teacher.hidden_states, attention_mask)
        if not wants_attention:
            return ModelOutput(loss=self.hidden_weight * distance)
        kl = attention_loss(student.attentions, teacher.attentions, attention_mask)
        terms = torch.stack([distance, kl]).detach().float().expand(input_ids.shape[0], 2)
        return ModelOutput(loss=self.hidden_weight * distance + self.attention_weight * kl, terms=terms)


def distillation_terms(prediction: EvalPrediction) -> dict[str, float]:
    """The eval metrics of :class:`EncoderDistillation` with the attention term: each term's mean over the held-out
    examples (the eval loss is their weighted sum, not comparable with a run without the term)."""
    terms = prediction.predictions
    return {"layer_distance": float(terms[:, 0].mean()), "attention_kl": float(terms[:, 1].mean())}


def load_encoder(source: str, **kwargs: Any) -> BertModel:
    try:
        return BertModel.from_pretrained(source, **kwargs)
    except OSError as e:
        raise SparseBertError(f"cannot load model '{source}': {str(e).splitlines()[0]}") from None


class UpstreamPruningJob(PretrainJob):
    """The MLM job with :class:`EncoderDistillation` as its model, unmasked blocks as its data, and the student
    alone as its exported ``model/``."""

    label_names: ClassVar[list[str] | None] = []  # no labels: the Trainer then takes the eval loss from the model

    def prepare(self) -> None:
        cfg = self.cfg
        teacher_source = resolve_pretrained(cfg.kd.teacher, self.output_root, "kd.teacher")
        source = resolve_pretrained(cfg.model.init_from, self.output_root, "model.init_from")
        self.tokenizer = load_tokenizer(cfg.model.tokenizer, self.output_root)
        with process_state().local_main_process_first():
            self.data = build_pretrain_data(cfg.data, self.tokenizer, self.data_dir, cfg.seed, mask_eval=False)
        # model.num_layers cuts both: the teacher is the dense model the student was
        student, teacher = (load_encoder(path, **pretrained_kwargs(cfg.model)) for path in (source, teacher_source))
        # the pooler sees no loss here, and a parameter without a gradient stalls DDP; it is exported as it came,
        # for the tasks whose heads read it
        if student.pooler is not None:
            student.pooler.requires_grad_(False)
        _check_same_shape(student, teacher, cfg.kd.teacher)
        self.model = prepare_model(EncoderDistillation(student, teacher, cfg.kd.hidden_weight,
                                                       cfg.kd.attention_weight), cfg)
        # the teacher is the model's own: no distillation hook on top of it
        self.hooks = build_hooks(replace(cfg, kd=None), self.model, cfg.train.max_steps, cfg.seed)

    def collator(self):
        return default_data_collator  # packed blocks of one length: input_ids only, no padding, no masks

    def metric_functions(self) -> dict[str, Any]:
        # the eval loss is the metric; with the attention term, each term beside it. The terms are copied as each
        # batch comes: under train.torch_compile_mode=reduce-overhead they live in a CUDA graph's output buffer,
        # which the next batch overwrites
        if self.cfg.kd.attention_weight <= 0:
            return {}
        return {"compute_metrics": distillation_terms,
                "preprocess_logits_for_metrics": lambda terms, labels: terms.clone()}

    def ready(self, trainer: SparseBertTrainer) -> None:
        prepare_teacher(self.model.teacher, trainer.args.device, trainer.args.bf16, trainer.args.fp16)

    def export(self, trainer: SparseBertTrainer, directory: Path) -> None:
        """The student as a plain ``BertModel`` directory with the tokenizer: what ``model.init_from`` loads."""
        if trainer.is_world_process_zero():
            self.model.student.save_pretrained(str(directory))
            self.tokenizer.save_pretrained(str(directory))

    def train(self, run_dir: Path, resume: bool) -> dict[str, Any]:
        metrics = super().train(run_dir, resume)
        # the eval loss is a distance to the teacher, not a cross-entropy: no perplexity, no masked tokens
        for key in ("perplexity", "initial_perplexity", "masked_accuracy"):
            metrics.pop(key, None)
        return metrics


def _check_same_shape(student: BertModel, teacher: BertModel, teacher_name: str) -> None:
    shapes = [(m.config.num_hidden_layers, m.config.hidden_size) for m in (student, teacher)]
    if shapes[0] != shapes[1]:
        raise SparseBertError(f"task upstream needs a teacher of the student's shape (layers, hidden size): the "
                              f"student is {shapes[0]}, kd.teacher {teacher_name} {shapes[1]}")
