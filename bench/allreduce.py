"""All-reduce bandwidth at the sizes DDP sends for BERT-base, under sets of NCCL environment variables.

The unsplit DDP step (docs/benchmarks.md, multi-GPU scaling) all-reduces its gradients after the backward in
14 buckets; this measures those all-reduces alone, one size at a time and as the whole sequence of buckets
back to back, so a setting that moves them faster shows here before it is tried in the training step.
Each environment set is one torchrun launch (NCCL reads its variables when the communicator starts).

    python bench/allreduce.py --gpus 2 --env-set "" --env-set NCCL_NTHREADS=512 --out allreduce.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 1_000_000
# BERT-base's DDP buckets at the default 25 MB cap, in bytes of fp32 gradients (NCCL's log, commit a9c53f4):
# the word embeddings' bucket, eleven ~28 MB ones and two smaller
BUCKETS = [93_763_584, *[28_351_488] * 11, 27_705_576, 4_733_952]
SIZES = {"4.7MB": 4_733_952, "28MB": 28_351_488, "94MB": 93_763_584, "438MB": sum(BUCKETS)}


def timed(tensors: list, iters: int, cuda: bool) -> float:
    """Seconds to all-reduce every tensor once, back to back (rank 0's wall time after two untimed rounds and a
    barrier, so every rank times the same calls)."""
    import torch
    import torch.distributed as dist

    def all_reduce_each():
        for t in tensors:
            dist.all_reduce(t)

    for _ in range(2):
        all_reduce_each()
    dist.barrier()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        all_reduce_each()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    world = dist.get_world_size()
    bus = 2 * (world - 1) / world  # bytes each rank sends per byte reduced, ring all-reduce (nccl-tests' busbw)
    scale = args.scale  # < 1 shrinks every size (a CPU smoke run)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        width = torch.finfo(dtype).bits // 8
        for name, fp32_bytes in SIZES.items():
            # the same gradient count as fp32 bucket; bf16 sends half the bytes for it
            numel = max(1, int(fp32_bytes * scale) // 4)
            x = torch.zeros(numel, dtype=dtype, device=device)  # zeros: repeated sums never overflow
            seconds = timed([x], args.iters, cuda)
            rows.append({"what": name, "dtype": str(dtype).removeprefix("torch."), "bytes": numel * width,
                         "ms": 1000 * seconds, "bus_gb_per_s": bus * numel * width / seconds / 1e9})
        # DDP's whole exposed phase: every bucket once, back to back, as the unsplit step sends them
        tensors = [torch.zeros(max(1, int(b * scale) // 4), dtype=dtype, device=device) for b in BUCKETS]
        total = sum(t.numel() * width for t in tensors)
        seconds = timed(tensors, args.iters, cuda)
        rows.append({"what": f"{len(BUCKETS)} buckets in sequence", "dtype": str(dtype).removeprefix("torch."),
                     "bytes": total, "ms": 1000 * seconds, "bus_gb_per_s": bus * total / seconds / 1e9})
    if dist.get_rank() == 0:
        Path(args.result).write_text(json.dumps({"gpus": world, "rows": rows}))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=2, help="processes (one per GPU)")
    p.add_argument("--env-set", action="append", default=None, metavar="K=V,K=V",
                   help="one launch per set ('' for NCCL's defaults); repeatable")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--scale", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    sets = args.env_set if args.env_set is not None else [""]
    from scaling import env_pairs, free_port

    parsed = [env_pairs([kv for kv in item.split(",") if kv], "--env-set") for item in sets]

    import torch

    from_env = {"card": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                "date": date.today().isoformat(), "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
                "commit": os.environ.get("SPARSEBERT_COMMIT")}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, env_set in enumerate(parsed):
            out = Path(tmp) / f"{i}.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.gpus),
                   "--master-port", str(free_port()), __file__, "--worker", "--iters", str(args.iters),
                   "--scale", str(args.scale), "--result", str(out)]
            done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env_set}, timeout=300)
            if done.returncode != 0 or not out.is_file():
                print(done.stderr[-2000:], file=sys.stderr)
                raise SystemExit(f"all-reduce launch with {env_set or 'NCCL defaults'} failed")
            results.append({"env": env_set, **json.loads(out.read_text())})
            label = ",".join(f"{k}={v}" for k, v in env_set.items()) or "NCCL defaults"
            print(f"\n{from_env['card']} x{args.gpus}, {label}\n| what | dtype | MB | ms | bus GB/s |\n|---|---|---|---|---|")
            for r in results[-1]["rows"]:
                print(f"| {r['what']} | {r['dtype']} | {r['bytes'] / MB:.1f} | {r['ms']:.3f} | {r['bus_gb_per_s']:.0f} |",
                      flush=True)
    if args.out:
        args.out.write_text(json.dumps({**from_env, "launches": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
