"""Multi-GPU scaling of the real training step: 1..N GPUs of one machine, dense and sparse_80_rigl.

BERT-base, seq 128, random full-length sequences, bf16, the registry's bert_100k and sparse_80_rigl with only
the batch, step count and logging changed. Each configuration runs under torchrun in its own job; rank 0
times optimizer steps warmup+1..steps (synchronized at both ends). Scaling efficiency at a per-GPU batch is
samples/s(N GPUs) / (N * samples/s(1 GPU)), all measured in this one call on the same machine.

    python bench/scaling.py --tokenizer minilm --gpus 1,2 --per-gpu-batch 128,256 --out scaling.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

# variant -> (experiment, extra overrides).
LAYERS = ["train.torch_compile=true", "train.torch_compile_scope=layers"]
STATIC = ["data.static_mask_count=true"]
CUDAGRAPHS = ["train.torch_compile_mode=reduce-overhead"]
NOSPLIT = ["train.ddp.split_compiled_graphs=false"]  # one compiled graph under DDP (no DDPOptimizer split)
ONE_PIECE = ["train.ddp.flat_pieces=1"]  # the flat all-reduce as first measured (the default is 3 pieces)
VARIANTS = {
    "bert_100k": ("bert_100k", []),
    "sparse_80_rigl": ("sparse_80_rigl", []),
    # torch.compile per encoder layer (fewer kernels and host work per step), with Dynamo's DDPOptimizer splitting
    # each layer's graph at the buckets (as first measured; no longer the default for per-layer graphs)
    "bert_100k_compiled_layers": ("bert_100k", [*LAYERS, "train.ddp.split_compiled_graphs=true"]),
    "sparse_80_rigl_compiled_layers": ("sparse_80_rigl", [*LAYERS, "train.ddp.split_compiled_graphs=true"]),
    # the same without the split (the default for per-layer graphs)
    "bert_100k_compiled_layers_nosplit": ("bert_100k", [*LAYERS, *NOSPLIT]),
    "sparse_80_rigl_compiled_layers_nosplit": ("sparse_80_rigl", [*LAYERS, *NOSPLIT]),
    # a fixed number of MLM decoder rows per batch (data.static_mask_count): the compiled step has one shape, so
    # it is replayed as CUDA graphs (reduce-overhead), which takes the host's per-kernel work out of the step
    "bert_100k_static_compiled": ("bert_100k", ["train.torch_compile=true", *STATIC]),
    "bert_100k_static_cudagraphs": ("bert_100k", ["train.torch_compile=true", *STATIC, *CUDAGRAPHS]),
    "sparse_80_rigl_static_cudagraphs": ("sparse_80_rigl", ["train.torch_compile=true", *STATIC, *CUDAGRAPHS]),
    # the same step with the Trainer's blocking batch copy, which waits every step until the GPU has finished
    # the previous one (train.async_batch_copy=false)
    "bert_100k_static_cudagraphs_blocking_copy": ("bert_100k", ["train.torch_compile=true", *STATIC, *CUDAGRAPHS,
                                                                "train.async_batch_copy=false"]),
    "bert_100k_layers_static_cudagraphs": ("bert_100k", [*LAYERS, *STATIC, *CUDAGRAPHS]),
    "sparse_80_rigl_layers_static_cudagraphs": ("sparse_80_rigl", [*LAYERS, *STATIC, *CUDAGRAPHS]),
}
# the Trainer's own clipping pass instead of the clip factor inside the fused AdamW step (train.clip_in_optimizer,
# the default since 982af3f: every variant here runs with it unless its name ends in _clip_outside)
CLIP_OUTSIDE = "_clip_outside"
for _name in ("bert_100k_static_cudagraphs", "sparse_80_rigl_static_cudagraphs"):
    VARIANTS[_name + CLIP_OUTSIDE] = (VARIANTS[_name][0], [*VARIANTS[_name][1], "train.clip_in_optimizer=false"])
# Variants that change DDP settings only: variant -> (the variant they change, DDP overrides). One process has no
# DDP, so their 1-GPU reference is that variant's 1-GPU run.
DDP_LEVERS = {
    # the DDP settings the Transformers Trainer picks by itself (find_unused_parameters and buffer broadcast on)
    "trainer_ddp_defaults": ("bert_100k", ["train.ddp.find_unused_parameters=true",
                                           "train.ddp.broadcast_buffers=true"]),
    # fewer, larger buckets; half-precision all-reduce; DDP's static-graph mode (bucket order fixed after the
    # first step, no per-step readiness bookkeeping)
    "bucket_100mb": ("bert_100k", ["train.ddp.bucket_cap_mb=100"]),
    "bf16_allreduce": ("bert_100k", ["train.ddp.comm_hook=bf16"]),
    "static_graph": ("bert_100k", ["train.ddp.static_graph=true"]),
    # the CUDA-graph step with the DDP levers on top
    "static_cudagraphs_bf16_allreduce": ("bert_100k_static_cudagraphs", ["train.ddp.comm_hook=bf16"]),
    "static_cudagraphs_bucket_100mb": ("bert_100k_static_cudagraphs", ["train.ddp.bucket_cap_mb=100"]),
    # Dynamo splits the graph at the buckets: 200 MB buckets leave three pieces instead of ~15, so most of the
    # split's boundary kernels (~1.1 ms per step at 25 MB) go, while the all-reduce of the later layers' half
    # still overlaps the earlier layers' backward (measured no better than one unsplit graph on 2 x H200)
    "static_cudagraphs_bucket_200mb": ("bert_100k_static_cudagraphs", ["train.ddp.bucket_cap_mb=200"]),
    # one bucket for all gradients: a single all-reduce after the backward instead of overlapping it. Tests
    # whether overlap costs more than it hides: one fp32 all-reduce of BERT-base's 440 MB should take ~2 ms on
    # 4 NVLink GPUs (355 GB/s bus bandwidth), less than the ~5 ms per step the 4-GPU step loses now
    "static_cudagraphs_one_bucket": ("bert_100k_static_cudagraphs", ["train.ddp.bucket_cap_mb=1024"]),
    # one compiled graph under DDP (no DDPOptimizer split at the buckets): the profile of the split step showed
    # ~1.1 ms per step of extra kernels at the graph boundaries and its matrix products slowed by the all-reduce
    # running beside them; unsplit, every gradient is ready at the end of the backward and the all-reduce runs
    # after it, alone
    "static_cudagraphs_nosplit": ("bert_100k_static_cudagraphs", NOSPLIT),
    "sparse_static_cudagraphs_nosplit": ("sparse_80_rigl_static_cudagraphs", NOSPLIT),
    # unsplit, with all gradients in one bucket: one large all-reduce after the backward instead of 14 of ~28 MB
    "static_cudagraphs_nosplit_one_bucket": ("bert_100k_static_cudagraphs", [*NOSPLIT, "train.ddp.bucket_cap_mb=1024"]),
    # unsplit, 100 MB buckets (5 all-reduces instead of 14): NCCL moved the 28 MB buckets at ~190-250 GB/s in
    # the unsplit profile, against the 360 GB/s its own model gives Ring / Simple there, while one bucket for
    # everything waits for all of the per-parameter copies into it before anything is sent
    "static_cudagraphs_nosplit_bucket_100mb": ("bert_100k_static_cudagraphs", [*NOSPLIT, "train.ddp.bucket_cap_mb=100"]),
    # the same with half the bytes on the wire (bf16 all-reduce)
    "static_cudagraphs_nosplit_bf16": ("bert_100k_static_cudagraphs", [*NOSPLIT, "train.ddp.comm_hook=bf16"]),
    # unsplit, DDP's reducer off: one flat all-reduce of every gradient after the backward (train.ddp.comm_hook=
    # flat), in fp32 and rounded to bf16 on the wire (flat_bf16): no per-parameter copies into 14 buckets
    "static_cudagraphs_nosplit_flat": ("bert_100k_static_cudagraphs", [*NOSPLIT, "train.ddp.comm_hook=flat", *ONE_PIECE]),
    "static_cudagraphs_nosplit_flat_bf16": ("bert_100k_static_cudagraphs", [*NOSPLIT, "train.ddp.comm_hook=flat_bf16",
                                                                              *ONE_PIECE]),
    # sparse runs sending only the active weights' gradients (train.ddp.comm_hook=sparse): at 80 % sparsity of the
    # encoder's Linear weights, 42 M of BERT-base's 110 M values (the dense gradient on RigL update steps) in one
    # flat all-reduce after the backward instead of DDP's reducer; with one graph (its default under whole-model
    # compile) and with Dynamo's split graph, which then has nothing to overlap
    "sparse_static_cudagraphs_nosplit_sparse_allreduce": ("sparse_80_rigl_static_cudagraphs",
                                                          [*NOSPLIT, "train.ddp.comm_hook=sparse", *ONE_PIECE]),
    "sparse_static_cudagraphs_sparse_allreduce": ("sparse_80_rigl_static_cudagraphs",
                                                  ["train.ddp.comm_hook=sparse", "train.ddp.split_compiled_graphs=true",
                                                   *ONE_PIECE]),
    # the flat all-reduces cut into 3 pieces (train.ddp.flat_pieces; the default since 43ac917, so the variants
    # above now run with train.ddp.flat_pieces=1): each piece's copies overlap the all-reduce of another, instead
    # of all copies before and (bf16, sparse) after the whole all-reduce. (The _p4 variants of 5230246 cut 4
    # pieces of about equal size at parameter boundaries.)
    **{f"{name}_p3": (experiment, [*NOSPLIT, f"train.ddp.comm_hook={hook}", "train.ddp.flat_pieces=3"])
       for name, experiment, hook in (("static_cudagraphs_nosplit_flat", "bert_100k_static_cudagraphs", "flat"),
                                      ("static_cudagraphs_nosplit_flat_bf16", "bert_100k_static_cudagraphs", "flat_bf16"),
                                      ("sparse_static_cudagraphs_nosplit_sparse_allreduce",
                                       "sparse_80_rigl_static_cudagraphs", "sparse"))},
}
# the 3-piece flat all-reduces with the Trainer's own clipping pass, as measured before clip_in_optimizer (which
# with the flat all-reduce also takes the gradients' norm from it, summed piece by piece)
for _name in ("static_cudagraphs_nosplit_flat_bf16_p3", "sparse_static_cudagraphs_nosplit_sparse_allreduce_p3"):
    _reference, _ddp = DDP_LEVERS[_name]
    DDP_LEVERS[_name + CLIP_OUTSIDE] = (_reference + CLIP_OUTSIDE, _ddp)
for _name, (_reference, _ddp) in DDP_LEVERS.items():
    VARIANTS[_name] = (VARIANTS[_reference][0], [*VARIANTS[_reference][1], *_ddp])
DDP_ONLY = {name: reference for name, (reference, _) in DDP_LEVERS.items()}
# "plain_ddp" is not a registry variant: the same model, collator, optimizer and DDP settings as bert_100k in a
# hand-written torch DDP loop, without the Trainer and Accelerate (what they add on top of DDP is the difference).
PLAIN_DDP = "plain_ddp"


def time_plain_ddp(cfg, tokenizer, data, warmup: int) -> dict:
    """bert_100k's model, MLM collator and fused AdamW (bf16 autocast, clipping at 1.0) in a plain loop under
    torch DDP with the settings of train.ddp (no buffer broadcast, gradients as bucket views); rank 0's wall time
    of steps warmup+1..end, synchronized at both ends, as StepTimer does for the Trainer variants."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    from sparsebert.data.mlm_data import MLMCollator
    from sparsebert.models.bert import build_mlm_model

    world, cuda = int(os.environ.get("WORLD_SIZE", "1")), torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)  # collectives and synchronize() on this rank's GPU, not GPU 0
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    torch.manual_seed(cfg.seed)
    model = build_mlm_model(cfg.model, tokenizer, cfg.data).to(device).train()
    step_model = model
    if world > 1:
        step_model = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None,
                                             broadcast_buffers=False, gradient_as_bucket_view=True,
                                             bucket_cap_mb=cfg.train.ddp.bucket_cap_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.learning_rate, weight_decay=cfg.train.weight_decay,
                            fused=cuda)
    per_device = cfg.train.global_batch_size // world
    sampler = DistributedSampler(data, shuffle=False) if world > 1 else None
    loader = DataLoader(data.with_format(None), batch_size=per_device, sampler=sampler, num_workers=4,
                        pin_memory=cuda, drop_last=True,
                        collate_fn=MLMCollator.for_data(cfg.data, tokenizer))
    steps = cfg.train.max_steps
    start = 0.0
    for i, batch in enumerate(loader):
        if i == steps:
            break
        if i == warmup:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = step_model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    end = time.perf_counter()
    seconds = (end - start) / (steps - warmup)
    return {"variant": PLAIN_DDP, "step_ms": 1000 * seconds, "window": (start, end),
            "samples_per_second": cfg.train.global_batch_size / seconds,
            "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}


def worker(args: argparse.Namespace) -> None:
    """One world size and batch, inside torchrun: time each variant ``--repeats`` times (variants alternate, so
    drift spreads over all of them); rank 0 writes the results. One launch per world size saves the start-up
    (imports, process group) of every further run."""
    import torch._dynamo
    from gpu_clocks import ClockSampler
    from sparse_overhead import random_blocks, time_variant, timing_overrides

    from sparsebert.config import ExperimentRegistry
    from sparsebert.data.tokenizer import load_tokenizer

    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokenizer = load_tokenizer(args.tokenizer)
    global_batch = args.batch * world
    overrides = timing_overrides(args.steps, global_batch, args.tokenizer, args.size)
    data = random_blocks(args.steps * global_batch, 128, len(tokenizer), tokenizer, seed=0)
    registry = ExperimentRegistry.builtin()
    results = []

    def overrides_of(variant: str) -> tuple[str, list[str]]:
        experiment, extra = VARIANTS[variant]
        return experiment, [*overrides, *extra, *(["train.torch_compile=true"] if args.compile else [])]

    rank = int(os.environ.get("RANK", "0"))

    def run_once(variant: str, callbacks: list | None = None) -> dict:
        """One training run of ``variant``, compiled afresh (no recompile limit; the last run's CUDA graphs
        freed); its timing, with the GPUs' clocks over its timed steps."""
        torch._dynamo.reset()
        with ClockSampler() if rank == 0 else contextlib.nullcontext() as clocks:
            if variant == PLAIN_DDP:
                result = time_plain_ddp(registry.build("bert_100k", overrides), tokenizer, data, args.warmup)
            else:
                experiment, items = overrides_of(variant)
                result = time_variant(registry, experiment, items, tokenizer, data, args.warmup, callbacks)
        window = result.pop("window")
        result.update(clocks.summary(window) if clocks else {})
        result.update(per_rank(result, window))
        result.update({"variant": variant, "gpus": world, "per_gpu_batch": args.batch,
                       "compiled": variant != PLAIN_DDP and "train.torch_compile=true" in overrides_of(variant)[1]})
        return result

    variants = args.variant.split(",")
    if args.untimed_first:
        # a freshly started machine's first training run can be slow for reasons outside the step (the GPU partly
        # idle; cause not found), and so is the first run of a multi-GPU launch, for its first ~100 steps
        # (docs/performance.md): one run of the first variant before the timed ones, kept in the JSON as
        # "untimed" and left out of every median
        results.append({**run_once(variants[0]), "repeat": -1, "untimed": True})
    for repeat in range(args.repeats):
        for variant in variants:
            results.append({**run_once(variant), "repeat": repeat})
            if rank == 0:
                Path(args.result).write_text(json.dumps(results))
    if args.profile:
        # after the timed runs, so the profiler's own cost never enters a timing: one more run of each variant
        # with 3 steps after the warm-up profiled on every rank (all-reduce overlap and gaps show per rank)
        from sparsebert.trainer.profiling import ProfilerCallback

        for variant in (v for v in variants if v != PLAIN_DDP):  # the plain loop takes no Trainer callbacks
            out = Path(args.profile) / f"{variant}-{world}gpu-b{args.batch}-rank{rank}"
            run_once(variant, callbacks=[ProfilerCallback(warmup=args.warmup, steps=3, out_dir=out)])


def per_rank(result: dict, window: tuple[float, float]) -> dict:
    """Every rank's timed-window step time, where its window started and ended relative to rank 0's (ms; the
    ranks' perf_counter clocks are the host's monotonic clock, so they compare on one machine), and its host syncs
    per step. The windows end after collectives, so their lengths agree closely; a rank that enters its window
    late, or syncs where the others do not, is the one to look at."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return {}
    mine = {"step_ms": round(result["step_ms"], 3), "window": window,
            "host_syncs_per_step": result.get("host_syncs_per_step"), "weights": result.get("weights_fingerprint")}
    ranks: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    start0, end0 = ranks[0]["window"]
    return {"step_ms_per_rank": [r["step_ms"] for r in ranks],
            "window_start_offset_ms_per_rank": [round(1000 * (r["window"][0] - start0), 3) for r in ranks],
            "window_end_offset_ms_per_rank": [round(1000 * (r["window"][1] - end0), 3) for r in ranks],
            "host_syncs_per_step_per_rank": [r["host_syncs_per_step"] for r in ranks],
            "weights_agree_across_ranks": (None if any(r["weights"] is None for r in ranks)  # plain_ddp's loop
                                           else len({r["weights"] for r in ranks}) == 1)}


def launch_variants(variants: list[str], gpus: int) -> list[str]:
    """What one launch runs: on one GPU a DDP-settings variant is replaced by the variant it changes (its
    efficiency reference), so every listed variant gets an efficiency."""
    if gpus > 1:
        return variants
    return list(dict.fromkeys(DDP_ONLY.get(v, v) for v in variants))


def env_pairs(items: list[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` items as a dict; a malformed one stops the bench, naming ``flag``."""
    bad = [item for item in items if "=" not in item or not item.split("=", 1)[0]]
    if bad:
        raise SystemExit(f"{flag} wants KEY=VALUE, got {bad}")
    return dict(item.split("=", 1) for item in items)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def report(runs: list[dict], out: Path | None, table: bool = True) -> None:
    """Median samples/s over repeats per (variant, GPUs, batch); efficiency against the 1-GPU median at the same
    per-GPU batch of the same variant (of the variant it changes, for a DDP-settings variant); the table; the
    JSON file (medians and every run)."""
    import torch

    from sparsebert.env_info import git_commit

    cells: dict[tuple[str, int, int], list[float]] = {}
    for r in (r for r in runs if not r.get("untimed")):
        cells.setdefault((r["variant"], r["gpus"], r["per_gpu_batch"]), []).append(r["samples_per_second"])
    medians = {k: statistics.median(v) for k, v in cells.items()}
    rows, summary_rows = [], []
    for (variant, n, batch), speed in medians.items():
        # a DDP-settings variant has no 1-GPU run of its own (one process has no DDP): it is compared with the
        # 1-GPU run of the variant it changes
        reference = DDP_ONLY.get(variant, variant)
        one = medians.get((reference, 1, batch))
        eff = speed / (n * one) if one else None
        summary_rows.append({"variant": variant, "gpus": n, "per_gpu_batch": batch, "samples_per_second": speed,
                             "runs": cells[(variant, n, batch)], "scaling_efficiency": eff})
        runs_text = " / ".join(f"{x:.0f}" for x in cells[(variant, n, batch)])
        rows.append(f"| {variant} | {batch} | {n} | {speed:.0f} ({runs_text}) | "
                    + (f"{eff:.3f} |" if eff else "- |"))
    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    summary = {"card": card, "gpus_on_machine": torch.cuda.device_count(), "date": date.today().isoformat(),
               "commit": git_commit(ROOT), "compiled": sorted({r["variant"] for r in runs if r["compiled"]}),
               "cells": summary_rows,
               "runs": runs}
    if table:
        print(f"\n{card} x{summary['gpus_on_machine']}, compiled: {', '.join(summary['compiled']) or 'none'}\n"
              "| variant | per-GPU batch | GPUs | samples/s median (runs) | scaling efficiency |\n"
              "|---|---|---|---|---|\n" + "\n".join(rows), flush=True)
    if out:
        out.write_text(json.dumps(summary, indent=2) + "\n")


def check_variants(args: argparse.Namespace) -> dict[tuple[str, int, int], Any]:
    """Build every variant's config here, before any GPU process starts: a refused one stops the bench in one line
    (inside torchrun it would end as a worker traceback).

    Returns:
        Each launch's config by (variant, per-GPU batch, GPUs).
    """
    from sparse_overhead import timing_overrides, variant_config

    from sparsebert.config import ExperimentRegistry

    registry = ExperimentRegistry.builtin()
    compile_items = ["train.torch_compile=true"] if args.compile else []
    configs = {}
    for variant in (v for v in args.variants.split(",") if v != PLAIN_DDP):
        experiment, extra = VARIANTS[variant]
        for batch in map(int, args.per_gpu_batch.split(",")):
            for gpus in map(int, args.gpus.split(",")):  # the global batch of each launch, as the workers build it
                items = [*timing_overrides(args.steps, batch * gpus, args.tokenizer, args.size), *extra,
                         *compile_items]
                try:
                    configs[variant, batch, gpus] = variant_config(registry, experiment, items)
                except ValueError as e:
                    raise SystemExit(f"{variant}: {e}") from None
    return configs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", default="minilm")
    p.add_argument("--gpus", default="1,2")
    p.add_argument("--per-gpu-batch", default="128,256")
    p.add_argument("--steps", type=int, default=120, help="optimizer steps per run; the sparse variants' RigL "
                   "updates every 100, so the window after --warmup must hold a multiple of 100")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--size", default="base", help="model size (tiny for a CPU smoke run)")
    p.add_argument("--variants", default="bert_100k,sparse_80_rigl",
                   help=f"any of {', '.join([*VARIANTS, PLAIN_DDP])}")
    p.add_argument("--repeats", type=int, default=2, help="timed runs of each variant (median reported)")
    p.add_argument("--compile", action="store_true", help="train.torch_compile=true in every variant")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="also profile 3 steps of each variant (an extra, untimed run) at 1 GPU and the most GPUs: "
                        "DIR/VARIANT-NGPU-bB-rankR/")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="set in every launch's environment (e.g. NCCL_PROTO=Simple); repeatable; kept in the JSON")
    p.add_argument("--no-untimed-first", dest="untimed_first", action="store_false",
                   help="skip the untimed run that the first launch and every multi-GPU launch make before their "
                        "timed ones")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", default="bert_100k", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=128, help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    return p


