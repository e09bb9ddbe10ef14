"""Pretraining throughput: sparsebert's real training step against a plain Hugging Face loop, same call, same card.

Baseline (the issue's reference, written here in ~30 lines): ``BertForMaskedLM`` with the BERT-base config, seq 128,
batch 256, bf16 autocast, fused AdamW, random full-length sequences with 15 % of positions labelled, a plain
``forward / backward / step`` loop; eager and sdpa attention, then sdpa + ``torch.compile``.

Ours: the registry's ``bert_100k`` (dense) and ``sparse_80_rigl`` through SparseBertTrainer (MLM collator with
content-seeded masking, decoder only at masked positions, fused AdamW, bf16), eager and with
``train.torch_compile=true``; then with ``data.static_mask_count=true`` (a fixed number of decoder rows: one
graph per step), also replayed as CUDA graphs (``reduce-overhead``), and the levers tried on top. Every row also
records the GPU's SM clock and power over its timed steps (NVML GPU 0; ``bench/gpu_clocks.py``) and its wall time,
compilation included (``wall_s``). ``--profile KEYS`` profiles an extra, untimed run of each listed variant after
the timings (``ProfilerCallback``: top_ops.txt, gpu_time.json, trace; clocks.json: the SM clock over the profiled
steps).

MFU counts the baseline's model FLOPs for every variant, 6 * (matmul params incl. the full decoder) + 12 * L * H * S
per token, against the card's dense bf16 peak (--peak-tflops; 781 measured on H100 in the issue), so MFU is
proportional to samples/s and the ratio column says how much faster each variant does the same job.

    python bench/pretrain_throughput.py --tokenizer minilm --out pretrain_throughput.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import date
from pathlib import Path

import torch
import torch._dynamo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

SEQ = 128
BASELINES = [("eager", "eager", False), ("sdpa", "sdpa", False), ("compiled", "sdpa", True)]  # key, attention, compile
STATIC = ("data.static_mask_count=true",)
HALF = (*STATIC, "model.half_precision_residual=true")  # + LayerNorm outputs (the residual stream) in bf16
GRAPHS = "train.torch_compile_mode=reduce-overhead"  # CUDA graphs
AUTOTUNE = "train.torch_compile_mode=max-autotune-no-cudagraphs"
TUNED = "train.torch_compile_tune_kernels=true"
FAST_DROPOUT = "model.fast_dropout=true"
CLIP_OUTSIDE = "train.clip_in_optimizer=false"  # the Trainer's own clipping pass (the default before 982af3f)
# key, experiment, train.torch_compile, further overrides, label
OURS = [
    ("ours-eager", "bert_100k", False, (), ""),
    ("ours", "bert_100k", True, (), ""),
    ("ours-sparse", "sparse_80_rigl", True, (), ""),
    # a fixed number of decoder rows per batch (data.static_mask_count): one graph for the whole step, then also
    # replayed as CUDA graphs (reduce-overhead)
    ("ours-static", "bert_100k", True, STATIC, " + static mask count"),
    ("ours-static-blocking-copy", "bert_100k", True, (*STATIC, "train.async_batch_copy=false"),
     " + static mask count, blocking batch copy"),
    ("ours-static-cudagraphs", "bert_100k", True, (*STATIC, GRAPHS), " + static mask count + CUDA graphs"),
    ("ours-sparse-static-cudagraphs", "sparse_80_rigl", True, (*STATIC, GRAPHS), " + static mask count + CUDA graphs"),
    # Inductor's autotuned matmul and kernel configurations, without CUDA graphs (max-autotune with them failed
    # to compile at fdf7bbe); not measured: its bf16-residual twin below first failed, then outlasted a call
    ("ours-static-autotune", "bert_100k", True, (*STATIC, AUTOTUNE), " + static mask count + max-autotune-no-cudagraphs"),
    # the bf16 residual stream (model.half_precision_residual): the best dense row measured
    ("ours-static-half-residual", "bert_100k", True, HALF, " + static mask count + bf16 residual stream"),
    ("ours-static-half-residual-autotune", "bert_100k", True, (*HALF, AUTOTUNE),
     " + static mask count + bf16 residual stream + max-autotune-no-cudagraphs"),
    # Inductor's autotuning of the matrix products only (INDUCTOR_PATCHES; Triton templates against cuBLAS, each
    # product's pointwise epilogue such as GELU fused into a template where that measures faster); the pointwise
    # and reduction kernels keep their default configurations, so it compiles sooner than max-autotune
    ("ours-static-half-residual-autotune-gemm", "bert_100k", True, HALF,
     " + static mask count + bf16 residual stream + Inductor GEMM autotuning"),
    ("ours-static-half-residual-cudagraphs", "bert_100k", True, (*HALF, GRAPHS),
     " + static mask count + bf16 residual stream + CUDA graphs"),
    # Inductor's combo kernels (INDUCTOR_PATCHES: horizontal fusion of independent small kernels, e.g. the ~200
    # per-weight bf16 casts of a step) set for this run only; a trial, not yet a train option
    ("ours-static-half-residual-combo", "bert_100k", True, HALF,
     " + static mask count + bf16 residual stream + Inductor combo kernels"),
    ("ours-sparse-static-half-residual", "sparse_80_rigl", True, (*HALF, GRAPHS),
     " + static mask count + CUDA graphs + bf16 residual stream"),
    # Inductor's coordinate-descent tuning of its own Triton kernels' block sizes and warps
    # (train.torch_compile_tune_kernels), without the matrix-product autotuning: the pointwise and normalization
    # kernels (GELU, dropout + residual + LayerNorm) are a third of the step and moved 2.7-3.0 TB/s in call C's
    # profile, against the card's 4.8
    ("ours-static-half-residual-tuned", "bert_100k", True, (*HALF, TUNED),
     " + static mask count + bf16 residual stream + Inductor kernel tuning"),
    ("ours-sparse-static-half-residual-tuned", "sparse_80_rigl", True, (*HALF, GRAPHS, TUNED),
     " + static mask count + CUDA graphs + bf16 residual stream + Inductor kernel tuning"),
    # dropout's random numbers (one 10-round Philox call per value in Inductor's kernels) from a counter hash
    # instead (model.fast_dropout)
    ("ours-static-half-residual-fast-dropout", "bert_100k", True, (*HALF, FAST_DROPOUT),
     " + static mask count + bf16 residual stream + fast dropout"),
    ("ours-sparse-static-half-residual-fast-dropout", "sparse_80_rigl", True, (*HALF, GRAPHS, FAST_DROPOUT),
     " + static mask count + CUDA graphs + bf16 residual stream + fast dropout"),
    ("ours-sparse-static-half-residual-fast-dropout-tuned", "sparse_80_rigl", True,
     (*HALF, GRAPHS, FAST_DROPOUT, TUNED),
     " + static mask count + CUDA graphs + bf16 residual stream + fast dropout + Inductor kernel tuning"),
]
# the two fast-dropout rows with the Trainer's own clipping pass (a norm, then a multiplication of every gradient)
# instead of the clip factor inside the fused AdamW step (train.clip_in_optimizer, the default since these rows
# were added; every row above runs with it)
OURS += [(f"{key}-clip-outside", experiment, compiled, (*overrides, CLIP_OUTSIDE),
          f"{label}, clipping as a pass of its own")
         for key, experiment, compiled, overrides, label in OURS
         if key in ("ours-static-half-residual-fast-dropout", "ours-sparse-static-half-residual-fast-dropout")]


INDUCTOR_PATCHES = {"ours-static-half-residual-combo": {"combo_kernels": True},
                    "ours-static-half-residual-autotune-gemm": {"max_autotune_gemm": True}}


def flops_per_token(cfg) -> float:
    h, layers, inter, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size
    matmul_params = layers * (4 * h * h + 2 * h * inter) + h * h + h * vocab  # encoder, MLM transform, decoder
    return 6 * matmul_params + 12 * layers * h * SEQ


def baseline(vocab: int, batch: int, steps: int, warmup: int, attn: str, compiled: bool) -> dict:
    """The plain loop: no Trainer, no collator, nothing but the model and the optimizer."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=vocab)
    model = BertForMaskedLM._from_config(cfg, attn_implementation=attn).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    step_fn = torch.compile(model) if compiled else model
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(1000, vocab, (steps, batch, SEQ), device="cuda", generator=g)
    picked = torch.rand(steps, batch, SEQ, device="cuda", generator=g) < 0.15
    labels = torch.where(picked, ids, torch.full_like(ids, -100))
    torch.cuda.reset_peak_memory_stats()
    start = 0.0
    for i in range(steps):
        if i == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(input_ids=ids[i], labels=labels[i]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    end = time.perf_counter()
    seconds = (end - start) / (steps - warmup)
    return {"variant": f"plain HF BertForMaskedLM, {attn}" + (" + torch.compile" if compiled else ""),
            "step_ms": 1000 * seconds, "samples_per_second": batch / seconds, "window": (start, end),
            "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30, "flops_config": cfg}


def ours(callbacks: list, experiment: str, tokenizer_path: str, batch: int, steps: int, warmup: int,
         compiled: bool, extra: tuple[str, ...] = (), label: str = "", inductor: dict | None = None) -> dict:
    from sparse_overhead import random_blocks, time_variant, timing_overrides

    from sparsebert.config import Registry
    from sparsebert.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path)
    overrides = [*timing_overrides(steps, batch, tokenizer_path), f"train.torch_compile={str(compiled).lower()}",
                 *extra]
    data = random_blocks(steps * batch, SEQ, len(tokenizer), tokenizer, seed=0)
    import torch._inductor.config

    with torch._inductor.config.patch(inductor or {}):
        r = time_variant(Registry.from_directory(ROOT / "experiments"), experiment, overrides, tokenizer, data,
                         warmup, callbacks)
    r["variant"] = f"sparsebert {experiment}" + (" + torch.compile" if compiled else "") + label
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", default="minilm")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=50, help="baseline steps (the first --warmup untimed)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--ours-steps", type=int, default=120, help="Trainer steps (RigL: one update per 100)")
    p.add_argument("--peak-tflops", type=float, default=781.0, help="dense bf16 matmul peak of the card")
    p.add_argument("--skip", default="", help="comma list of variant keys to skip: "
                   + ", ".join(key for key, *_ in [*BASELINES, *OURS]))
    p.add_argument("--only", default="",
                   help="comma list of the variant keys to run, in this order (all others skipped)")
    p.add_argument("--profile", default="", metavar="KEYS",
                   help="comma list of ours* keys to profile after the timed runs: one more, untimed run each, "
                        "3 steps after the warm-up, into --profile-dir/KEY/ (top_ops.txt, gpu_time.json, trace, "
                        "clocks.json)")
    p.add_argument("--profile-dir", type=Path, default=Path("profile"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("pretrain_throughput: needs a CUDA GPU (bf16, fused AdamW)")

    from gpu_clocks import ClockSampler

    from sparsebert.data.tokenizer import load_tokenizer

    vocab = len(load_tokenizer(args.tokenizer))
    skip = {key.strip() for key in args.skip.split(",")}
    results = []
    plan = [(key, lambda cb, attn=attn, compiled=compiled: baseline(vocab, args.batch, args.steps, args.warmup,
                                                                     attn, compiled))
            for key, attn, compiled in BASELINES]
    plan += [(key, lambda cb, key=key, v=v: ours(cb, v[0], args.tokenizer, args.batch, args.ours_steps,
                                                  args.warmup, *v[1:], inductor=INDUCTOR_PATCHES.get(key, {})))
             for key, *v in OURS]
    profile = {key.strip() for key in args.profile.split(",")} - {""}
    only = list(dict.fromkeys(key.strip() for key in args.only.split(",") if key.strip()))  # ordered, unique
    for flag, keys, known in (("--skip", skip, [k for k, _ in plan]), ("--only", set(only), [k for k, _ in plan]),
                              ("--profile", profile, [k for k, *_ in OURS])):
        unknown = keys - set(known) - {""}
        if unknown:  # before the first variant's minutes are spent
            raise SystemExit(f"{flag}: unknown variant key(s) {sorted(unknown)}; known: {', '.join(known)}")
    timed = plan
    if only:  # the listed order: which variant runs (and compiles) first is part of an experiment
        timed = sorted((item for item in plan if item[0] in only), key=lambda item: only.index(item[0]))
    for key, fn in timed:
        if key in skip:
            continue
        began = time.perf_counter()
        try:
            with ClockSampler() as clocks:
                r = fn([])
        except Exception as e:  # one variant that fails to compile must not cost the rest of the call
            first_line = (str(e).splitlines() or [""])[0]
            print(f"{key} FAILED: {type(e).__name__}: {first_line[:300]}", file=sys.stderr, flush=True)
            torch._dynamo.reset()
            torch.cuda.empty_cache()
            continue
        r.pop("flops_config", None)
        # the card's SM clock and power over the timed steps; the wall time includes compilation (autotuning)
        r.update(clocks.summary(r.pop("window")), key=key, wall_s=round(time.perf_counter() - began, 1))
        results.append(r)
        print(json.dumps(r), flush=True)
        torch._dynamo.reset()  # the next variant compiles afresh; this one's CUDA graph pool is freed
        torch.cuda.empty_cache()
        report(results, vocab, args, table=False)  # after every variant: a cut-off call keeps its numbers
    if results:
        report(results, vocab, args)
    from sparsebert.trainer.profiling import ProfilerCallback

    for key, fn in plan:  # after the timings, so the profiler's cost never enters one
        if key in profile:
            torch._dynamo.reset()  # compiled afresh, as in the timed run
            profiler = ProfilerCallback(warmup=args.warmup, steps=3, out_dir=args.profile_dir / key)
            # sampled often: the profiled steps last a fraction of a second. Under the profiler the GPU idles
            # between kernels the host launches late, so it may clock higher than in the timed run
            with ClockSampler(interval=0.01) as clocks:
                fn([profiler])
            if profiler.window is None:  # the run ended before the profiled steps (--ours-steps <= --warmup)
                continue
            summary = clocks.summary(profiler.window)
            (args.profile_dir / key / "clocks.json").write_text(json.dumps(summary) + "\n")
            print(f"profile of {key}: {args.profile_dir / key}, clocks {summary}", flush=True)


def clocks_text(r: dict) -> str:
    """NVML GPU 0's median SM clock and power over the timed steps ("-" without NVML): the card that ran, on a
    machine whose first GPU runs the bench."""
    if not r.get("sm_clock_mhz"):
        return "-"
    return f"{r['sm_clock_mhz'][0]:.0f}, {r['power_w'][0]}"


def report(results: list[dict], vocab: int, args: argparse.Namespace, table: bool = True) -> None:
    from transformers import BertConfig

    from sparsebert.env_info import git_commit

    per_token = flops_per_token(BertConfig(vocab_size=vocab))
    reference = next((r for r in results if r["key"] == "compiled"), results[0])
    card = torch.cuda.get_device_name(0)
    lines = [f"\n{card}, batch {args.batch}, seq {SEQ}\n",
             "| variant | samples/s | tokens/s | MFU | peak memory GB | host syncs / step | SM MHz, W | "
             "ratio vs compiled baseline |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        r["tokens_per_second"] = r["samples_per_second"] * SEQ
        r["mfu"] = r["tokens_per_second"] * per_token / (args.peak_tflops * 1e12)
        r["ratio"] = r["samples_per_second"] / reference["samples_per_second"]
        lines.append(f"| {r['variant']} | {r['samples_per_second']:.0f} | {r['tokens_per_second']:.0f} | "
                     f"{100 * r['mfu']:.1f} % | {r['peak_memory_gb']:.1f} | {r.get('host_syncs_per_step', '-')} | "
                     f"{clocks_text(r)} | {r['ratio']:.2f} |")
    if table:
        print("\n".join(lines))
    summary = {"card": card, "date": date.today().isoformat(), "commit": git_commit(ROOT),
               "torch": torch.__version__, "batch": args.batch, "seq": SEQ, "flops_per_token": per_token,
               "peak_tflops": args.peak_tflops, "reference": reference["variant"], "runs": results}
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")

if __name__ == "__main__":
    main()
