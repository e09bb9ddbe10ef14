"""SQuAD v1.1 / v2.0 finetuning: sliding windows, n-best post-processing, the official EM/F1 (and the best
no-answer thresholds), predictions JSON (reading, features and span decoding: ``data/squad.py``)."""

from __future__ import annotations

import collections
import logging
import os
import re
import string
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import datasets
from transformers import AutoModelForQuestionAnswering, default_data_collator

from sparsebert.data.featurize import featurize
from sparsebert.data.squad import (
    postprocess_predictions,
    prepare_eval_features,
    prepare_train_features,
    read_squad,
    split_by_article,
)
from sparsebert.io import atomic_write_json
from sparsebert.jobs.finetune.common import FinetuneContext, finish_run, make_trainer

logger = logging.getLogger(__name__)


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
    if fcfg.max_train_samples is not None:
        train = train[:fcfg.max_train_samples]
    if fcfg.max_eval_samples is not None:
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

    @property
    def train_rows(self) -> int:
        return len(self.train_features)


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


# ---------------------------------------------------------------------------------------------- metrics, outputs


_ARTICLES = re.compile(r"\b(a|an|the)\b")


_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Official SQuAD normalization: lower case, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _exact(gold: str, pred: str) -> float:
    return float(normalize_answer(gold) == normalize_answer(pred))


def _f1(gold: str, pred: str, version_2: bool = True) -> float:
    gold_toks = normalize_answer(gold).split()
    pred_toks = normalize_answer(pred).split()
    if version_2 and (not gold_toks or not pred_toks):
        # v2: "no answer" is right only against "no answer"; v1.1's script has no such rule (no common token: 0)
        return float(gold_toks == pred_toks)
    common = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_toks)
    recall = common / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def squad_metrics(
    examples: Iterable[Mapping[str, Any]], predictions: Mapping[str, str], version_2: bool
) -> dict[str, float]:
    """``exact`` / ``f1`` in percent (max over gold answers) and ``total``; for v2 also the HasAns_* and
    NoAns_* breakdowns (``*_exact`` / ``*_f1`` are omitted when that group is empty, as the official script
    does). For v2, gold answers that normalize to "" are dropped, as the v2 script does (v1.1's keeps them); an
    unanswerable question's gold is [""].
    A question without a prediction scores 0 (with a warning).
    """
    groups: dict[str, list[tuple[float, float]]] = {"all": [], "HasAns": [], "NoAns": []}
    missing = []
    for ex in examples:
        texts = ex["answers"]["text"]
        golds = ([t for t in texts if normalize_answer(t)] if version_2 else list(texts)) or [""]
        if ex["id"] not in predictions:
            missing.append(ex["id"])
            scores = (0.0, 0.0)
        else:
            pred = predictions[ex["id"]]
            scores = (max(_exact(g, pred) for g in golds), max(_f1(g, pred, version_2) for g in golds))
        groups["all"].append(scores)
        groups["HasAns" if ex["answers"]["text"] else "NoAns"].append(scores)
    if missing:
        logger.warning(
            "squad_metrics: %d questions have no prediction (scored 0), e.g. %s", len(missing), missing[0]
        )

    def summary(prefix: str, scores: list[tuple[float, float]]) -> dict[str, float]:
        out: dict[str, float] = {}
        if scores:
            out[f"{prefix}exact"] = 100.0 * sum(s[0] for s in scores) / len(scores)
            out[f"{prefix}f1"] = 100.0 * sum(s[1] for s in scores) / len(scores)
        out[f"{prefix}total"] = len(scores)
        return out

    metrics = summary("", groups["all"])
    if version_2:
        metrics.update(summary("HasAns_", groups["HasAns"]))
        metrics.update(summary("NoAns_", groups["NoAns"]))
    return metrics


def best_null_thresholds(
    examples: Iterable[Mapping[str, Any]], span_predictions: Mapping[str, str], null_odds: Mapping[str, float]
) -> dict[str, float]:
    """v2: the null-odds threshold that maximizes EM and F1 over these examples, as the official v2 script's
    ``find_best_thresh`` searches it: ``best_exact`` / ``best_f1`` (percent) and ``best_exact_thresh`` /
    ``best_f1_thresh``. ``span_predictions`` are the best spans (no threshold applied); a question gets "" when
    its null odds exceed the threshold. Scores are measured on the same examples, so they are optimistic."""
    examples = [ex for ex in examples if ex["id"] in span_predictions]
    if not examples:
        return {}
    exact, f1, has_ans = {}, {}, {}
    for ex in examples:
        golds = [t for t in ex["answers"]["text"] if normalize_answer(t)] or [""]
        pred = span_predictions[ex["id"]]
        exact[ex["id"]] = max(_exact(g, pred) for g in golds)
        f1[ex["id"]] = max(_f1(g, pred) for g in golds)
        has_ans[ex["id"]] = bool(ex["answers"]["text"])
    order = sorted(exact, key=lambda qid: null_odds[qid])
    out: dict[str, float] = {}
    for name, scores in (("exact", exact), ("f1", f1)):
        score = best = float(sum(not h for h in has_ans.values()))  # every question answered ""
        thresh = 0.0
        for qid in order:  # answer the questions in order of rising null odds
            score += scores[qid] if has_ans[qid] else (-1.0 if span_predictions[qid] else 0.0)
            if score > best:
                best, thresh = score, float(null_odds[qid])
        out[f"best_{name}"] = 100.0 * best / len(scores)
        out[f"best_{name}_thresh"] = thresh
    return out


def write_predictions_json(path: str | os.PathLike, predictions: Mapping[str, str]) -> None:
    """Official prediction file: ``{question_id: answer_text}`` ("" = no answer)."""
    atomic_write_json(path, dict(predictions))
