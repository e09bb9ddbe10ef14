"""2:4 while training, at the layer: each BERT encoder product forward + backward in bf16, a plain ``nn.Linear``
against torchao's ``SemiSparseLinear``, same shapes, same weights, same call.

``SemiSparseLinear`` prunes its weight to 2:4 at every forward and multiplies through cuSPARSELt: by 4 x 4 tiles, so
that the weight and its transpose are both 2:4 (the input gradient multiplies by the transpose); this keeps half
the weights, but not always the two largest of every four a ``sparsity.pattern=2:4`` mask keeps. The weight
gradient is dense (a straight-through estimate). The pruning is part of every step: the weights change. The
baseline is what a user writes: ``nn.Linear`` in bf16, eager (one product per call: nothing for a compiler to
fuse). Rows: the four products of one encoder layer with fused QKV (hidden H: QKV H -> 3H, attention output
H -> H, feed-forward up H -> 4H and down 4H -> H) at batch x 128 tokens, and their sum, the layer's products.
Every layer is checked first: its output against a dense product with the 2:4 weight it made.

    python bench/semi_sparse_training.py --out semi_sparse_training.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from datetime import date
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SIZES = {"base": 768, "large": 1024}


def layer_products(hidden: int) -> dict[str, tuple[int, int]]:
    """(in, out) features of one encoder layer's products under fused QKV."""
    return {"qkv": (hidden, 3 * hidden), "attention output": (hidden, hidden),
            "feed-forward up": (hidden, 4 * hidden), "feed-forward down": (4 * hidden, hidden)}


def fwd_bwd(linear: nn.Module, x: torch.Tensor, grad: torch.Tensor):
    """One training step's work of a layer: the product, then the input and weight gradients."""
    def call() -> None:
        x.grad = None
        linear.weight.grad = linear.bias.grad = None
        linear(x).backward(grad)
    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="base,large", help="comma list of " + ", ".join(SIZES))
    p.add_argument("--tokens", type=int, default=256 * 128, help="rows of every product: batch x sequence length")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7, help="dense and 2:4 alternate; the median is reported")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",")]
    if unknown := set(sizes) - set(SIZES):
        raise SystemExit(f"--sizes: unknown {sorted(unknown)}; known: {', '.join(SIZES)}")
    if not torch.cuda.is_available():
        raise SystemExit("semi_sparse_training: needs a CUDA GPU with 2:4 sparse tensor cores (sm80 or later)")
    from torchao.sparsity.training import SemiSparseLinear, semi_structured_sparsify

    from sparsebert.cuda_timing import ms_per_call
    from sparsebert.env_info import git_commit

    rows = []
    for size in sizes:
        for name, (k, n) in layer_products(SIZES[size]).items():
            torch.manual_seed(0)
            dense = nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
            sparse = SemiSparseLinear.from_dense(copy.deepcopy(dense))
            x = torch.randn(args.tokens, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            grad = torch.randn(args.tokens, n, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                weight_2_4 = semi_structured_sparsify(dense.weight, backend="cusparselt").to_dense()
                want = nn.functional.linear(x, weight_2_4, dense.bias)
                error = ((sparse(x) - want).norm() / want.norm()).item()
                kept = (weight_2_4 != 0).float().mean().item()
            if error > 1e-2 or abs(kept - 0.5) > 1e-3:
                raise SystemExit(f"{size} {name}: the 2:4 layer is off by {error:.3g} (relative) or keeps "
                                 f"{kept:.3f} of its weights")
            calls = {"dense": fwd_bwd(dense, x, grad), "2:4": fwd_bwd(sparse, x, grad)}
            for call in calls.values():
                ms_per_call(call, 3)  # warm-up: cuSPARSELt's plans, cuBLAS's heuristics
            times: dict[str, list[float]] = {key: [] for key in calls}
            for _ in range(args.repeats):
                for key, call in calls.items():
                    times[key].append(ms_per_call(call, args.calls))
            row = {"size": size, "product": name, "in": k, "out": n, "relative_error": error, "kept": kept,
                   **{f"{key}_ms": statistics.median(t) for key, t in times.items()}, "times_ms": times}
            row["speedup"] = row["dense_ms"] / row["2:4_ms"]
            rows.append(row)
            print(f"{size} {name} ({k} -> {n}): dense {row['dense_ms']:.3f} ms, 2:4 {row['2:4_ms']:.3f} ms, "
                  f"{row['speedup']:.2f}x", flush=True)
        layer = [r for r in rows if r["size"] == size]
        dense_ms, sparse_ms = sum(r["dense_ms"] for r in layer), sum(r["2:4_ms"] for r in layer)
        print(f"{size}, one layer's products: dense {dense_ms:.3f} ms, 2:4 {sparse_ms:.3f} ms, "
              f"{dense_ms / sparse_ms:.2f}x", flush=True)
    if args.out:
        report = {"bench": "semi_sparse_training", "card": torch.cuda.get_device_name(0), "date": str(date.today()),
                  "commit": git_commit(ROOT), "torch": torch.__version__, "tokens": args.tokens, "rows": rows}
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        tmp.replace(args.out)


if __name__ == "__main__":
    main()
