"""2:4 while training, at the layer: each BERT encoder product forward + backward in bf16, a plain ``nn.Linear``
against the same layer with its weight pruned to 2:4 at every forward (torchao's ``semi_structured_sparsify``),
same shapes, same weights, same call.

The pruning works on 4 x 4 tiles, so that the weight and its transpose are both 2:4 (the input gradient multiplies
by the transpose). Its default rule (torchao's, ``--algorithm ""``) picks greedily by signed value and may keep
fewer than 8 of a tile's 16 (about 0.49 of the weights, not 0.5); ``largest_abs_values_greedy`` picks by magnitude,
closer to what a ``sparsity.pattern=2:4`` mask keeps. The weight gradient is dense (a straight-through estimate).
The pruning is part of every step: the weights change. Two backends of the 2:4 product: ``cusparselt`` (torchao's
``SemiSparseLinear``) and ``cutlass``; one that fails at this torch / torchao pair is printed and listed under
``failed`` in the report with its error, and the others still run (a fault that breaks the CUDA context ends the
process: run that backend alone with ``--backends``). The baseline is what a user writes: ``nn.Linear`` in bf16,
eager (one product per call: nothing for a compiler to fuse). Rows: the four products of one encoder layer with
fused QKV (hidden H: QKV H -> 3H, attention output H -> H, feed-forward up H -> 4H and down 4H -> H) at batch x 128
tokens, and their sum, the layer's products.
Every 2:4 layer is checked first: the weight it multiplies by (read back through the layer itself) keeps at most 2
of every 4 inputs and about half in all, and its output is that weight's dense product.

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
BACKENDS = ("cusparselt", "cutlass")


def layer_products(hidden: int) -> dict[str, tuple[int, int]]:
    """(in, out) features of one encoder layer's products under fused QKV."""
    return {"qkv": (hidden, 3 * hidden), "attention output": (hidden, hidden),
            "feed-forward up": (hidden, 4 * hidden), "feed-forward down": (4 * hidden, hidden)}


class RuntimeSemiSparseLinear(nn.Linear):
    """``nn.Linear`` whose weight is pruned to 2:4 at every forward through ``backend`` by ``algorithm`` (torchao's
    ``SemiSparseLinear`` with both a choice)."""

    def __init__(self, dense: nn.Linear, backend: str, algorithm: str = ""):
        super().__init__(dense.in_features, dense.out_features, bias=dense.bias is not None, device="meta")
        self.weight, self.bias, self.backend, self.algorithm = dense.weight, dense.bias, backend, algorithm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torchao.sparsity.training import semi_structured_sparsify

        sparse = semi_structured_sparsify(self.weight, algo=self.algorithm, backend=self.backend)
        return nn.functional.linear(x, sparse, self.bias)


def fwd_bwd(linear: nn.Module, x: torch.Tensor, grad: torch.Tensor):
    """One training step's work of a layer: the product, then the input and weight gradients."""
    def call() -> None:
        x.grad = None
        linear.weight.grad = linear.bias.grad = None
        linear(x).backward(grad)
    return call


