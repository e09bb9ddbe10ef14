"""Pretraining throughput: sparsebert's real training step against plain Hugging Face loops, same call, same card.

Two references, both ``BertForMaskedLM`` of ``--size`` (BERT-base, or BERT-large; ours then sets ``model.size``
to match) with the tokenizer's vocabulary, seq 128, batch 256, bf16 autocast, fused AdamW, gradient clipping at
1.0, 15 % of positions labelled, 30 timed steps after 20:

- ``plain``: the plainest compiled loop a user writes (issue 36), :func:`plain_loop`: one fixed batch made on the
  GPU before the loop, an all-ones attention mask passed in.
- ``compiled-mask`` (the bench's baseline): the same model built the same way, a new batch every step (all of them
  made on the GPU before the loop) and the plain loop's all-ones attention mask. ``compiled`` is it without the
  mask, ``eager`` and ``sdpa`` that uncompiled: diagnostic rows. Leaving the mask out, which unpadded sequences
  allow, was the old baseline and cost stock ``BertForMaskedLM`` 13 % under torch.compile on an H200
  (transformers 5.17; docs/performance.md), although sparsebert's own model gains from it: that was why the old
  baseline was slower than the plain loop.

A baseline must be at least as fast as the plainest code a user would write, so every row's ratio is reported
against both, and the report warns when the baseline is more than 2 % slower than ``plain``.

Ours: the registry's ``bert_100k`` (dense) and ``sparse_80_rigl`` through SparseBertTrainer (MLM collator with
content-seeded masking, decoder only at masked positions, fused AdamW, bf16), eager and with
``train.torch_compile=true``; then with ``data.static_mask_count=true`` (a fixed number of decoder rows: one
graph per step), also replayed as CUDA graphs (``reduce-overhead``), and the levers tried on top. Every row also
records the GPU's SM clock and power over its timed steps (NVML GPU 0; ``bench/gpu_clocks.py``) and its wall time,
compilation included (``wall_s``). ``--profile KEYS`` profiles an extra, untimed run of each listed variant after
the timings (``ProfilerCallback``: top_ops.txt, gpu_time.json, trace; clocks.json: the SM clock over the profiled
steps).

Without ``--only`` the bench runs HEADLINE: ``plain``, ``compiled-mask``, then the best dense and ``sparse_80_rigl``
rows with the settings docs/performance.md recommends (``--only headline`` names the same set, ``--only all``
every row). Each row starts from the state the process started in: compiled code dropped, Inductor's and
Dynamo's settings and the fp32 matmul precision restored (ours rows change them), CUDA cache emptied.

MFU: ``mfu`` counts the matrix-multiply FLOPs each row's model really executes (:func:`train_flops_per_step`;
ours runs the MLM decoder only at its decoder rows), against the card's bf16 matmul peak measured in the same
call (:func:`measure_peak_tflops`; ``--peak-tflops`` sets it instead). ``mfu_baseline_flops`` counts the
baseline's FLOPs (the full decoder) for every row, so it is proportional to samples/s.

    python bench/pretrain_throughput.py --tokenizer minilm --out pretrain_throughput.json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import time
from datetime import date
from pathlib import Path

import torch
import torch._dynamo
from transformers import BertConfig, BertForMaskedLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

SEQ = 128
PLAIN = "plain"
BASELINE = "compiled-mask"  # the bench's baseline, the reference of every "ratio_vs_baseline"
# key, attention, torch.compile, all-ones attention mask
BASELINES = [("eager", "eager", False, False), ("sdpa", "sdpa", False, False), ("compiled", "sdpa", True, False),
             ("compiled-mask", "sdpa", True, True)]
STATIC = ("data.static_mask_count=true",)
HALF = (*STATIC, "model.half_precision_residual=true")  # + LayerNorm outputs (the residual stream) in bf16
GRAPHS = "train.torch_compile_mode=reduce-overhead"  # CUDA graphs
AUTOTUNE = "train.torch_compile_mode=max-autotune-no-cudagraphs"
TUNED = "train.torch_compile_tune_kernels=true"
# the bf16 residual stream (HALF), fast dropout and fused QKV: every row starts with the three off and names what
# it turns on (sparse_overhead.timing_overrides)
FAST_DROPOUT = "model.fast_dropout=true"
FUSED_QKV = "model.fused_qkv=true"
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
    # Q, K and V as one matrix product of the concatenated weights (model.fused_qkv)
    ("ours-static-half-residual-fast-dropout-fused-qkv", "bert_100k", True, (*HALF, FAST_DROPOUT, FUSED_QKV),
     " + static mask count + bf16 residual stream + fast dropout + fused QKV"),
    ("ours-sparse-static-half-residual-fast-dropout-fused-qkv", "sparse_80_rigl", True,
     (*HALF, GRAPHS, FAST_DROPOUT, FUSED_QKV),
     " + static mask count + CUDA graphs + bf16 residual stream + fast dropout + fused QKV"),
    # the attention kernel: sdpa picks cuDNN's fused attention on Hopper; this row allows FlashAttention only
    # (SDPA_BACKENDS)
    ("ours-static-half-residual-fast-dropout-flash", "bert_100k", True, (*HALF, FAST_DROPOUT),
     " + static mask count + bf16 residual stream + fast dropout, FlashAttention instead of cuDNN"),
]
# the two fast-dropout rows with the Trainer's own clipping pass (a norm, then a multiplication of every gradient)
# instead of the clip factor inside the fused AdamW step (train.clip_in_optimizer, the default since these rows
# were added; every row above runs with it)
OURS += [(f"{key}-clip-outside", experiment, compiled, (*overrides, CLIP_OUTSIDE),
          f"{label}, clipping as a pass of its own")
         for key, experiment, compiled, overrides, label in OURS
         if key in ("ours-static-half-residual-fast-dropout", "ours-sparse-static-half-residual-fast-dropout")]

# FP8 (train.precision=fp8, models/fp8.py): every encoder Linear, or torchao's choice (fp8_layers=auto); first the
# twins of the fast-dropout rows without fused QKV, then the defaults' layout. Last in the list and only with --only
# naming them: torchao's conversion patches Inductor's code generation for the rest of the process
FP8 = "train.precision=fp8"
FP8_AUTO = (FP8, "train.fp8_layers=auto")
GW_HP = "train.fp8_recipe=tensorwise_with_gw_hp"
ROWWISE_GW_HP = "train.fp8_recipe=rowwise_with_gw_hp"
OURS += [
    ("ours-static-half-residual-fast-dropout-fp8", "bert_100k", True, (*HALF, FAST_DROPOUT, FP8),
     " + static mask count + bf16 residual stream + fast dropout + FP8 encoder products"),
    ("ours-static-half-residual-fast-dropout-fp8-auto", "bert_100k", True, (*HALF, FAST_DROPOUT, *FP8_AUTO),
     " + static mask count + bf16 residual stream + fast dropout + FP8 where torchao expects a gain"),
    ("ours-sparse-static-half-residual-fast-dropout-fp8", "sparse_80_rigl", True, (*HALF, GRAPHS, FAST_DROPOUT, FP8),
     " + static mask count + CUDA graphs + bf16 residual stream + fast dropout + FP8 encoder products"),
    # the defaults (fused QKV: one FP8 cast of each layer's input for Q, K and V) in FP8, then with the
    # weight-gradient products in bf16 (fewer casts: tensorwise or rowwise scales for the other two products)
    ("ours-fused-qkv-fp8", "bert_100k", True, (*HALF, FAST_DROPOUT, FUSED_QKV, FP8),
     " + the defaults (fused QKV) + FP8 encoder products"),
    ("ours-fused-qkv-fp8-gw-hp", "bert_100k", True, (*HALF, FAST_DROPOUT, FUSED_QKV, FP8, GW_HP),
     " + the defaults (fused QKV) + FP8 encoder products, weight gradients in bf16"),
    ("ours-fused-qkv-fp8-rowwise-gw-hp", "bert_100k", True, (*HALF, FAST_DROPOUT, FUSED_QKV, FP8, ROWWISE_GW_HP),
     " + the defaults (fused QKV) + FP8 encoder products, rowwise scales, weight gradients in bf16"),
    ("ours-fused-qkv-fp8-auto", "bert_100k", True, (*HALF, FAST_DROPOUT, FUSED_QKV, *FP8_AUTO),
     " + the defaults (fused QKV) + FP8 where torchao expects a gain"),
    ("ours-sparse-fused-qkv-fp8-gw-hp", "sparse_80_rigl", True, (*HALF, GRAPHS, FAST_DROPOUT, FUSED_QKV, FP8, GW_HP),
     " + the defaults (fused QKV) + FP8 encoder products, weight gradients in bf16"),
]


# the default row set: both references first (in the process's fresh state), then the settings docs/performance.md
# recommends, dense and sparse (``--only headline``)
HEADLINE = (PLAIN, BASELINE, "ours-static-half-residual-fast-dropout-fused-qkv",
            "ours-sparse-static-half-residual-fast-dropout-fused-qkv")
SLOWER_WARNING = 0.02  # warn when the baseline is this much slower than the plain loop

INDUCTOR_PATCHES = {"ours-static-half-residual-combo": {"combo_kernels": True},
                    "ours-static-half-residual-autotune-gemm": {"max_autotune_gemm": True}}
# the sdpa backends a row allows (torch.nn.attention.sdpa_kernel around the whole row, compilation included)
SDPA_BACKENDS = {"ours-static-half-residual-fast-dropout-flash": ("FLASH_ATTENTION",)}


FLOPS_FORMULA = "3 * (batch * (2*S*L*(4*H^2 + 2*H*I) + 4*L*S^2*H) + decoder_rows * 2*(H^2 + H*V))"


def train_flops_per_step(cfg: BertConfig, batch: int, seq: int, decoder_rows: float) -> float:
    """Matrix-multiply FLOPs of one training step of a BERT MLM that runs its MLM head on ``decoder_rows`` rows.

    With L layers, hidden size H, intermediate size I, vocabulary V, sequence length S (2 FLOPs per multiply-add):

    - encoder, per sample: ``2 * S * L * (4 * H**2 + 2 * H * I)`` (the Q, K, V and output projections, the two
      feed-forward matrices) ``+ 4 * L * S**2 * H`` (Q @ K^T and probabilities @ V, S * S * H multiply-adds each);
    - MLM head, per decoder row: ``2 * (H**2 + H * V)`` (its transform's dense layer and the decoder);
    - a step: 3 x the forward (the backward computes the gradients of inputs and weights, 2 x the forward), so
      ``3 * (batch * encoder + decoder_rows * head)``.

    ``BertForMaskedLM`` runs its head at every position (``decoder_rows = batch * S``); sparsebert's model only at
    the masked positions (:func:`decoder_rows`). Not counted: embeddings (gathers), softmax, dropout, LayerNorm,
    GELU, the loss, the optimizer. A sparse model whose zeros are stored densely executes the dense FLOPs.
    With ``decoder_rows = batch * S`` this is ``batch * S`` times the usual ``6 * matmul parameters + 12 * L * H * S``
    per token."""
    h, layers, inter, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size
    encoder = 2 * seq * layers * (4 * h * h + 2 * h * inter) + 4 * layers * seq * seq * h
    head = 2 * (h * h + h * vocab)
    return 3 * (batch * encoder + decoder_rows * head)


def decoder_rows(batch: int, seq: int, mlm_probability: float, static_mask_count: bool) -> float:
    """Decoder rows of one of sparsebert's training batches: under ``data.static_mask_count`` the fixed count
    (``static_prediction_rows``), else the expected number of masked tokens, ``mlm_probability`` of the tokens
    other than each block's [CLS] and [SEP] (the bench's random blocks hold no other special token)."""
    from sparsebert.models.bert import static_prediction_rows

    if static_mask_count:
        return static_prediction_rows(batch * seq, mlm_probability)
    return mlm_probability * batch * (seq - 2)


def bert_config(size: str, vocab: int, attn: str | None = None) -> BertConfig:
    """The references' ``BertConfig`` of a named size: the one ours builds from ``model.size``
    (``sparsebert.models.bert.bert_config``), with ``attn`` as its attention implementation if given."""
    from sparsebert.config.sections import ModelConfig
    from sparsebert.models.bert import bert_config as ours

    config = ours(ModelConfig(size=size), vocab, pad_token_id=BertConfig().pad_token_id)
    if attn is not None:
        config._attn_implementation = attn
    return config


def measure_peak_tflops(n: int = 8192, calls: int = 100) -> float:
    """The card's dense bf16 matmul rate (TFLOP/s) in this call: ``calls`` back-to-back n x n x n products after a
    warm-up, the denominator of MFU."""
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * calls / (time.perf_counter() - start) / 1e12


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def plain_loop(config: BertConfig, batch: int = 256, seq: int = SEQ, steps: int = 50, warmup: int = 20,
               device: str = "cuda", compile: bool = True) -> dict:
    """The plainest compiled loop a user writes, as issue 36 states it: one fixed batch, an all-ones mask.

    ``config`` is ``BertConfig(attn_implementation="sdpa")`` with the tokenizer's vocabulary; ``device`` and
    ``compile`` exist for the CPU test only."""
    model = BertForMaskedLM(config).to(device).train()
    if compile:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    input_ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    labels = torch.where(torch.rand(batch, seq, device=device) < 0.15, input_ids, -100)
    attention_mask = torch.ones_like(input_ids)

    for step in range(steps):
        if step == warmup:
            _sync(device)
            start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    _sync(device)
    end = time.perf_counter()
    return timing_result("plain user loop: compiled BertForMaskedLM, one fixed batch", batch, seq, steps - warmup,
                         start, end, device)


def baseline(config: BertConfig, batch: int = 256, seq: int = SEQ, steps: int = 50, warmup: int = 20,
             compiled: bool = True, mask: bool = False, device: str = "cuda") -> dict:
    """The bench's baseline: :func:`plain_loop` with a new batch every step, and no attention mask.

    Why the earlier baseline measured slower than the plain loop (issue 36; docs/performance.md), as far as a
    reading on CPU (transformers 5.24, torch 2.13) tells:

    - not the model: ``_from_config`` built what ``BertForMaskedLM(config)`` builds (fp32 weights, tied decoder,
      sdpa), compiled the same way;
    - not the data: its per-step batches were views into one (steps, batch, seq) tensor, for which Dynamo does
      not recompile (checked: one graph over changing storage offsets); no host sync, no per-step host work;
    - not the mask, which goes the other way: under torch.compile the plain loop's all-ones mask is traced into a
      dense 4-D mask (transformers cannot look at its values while tracing), and sdpa then leaves its fused
      unmasked kernel, so the plain loop's attention is the slower one;
    - left: what the process did before the row. Ours rows turn TF32 on (transformers), set Inductor's
      coordinate_descent_tuning and leave compiled code and cached memory behind, and every row is one ~2 s
      window on a card at its power limit.

    So this baseline is built exactly like the plain loop, each step's batch is its own tensor made before the
    loop (a timed step only takes the next one from a list), every row starts from the process's fresh state
    (:class:`FreshState`) and the references run first. ``plain`` and ``compiled-mask`` (``mask=True``) in the
    same call show whatever gap remains, and how much of it is the mask."""
    model = BertForMaskedLM(config).to(device).train()
    if compiled:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator(device=device).manual_seed(0)
    batches = []
    for _ in range(steps):
        input_ids = torch.randint(0, config.vocab_size, (batch, seq), device=device, generator=g)
        picked = torch.rand(batch, seq, device=device, generator=g) < 0.15
        inputs = {"input_ids": input_ids, "labels": torch.where(picked, input_ids, -100)}
        if mask:
            inputs["attention_mask"] = torch.ones_like(input_ids)
        batches.append(inputs)

    for step, inputs in enumerate(batches):
        if step == warmup:
            _sync(device)
            start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    _sync(device)
    end = time.perf_counter()
    attn = config._attn_implementation
    variant = (f"bench baseline: BertForMaskedLM, {attn}" + (" + torch.compile" if compiled else "")
               + ", a new batch every step" + (", all-ones mask" if mask else ""))
    return timing_result(variant, batch, seq, steps - warmup, start, end, device)


def timing_result(variant: str, batch: int, seq: int, timed_steps: int, start: float, end: float,
                  device: str) -> dict:
    """A reference row's result: BertForMaskedLM runs its decoder at every position."""
    seconds = (end - start) / timed_steps
    return {"variant": variant, "step_ms": 1000 * seconds, "samples_per_second": batch / seconds,
            "window": (start, end), "decoder_rows": batch * seq,
            "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None}


def ours(callbacks: list, experiment: str, tokenizer_path: str, batch: int, steps: int, warmup: int,
         compiled: bool, extra: tuple[str, ...] = (), label: str = "", size: str = "base",
         inductor: dict | None = None, sdpa_backends: tuple[str, ...] = ()) -> dict:
    from sparse_overhead import random_blocks, time_variant, timing_overrides
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from sparsebert.config import ExperimentRegistry
    from sparsebert.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path)
    overrides = [*timing_overrides(steps, batch, tokenizer_path, size), f"train.torch_compile={str(compiled).lower()}",
                 *extra]
    data = random_blocks(steps * batch, SEQ, len(tokenizer), tokenizer, seed=0)
    registry = ExperimentRegistry.builtin()
    import torch._inductor.config

    backends = (sdpa_kernel([getattr(SDPBackend, name) for name in sdpa_backends]) if sdpa_backends
                else contextlib.nullcontext())  # sdpa's own choice
    with torch._inductor.config.patch(inductor or {}), backends:
        r = time_variant(registry, experiment, overrides, tokenizer, data, warmup, callbacks)
    r["variant"] = f"sparsebert {experiment}" + (" + torch.compile" if compiled else "") + label
    cfg = registry.build(experiment, [*overrides, f"rigl.end_step={steps + 1}"]
                         if registry.resolve(experiment).get("rigl") is not None else overrides)
    r["decoder_rows"] = decoder_rows(batch, SEQ, cfg.data.mlm_probability, cfg.data.static_mask_count)
    return r