def main() -> None:
    args = build_parser().parse_args()
    if args.worker:
        return worker(args)
    unknown = sorted(set(args.variants.split(",")) - VARIANTS.keys() - {PLAIN_DDP})
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")

    check_variants(args)
    env = {**os.environ, **env_pairs(args.env, "--env")}

    runs: list[dict] = []
    first_launch = True
    with tempfile.TemporaryDirectory() as tmp:
        for batch in map(int, args.per_gpu_batch.split(",")):
            for n in map(int, args.gpus.split(",")):
                variants = launch_variants(args.variants.split(","), n)
                profile_here = args.profile and n in (1, max(map(int, args.gpus.split(","))))
                out = Path(tmp) / f"{n}-{batch}.json"
                cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
                       "--master-port", str(free_port()), __file__, "--worker", "--variant", ",".join(variants),
                       "--batch", str(batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
                       "--repeats", str(args.repeats), "--tokenizer", args.tokenizer, "--size", args.size,
                       "--result", str(out), *(["--compile"] if args.compile else []),
                       *([] if args.untimed_first and (first_launch or n > 1) else ["--no-untimed-first"]),
                       *(["--profile", str(Path(args.profile).resolve())] if profile_here else [])]
                done = subprocess.run(cmd, capture_output=True, text=True, env=env)
                first_launch = False
                if done.returncode != 0 or not out.is_file():
                    if args.out:  # the workers' own traceback is far above torchrun's summary: keep all of it
                        args.out.with_suffix(f".{n}gpu.stderr.txt").write_text(done.stderr)
                    print(done.stderr[-2000:], file=sys.stderr)
                    raise SystemExit(f"{variants} on {n} GPU(s), batch {batch} failed")
                launched = [{**r, "env": args.env} for r in json.loads(out.read_text())]
                runs.extend(launched)
                for r in launched:
                    print(json.dumps(r), flush=True)
                report(runs, args.out, table=False)  # after every launch: a cut-off call keeps its numbers

    report(runs, args.out)


if __name__ == "__main__":
    main()
