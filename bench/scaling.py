"""Multi-GPU scaling of the real training step: 1..N GPUs of one machine, dense and sparse_80_rigl.

BERT-base, seq 128, random full-length sequences, bf16, the registry's bert_100k and sparse_80_rigl with only
the batch, step count and logging changed. Each configuration runs under torchrun in its own job; rank 0
times optimizer steps warmup+1..steps (synchronized at both ends). Scaling efficiency at a per-GPU batch is
samples/s(N GPUs) / (N * samples/s(1 GPU)), all measured in this one call on the same machine.

    python bench/scaling.py --tokenizer minilm --gpus 1,2 --per-gpu-batch 128,256 --out scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

# variant -> (experiment, extra overrides). "trainer_ddp_defaults" is bert_100k with the DDP settings the
# Transformers Trainer picks by itself (find_unused_parameters and buffer broadcast on): the lever's A/B.
VARIANTS = {
    "bert_100k": ("bert_100k", []),
    "sparse_80_rigl": ("sparse_80_rigl", []),
    "trainer_ddp_defaults": ("bert_100k", ["train.ddp.find_unused_parameters=true",
                                           "train.ddp.broadcast_buffers=true"]),
}


def worker(args: argparse.Namespace) -> None:
    """One configuration, inside torchrun: time it and let rank 0 write the result."""
    from sparse_overhead import random_blocks, time_variant

    from sparsebert.config import Registry
    from sparsebert.data.tokenizer import load_tokenizer

    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokenizer = load_tokenizer(args.tokenizer)
    global_batch = args.batch * world
    overrides = [f"train.max_steps={args.steps}", "train.warmup_steps=10", f"train.global_batch_size={global_batch}",
                 "train.eval_at_start=false", "train.eval_steps=100000", "train.save_steps=100000",
                 "train.logging_steps=50", "train.report_to=[]", "train.dataloader_workers=4",
                 f"model.tokenizer={args.tokenizer}", f"model.size={args.size}"]
    experiment, extra = VARIANTS[args.variant]
    if args.compile:
        extra = [*extra, "train.torch_compile=true"]
    data = random_blocks(args.steps * global_batch, 128, len(tokenizer), tokenizer, seed=0)
    result = time_variant(Registry.from_directory(ROOT / "experiments"), experiment, [*overrides, *extra],
                          tokenizer, data, args.warmup)
    if int(os.environ.get("RANK", "0")) == 0:
        result.update({"variant": args.variant, "gpus": world, "per_gpu_batch": args.batch,
                       "compiled": args.compile})
        Path(args.result).write_text(json.dumps(result))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def report(results: list[dict], out: Path | None, table: bool = True) -> None:
    """Efficiencies against the 1-GPU run of the same variant and per-GPU batch; the table; the JSON file."""
    import torch

    from sparsebert.env_info import git_commit

    one_gpu = {(r["variant"], r["per_gpu_batch"]): r["samples_per_second"] for r in results if r["gpus"] == 1}
    rows = []
    for r in results:
        # trainer_ddp_defaults has no 1-GPU run of its own: one process has no DDP, so it is bert_100k's
        one = one_gpu.get((r["variant"], r["per_gpu_batch"])) or one_gpu.get((VARIANTS[r["variant"]][0],
                                                                              r["per_gpu_batch"]))
        if one:
            r["scaling_efficiency"] = r["samples_per_second"] / (r["gpus"] * one)
        rows.append(f"| {r['variant']} | {r['per_gpu_batch']} | {r['gpus']} | {r['samples_per_second']:.0f} "
                    f"| {r.get('scaling_efficiency', float('nan')):.3f} |")
    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    summary = {"card": card, "gpus_on_machine": torch.cuda.device_count(),
               "date": date.today().isoformat(), "commit": git_commit(ROOT), "runs": results}
    if table:
        print(f"\n{summary['card']} x{summary['gpus_on_machine']}\n| variant | per-GPU batch | GPUs | samples/s | "
              "scaling efficiency |\n|---|---|---|---|---|\n" + "\n".join(rows), flush=True)
    if out:
        out.write_text(json.dumps(summary, indent=2) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", default="minilm")
    p.add_argument("--gpus", default="1,2")
    p.add_argument("--per-gpu-batch", default="128,256")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--size", default="base", help="model size (tiny for a CPU smoke run)")
    p.add_argument("--variants", default="bert_100k,sparse_80_rigl", help=f"any of {', '.join(VARIANTS)}")
    p.add_argument("--compile", action="store_true", help="train.torch_compile=true in every variant")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", default="bert_100k", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=128, help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch in map(int, args.per_gpu_batch.split(",")):
            for n in map(int, args.gpus.split(",")):
                for variant in args.variants.split(","):
                    if variant == "trainer_ddp_defaults" and n == 1:
                        continue  # one process has no DDP: its 1-GPU reference is bert_100k's
                    out = Path(tmp) / f"{variant}-{n}-{batch}.json"
                    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
                           "--master-port", str(free_port()), __file__, "--worker", "--variant", variant,
                           "--batch", str(batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
                           "--tokenizer", args.tokenizer, "--size", args.size, "--result", str(out),
                           *(["--compile"] if args.compile else [])]
                    done = subprocess.run(cmd, capture_output=True, text=True)
                    if done.returncode != 0 or not out.is_file():
                        print(done.stderr[-2000:], file=sys.stderr)
                        raise SystemExit(f"{variant} on {n} GPU(s), batch {batch} failed")
                    results.append(json.loads(out.read_text()))
                    print(json.dumps(results[-1]), flush=True)
                    report(results, args.out, table=False)  # after every run: a cut-off call still leaves its numbers

    report(results, args.out)


if __name__ == "__main__":
    main()