def check_2_4(layer: nn.Module, x: torch.Tensor) -> dict[str, float]:
    """The weight ``layer`` multiplies by, read back through the layer (its product with the identity, less the
    bias), must keep at most 2 of every 4 inputs of each output and about half in all (the tile rule may keep a
    little less), and ``layer(x)`` must be its dense product.

    Returns:
        ``relative_error`` of ``layer(x)`` against that product and ``kept``, the fraction of weights kept.
    Raises:
        ValueError: where the layer is not a 2:4 product.
    """
    with torch.no_grad():
        eye = torch.eye(layer.in_features, device=x.device, dtype=x.dtype)
        weight = (layer(eye) - (0 if layer.bias is None else layer.bias)).t()
        per_group = (weight != 0).reshape(weight.shape[0], -1, 4).sum(-1)
        want = nn.functional.linear(x, weight, layer.bias)
        error = ((layer(x) - want).norm() / want.norm()).item()
    kept = (weight != 0).float().mean().item()
    if per_group.max().item() > 2 or not 0.45 <= kept <= 0.5 or error > 1e-2:
        raise ValueError(f"not a 2:4 product: up to {per_group.max().item()} of 4 kept, {kept:.3f} of all, "
                         f"output off by {error:.3g} (relative)")
    return {"relative_error": error, "kept": kept}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="base,large", help="comma list of " + ", ".join(SIZES))
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma list of " + ", ".join(BACKENDS))
    p.add_argument("--algorithm", default="", help='the 2:4 tile rule: "" (torchao\'s default) or '
                   "largest_abs_values_greedy")
    p.add_argument("--tokens", type=int, default=256 * 128, help="rows of every product: batch x sequence length")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7, help="dense and 2:4 alternate; the median is reported")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",")]
    backends = [b.strip() for b in args.backends.split(",")]
    if unknown := set(sizes) - set(SIZES):
        raise SystemExit(f"--sizes: unknown {sorted(unknown)}; known: {', '.join(SIZES)}")
    if unknown := set(backends) - set(BACKENDS):
        raise SystemExit(f"--backends: unknown {sorted(unknown)}; known: {', '.join(BACKENDS)}")
    if not torch.cuda.is_available():
        raise SystemExit("semi_sparse_training: needs a CUDA GPU with 2:4 sparse tensor cores (sm80 or later)")

    from sparsebert.cuda_timing import ms_per_call
    from sparsebert.env_info import git_commit

    rows, failed = [], {}
    for size in sizes:
        for name, (k, n) in layer_products(SIZES[size]).items():
            torch.manual_seed(0)
            dense = nn.Linear(k, n, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(args.tokens, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            grad = torch.randn(args.tokens, n, device="cuda", dtype=torch.bfloat16)
            calls, checks = {"dense": fwd_bwd(dense, x, grad)}, {}
            for backend in backends:
                if backend in failed:
                    continue
                sparse = RuntimeSemiSparseLinear(copy.deepcopy(dense), backend, args.algorithm)
                try:
                    checks[backend] = check_2_4(sparse, x)
                    calls[backend] = fwd_bwd(sparse, x, grad)
                    ms_per_call(calls[backend], 3)  # warm-up: cuSPARSELt's plans; a failing backward fails here
                except Exception as error:  # a torch / torchao pair may break a backend anywhere in its stack
                    calls.pop(backend, None)
                    checks.pop(backend, None)
                    message = (str(error).strip().splitlines() or [""])[0]
                    failed[backend] = f"{size} {name}: {type(error).__name__}: {message}"
                    print(f"{backend}: failed at {failed[backend]}", flush=True)
            ms_per_call(calls["dense"], 3)  # warm-up: cuBLAS's heuristics
            times: dict[str, list[float]] = {key: [] for key in calls}
            for _ in range(args.repeats):
                for key, call in calls.items():
                    times[key].append(ms_per_call(call, args.calls))
            row = {"size": size, "product": name, "in": k, "out": n, "checks": checks,
                   **{f"{key}_ms": statistics.median(t) for key, t in times.items()}, "times_ms": times}
            row["speedup"] = {key: row["dense_ms"] / row[f"{key}_ms"] for key in calls if key != "dense"}
            rows.append(row)
            print(f"{size} {name} ({k} -> {n}): dense {row['dense_ms']:.3f} ms"
                  + "".join(f", {key} {row[f'{key}_ms']:.3f} ms ({row['speedup'][key]:.2f}x)"
                            for key in row["speedup"]), flush=True)
        layer = [r for r in rows if r["size"] == size]
        for key in [b for b in backends if all(f"{b}_ms" in r for r in layer)]:
            dense_ms, sparse_ms = sum(r["dense_ms"] for r in layer), sum(r[f"{key}_ms"] for r in layer)
            print(f"{size}, one layer's products, {key}: dense {dense_ms:.3f} ms, 2:4 {sparse_ms:.3f} ms, "
                  f"{dense_ms / sparse_ms:.2f}x", flush=True)
    if args.out:
        import torchao

        report = {"bench": "semi_sparse_training", "card": torch.cuda.get_device_name(0), "date": str(date.today()),
                  "commit": git_commit(ROOT), "torch": torch.__version__, "torchao": torchao.__version__,
                  "algorithm": args.algorithm, "tokens": args.tokens, "failed": failed, "rows": rows}
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        tmp.replace(args.out)


if __name__ == "__main__":
    main()