def select_rows(only: str, skip: str, known: list[str]) -> list[str]:
    """The row keys to run, in order: ``only``'s comma list (``headline``: HEADLINE, ``all``: every row in the
    table's order; empty: HEADLINE), less ``skip``'s. An unknown key exits before the first row's minutes are
    spent."""
    listed = [key.strip() for key in only.split(",") if key.strip()] or ["headline"]
    expanded: list[str] = []
    for key in listed:
        expanded += {"headline": list(HEADLINE), "all": known}.get(key, [key])
    skipped = {key.strip() for key in skip.split(",")} - {""}
    for flag, keys in (("--only", set(expanded)), ("--skip", skipped)):
        unknown = keys - set(known)
        if unknown:
            raise SystemExit(f"{flag}: unknown variant key(s) {sorted(unknown)}; known: headline, all, "
                             + ", ".join(known))
    # the listed order, each key once: which row runs (and compiles) first is part of an experiment
    return [key for key in dict.fromkeys(expanded) if key not in skipped]


class FreshState:
    """The process's settings as the bench started, put back before every row: compiled code dropped, Inductor's
    settings and the fp32 matmul precision restored (ours rows turn TF32 on through transformers and set
    Inductor's coordinate_descent_tuning), freed memory given back to the driver, peak memory reset."""

    def __init__(self):
        import torch._inductor.config

        self.inductor = torch._inductor.config.save_config()
        self.generic_precision = getattr(torch.backends, "fp32_precision", None)  # torch 2.9+
        self.matmul_precision = torch.get_float32_matmul_precision()

    def __call__(self) -> None:
        import torch._inductor.config

        torch._dynamo.reset()
        torch._inductor.config.load_config(self.inductor)
        if self.generic_precision is not None:
            torch.backends.fp32_precision = self.generic_precision
        torch.set_float32_matmul_precision(self.matmul_precision)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", default="minilm")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", default="base", choices=("base", "large"),
                   help="the BERT size of every row (the references' BertConfig, ours' model.size)")
    p.add_argument("--steps", type=int, default=50, help="reference steps (the first --warmup untimed)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--ours-steps", type=int, default=120, help="Trainer steps (RigL: one update per 100)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the card's dense bf16 matmul peak for MFU (default: measured at the start of the call)")
    p.add_argument("--only", default="",
                   help="comma list of the variant keys to run, in this order; 'headline' (the default: "
                        + ", ".join(HEADLINE) + ") or 'all' stand for those sets")
    p.add_argument("--skip", default="", help="comma list of variant keys not to run")
    p.add_argument("--profile", default="", metavar="KEYS",
                   help="comma list of ours* keys to profile after the timed runs: one more, untimed run each, "
                        "3 steps after the warm-up, into --profile-dir/KEY/ (top_ops.txt, gpu_time.json, trace, "
                        "clocks.json)")
    p.add_argument("--profile-dir", type=Path, default=Path("profile"))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()

    from sparsebert.data.tokenizer import load_tokenizer

    vocab = len(load_tokenizer(args.tokenizer))
    steps = (args.batch, SEQ, args.steps, args.warmup)
    plan = {PLAIN: lambda cb: plain_loop(bert_config(args.size, vocab, "sdpa"), *steps)}
    plan |= {key: lambda cb, attn=attn, compiled=compiled, mask=mask: baseline(
        bert_config(args.size, vocab, attn), *steps, compiled=compiled, mask=mask)
        for key, attn, compiled, mask in BASELINES}
    plan |= {key: lambda cb, key=key, v=v: ours(cb, v[0], args.tokenizer, args.batch, args.ours_steps, args.warmup,
                                                 *v[1:], size=args.size, inductor=INDUCTOR_PATCHES.get(key, {}),
                                                 sdpa_backends=SDPA_BACKENDS.get(key, ()))
             for key, *v in OURS}
    timed = select_rows(args.only, args.skip, list(plan))
    profile = {key.strip() for key in args.profile.split(",")} - {""}
    if profile - {key for key, *_ in OURS}:
        raise SystemExit(f"--profile: unknown ours key(s) {sorted(profile - {key for key, *_ in OURS})}")
    if not torch.cuda.is_available():
        raise SystemExit("pretrain_throughput: needs a CUDA GPU (bf16, fused AdamW)")

    from gpu_clocks import ClockSampler

    fresh_state = FreshState()  # before anything compiles or trains
    if args.peak_tflops is None:
        args.peak_tflops = measure_peak_tflops()
        args.peak_source = "measured in this call (bf16 8192^3 matmuls)"
    else:
        args.peak_source = "--peak-tflops"
    print(f"rows: {', '.join(timed)}; bf16 matmul peak {args.peak_tflops:.0f} TFLOP/s ({args.peak_source})",
          flush=True)
    results = []
    for key in timed:
        fresh_state()
        began = time.perf_counter()
        try:
            with ClockSampler() as clocks:
                r = plan[key]([])
        except Exception as e:  # one variant that fails to compile must not cost the rest of the call
            first_line = (str(e).splitlines() or [""])[0]
            print(f"{key} FAILED: {type(e).__name__}: {first_line[:300]}", file=sys.stderr, flush=True)
            continue
        # the card's SM clock and power over the timed steps; the wall time includes compilation (autotuning)
        r.update(clocks.summary(r.pop("window")), key=key, wall_s=round(time.perf_counter() - began, 1))
        results.append(r)
        print(json.dumps(r), flush=True)
        report(results, vocab, args, table=False)  # after every variant: a cut-off call keeps its numbers
    fresh_state()
    if results:
        report(results, vocab, args)
    from sparsebert.trainer.profiling import ProfilerCallback

    for key in plan:  # after the timings, so the profiler's cost never enters one
        if key in profile:
            fresh_state()  # compiled afresh, as in the timed run
            profiler = ProfilerCallback(warmup=args.warmup, steps=3, out_dir=args.profile_dir / key)
            # sampled often: the profiled steps last a fraction of a second. Under the profiler the GPU idles
            # between kernels the host launches late, so it may clock higher than in the timed run
            with ClockSampler(interval=0.01) as clocks:
                plan[key]([profiler])
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


