"""GAP pronoun resolution: train on one file, evaluate on another, with the concat / mul / segment head; the GAP
metrics, the Kaggle submission and the official scorer's system file (reading, features: ``data/gap.py``)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from transformers import default_data_collator

from sparsebert.data.gap import GapExample, gap_features, read_gap
from sparsebert.errors import SparseBertError
from sparsebert.io import atomic_write_text
from sparsebert.jobs.finetune.classification_metrics import plot_confusion_matrix
from sparsebert.jobs.finetune.common import FinetuneContext, finish_run, make_trainer, softmax
from sparsebert.models.gap_heads import GapClassifier, encoder_config

MODEL_INPUTS = ["input_ids", "attention_mask", "token_type_ids", "p_idx", "a_idx", "b_idx", "labels"]


@dataclass
class GapInputs:
    """Everything a GAP run reads, checked before any run directory exists."""

    train_examples: list[GapExample]
    eval_examples: list[GapExample]
    train_features: Any  # datasets.Dataset of MODEL_INPUTS
    eval_features: Any
    teacher: str | None

    @property
    def train_rows(self) -> int:
        return len(self.train_features)


def load_gap(ctx: FinetuneContext, task: str) -> GapInputs:
    fcfg = ctx.cfg.finetune
    teacher = ctx.teacher_source("gap")
    train_ex = read_gap(ctx.data_file(fcfg.gap_train_file), on_bad_row=fcfg.gap_bad_rows)
    eval_ex = read_gap(ctx.data_file(fcfg.gap_eval_file), on_bad_row=fcfg.gap_bad_rows)
    if fcfg.max_train_samples is not None:
        train_ex = train_ex[:fcfg.max_train_samples]
    if fcfg.max_eval_samples is not None:
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
                           load_teacher=lambda source: load_gap_model(source, fcfg.gap_head, ctx.model_source))
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


def load_gap_model(model_dir: str | Path, head: str, encoder_source: str) -> GapClassifier:
    """A finished run's GAP model (also a distillation teacher): the encoder built from the config of
    ``encoder_source`` (the model the run started from; ``model/`` holds only the state dict) with as many layers
    as the saved weights have, then every weight from ``model/model.safetensors``."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    state = load_file(str(Path(model_dir) / "model.safetensors"))
    # runs saved before the unused pooler was dropped still carry its weights
    state = {k: v for k, v in state.items() if not k.startswith("encoder.pooler.")}
    model = GapClassifier(AutoModel.from_config(encoder_config(state, encoder_source)), head)  # weights replaced below
    model.load_state_dict(state)
    return model


def _accuracy(p) -> dict[str, float]:
    return {"accuracy": float((np.asarray(p.predictions).argmax(-1) == p.label_ids).mean())}


# ---------------------------------------------------------------------------------------------- metrics, outputs


def _check_probs(probs: np.ndarray, n: int, what: str) -> np.ndarray:
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[1] != 3 or probs.shape[0] != n:
        raise SparseBertError(f"{what}: probs must have shape ({n}, 3), got {probs.shape}")
    return probs


def _prf(pred: np.ndarray, gold: np.ndarray) -> tuple[float, float, float]:
    tp = float(np.sum(pred & gold))
    precision = tp / pred.sum() if pred.sum() else 0.0
    recall = tp / gold.sum() if gold.sum() else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


GAP_CLASSES = ("A", "B", "Neither")  # label ids 0, 1, 2


def gap_metrics(probs: np.ndarray, examples: Sequence[GapExample]) -> dict[str, Any]:
    """``accuracy``, Kaggle ``log_loss`` and the GAP paper's pairwise ``precision/recall/f1``,
    ``f1_masculine``, ``f1_feminine`` and ``bias`` = F1(feminine) / F1(masculine) (nan when F1(masculine) = 0),
    and the 3-class ``confusion_matrix`` (rows = gold A / B / Neither, columns = predicted).

    Pairwise decisions: A-coref is predicted when argmax is A, B-coref when argmax is B; each row gives two
    decisions scored against its gold A-coref / B-coref (the positive class is "coreferent").
    """
    from sklearn.metrics import confusion_matrix  # as classification_metrics does; sklearn loads slowly

    probs = _check_probs(probs, len(examples), "gap_metrics")
    labels = np.array([ex.label for ex in examples])
    pred = probs.argmax(axis=1)
    # Kaggle: clip, renormalize each row, mean negative log probability of the gold class
    clipped = np.clip(probs, 1e-15, 1 - 1e-15)
    clipped /= clipped.sum(axis=1, keepdims=True)
    log_loss = float(-np.mean(np.log(clipped[np.arange(len(labels)), labels])))

    pred_pairs = np.concatenate([pred == 0, pred == 1])
    gold_pairs = np.concatenate([labels == 0, labels == 1])
    genders = np.array([ex.gender for ex in examples] * 2)
    precision, recall, f1 = _prf(pred_pairs, gold_pairs)
    f1_m = _prf(pred_pairs[genders == "M"], gold_pairs[genders == "M"])[2]
    f1_f = _prf(pred_pairs[genders == "F"], gold_pairs[genders == "F"])[2]
    return {
        "accuracy": float(np.mean(pred == labels)),
        "log_loss": log_loss,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "f1_masculine": f1_m,
        "f1_feminine": f1_f,
        "bias": f1_f / f1_m if f1_m else float("nan"),
        "confusion_matrix": confusion_matrix(labels, pred, labels=[0, 1, 2]).tolist(),
    }


def write_kaggle_submission(path: str | os.PathLike, ids: Sequence[str], probs: np.ndarray) -> None:
    """Kaggle GAP submission: ``ID,A,B,NEITHER`` header, one row of probabilities per ID (repr floats)."""
    probs = _check_probs(probs, len(ids), "write_kaggle_submission")
    lines = ["ID,A,B,NEITHER"] + [f"{i},{p[0]!r},{p[1]!r},{p[2]!r}" for i, p in zip(ids, probs.tolist())]
    atomic_write_text(path, "\n".join(lines) + "\n")


def write_gap_system_file(path: str | os.PathLike, ids: Sequence[str], probs: np.ndarray) -> None:
    """Input of the official GAP scorer: ``ID<TAB>A-coref<TAB>B-coref`` (TRUE/FALSE from argmax), no header."""
    pred = _check_probs(probs, len(ids), "write_gap_system_file").argmax(axis=1)
    tf = {True: "TRUE", False: "FALSE"}
    lines = [f"{i}\t{tf[bool(p == 0)]}\t{tf[bool(p == 1)]}" for i, p in zip(ids, pred)]
    atomic_write_text(path, "\n".join(lines) + "\n")
