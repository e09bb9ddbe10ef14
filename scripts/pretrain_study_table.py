"""Tables of the sparse-pretraining study (scripts/pretrain_study.sh) from its output root's registry.

    python scripts/pretrain_study_table.py OUT_ROOT [--out FILE.md] [--raw DIR]

Prints the MLM table (every pretraining run: eval loss, how far a sparse run ends above its dense twin,
perplexity, masked-token accuracy, steps, samples/s, recompiles after warm-up, the first evaluation below the
unigram plateau) and the GLUE tables
(``run.py --table glue --agg mean`` over the study's runs). The study finetunes each model on each task in a process
of its own, named ``glue_from=RUN~TASK`` (``~lrLR`` added for the learning-rate grid); here those rows are labelled
``glue_from=RUN`` again, so each pretrained model is one row: at the default finetuning learning rate, then per
learning rate of the grid, then with each task's best learning rate of the grid.

``--raw DIR`` also writes what docs/data keeps behind the study's tables: ``tables.md``; ``metrics.json``, each
pretraining run's metrics with its eval loss at every evaluation, final sparsity and whether every masked weight
ended exactly zero; ``glue_runs.json``, every GLUE row of the registry (one per finetuning run and seed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from sparsebert.io import atomic_write_text  # noqa: E402
from sparsebert.results import RunRegistry, glue_table  # noqa: E402
from sparsebert.results.glue_table import TASK_METRICS  # noqa: E402

SPARSITY_SECTIONS = ("sparsity", "rigl", "gmp")  # what a sparse run may differ in from its dense twin
PLATEAU = 5.5  # MLM eval loss: a model above it still predicts little beyond token frequencies (unigram loss ~6)
DEFAULT_LR = "5e-5"  # glue_from's finetuning learning rate: the rate of the runs without ``~lr``
# what a GLUE row keeps in glue_runs.json (the registry's other fields repeat its metrics or the pretraining run's)
GLUE_ROW_FIELDS = ("run_dir", "experiment", "task", "model", "seed", "status", "sparsity", "metrics", "git_commit",
                   "error")


def left_plateau_at(run_dir: Path) -> str:
    """The first evaluated step with an MLM eval loss below PLATEAU; "never" when the curve stays above it; "?"
    without a curve (no log_history.json) to read."""
    losses = eval_losses(run_dir)
    if losses is None:
        return "?"
    return next((step for step, loss in losses.items() if loss < PLATEAU), "never")


def eval_losses(run_dir: Path) -> dict[str, float] | None:
    """The run's MLM eval loss at each evaluated step (``log_history.json``); None without that file."""
    path = run_dir / "log_history.json"
    if not path.is_file():
        return None
    return {str(int(h["step"])): h["eval_loss"] for h in json.loads(path.read_text()) if "eval_loss" in h}


def masked_weights_zero(run_dir: Path) -> bool | None:
    """Whether every masked weight of the sparse layers ended exactly zero (``sparsity.json``: as many nonzeros as
    active weights); None for a dense run or without the file."""
    path = run_dir / "sparsity.json"
    if not path.is_file():
        return None
    selected = json.loads(path.read_text())["selected"]
    return selected["nonzero"] == selected["active"]


def _json_lines(entries: dict | list) -> str:
    """JSON with one entry of the object or list per line: small in docs/data, readable in a diff."""
    def compact(value) -> str:
        return json.dumps(value, separators=(",", ":"))

    if isinstance(entries, dict):
        return "{\n" + ",\n".join(f"{json.dumps(k)}:{compact(v)}" for k, v in entries.items()) + "\n}\n"
    return "[\n" + ",\n".join(compact(e) for e in entries) + "\n]\n"


def local_dir(root: Path, record) -> Path:
    """A registry row's run directory under ``root``, the study's output root as copied here from the machine
    that ran it."""
    return root / Path(record.run_dir).name


def write_raw(registry: RunRegistry, root: Path, out: Path, tables: str) -> None:
    """The study's raw files into ``out`` (see the module docstring), each written whole or not at all."""
    runs = sorted(registry.runs(task_prefix="mlm"), key=lambda r: r.experiment)
    metrics = {}
    for rec in runs:
        run_dir = local_dir(root, rec)
        metrics[rec.experiment] = {**rec.metrics, "sparsity": rec.sparsity,
                                   "masked_weights_zero": masked_weights_zero(run_dir),
                                   "eval_loss_by_step": eval_losses(run_dir) or {}}
    glue = [{k: v for k, v in dataclasses.asdict(rec).items() if k in GLUE_ROW_FIELDS and v is not None}
            for rec in sorted(registry.runs(task_prefix="glue:"), key=lambda r: (r.experiment, r.seed))]
    atomic_write_text(out / "tables.md", tables)
    atomic_write_text(out / "metrics.json", _json_lines(metrics))
    atomic_write_text(out / "glue_runs.json", _json_lines(glue))


def dense_twin_key(run_dir: Path) -> str | None:
    """The run's config.json without its name, description and sparsity sections: a sparse run and a dense run
    with the same key differ in sparsity alone (seed, steps, data, teacher, schedule). None without a config."""
    path = run_dir / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    drop = {"name", "description", *SPARSITY_SECTIONS}
    return json.dumps({k: v for k, v in config.items() if k not in drop}, sort_keys=True)


