"""SQuAD v1.1 / v2.0 finetuning: sliding windows, n-best post-processing, official EM/F1, predictions JSON."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import datasets
from transformers import AutoModelForQuestionAnswering, default_data_collator

from sparsebert.data.featurize import featurize
from sparsebert.data.squad import (
    best_null_thresholds,
    postprocess_predictions,
    prepare_eval_features,
    prepare_train_features,
    read_squad,
    split_by_article,
    squad_metrics,
    write_predictions_json,
)
from sparsebert.io import atomic_write_json
from sparsebert.trainer.finetune.common import FinetuneContext, finish_run, make_trainer


def squad_examples(ctx: FinetuneContext) -> tuple[list[dict], list[dict]]:
    """(train, eval) examples: the standard pair when a train file is set, else one file split by article.

    The split uses the experiment seed, not the run seed, so every run of an experiment sees the same split.
    """
    fcfg = ctx.cfg.finetune
    if fcfg.squad_train_file:
        train, evaluation = read_squad(ctx.data_file(fcfg.squad_train_file)), read_squad(ctx.data_file(fcfg.squad_file))
    else:
        train, evaluation = split_by_article(read_squad(ctx.data_file(fcfg.squad_file)),
                                             fcfg.squad_eval_fraction, ctx.cfg.seed)
    if fcfg.max_train_samples:
        train = train[:fcfg.max_train_samples]
    if fcfg.max_eval_samples:
        evaluation = evaluation[:fcfg.max_eval_samples]
    return train, evaluation


def squad_features(examples: list[dict], tokenizer, *, train: bool, max_seq_length: int, doc_stride: int,
                   max_query_length: int, num_proc: int | None = None, cache_dir=None) -> datasets.Dataset:
    """Windowed features of SQuAD examples (train: with answer positions; eval: with example ids and offsets),
    through the featurizer: parallel and cached by the examples' content, the tokenizer and the settings."""
    raw = datasets.Dataset.from_list(examples)
    return featurize(raw, prepare_train_features if train else prepare_eval_features,
                     name="squad-train" if train else "squad-eval", tokenizer=tokenizer,
                     fn_kwargs={"tokenizer": tokenizer, "max_seq_length": max_seq_length, "doc_stride": doc_stride,
                                "max_query_length": max_query_length},
                     num_proc=num_proc, remove_columns=raw.column_names, cache_dir=cache_dir)


@dataclass
class SquadInputs:
    """Everything a SQuAD run reads, checked before any run directory exists."""

    version_2: bool
    train_examples: list[dict]
    eval_examples: list[dict]
    train_features: datasets.Dataset
    eval_features: datasets.Dataset
    teacher: str | None


def load_squad(ctx: FinetuneContext, task: str) -> SquadInputs:
    fcfg = ctx.cfg.finetune
    teacher = ctx.teacher_source(task)
    train_ex, eval_ex = squad_examples(ctx)
    window = {"max_seq_length": fcfg.max_seq_length, "doc_stride": fcfg.doc_stride,
              "max_query_length": fcfg.max_query_length}
    return SquadInputs(task == "squad_v2", train_ex, eval_ex,
                       squad_features(train_ex, ctx.tokenizer, train=True, **window),
                       squad_features(eval_ex, ctx.tokenizer, train=False, **window), teacher)


def run_squad(ctx: FinetuneContext, inputs: SquadInputs, seed: int, run_dir: Path) -> dict[str, Any]:
    started = time.time()
    fcfg = ctx.cfg.finetune
    task = "squad_v2" if inputs.version_2 else "squad_v1"
    eval_ex, eval_features = inputs.eval_examples, inputs.eval_features
    model = AutoModelForQuestionAnswering.from_pretrained(ctx.model_source, **ctx.pretrained_kwargs)
    trainer = make_trainer(ctx, model, run_dir, seed, inputs.train_features, None, default_data_collator,
                           ["start_positions", "end_positions"], teacher_source=inputs.teacher,
                           load_teacher=AutoModelForQuestionAnswering.from_pretrained)
    trainer.train()
    out = trainer.predict(eval_features.remove_columns(["example_id", "offset_mapping"]))
    start_logits, end_logits = out.predictions[:2]
    nbest: dict[str, list[dict[str, Any]]] = {}
    spans, null_odds = postprocess_predictions(  # the best span of every question, and its null odds
        eval_ex, eval_features, start_logits, end_logits, n_best_size=fcfg.n_best_size,
        max_answer_length=fcfg.max_answer_length, version_2=inputs.version_2,
        null_score_diff_threshold=float("inf"), nbest=nbest)
    threshold = fcfg.null_score_diff_threshold  # v2: "" where the null odds exceed it (postprocess_predictions)
    predictions = {qid: "" if inputs.version_2 and null_odds[qid] > threshold else text
                   for qid, text in spans.items()}
    metrics = squad_metrics(eval_ex, predictions, inputs.version_2)
    if inputs.version_2:  # beside the fixed threshold's scores: the best threshold on this eval set
        metrics.update(null_score_diff_threshold=threshold, **best_null_thresholds(eval_ex, spans, null_odds))
    metrics.update({"train_examples": len(inputs.train_examples), "eval_examples": len(eval_ex),
                    "train_windows": len(inputs.train_features), "eval_windows": len(eval_features)})
    outputs = [partial(write_predictions_json, run_dir / "predictions.json", predictions),
               partial(atomic_write_json, run_dir / "nbest_predictions.json", nbest)]
    if inputs.version_2:
        outputs.append(partial(atomic_write_json, run_dir / "null_odds.json", null_odds))
    return finish_run(ctx, trainer, run_dir, task, seed, metrics, started, outputs)