def add_metrics(results: list[dict], cfg: BertConfig, batch: int, peak_tflops: float) -> list[str]:
    """Per row: tokens/s, the FLOPs its model executes per step and the MFU they give, the MFU of the baseline's
    FLOPs, and its ratio against the plain loop and against the bench's baseline (None where that row did not
    run). Returns the warnings: the baseline more than SLOWER_WARNING slower than the plain loop."""
    by_key = {r["key"]: r["samples_per_second"] for r in results}
    baseline_flops = train_flops_per_step(cfg, batch, SEQ, batch * SEQ)
    for r in results:
        per_second = r["samples_per_second"] / batch  # steps per second
        r["tokens_per_second"] = r["samples_per_second"] * SEQ
        r["model_tflops_per_step"] = train_flops_per_step(cfg, batch, SEQ, r["decoder_rows"]) / 1e12
        r["model_tflops_per_second"] = r["model_tflops_per_step"] * per_second
        r["mfu"] = r["model_tflops_per_second"] / peak_tflops
        r["mfu_baseline_flops"] = baseline_flops / 1e12 * per_second / peak_tflops
        for name, key in (("ratio_vs_plain", PLAIN), ("ratio_vs_baseline", BASELINE)):
            r[name] = r["samples_per_second"] / by_key[key] if key in by_key else None
    warnings = []
    if PLAIN in by_key and BASELINE in by_key and by_key[BASELINE] < (1 - SLOWER_WARNING) * by_key[PLAIN]:
        warnings.append(f"WARNING: the baseline ({BASELINE}, {by_key[BASELINE]:.0f} samples/s) is "
                        f"{100 * (1 - by_key[BASELINE] / by_key[PLAIN]):.1f} % slower than the plain user loop "
                        f"({by_key[PLAIN]:.0f} samples/s): ratios against it overstate the gain")
    return warnings


