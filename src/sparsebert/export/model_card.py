"""What an export says about itself: the task's label names (``id2label`` in ``config.json``) and a Hugging Face
model card (``README.md``: YAML front matter the Hub reads, then base model, task, sparsity, metrics, recipe,
command and commit of the run).

Everything comes from the run directory: its ``config.json`` (the experiment, plus ``task`` and ``model_source``
for a finetuning run), ``metrics.json``, ``sparsity.json``, and the ``env.json`` of the run or of the experiment
directory above it (the command line and git commit).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

# model.init_from -> the Hub model it is a copy of (the package ships sentence-transformers' MiniLM)
HUB_NAMES = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}
REGRESSION_LABEL = "similarity"  # STS-B's one output: a pipeline then answers {"label": "similarity", ...}
PIPELINE_TAGS = {"glue": "text-classification", "csv": "text-classification", "gap": "text-classification",
                 "squad": "question-answering", "mlm": "fill-mask"}


def read_json(path: Path) -> dict[str, Any]:
    """``path``'s JSON object; {} for a missing or unreadable file (a card leaves out what it cannot tell)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def label_names(task: str | None, run_dir: Path) -> list[str] | None:
    """The classes of ``task`` in label-id order, or None where the model has no classes (MLM, SQuAD).

    Args:
        task: the run's task (``glue:sst2``, ``csv``, ``gap``, ...).
        run_dir: the run directory; a CSV task's labels are those its ``metrics.json`` recorded.
    Returns:
        e.g. ``["negative", "positive"]``; ``["similarity"]`` for STS-B's regression output.
    """
    if not task:
        return None
    if task.startswith("glue:"):
        from sparsebert.data.glue import get_glue_task

        names = get_glue_task(task.split(":", 1)[1]).label_names
        return list(names) if names is not None else [REGRESSION_LABEL]
    if task == "csv":
        names = read_json(run_dir / "metrics.json").get("label_names")
        return [str(n) for n in names] if isinstance(names, list) and names else None
    if task == "gap":
        from sparsebert.data.gap import LABEL_NAMES

        return list(LABEL_NAMES)
    return None


def set_labels(config: dict[str, Any], names: list[str] | None, check_size: bool = True) -> dict[str, Any]:
    """``config`` (a ``config.json`` dict) with ``id2label``/``label2id`` from ``names`` where they fit its head
    (``check_size``: the config's label count sizes the model's head, as in transformers' classifiers)."""
    if names is None:
        return config
    head_size = len(config.get("id2label") or {}) or config.get("num_labels")
    if check_size and head_size not in (None, len(names)):
        return config  # a head of another size: the names would be wrong, keep what the run saved
    return {**config, "id2label": {str(i): n for i, n in enumerate(names)},
            "label2id": {n: i for i, n in enumerate(names)}}


def run_environment(run_dir: Path) -> dict[str, Any]:
    """The ``env.json`` of the run, or of the experiment directory above it (a finetuning run's)."""
    for directory in (run_dir, *run_dir.resolve().parents[:2]):
        env = read_json(directory / "env.json")
        if env:
            return env
    return {}


def base_model(run_config: dict[str, Any]) -> str | None:
    """The Hub id of the model the run started from, or None where it started from a local directory."""
    init_from = (run_config.get("model") or {}).get("init_from")
    if not init_from:
        return None
    if init_from in HUB_NAMES:
        return HUB_NAMES[init_from]
    looks_like_hub_id = init_from.count("/") == 1 and not Path(init_from).exists()
    return init_from if looks_like_hub_id else None


def _family(task: str) -> str:
    return "squad" if task.startswith("squad") else task.split(":", 1)[0]


def model_card(run_dir: Path, labels: list[str] | None, architecture: str | None, usage: str) -> str:
    """The ``README.md`` of an export of the run in ``run_dir``.

    Args:
        run_dir: the finished run.
        labels: the names ``config.json`` was given (None: no classes).
        architecture: the class ``config.json`` names.
        usage: a Markdown section on how to load this export (plain and compressed ones differ).
    Returns:
        the card's text: YAML front matter, then the run's facts.
    """
    config, env = read_json(run_dir / "config.json"), run_environment(run_dir)
    metrics, sparsity_report = read_json(run_dir / "metrics.json"), read_json(run_dir / "sparsity.json")
    task = str(config.get("task") or "unknown")
    sparsity = (sparsity_report.get("selected") or {}).get("sparsity", metrics.get("sparsity"))
    base = base_model(config)
    label_text = f" (labels: {', '.join(labels)})" if labels else ""
    tags = ["sparsebert", "sparse", "pruned", task.replace(":", "-")]
    if isinstance(sparsity, int | float):
        tags.append(f"sparsity-{round(100 * sparsity)}")
    front = {"library_name": "transformers", **({"base_model": base} if base else {}),
             "pipeline_tag": PIPELINE_TAGS.get(_family(task)), "tags": tags}
    lines = ["---", *(f"{k}: {json.dumps(v)}" for k, v in front.items() if v is not None), "---", "",
             f"# {config.get('experiment') or run_dir.name}: {task}", "",
             f"A sparse {architecture or 'model'} trained by sparsebert.", "",
             "| | |", "|---|---|",
             f"| base model | {base or (config.get('model') or {}).get('init_from') or config.get('model_source') or '-'} |",
             f"| task | {task}{label_text} |",
             f"| sparsity | {_percent(sparsity)} of the pruned weights (sparsity.json) |",
             f"| experiment | {config.get('experiment') or config.get('name') or '-'} (seed {config.get('seed', '-')}) |",
             f"| command | `{_command(env)}` |",
             f"| commit | {env.get('git_commit') or '-'} |", ""]
    scalars = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    if scalars:
        lines += ["## Metrics", "", "| metric | value |", "|---|---|",
                  *(f"| {k} | {v:.4g} |" for k, v in scalars.items()), ""]
    recipe = {k: config[k] for k in ("model", "sparsity", "finetune", "train", "kd") if config.get(k)}
    if recipe:
        lines += ["## Recipe", "", "The run's settings (its `config.json`):", "", "```json",
                  json.dumps(recipe, indent=2, default=str), "```", ""]
    return "\n".join([*lines, usage.strip(), ""])


def _percent(value: Any) -> str:
    return f"{100 * value:.1f} %" if isinstance(value, int | float) else "-"


def _command(env: dict[str, Any]) -> str:
    argv = env.get("argv")
    if not isinstance(argv, list) or not argv:
        return "-"
    # the console command, whichever of sparsebert, python -m sparsebert or run.py started the run: it is the one
    # a reader of the card has after pip install
    return "sparsebert " + shlex.join(str(a) for a in argv[1:])
