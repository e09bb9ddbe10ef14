"""Every form of one 2:4 Linear that cuSPARSELt takes, timed against dense: does any beat torch's binding?

A Linear is ``Y = X W^T`` with X [tokens, in], W [out, in] 2:4 along ``in``. torch's ``_cslt_sparse_mm`` computes
it one way: the weight as operand A, row-major (``D = W X^T``). cuSPARSELt also takes the weight as operand B
(``D = X W^T``), either operand stored row- or column-major, with or without a transpose op. Each form gives the
same numbers; which kernel cuSPARSELt picks, and how fast it is, may differ. Through our ctypes binding
(``cusparselt_binding.py``) this bench builds every form for each activation layout in -> result layout out
(row-major X or column-major X; row-major Y or column-major Y) and each weight storage, checks it against the
dense product, and times it as a CUDA graph of 20 calls (kernels only) against dense ``F.linear`` (row-major X
and Y) and torch's own binding in the same layout, alternating within each of ``--repeats`` rounds.

``--epilogue`` then times the feed-forward up-projection with its bias and GELU: dense as ``F.linear`` then
``F.gelu`` (two kernels) and as cuBLASLt's GELU epilogue (``torch._addmm_activation``), 2:4 as torch's binding
then ``F.gelu``, and as cuSPARSELt's bias + GELU epilogue through our binding where the library accepts it for
bf16 (a refusal is recorded; a ReLU epilogue, checked but not timed, shows whether the binding sets activations at
all). cuBLASLt's epilogue computes the tanh form of GELU; every variant is checked against the tanh form in fp32.

    python bench/cusparselt_layouts.py --out docs/data/cusparselt_layouts.json [--shapes bert-large] [--epilogue]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from datetime import date
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.sparse import SparseSemiStructuredTensorCUSPARSELT

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from cuda_timing import alternating_graph_ms  # noqa: E402
from cusparselt_binding import OP_T, CuSparseLtError, Library, Matmul, Operand  # noqa: E402

from sparsebert.env_info import git_commit  # noqa: E402
from sparsebert.io import atomic_write_json  # noqa: E402
from sparsebert.sparsity.masks import nm_mask  # noqa: E402
from sparsebert.sparsity.semi_structured import cusparselt_linear  # noqa: E402

SHAPES = {  # model -> (layer, out, in)
    "bert-large": [("q/k/v/out", 1024, 1024), ("up", 4096, 1024), ("down", 1024, 4096)],
    "bert-base": [("q/k/v/out", 768, 768), ("up", 3072, 768), ("down", 768, 3072)],
}
# One matmul against its dense reference, relative to the reference's largest |value|: a few bf16 spacings at that
# magnitude (2^-8 to 2^-7 of it each, both results rounded to bf16); a misplaced operand is O(1).
RTOL = 2**-6


def as_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values, row-major ("row") or column-major ("col", a transposed contiguous copy viewed back)."""
    return t.contiguous() if layout == "row" else t.t().contiguous().t()


def descriptions(view: torch.Tensor) -> list[tuple[str, Operand, torch.Tensor]]:
    """The two ways to describe one logical matrix held in ``view``: as it is, or as its transpose with op T.
    Each with the tensor whose memory the descriptor names."""
    return [("", Operand.of(view), view), ("T", Operand.of(view.t(), OP_T), view.t())]