def report(results: list[dict], vocab: int, args: argparse.Namespace, table: bool = True) -> None:
    from sparsebert.env_info import git_commit

    cfg = bert_config(args.size, vocab)
    warnings = add_metrics(results, cfg, args.batch, args.peak_tflops)
    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    lines = [f"\n{card}, batch {args.batch}, seq {SEQ}, bf16 matmul peak {args.peak_tflops:.0f} TFLOP/s\n",
             "| variant | samples/s | TFLOP per step (executed) | MFU (executed FLOPs) | MFU (baseline FLOPs) | "
             "peak memory GB | host syncs / step | SM MHz, W | ratio vs plain loop | ratio vs baseline |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['variant']} | {r['samples_per_second']:.0f} | {r['model_tflops_per_step']:.2f} | "
                     f"{100 * r['mfu']:.1f} % | {100 * r['mfu_baseline_flops']:.1f} % | "
                     f"{r['peak_memory_gb'] or 0:.1f} | {r.get('host_syncs_per_step', '-')} | {clocks_text(r)} | "
                     f"{ratio(r['ratio_vs_plain'])} | {ratio(r['ratio_vs_baseline'])} |")
    if table:
        print("\n".join([*lines, *warnings]), flush=True)
        for warning in warnings:
            print(warning, file=sys.stderr, flush=True)
    summary = {"card": card, "date": date.today().isoformat(), "commit": git_commit(ROOT),
               "torch": torch.__version__, "size": args.size, "batch": args.batch, "seq": SEQ,
               "peak_tflops": args.peak_tflops, "peak_source": args.peak_source,
               "flops_per_step": FLOPS_FORMULA,
               "plain": PLAIN, "baseline": BASELINE, "warnings": warnings, "runs": results}
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
