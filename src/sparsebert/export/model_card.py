"""What an export says about itself: the task's label names (``id2label`` in ``config.json``) and a Hugging Face
model card (``README.md``: YAML front matter the Hub reads, then base model, task, sparsity, metrics, recipe,
command and commit of the run).

Everything comes from the run directory: its ``config.json`` (the experiment, plus ``task`` and ``model_source``
for a finetuning run), ``metrics.json``, ``sparsity.json``, and the ``env.json`` of the run or of the experiment
directory above it (the command line and git commit of the invocation that finished the run, checked against the
commit the results registry recorded for it). A dense run (a baseline, a KD teacher) is called dense.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

from sparsebert.env_info import invocations

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


def run_invocations(run_dir: Path) -> list[dict[str, Any]]:
    """The invocations (``env.json`` environments) that made the run in ``run_dir``, first to last: the last one
    finished it, and its command and commit are the card's.

    A run's own ``env.json`` (a pretraining run's, with its resumes; a finetuning run's since they write one) names
    them; an older finetuning run has only its experiment's (which older versions rewrote on each start), so the
    results registry's commit for the run picks the invocation there (:func:`at_commit`).
    """
    own, commit = read_json(run_dir / "env.json"), registry_commit(run_dir)
    if own:
        return at_commit(invocations(own), commit)
    experiment = next((env for d in run_dir.resolve().parents[:2] if (env := read_json(d / "env.json"))), {})
    # a finetuning run is trained whole by one of its experiment's invocations
    return at_commit(invocations(experiment) if experiment else [], commit)[-1:]


def at_commit(found: list[dict[str, Any]], commit: str | None) -> list[dict[str, Any]]:
    """``found`` where its last invocation ran at ``commit`` (the registry's, None: unknown), else the last one of
    them that did, else only the commit: the command that ran it is not on record, and naming another would lie."""
    if commit is None or (found and found[-1].get("git_commit") == commit):
        return found
    matching = [env for env in found if env.get("git_commit") == commit]
    return matching[-1:] or [{"git_commit": commit}]


def registry_commit(run_dir: Path) -> str | None:
    """The commit the results registry of the output root above ``run_dir`` recorded for the run (that of the
    invocation that finished it), or None where no registry there knows it."""
    from sparsebert.results.recording import find_run_record

    row = find_run_record(run_dir)
    return row.git_commit if row is not None else None


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


def run_sparsity(config: dict[str, Any], metrics: dict[str, Any], report: dict[str, Any]) -> tuple[bool, Any]:
    """Whether the run's model is sparse, and its measured sparsity (None: not measured). Measured zeros decide; a
    run without a measure is sparse where it had a sparsity section (a finetuning run from a sparse one gets its
    own), and a dense baseline or KD teacher has neither."""
    measured = (report.get("selected") or {}).get("sparsity", metrics.get("sparsity"))
    if isinstance(measured, bool) or not isinstance(measured, int | float):
        return bool(config.get("sparsity")), None
    return measured > 0, measured


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
    config, history = read_json(run_dir / "config.json"), run_invocations(run_dir)
    metrics, sparsity_report = read_json(run_dir / "metrics.json"), read_json(run_dir / "sparsity.json")
    task = str(config.get("task") or "unknown")
    sparse, sparsity = run_sparsity(config, metrics, sparsity_report)
    base = base_model(config)
    label_text = f" (labels: {', '.join(labels)})" if labels else ""
    tags = ["sparsebert", *(("sparse", "pruned") if sparse else ()), task.replace(":", "-")]
    if sparse and sparsity is not None:
        tags.append(f"sparsity-{round(100 * sparsity)}")
    front = {"library_name": "transformers", **({"base_model": base} if base else {}),
             "pipeline_tag": PIPELINE_TAGS.get(_family(task)), "tags": tags}
    lines = ["---", *(f"{k}: {json.dumps(v)}" for k, v in front.items() if v is not None), "---", "",
             f"# {config.get('experiment') or run_dir.name}: {task}", "",
             _summary(sparse, architecture), "",
             "| | |", "|---|---|",
             f"| base model | {base or (config.get('model') or {}).get('init_from') or config.get('model_source') or '-'} |",
             f"| task | {task}{label_text} |",
             f"| sparsity | {_sparsity_text(sparse, sparsity, sparsity_report)} |",
             f"| experiment | {config.get('experiment') or config.get('name') or '-'} (seed {config.get('seed', '-')}) |",
             *_invocation_rows(history), ""]
    scalars = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    if scalars:
        lines += ["## Metrics", "", "| metric | value |", "|---|---|",
                  *(f"| {k} | {metric_text(v)} |" for k, v in scalars.items()), ""]
    recipe = {k: config[k] for k in ("model", "sparsity", "finetune", "train", "kd") if config.get(k)}
    if recipe:
        lines += ["## Recipe", "", "The run's settings (its `config.json`):", "", "```json",
                  json.dumps(recipe, indent=2, default=str), "```", ""]
    return "\n".join([*lines, usage.strip(), ""])


def metric_text(value: int | float) -> str:
    """A metric as the card prints it. Counts (global_step, train_blocks: ints, or floats after a JSON round trip
    or a mean) are exact, never ``1.235e+05``; other values keep 4 significant digits, except that from 1e4 up
    fixed notation with one decimal shows every integer digit (a perplexity of 31410.5, not ``3.141e+04``)."""
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(value)  # nan, inf: a diverged run says so
    if value.is_integer():
        return str(int(value))
    return f"{value:.1f}" if abs(value) >= 1e4 else f"{value:.4g}"


def _invocation_rows(history: list[dict[str, Any]]) -> list[str]:
    """The command and commit that finished the run; for a resumed run also the ones that started it, since its
    weights owe to both."""
    env = history[-1] if history else {}
    rows = [f"| command | `{_command(env)}` |", f"| commit | {env.get('git_commit') or '-'} |"]
    if len(history) > 1:
        rows += [f"| started by | `{_command(history[0])}` at commit {history[0].get('git_commit') or '-'} |",
                 f"| resumes | {len(history) - 1} (the last one: the command and commit above) |"]
    return rows


def _summary(sparse: bool, architecture: str | None) -> str:
    """The card's first sentence: what kind of model this is, which a dense baseline must not be called sparse."""
    if sparse:
        return f"A sparse {architecture or 'model'} trained by sparsebert."
    return f"A dense {architecture or 'model'} (no weights pruned) trained by sparsebert."


def _sparsity_text(sparse: bool, sparsity: Any, report: dict[str, Any]) -> str:
    """The sparsity row, naming the file the measure comes from."""
    if not sparse:
        return "dense (no weights pruned)"
    if sparsity is None:
        return "sparse (not measured)"
    source = "sparsity.json" if "sparsity" in (report.get("selected") or {}) else "metrics.json"
    return f"{_percent(sparsity)} of the pruned layers' weights are zero ({source})"


def _percent(value: Any) -> str:
    return f"{100 * value:.1f} %" if isinstance(value, int | float) else "-"


def _command(env: dict[str, Any]) -> str:
    argv = env.get("argv")
    if not isinstance(argv, list) or not argv:
        return "-"
    # the console command, whichever of sparsebert, python -m sparsebert or run.py started the run: it is the one
    # a reader of the card has after pip install
    return "sparsebert " + shlex.join(str(a) for a in argv[1:])