def forms(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor,
          refused: dict[str, str]) -> list[tuple[str, Matmul, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Every cuSPARSELt form of ``y = x @ w.T`` over these tensors' memory: (name, plan, weight tensor to
    compress, activation tensor to pass, result tensor to write). Forms cuSPARSELt refuses go into ``refused``."""
    found = []
    # frame A: D = W X^T, D = y^T; frame B: D = X W^T, D = y
    frames = {"A": (w, x.t(), y.t(), True), "B": (x, w.t(), y, False)}
    for frame, (left, right, d, sparse_a) in frames.items():
        for (left_form, a, a_t), (right_form, b, b_t) in itertools.product(descriptions(left), descriptions(right)):
            name = f"sparse {frame}, A{left_form} B{right_form}"
            try:
                plan = Matmul(a, b, Operand.of(d), sparse_a=sparse_a)
            except CuSparseLtError as e:
                refused[name] = str(e)
                continue
            weight_t, act_t = (a_t, b_t) if sparse_a else (b_t, a_t)
            found.append((name, plan, weight_t, act_t, d))
    return found


def check(label: str, out: torch.Tensor, reference: torch.Tensor) -> float:
    """Max |out - reference|; raises beyond ``RTOL`` of the reference's largest value (``check_kernel`` in
    semi_structured.py warns instead; here a wrong form must not be timed)."""
    diff = (out.float() - reference).abs().max().item()
    if not diff <= RTOL * reference.abs().max().item():  # NaN fails too: an output left unwritten
        raise RuntimeError(f"{label}: differs from the dense result by {diff:.3g}")
    return diff


@torch.inference_mode()
def bench_layouts(args: argparse.Namespace) -> list[dict]:
    rows = []
    for model in args.shapes:
        for layer, n_out, n_in in SHAPES[model]:
            g = torch.Generator(device="cuda").manual_seed(n_out * n_in)
            w_dense = torch.randn(n_out, n_in, device="cuda", generator=g)
            w_dense = (w_dense * nm_mask(w_dense, 2, 4)).to(torch.bfloat16)
            x_row = torch.randn(args.tokens, n_in, device="cuda", generator=g).to(torch.bfloat16)
            reference = F.linear(x_row, w_dense).float()
            fns: dict[str, Callable[[], object]] = {"dense": partial(F.linear, x_row, w_dense)}
            compressed_torch = SparseSemiStructuredTensorCUSPARSELT.from_dense(w_dense)
            weights = {w_layout: as_layout(w_dense, w_layout) for w_layout in ("row", "col")}
            layout_of: dict[str, str] = {}
            errors: dict[str, float] = {}
            refused: dict[str, str] = {}  # forms cuSPARSELt would not build, or whose result was wrong
            for x_layout, y_layout in itertools.product(("row", "col"), repeat=2):
                layout = f"{x_layout}->{y_layout}"
                x = as_layout(x_row, x_layout)
                key = f"torch {layout}"
                fns[key], layout_of[key] = _torch_form(x, compressed_torch, y_layout), layout
                errors[key] = check(key, fns[key](), reference)
                for w_layout, w in weights.items():
                    y = as_layout(torch.empty(args.tokens, n_out, device="cuda", dtype=torch.bfloat16), y_layout)
                    form_refused: dict[str, str] = {}
                    for name, plan, weight_t, act_t, d in forms(x, w, y, form_refused):
                        key = f"{layout} W {w_layout}, {name}"
                        fn = partial(plan, plan.compress(weight_t), act_t, d)
                        y.fill_(float("nan"))  # every form writes into the same y: check what this one wrote
                        try:
                            fn()
                            errors[key] = check(key, y, reference)
                        except (CuSparseLtError, RuntimeError) as e:  # refused at run time, or a wrong result
                            refused[key] = str(e)
                            print(f"    {model} {layer} {key}: {e}")
                            continue
                        fns[key], layout_of[key] = fn, layout
                    refused.update({f"{layout} W {w_layout}, {k}": v for k, v in form_refused.items()})
            ms, runs = alternating_graph_ms(fns, args.repeats)
            best = {}
            for layout in (f"{a}->{b}" for a, b in itertools.product(("row", "col"), repeat=2)):
                ours = [k for k in ms if layout_of.get(k) == layout and not k.startswith("torch")]
                best[layout] = min(ours, key=ms.__getitem__) if ours else None
            rows.append({"model": model, "layer": layer, "out_features": n_out, "in_features": n_in,
                         "tokens": args.tokens, "ms": ms, "speedup": {k: ms["dense"] / v for k, v in ms.items()},
                         "best_form": best, "layout": layout_of, "max_abs_diff": errors, "refused": refused,
                         "runs": runs})
            print(f"\n{model} {layer} {n_out}x{n_in}, {args.tokens} tokens: dense {ms['dense']:.4f} ms")
            print("| layout | torch's binding | best form of ours | its speedup | forms that ran |")
            print("|---|---|---|---|---|")
            for layout, key in best.items():
                torch_key = f"torch {layout}"
                n_forms = sum(1 for k in layout_of if layout_of[k] == layout and not k.startswith("torch"))
                ours = f"{key} | {ms['dense'] / ms[key]:.2f}" if key else "- | -"
                print(f"| {layout} | {ms['dense'] / ms[torch_key]:.2f} | {ours} | {n_forms} |")
            ranked = sorted((k for k in ms if k != "dense"), key=ms.__getitem__)
            print("fastest: " + "; ".join(f"{k} {ms['dense'] / ms[k]:.2f}" for k in ranked[:4]))
    return rows


def _torch_form(x: torch.Tensor, compressed: SparseSemiStructuredTensorCUSPARSELT, y_layout: str) -> Callable[[], torch.Tensor]:
    """torch's binding, the weight as A: the result [tokens, out], row-major or column-major as asked."""
    return partial(cusparselt_linear, x, compressed, None, y_layout == "col")


