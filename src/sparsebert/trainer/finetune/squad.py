"""SQuAD v1.1 / v2.0 finetuning: sliding windows, n-best post-processing, official EM/F1, predictions JSON."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import datasets
from transformers import AutoModelForQuestionAnswering, default_data_collator

from sparsebert.data.squad import (
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


def run_squad(ctx: FinetuneContext, task: str, seed: int, run_dir: Path) -> dict[str, Any]:
    started = time.time()
    fcfg = ctx.cfg.finetune
    version_2 = task == "squad_v2"
    train_ex, eval_ex = squad_examples(ctx)
    window = {"tokenizer": ctx.tokenizer, "max_seq_length": fcfg.max_seq_length, "doc_stride": fcfg.doc_stride,
              "max_query_length": fcfg.max_query_length}
    train_raw = datasets.Dataset.from_list(train_ex)
    train_features = train_raw.map(prepare_train_features, batched=True, remove_columns=train_raw.column_names,
                                   fn_kwargs=window, desc="SQuAD train windows")
    eval_raw = datasets.Dataset.from_list(eval_ex)
    eval_features = eval_raw.map(prepare_eval_features, batched=True, remove_columns=eval_raw.column_names,
                                 fn_kwargs=window, desc="SQuAD eval windows")

    model = AutoModelForQuestionAnswering.from_pretrained(ctx.model_source)
    trainer = make_trainer(ctx, model, run_dir, seed, train_features, None, default_data_collator,
                           ["start_positions", "end_positions"])
    trainer.train()
    out = trainer.predict(eval_features.remove_columns(["example_id", "offset_mapping"]))
    start_logits, end_logits = out.predictions[:2]
    predictions, null_odds = postprocess_predictions(
        eval_ex, eval_features, start_logits, end_logits, n_best_size=fcfg.n_best_size,
        max_answer_length=fcfg.max_answer_length, version_2=version_2,
        null_score_diff_threshold=fcfg.null_score_diff_threshold)
    metrics = squad_metrics(eval_ex, predictions, version_2)
    metrics.update({"train_examples": len(train_ex), "eval_examples": len(eval_ex),
                    "train_windows": len(train_features), "eval_windows": len(eval_features)})
    write_predictions_json(run_dir / "predictions.json", predictions)
    if version_2:
        atomic_write_json(run_dir / "null_odds.json", null_odds)
    return finish_run(ctx, trainer, run_dir, task, seed, metrics, started)