def mlm_table(records, root: Path) -> str:
    """One row per pretraining run; its run directory is looked up under ``root`` (the study's output root, where
    it may have been copied from the machine that ran it). A sparse run's gap is to the dense run of the study
    whose config differs in sparsity alone ("no twin" when the study has none)."""
    local = {rec.run_dir: local_dir(root, rec) for rec in records}
    keys = {run_dir: dense_twin_key(path) for run_dir, path in local.items()}
    dense_loss = {keys[rec.run_dir]: rec.metrics["eval_loss"] for rec in records
                  if rec.sparsity is None and keys[rec.run_dir] is not None}
    lines = ["| run | steps | MLM eval loss | above the dense twin | perplexity | masked-token acc. | sparsity | "
             f"samples/s | recompiles after warm-up | eval loss < {PLATEAU} from step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for rec in sorted(records, key=lambda r: r.experiment):
        m = rec.metrics
        twin = dense_loss.get(keys[rec.run_dir])
        gap = "–" if rec.sparsity is None else "no twin" if twin is None else f"{m['eval_loss'] - twin:+.3f}"
        sparsity = "dense" if rec.sparsity is None else f"{rec.sparsity:.3f}"
        accuracy = m.get("masked_accuracy")
        recompiles = m.get("recompiles_after_warmup")  # the registry keeps numbers as floats
        lines.append(f"| `{rec.experiment}` | {m.get('global_step', 0):.0f} | {m['eval_loss']:.3f} | {gap} | "
                     f"{math.exp(m['eval_loss']):.1f} | {'-' if accuracy is None else f'{100 * accuracy:.1f} %'} | "
                     f"{sparsity} | {m.get('train_samples_per_second', 0):.0f} | "
                     f"{'-' if recompiles is None else int(recompiles)} | {left_plateau_at(local[rec.run_dir])} |")
    return "\n".join(lines)


def _model_and_lr(experiment: str) -> tuple[str, str | None]:
    """``glue_from=RUN~TASK[~lrLR]`` -> (``glue_from=RUN``, LR or None)."""
    model, _, rest = experiment.partition("~")
    _, _, lr = rest.partition("~lr")
    return model, lr or None


def study_glue_records(registry: RunRegistry):
    """The study's GLUE rows at the default learning rate, each labelled with the pretraining run it started from."""
    records = registry.runs(task_prefix="glue:")
    return [dataclasses.replace(r, group=_model_and_lr(r.experiment)[0]) for r in records
            if _model_and_lr(r.experiment)[1] is None]


def _rate(lr: str | None) -> str:
    """A learning rate as one label however it was written (``5e-5``, ``5e-05``, ``0.00005``)."""
    return f"{float(lr or DEFAULT_LR):.0e}"


def lr_grid_records(registry: RunRegistry):
    """(the grid: each model's runs of the tasks finetuned at several rates, labelled ``MODEL lr=LR``; each model's
    every task at its best rate, labelled ``MODEL best lr``): the best is the highest mean score over seeds on the
    dev set, so optimistic, and chosen the same way for every model."""
    records = registry.runs(task_prefix="glue:")
    gridded = {(_model_and_lr(r.experiment)[0], r.task) for r in records if _model_and_lr(r.experiment)[1]}
    by_lr: dict[tuple[str, str, str], list] = defaultdict(list)
    for r in records:
        model, lr = _model_and_lr(r.experiment)
        if model in {m for m, _ in gridded}:
            by_lr[model, r.task, _rate(lr)].append(r)
    grid = [dataclasses.replace(r, group=f"{model} lr={lr}")
            for (model, task, lr), runs in sorted(by_lr.items(), key=lambda item: (item[0][0], float(item[0][2])))
            if (model, task) in gridded for r in runs]
    best = []
    for model, task in sorted({(m, t) for m, t, _ in by_lr}):
        lrs = [lr for m, t, lr in by_lr if (m, t) == (model, task)]
        top = max(lrs, key=lambda lr: statistics.fmean(_score(r) for r in by_lr[model, task, lr]))
        best += [dataclasses.replace(r, group=f"{model} best lr") for r in by_lr[model, task, top]]
    return grid, best


def _score(record) -> float:
    """A run's GLUE score (``score``, else the mean of its task's metrics); NaN (a collapsed STS-B run) ranks last."""
    score = record.metrics.get("score")
    if score is None:
        score = statistics.fmean(record.metrics[key] for key in TASK_METRICS[record.task.partition(":")[2]])
    return -math.inf if math.isnan(score) else score


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--out", type=Path, help="also write the tables to this markdown file")
    parser.add_argument("--raw", type=Path, help="also write the study's raw files into this directory")
    args = parser.parse_args()
    registry = RunRegistry.in_output_root(args.root, read_only=True)
    parts = ["## MLM", "", mlm_table(registry.runs(task_prefix="mlm"), args.root), ""]
    glue = study_glue_records(registry)
    if glue:
        parts += [f"## GLUE (mean over seeds), finetuning learning rate {_rate(DEFAULT_LR)}", "",
                  glue_table(glue, agg="mean"), ""]
    grid, best = lr_grid_records(registry)
    if grid:
        parts += ["## GLUE per finetuning learning rate", "", glue_table(grid, agg="mean"), "",
                  "## GLUE with each task's best learning rate of the grid (chosen on dev: optimistic, for every "
                  "model alike)", "", glue_table(best, agg="mean"), ""]
    text = "\n".join(parts)
    print(text)
    if args.out:
        atomic_write_text(args.out, text)
    if args.raw:
        write_raw(registry, args.root, args.raw, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
