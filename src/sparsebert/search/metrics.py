"""The number a trial is judged by, read from its experiment's metrics.json (see ``--metric`` in the package doc)."""

from __future__ import annotations

import statistics
from typing import Any

from sparsebert.config import ExperimentConfig
from sparsebert.data.glue import get_glue_task
from sparsebert.errors import SparseBertError

HEADLINE = "headline"
# a task's headline: GLUE runs carry "score" (the leaderboard number, the GLUE table's too), SQuAD, GAP and CSV runs
# "f1"; the rest stand in for metrics.json files without either
HEADLINE_KEYS = ("score", "f1", "accuracy", "matthews_corr", "pearson")
# what jobs/finetune/common.py's finish_run adds to the task's own metrics in every finetuning run ("sparsity" in a
# sparse run only: its own sparsity section, or masks kept from model.init_from's run); the finish_run module
# keeps no list of them, so tests/search check this one against what finish_run writes
RUN_KEYS = ("global_step", "train_samples_per_second", "train_runtime_s", "wall_time_s", "sparsity")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _task_summaries(metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The per-task entries of a finetuning experiment's metrics.json (the rest is e.g. wall_time_s)."""
    return {task: summary for task, summary in metrics.items() if isinstance(summary, dict)}


def _headline(summary: dict[str, Any]) -> float | None:
    for key in HEADLINE_KEYS:
        if isinstance(summary.get(key), dict) and _is_number(summary[key].get("mean")):
            return float(summary[key]["mean"])
    return None


def metric_keys(metrics: dict[str, Any]) -> list[str]:
    """Every ``--metric`` a metrics.json answers: ``headline`` and ``TASK/METRIC`` for finetuning, flat keys
    for pretraining.

    Args:
        metrics: an experiment's metrics.json.

    Returns:
        The keys, in file order.
    """
    tasks = _task_summaries(metrics)
    if not tasks:
        return [key for key, value in metrics.items() if _is_number(value)]
    keys = [HEADLINE] if all(_headline(s) is not None for s in tasks.values()) else []
    for task, summary in tasks.items():
        keys += [f"{task}/{key}" for key, value in summary.items() if isinstance(value, dict) and "mean" in value]
    return keys


def metric_value(metrics: dict[str, Any], metric: str) -> float:
    """The value of ``--metric`` in an experiment's metrics.json.

    Args:
        metrics: a finetuning summary (``{task: {"runs": n, metric: {"mean", "std", "max"}}}``) or the flat
            metrics of a pretraining run.
        metric: ``headline``, ``TASK/METRIC`` or a flat key.

    Returns:
        The value (finetuning: means over the task's runs).

    Raises:
        SparseBertError: when the metric is not there, listing those that are.
    """
    tasks = _task_summaries(metrics)
    if metric == HEADLINE and tasks:
        values = [_headline(summary) for summary in tasks.values()]
        if None not in values:
            return statistics.fmean(values)
    elif "/" in metric:
        task, _, key = metric.partition("/")
        entry = tasks.get(task, {}).get(key)
        if isinstance(entry, dict) and _is_number(entry.get("mean")):
            return float(entry["mean"])
    elif _is_number(metrics.get(metric)):
        return float(metrics[metric])
    raise SparseBertError(f"metric {metric} is not in metrics.json (available: "
                          f"{', '.join(metric_keys(metrics)) or 'none'})")


def default_metric(cfg: ExperimentConfig) -> str:
    return HEADLINE if cfg.is_finetuning else "eval_loss"


def default_direction(metric: str) -> str:
    """min for losses and perplexity (they fall as a model improves), max for every other metric here."""
    name = metric.rpartition("/")[2]
    return "min" if name.endswith("loss") or name == "perplexity" else "max"


def task_metric_names(task: str) -> list[str] | None:
    """The metrics a finetuning run of ``task`` writes to metrics.json (and so its experiment's summary), known
    before it runs; None where only a run tells.

    Args:
        task: a task of :func:`sparsebert.jobs.finetune.job.task_list`, e.g. ``glue:mnli`` or ``squad_v2``.
    """
    kind, _, name = task.partition(":")
    if kind != "glue":
        # SQuAD, GAP and CSV runs build their metrics in their job modules (jobs/finetune/) with no list of the
        # names to import, and some names come with the data only (SQuAD v2's HasAns_* / NoAns_*, CSV's *_binary
        # for two labels): their metrics are checked when a trial's metrics.json is read
        return None
    return [*get_glue_task(name).metric_keys, *RUN_KEYS]


def check_metric(metric: str, cfg: ExperimentConfig, tasks: list[str]) -> None:
    """Refuse a ``--metric`` of the wrong form for the experiment, or one its task does not measure (where that is
    known: :func:`task_metric_names`), before any trial runs.

    Args:
        metric: the ``--metric`` given.
        cfg: the experiment searched.
        tasks: the tasks it runs (finetuning), e.g. ``["glue:rte"]``.
    """
    if not cfg.is_finetuning:
        # only the form: a pretraining run's keys are built by its job (jobs/pretrain.py, the runner's wall_time_s)
        # with no list to import, and some come with settings only (initial_* with train.eval_at_start,
        # recompiles_after_warmup with train.torch_compile, sparsity; task upstream drops perplexity): a mistyped
        # key is reported when a trial's metrics.json is read
        if "/" in metric or metric == HEADLINE or not metric:
            raise SparseBertError(f"--metric {metric}: {cfg.name} pretrains; use a key of its metrics.json, "
                                  "e.g. eval_loss")
        return
    if metric == HEADLINE:
        return
    task, slash, key = metric.partition("/")
    if not (slash and key and "/" not in key and task in tasks):
        raise SparseBertError(f"--metric {metric}: for {cfg.name} use {HEADLINE} or TASK/METRIC with TASK one of "
                              f"{', '.join(tasks)} (e.g. {tasks[0]}/accuracy)")
    names = task_metric_names(task)
    if names is not None and key not in names:
        raise SparseBertError(f"--metric {metric}: {task} runs do not measure {key}; use {task}/METRIC with METRIC "
                              f"one of {', '.join(names)}")
