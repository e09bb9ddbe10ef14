"""GAP pronoun resolution: train on one file, evaluate on another, with the concat / mul / segment head."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from transformers import default_data_collator

from sparsebert.data.classification_metrics import plot_confusion_matrix
from sparsebert.data.gap import (
    GAP_CLASSES,
    GapExample,
    gap_features,
    gap_metrics,
    read_gap,
    write_gap_system_file,
    write_kaggle_submission,
)
from sparsebert.errors import SparseBertError
from sparsebert.models.gap_heads import GapClassifier
from sparsebert.trainer.finetune.common import FinetuneContext, finish_run, make_trainer, softmax

MODEL_INPUTS = ["input_ids", "attention_mask", "token_type_ids", "p_idx", "a_idx", "b_idx", "labels"]


@dataclass
class GapInputs:
    """Everything a GAP run reads, checked before any run directory exists."""

    train_examples: list[GapExample]
    eval_examples: list[GapExample]
    train_features: Any  # datasets.Dataset of MODEL_INPUTS
    eval_features: Any
    teacher: str | None


def load_gap(ctx: FinetuneContext, task: str) -> GapInputs:
    fcfg = ctx.cfg.finetune
    teacher = ctx.teacher_source("gap")
    train_ex = read_gap(ctx.data_file(fcfg.gap_train_file), on_bad_row=fcfg.gap_bad_rows)
    eval_ex = read_gap(ctx.data_file(fcfg.gap_eval_file), on_bad_row=fcfg.gap_bad_rows)
    if fcfg.max_train_samples:
        train_ex = train_ex[:fcfg.max_train_samples]
    if fcfg.max_eval_samples:
        eval_ex = eval_ex[:fcfg.max_eval_samples]
    train_features = gap_features(train_ex, ctx.tokenizer, fcfg.max_seq_length, fcfg.gap_head)
    eval_features = gap_features(eval_ex, ctx.tokenizer, fcfg.max_seq_length, fcfg.gap_head)
    return GapInputs(train_ex, eval_ex, train_features.select_columns(MODEL_INPUTS),
                     eval_features.select_columns(MODEL_INPUTS), teacher)


def run_gap(ctx: FinetuneContext, inputs: GapInputs, seed: int, run_dir: Path) -> dict[str, Any]:
    started = time.time()
    fcfg = ctx.cfg.finetune
    model = GapClassifier.from_pretrained_encoder(ctx.model_source, fcfg.gap_head,
                                                  encoder_kwargs=ctx.pretrained_kwargs)
    trainer = make_trainer(ctx, model, run_dir, seed, inputs.train_features, inputs.eval_features,
                           default_data_collator, ["labels"], compute_metrics=_accuracy,
                           teacher_source=inputs.teacher,
                           load_teacher=lambda source: load_gap_teacher(ctx.model_source, fcfg.gap_head, source))
    trainer.train()
    out = trainer.predict(inputs.eval_features)
    probs = softmax(out.predictions)
    metrics = gap_metrics(probs, inputs.eval_examples)
    ids = [ex.id for ex in inputs.eval_examples]
    outputs = [partial(write_kaggle_submission, run_dir / "submission.csv", ids, probs),
               partial(write_gap_system_file, run_dir / "gap_system.tsv", ids, probs),
               partial(plot_confusion_matrix, metrics["confusion_matrix"], GAP_CLASSES,
                       run_dir / "confusion_matrix.png")]
    metrics.update({"head": fcfg.gap_head, "train_examples": len(inputs.train_examples),
                    "eval_examples": len(inputs.eval_examples)})
    return finish_run(ctx, trainer, run_dir, "gap", seed, metrics, started, outputs)


def load_gap_teacher(encoder_source: str, head: str, teacher_dir: str) -> GapClassifier:
    """A finetuned GAP model: the same architecture, with the weights its run saved (model.safetensors)."""
    from safetensors.torch import load_file

    teacher = GapClassifier.from_pretrained_encoder(encoder_source, head)
    state = load_file(str(Path(teacher_dir) / "model.safetensors"))
    # runs saved before the unused pooler was dropped still carry its weights
    teacher.load_state_dict({k: v for k, v in state.items() if not k.startswith("encoder.pooler.")})
    return teacher


def load_gap_model(model_dir: str | Path, head: str, encoder_source: str) -> GapClassifier:
    """A finished run's GAP model: the encoder built from the config of ``encoder_source`` (the model the run
    started from; ``model/`` holds only the state dict), then every weight from ``model/model.safetensors``."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModel

    try:
        config = AutoConfig.from_pretrained(encoder_source)
    except (OSError, ValueError) as e:
        raise SparseBertError(f"cannot load the config of {encoder_source}, the encoder the GAP run started "
                              f"from: {str(e).splitlines()[0]}") from None
    model = GapClassifier(AutoModel.from_config(config), head)  # random weights, all replaced below
    state = load_file(str(Path(model_dir) / "model.safetensors"))
    # runs saved before the unused pooler was dropped still carry its weights
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("encoder.pooler.")})
    return model


def _accuracy(p) -> dict[str, float]:
    return {"accuracy": float((np.asarray(p.predictions).argmax(-1) == p.label_ids).mean())}