def then_gelu(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    return lambda: F.gelu(fn(), approximate="tanh")


def linear_into(plan: Matmul, compressed: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A frame-A plan (``D = W X^T``) as a Linear: writes ``y`` [tokens, out] and returns it."""
    plan(compressed, x.t(), y.t())
    return y


@torch.inference_mode()
def bench_epilogue(args: argparse.Namespace) -> list[dict]:
    rows = []
    for model in args.shapes:
        layer, n_out, n_in = next(s for s in SHAPES[model] if s[0] == "up")
        g = torch.Generator(device="cuda").manual_seed(n_out * n_in + 1)
        w = torch.randn(n_out, n_in, device="cuda", generator=g)
        w = ((w * nm_mask(w, 2, 4)) / n_in**0.5).to(torch.bfloat16)
        bias = torch.randn(n_out, device="cuda", generator=g).to(torch.bfloat16)
        x = torch.randn(args.tokens, n_in, device="cuda", generator=g).to(torch.bfloat16)
        reference = F.gelu(F.linear(x.float(), w.float(), bias.float()), approximate="tanh")
        compressed_torch = SparseSemiStructuredTensorCUSPARSELT.from_dense(w)
        fns: dict[str, Callable[[], torch.Tensor]] = {
            "dense, then GELU": then_gelu(partial(F.linear, x, w, bias)),
            "dense, cuBLASLt GELU epilogue": partial(torch._addmm_activation, bias, x, w.t(), use_gelu=True),
            "2:4 torch row->col, then GELU": then_gelu(partial(cusparselt_linear, x, compressed_torch, bias, True)),
        }
        refused: dict[str, str] = {}
        wrong: dict[str, str] = {}
        accepted: list[str] = []
        for y_layout in ("col", "row"):
            y = as_layout(torch.empty(args.tokens, n_out, device="cuda", dtype=torch.bfloat16), y_layout)
            for activation in (None, "gelu", "relu"):
                key = f"2:4 ours row->{y_layout}, bias" + (f" + {activation} epilogue" if activation else ", then GELU")
                # frame A (D = W X^T = y^T): the bias runs along D's rows, the output features
                try:
                    plan = Matmul(Operand.of(w), Operand.of(x.t()), Operand.of(y.t()), sparse_a=True, bias=bias,
                                  activation=activation)
                except CuSparseLtError as e:  # an epilogue this cuSPARSELt does not offer for bf16
                    refused[key] = str(e)
                    print(f"  {model} {key}: refused: {e}")
                    continue
                call = partial(linear_into, plan, plan.compress(w), x, y)
                if activation == "relu":  # a control: does the binding set activations at all (not timed)
                    y.fill_(float("nan"))
                    try:
                        check(f"{model} {key}", call(), F.relu(F.linear(x.float(), w.float(), bias.float())))
                        accepted.append(key)
                    except RuntimeError as e:
                        wrong[key] = str(e)
                    continue
                fns[key] = call if activation else then_gelu(call)
        errors = {}
        for key, fn in fns.items():  # every variant returns [tokens, out]
            errors[key] = check(f"{model} {key}", fn(), reference)
        ms, runs = alternating_graph_ms(fns, args.repeats)
        base = ms["dense, then GELU"]
        rows.append({"model": model, "layer": layer, "out_features": n_out, "in_features": n_in,
                     "tokens": args.tokens, "ms": ms, "speedup_over_dense_then_gelu": {k: base / v for k, v in ms.items()},
                     "max_abs_diff": errors, "runs": runs, "epilogues_refused": refused,
                     "epilogues_wrong": wrong, "epilogues_checked_untimed": accepted})
        print(f"\n{model} up-projection {n_out}x{n_in} + bias + GELU, {args.tokens} tokens")
        print("| variant | ms | vs dense then GELU | vs dense GELU epilogue |")
        print("|---|---|---|---|")
        for key, v in ms.items():
            print(f"| {key} | {v:.4f} | {base / v:.2f} | {ms['dense, cuBLASLt GELU epilogue'] / v:.2f} |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", nargs="+", default=["bert-large"], choices=sorted(SHAPES))
    p.add_argument("--tokens", type=int, default=256 * 128, help="rows of X: batch x sequence length")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epilogue", action="store_true", help="also time the up-projection's bias + GELU epilogues")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("cusparselt_layouts.py: needs a CUDA GPU")
    card = torch.cuda.get_device_name()
    print(f"{card}, torch {torch.__version__}, cuSPARSELt {Library.get().version()}")
    result = {"card": card, "date": date.today().isoformat(), "commit": git_commit(ROOT), "torch": torch.__version__,
              "cusparselt": Library.get().version(), "tokens": args.tokens, "repeats": args.repeats,
              "layouts": bench_layouts(args)}
    atomic_write_json(args.out, result)  # kept should the epilogue part fail
    if args.epilogue:
        result["epilogue"] = bench_epilogue(args)
    atomic_write_json(args.out, result)


if __name__ == "__main__":
    main()
