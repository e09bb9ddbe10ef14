"""Our CUTLASS 2:4 Linear (row-major in and out, bias and GELU fused) against dense and torch's cuSPARSELt binding.

For each of BERT-large's, BERT-base's and MiniLM's encoder Linears at ``--tokens`` rows (batch x sequence), times as CUDA
graphs of 20 calls, alternating within each of ``--repeats`` rounds:
- dense ``F.linear`` with bias, and for the up-projection also dense then GELU, and dense with cuBLASLt's GELU
  epilogue (``torch._addmm_activation``), the fastest dense form;
- torch's cuSPARSELt binding, row-major in and out (what a drop-in Linear needs), then GELU for the up-projection;
- our kernel in each tile configuration the library was built with, GELU fused for the up-projection.
Each variant is checked against the fp32 product first (a wrong one raises, it is never timed).

    python bench/cutlass_layers.py --out docs/data/cutlass_layers.json [--shapes bert-large bert-base]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import date
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.sparse import SparseSemiStructuredTensorCUSPARSELT

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from cuda_timing import alternating_graph_ms  # noqa: E402

from sparsebert.env_info import git_commit  # noqa: E402
from sparsebert.export.semi_structured import cusparselt_linear  # noqa: E402
from sparsebert.export.sparse24_kernel import Library, Sparse24Linear  # noqa: E402
from sparsebert.io import atomic_write_json  # noqa: E402
from sparsebert.sparsity.masks import nm_mask  # noqa: E402

SHAPES = {  # model -> (layer, out, in): the encoder Linear shapes
    "bert-large": [("q/k/v/out", 1024, 1024), ("up", 4096, 1024), ("down", 1024, 4096)],
    "bert-base": [("q/k/v/out", 768, 768), ("up", 3072, 768), ("down", 768, 3072)],
    "minilm": [("q/k/v/out", 384, 384), ("up", 1536, 384), ("down", 384, 1536)],
}
# One matmul against its fp32 reference, relative to the reference's largest |value|: a few bf16 spacings at that
# magnitude (2^-8 to 2^-7 of it each, the results rounded to bf16); a misplaced operand is O(1).
RTOL = 2**-6


def check(label: str, out: torch.Tensor, reference: torch.Tensor) -> float:
    """Max |out - reference|; raises beyond ``RTOL`` of the reference's largest value: a wrong variant must not
    be timed."""
    diff = (out.float() - reference).abs().max().item()
    if not diff <= RTOL * reference.abs().max().item():  # NaN fails too: an output left unwritten
        raise RuntimeError(f"{label}: differs from the dense result by {diff:.3g}")
    return diff


@torch.inference_mode()
def bench_layer(model: str, layer: str, n_out: int, n_in: int, tokens: int, repeats: int) -> dict:
    gelu = layer == "up"
    g = torch.Generator(device="cuda").manual_seed(n_out * n_in)
    linear = nn.Linear(n_in, n_out, device="cuda")
    w = torch.randn(n_out, n_in, device="cuda", generator=g) / n_in**0.5
    linear.weight.data = (w * nm_mask(w, 2, 4)).to(torch.bfloat16)
    linear.bias.data = (torch.randn(n_out, device="cuda", generator=g) * 0.1).to(torch.bfloat16)
    w, b = linear.weight.data, linear.bias.data
    x = torch.randn(tokens, n_in, device="cuda", generator=g).to(torch.bfloat16)
    reference = F.linear(x.float(), w.float(), b.float())
    if gelu:
        reference = F.gelu(reference)
    dense = partial(F.linear, x, w, b)
    torch24 = partial(cusparselt_linear, x, SparseSemiStructuredTensorCUSPARSELT.from_dense(w), b)
    fns: dict[str, Callable[[], torch.Tensor]] = {}
    if gelu:
        fns["dense, then GELU"] = lambda: F.gelu(dense())
        fns["dense, cuBLASLt GELU epilogue"] = partial(torch._addmm_activation, b, x, w.t(), use_gelu=True)
        fns["cuSPARSELt (torch), then GELU"] = lambda: F.gelu(torch24())
    else:
        fns["dense"] = dense
        fns["cuSPARSELt (torch)"] = torch24
    for config, name in enumerate(Library.get().configs):
        fns[f"ours {name}"] = partial(Sparse24Linear(linear, gelu=gelu, configs={tokens: config}), x)
    errors = {key: check(f"{model} {layer} {key}", fn(), reference) for key, fn in fns.items()}
    ms, runs = alternating_graph_ms(fns, repeats)
    base = "dense, cuBLASLt GELU epilogue" if gelu else "dense"
    print(f"\n{model} {layer} {n_out}x{n_in}{' + bias + GELU' if gelu else ' + bias'}, {tokens} tokens")
    print("| variant | ms | speedup over the fastest dense |")
    print("|---|---|---|")
    for key, v in ms.items():
        print(f"| {key} | {v:.4f} | {ms[base] / v:.2f} |")
    return {"model": model, "layer": layer, "out_features": n_out, "in_features": n_in, "tokens": tokens,
            "gelu": gelu, "baseline": base, "ms": ms, "speedup": {k: ms[base] / v for k, v in ms.items()},
            "max_abs_diff": errors, "runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--tokens", type=int, nargs="+", default=[256 * 128], help="rows of x: batch x sequence")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("cutlass_layers.py: needs a CUDA GPU")
    card = torch.cuda.get_device_name()
    print(f"{card}, torch {torch.__version__}, configurations {Library.get().configs}")
    result = {"card": card, "date": date.today().isoformat(), "commit": git_commit(ROOT),
              "torch": torch.__version__, "repeats": args.repeats, "layers": []}
    for tokens in args.tokens:
        for model in args.shapes:
            for layer, n_out, n_in in SHAPES[model]:
                result["layers"].append(bench_layer(model, layer, n_out, n_in, tokens, args.repeats))
                atomic_write_json(args.out, result)  # kept should a later shape fail


if __name__ == "__main__":
    main()
