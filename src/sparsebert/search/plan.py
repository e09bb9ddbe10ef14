"""A search request, checked in full before any trial runs."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.distributions import BaseDistribution

from sparsebert.config import ExperimentRegistry
from sparsebert.config.experiment_registry import STUDY_NAME
from sparsebert.distributed.gpus import visible_gpus
from sparsebert.errors import SparseBertError
from sparsebert.search.metrics import check_metric, default_direction, default_metric
from sparsebert.search.space import check_space_keys, parse_space, set_item

DIRECTIONS = {"max": "maximize", "min": "minimize"}


@dataclass
class SearchPlan:
    """Everything a search needs, checked: see :func:`plan_search`."""

    experiment: str  # as the command named it: the best trial's command line repeats it
    space: str
    distributions: dict[str, BaseDistribution]
    space_params: dict[str, Any]  # the space as defined: a study refuses to continue under a changed one
    trials: int
    overrides: list[str]
    metric: str
    direction: str  # "max" | "min"
    parallel: int
    gpus: list[str]  # CUDA_VISIBLE_DEVICES names of the GPUs trials run on; empty on CPU
    study: str
    seed: int
    output_root: Path
    data_dir: Path | None
    experiment_paths: list[Path]  # the user's --experiments files and folders (absolute), added to the built-in ones

    @property
    def study_dir(self) -> Path:
        return self.output_root / "search" / self.study

    def run_name(self, number: int) -> str:
        """The trial's run name: its run directory under the output root."""
        return f"search/{self.study}/trial{number:03d}"

    def trial_overrides(self, params: dict[str, Any]) -> list[str]:
        return [*self.overrides, *(set_item(key, value) for key, value in params.items())]

    def command_line(self, params: dict[str, Any]) -> str:
        sets = " ".join(f"--set {shlex.quote(item)}" for item in self.trial_overrides(params))
        paths = " ".join(f"--experiments {shlex.quote(str(path))}" for path in self.experiment_paths)
        return " ".join(part for part in ("python run.py", shlex.quote(self.experiment), paths, sets) if part)

    def settings(self) -> dict[str, Any]:
        """What makes trials comparable; kept in the study so a resumed search cannot silently change it."""
        return {"experiment": self.experiment, "space": self.space_params, "overrides": self.overrides,
                "metric": self.metric}


def plan_search(registry: ExperimentRegistry, experiment: str, space: str, trials: int, *, output_root: Path,
                data_dir: Path | None, experiment_paths: list[Path] | None = None, overrides: list[str] | None = None,
                metric: str | None = None, direction: str | None = None, parallel: int | None = None,
                study: str | None = None) -> SearchPlan:
    """Check every input of a search, so that a mistake fails in one line before any trial runs.

    Args:
        registry: the experiment registry (with the search spaces).
        experiment: the experiment to search (``NAME`` or ``NAME=<run>``).
        space: a search space name.
        trials: the number of complete trials the study should hold.
        output_root: the output root of the trials' runs.
        data_dir: the data directory the trials read (None: the hub).
        experiment_paths: the ``--experiments`` files and folders ``registry`` added to the built-in experiments,
            for the trial processes.
        overrides: ``--set`` items applied to every trial.
        metric: what to optimize (default: :func:`default_metric`).
        direction: "max" or "min" (default: :func:`default_direction`).
        parallel: trials at once (default: one per visible GPU, 1 on CPU).
        study: the study name (default ``<experiment>-<space>``).

    Returns:
        The plan for :func:`run_search`.
    """
    overrides = list(overrides or [])
    cfg = registry.build(experiment, overrides)
    space_def = registry.space(space)
    distributions = parse_space(space, space_def)
    check_space_keys(registry, experiment, space, overrides, distributions)
    if trials < 1:
        raise SparseBertError(f"--trials {trials}: need at least 1")
    if parallel is not None and parallel < 1:
        raise SparseBertError(f"--parallel {parallel}: need at least 1")
    metric = metric or default_metric(cfg)
    if cfg.is_finetuning:
        from sparsebert.jobs.finetune.job import task_list

        check_metric(metric, cfg, task_list(cfg, data_dir))
    else:
        check_metric(metric, cfg, [])
    if direction is not None and direction not in DIRECTIONS:
        raise SparseBertError(f"--direction {direction}: use max or min")
    study = study or f"{cfg.name}-{space}"
    if not re.fullmatch(STUDY_NAME, study) or study in (".", ".."):
        raise SparseBertError(f"--study {study}: use letters, digits and _ . = + - (it names a directory)")
    gpus = visible_gpus()
    return SearchPlan(
        experiment=experiment, space=space, distributions=distributions, space_params=space_def["params"],
        trials=trials, overrides=overrides, metric=metric, direction=direction or default_direction(metric),
        parallel=parallel or max(1, len(gpus)), gpus=gpus, study=study, seed=cfg.seed,
        output_root=output_root.resolve(), data_dir=data_dir,         experiment_paths=[Path(path).resolve() for path in experiment_paths or []],
    )
