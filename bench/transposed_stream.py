"""A BERT forward with the residual stream kept transposed, [hidden, tokens], and the add + LayerNorm it needs.

Why: BERT-large's 2:4 matmuls gain 1.2-1.5x over dense only in the mixed layouts (activations row-major in and
the result column-major out, or the reverse), and attention's projections lose in row -> row
(``semi_structured.py --kernels``). With the stream transposed, every encoder Linear runs a mixed layout, but
every LayerNorm then reduces over the strided dimension. ``semi_structured.py --variants "2:4 transposed stream"``
times the forward (``transposed_stream_logits``); this script times the add + LayerNorm alone, each Triton
configuration against the row-major fused add + LayerNorm that the other variants compile to, all as CUDA graphs
in one process, alternating:

    python bench/transposed_stream.py [--hidden 1024 768] [--batches 256] [--out docs/data/FILE.json]

On an H100 (2026-11-27, commits ``070c73d``, ``78b3a8e``; docs/benchmarks.md) none of the 48 configurations
reaches the row-major kernel: the fastest, the one-pass kernel with 32 tokens per program and 8 warps, takes 0.081
ms per call at hidden 1024 and batch 256 against 0.069 ms (0.84-0.85x), the two-pass kernel 0.58x at best, the
persistent one 0.40x. In the model the gap is wider: 0.108 ms a call against 0.066 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from datetime import date
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from cuda_timing import graph_ms  # noqa: E402

from sparsebert.env_info import git_commit  # noqa: E402
from sparsebert.io import atomic_write_json  # noqa: E402
from sparsebert.sparsity.semi_structured import SemiStructuredLinear  # noqa: E402

try:
    import triton
    import triton.language as tl
except ImportError:  # the forward then normalises with torch ops (layer_norm_t)
    triton = None


def layer_norm_t(x_t: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """``norm`` over dim 0 of a [hidden, tokens] tensor, the result [hidden, tokens] as well. Written out so that
    torch.compile fuses it into one kernel that keeps the layout (torch's layer_norm would copy it row-major)."""
    x = x_t.float()
    mean = x.mean(0, keepdim=True)
    centered = x - mean
    y = centered * torch.rsqrt(centered.square().mean(0, keepdim=True) + norm.eps)
    return (y * norm.weight.float()[:, None] + norm.bias.float()[:, None]).to(x_t.dtype)


if triton is not None:

    @triton.jit
    def _column_shift(a_ptr, b_ptr, cols, col_ok):
        """Each column's first value a + b (fp32): the sums below are of x - shift, so that E[x^2] - E[x]^2 loses
        no precision when a column's mean is large against its spread."""
        return (tl.load(a_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
                + tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32))

    @triton.jit
    def _shifted_rstd(sum_d, sum_squares, HIDDEN: tl.constexpr, eps):
        """The mean of x - shift and 1 / std from the column sums of x - shift and of its squares."""
        mean_d = sum_d / HIDDEN
        return mean_d, tl.rsqrt(tl.maximum(sum_squares / HIDDEN - mean_d * mean_d, 0.0) + eps)

    @triton.jit
    def _one_pass_kernel(a_ptr, b_ptr, w_ptr, bias_ptr, out_ptr, tokens, eps, HIDDEN: tl.constexpr,
                         HIDDEN_POW2: tl.constexpr, BLOCK_T: tl.constexpr):
        # one program: BLOCK_T tokens (columns) whole, all HIDDEN rows in registers; one read, one write
        cols = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        rows = tl.arange(0, HIDDEN_POW2)
        mask = (rows[:, None] < HIDDEN) & (cols[None, :] < tokens)
        offsets = rows[:, None].to(tl.int64) * tokens + cols[None, :]
        x = (tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
             + tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32))
        mean = tl.sum(x, axis=0) / HIDDEN
        centered = tl.where(mask, x - mean[None, :], 0.0)
        rstd = tl.rsqrt(tl.sum(centered * centered, axis=0) / HIDDEN + eps)
        weight = tl.load(w_ptr + rows, mask=rows < HIDDEN, other=0.0).to(tl.float32)
        bias = tl.load(bias_ptr + rows, mask=rows < HIDDEN, other=0.0).to(tl.float32)
        y = centered * rstd[None, :] * weight[:, None] + bias[:, None]
        tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _one_pass_bf16_kernel(a_ptr, b_ptr, w_ptr, bias_ptr, out_ptr, tokens, eps, HIDDEN: tl.constexpr,
                              HIDDEN_POW2: tl.constexpr, BLOCK_T: tl.constexpr):
        # the one-pass kernel with the sum a + b held as bf16 (inputs and output are bf16 in every kernel), as
        # Hugging Face's eager BERT rounds it too: half the registers, meant to allow twice the tokens per program
        # and twice as long a contiguous run per row (measured: 32 tokens stay the fastest block, as in fp32).
        # Both sums come from one sweep so that no fp32 tile stays live.
        cols = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        rows = tl.arange(0, HIDDEN_POW2)
        col_ok = cols < tokens
        mask = (rows[:, None] < HIDDEN) & col_ok[None, :]
        offsets = rows[:, None].to(tl.int64) * tokens + cols[None, :]
        x = (tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
             + tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)).to(tl.bfloat16)
        shift = _column_shift(a_ptr, b_ptr, cols, col_ok).to(tl.bfloat16).to(tl.float32)  # rounded as x is
        d = tl.where(mask, x.to(tl.float32) - shift[None, :], 0.0)
        mean_d, rstd = _shifted_rstd(tl.sum(d, axis=0), tl.sum(d * d, axis=0), HIDDEN, eps)
        mean = shift + mean_d
        weight = tl.load(w_ptr + rows, mask=rows < HIDDEN, other=0.0).to(tl.float32)
        bias = tl.load(bias_ptr + rows, mask=rows < HIDDEN, other=0.0).to(tl.float32)
        y = (x.to(tl.float32) - mean[None, :]) * rstd[None, :] * weight[:, None] + bias[:, None]
        tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _chunk(a_ptr, b_ptr, start, cols, col_ok, tokens, HIDDEN: tl.constexpr, BLOCK_H: tl.constexpr,
               EVICT: tl.constexpr):
        """Rows ``start`` .. ``start + BLOCK_H`` of the ``cols`` columns: the rows, mask, offsets and a + b (fp32)."""
        rows = start + tl.arange(0, BLOCK_H)
        mask = (rows[:, None] < HIDDEN) & col_ok[None, :]
        offsets = rows[:, None].to(tl.int64) * tokens + cols[None, :]
        x = (tl.load(a_ptr + offsets, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
             + tl.load(b_ptr + offsets, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32))
        return rows, mask, offsets, x

    @triton.jit
    def _two_pass_block(a_ptr, b_ptr, w_ptr, bias_ptr, out_ptr, block, tokens, eps, HIDDEN: tl.constexpr,
                        BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, FIRST_EVICT: tl.constexpr,
                        SECOND_EVICT: tl.constexpr):
        # BLOCK_T tokens, HIDDEN in chunks of BLOCK_H rows: a first pass for the sums, a second that reads the
        # inputs again to normalise (from HBM where they no longer sit in L2: up to 5 tensor passes of traffic
        # instead of 3). Wider token blocks than the one-pass kernel can hold in registers, so each row's load is a
        # longer contiguous run.
        cols = block * BLOCK_T + tl.arange(0, BLOCK_T)
        col_ok = cols < tokens
        shift = _column_shift(a_ptr, b_ptr, cols, col_ok)
        total = tl.zeros([BLOCK_T], dtype=tl.float32)
        squares = tl.zeros([BLOCK_T], dtype=tl.float32)
        for start in range(0, HIDDEN, BLOCK_H):
            rows, mask, offsets, x = _chunk(a_ptr, b_ptr, start, cols, col_ok, tokens, HIDDEN, BLOCK_H, FIRST_EVICT)
            d = tl.where(mask, x - shift[None, :], 0.0)
            total += tl.sum(d, axis=0)
            squares += tl.sum(d * d, axis=0)
        mean_d, rstd = _shifted_rstd(total, squares, HIDDEN, eps)
        mean = shift + mean_d
        for start in range(0, HIDDEN, BLOCK_H):
            rows, mask, offsets, x = _chunk(a_ptr, b_ptr, start, cols, col_ok, tokens, HIDDEN, BLOCK_H, SECOND_EVICT)
            weight = tl.load(w_ptr + rows, mask=rows < HIDDEN, other=0.0).to(tl.float32)
            bias = tl.load(bias_ptr + rows, mask=rows < HIDDEN, other=0.0).to(tl.float32)
            y = (x - mean[None, :]) * rstd[None, :] * weight[:, None] + bias[:, None]
            tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _two_pass_kernel(a_ptr, b_ptr, w_ptr, bias_ptr, out_ptr, tokens, eps, HIDDEN: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr):
        # one program per token block, as many as there are blocks
        _two_pass_block(a_ptr, b_ptr, w_ptr, bias_ptr, out_ptr, tl.program_id(0), tokens, eps, HIDDEN, BLOCK_H,
                        BLOCK_T, "", "")

    @triton.jit
    def _persistent_kernel(a_ptr, b_ptr, w_ptr, bias_ptr, out_ptr, tokens, eps, HIDDEN: tl.constexpr,
                           BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr):
        # the two-pass kernel on a grid of a few programs per SM, each taking token blocks in turn: only those
        # blocks are in flight at once (see LN_CONFIGS for how much), and the first pass asks L2 to keep them, so
        # that the second pass could read them from L2 rather than HBM: meant as 3 passes of HBM traffic with the
        # long contiguous runs of wide token blocks (measured: the slowest kernel here, too few loads in flight)
        for block in range(tl.program_id(0), tl.cdiv(tokens, BLOCK_T), tl.num_programs(0)):
            _two_pass_block(a_ptr, b_ptr, w_ptr, bias_ptr, out_ptr, block, tokens, eps, HIDDEN, BLOCK_H, BLOCK_T,
                            "evict_last", "evict_first")


KERNELS = ("one-pass", "one-pass-bf16", "two-pass", "persistent")


@dataclass(frozen=True)
class LayerNormConfig:
    """One Triton launch configuration of the transposed add + LayerNorm."""

    kernel: str  # "one-pass", "one-pass-bf16" (the sum a + b held in bf16), "two-pass", "persistent" (two-pass)
    block_t: int  # tokens per program (persistent: per block, a program takes several)
    warps: int
    block_h: int = 0  # two-pass, persistent: rows per chunk
    per_sm: int = 0  # persistent: programs per SM

    def __post_init__(self) -> None:
        chunked = self.kernel in ("two-pass", "persistent")
        valid = (self.kernel in KERNELS and (self.block_h > 0) == chunked
                 and (self.per_sm > 0) == (self.kernel == "persistent"))
        if not valid:
            raise ValueError(f"not a launch configuration: {self}")

    @property
    def name(self) -> str:
        chunk = f" h{self.block_h}" if self.block_h else ""
        programs = f" p{self.per_sm}" if self.per_sm else ""
        return f"{self.kernel}{chunk} t{self.block_t} w{self.warps}{programs}"


LN_CONFIGS = {c.name: c for c in [
    *(LayerNormConfig("one-pass", t, w) for t in (8, 16, 32) for w in (4, 8, 16)),
    *(LayerNormConfig("one-pass-bf16", t, w) for t in (16, 32, 64) for w in (8, 16, 32)),
    *(LayerNormConfig("two-pass", t, w, h) for h in (32, 64) for t in (32, 64, 128) for w in (4, 8)),
    # persistent: programs x BLOCK_T tokens x hidden x 2 inputs x 2 bytes in flight; at hidden 1024 on an H100's
    # 132 SMs 17 MB for t x p = 32, 35 MB for 64 (both fit its 50 MB L2) and 69 MB for 128 (does not)
    *(LayerNormConfig("persistent", t, w, h, p) for h in (16, 32) for t in (64, 128) for w in (4, 8)
      for p in (1, 2) if t * p <= 128),
    *(LayerNormConfig("persistent", 32, w, 32, p) for w in (4, 8) for p in (1, 2, 4)),
]}
DEFAULT_LN_CONFIG = "one-pass t32 w8"  # fastest alone on an H100 at hidden 1024 (070c73d, 78b3a8e; a tie at bc5d746)
# a timing bound, not a LayerNorm of the stream: the row-major add + LayerNorm run on the [hidden, tokens] buffers
# read as [tokens, hidden], so a model run costs what a transposed LayerNorm as fast as the row-major one would
# (its logits are wrong, and the bench says so)
ROW_MAJOR_WHAT_IF = "row-major what-if"
LN_TOLERANCE = 0.1  # max |difference| from a fp32 LayerNorm for a bf16 result to count as right (values ~1)


def add_layer_norm_t(a_t: torch.Tensor, b_t: torch.Tensor, norm: nn.LayerNorm,
                     config: str = DEFAULT_LN_CONFIG) -> torch.Tensor:
    """LayerNorm of ``a_t + b_t`` over dim 0 for [hidden, tokens] tensors, as one Triton kernel (the sum in fp32,
    or bf16 for one-pass-bf16) where Triton and a GPU are present and both inputs are contiguous [hidden, tokens];
    otherwise ``layer_norm_t(a_t + b_t, norm)`` (the sum rounded to the inputs' dtype first). ``ROW_MAJOR_WHAT_IF``:
    the row-major kernel on the buffers read as [tokens, hidden], wrong values (a timing bound)."""
    if config == ROW_MAJOR_WHAT_IF:
        hidden, tokens = a_t.shape  # view, not reshape: a copy would make the bound slower than it is
        return row_major_add_layer_norm(a_t.view(tokens, hidden), b_t.view(tokens, hidden),
                                        norm).view(hidden, tokens)
    launch = LN_CONFIGS[config]  # an unknown name fails here, on every path
    if triton is None or not a_t.is_cuda or not (a_t.is_contiguous() and b_t.is_contiguous()):
        return layer_norm_t(a_t + b_t, norm)
    return launch_layer_norm_t(a_t, b_t, norm.weight, norm.bias, norm.eps, launch)


def launch_layer_norm_t(a_t: torch.Tensor, b_t: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                        eps: float, config: LayerNormConfig, out: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton kernel of ``config`` on contiguous [hidden, tokens] inputs (any device Triton runs on), into
    ``out`` if given (the bench's check passes one full of NaN, so that an element left unwritten shows)."""
    hidden, tokens = a_t.shape
    out = torch.empty_like(a_t) if out is None else out
    grid = (triton.cdiv(tokens, config.block_t),)
    if config.kernel in ("one-pass", "one-pass-bf16"):
        kernel = _one_pass_kernel if config.kernel == "one-pass" else _one_pass_bf16_kernel
        kernel[grid](a_t, b_t, weight, bias, out, tokens, eps, HIDDEN=hidden,
                     HIDDEN_POW2=triton.next_power_of_2(hidden), BLOCK_T=config.block_t, num_warps=config.warps)
    elif config.kernel == "two-pass":
        _two_pass_kernel[grid](a_t, b_t, weight, bias, out, tokens, eps, HIDDEN=hidden, BLOCK_H=config.block_h,
                               BLOCK_T=config.block_t, num_warps=config.warps)
    elif config.kernel == "persistent":
        # off the GPU (Triton's CPU interpreter) a few programs, enough to exercise the loop over blocks
        sms = torch.cuda.get_device_properties(a_t.device).multi_processor_count if a_t.is_cuda else 4
        grid = (min(grid[0], sms * config.per_sm),)
        _persistent_kernel[grid](a_t, b_t, weight, bias, out, tokens, eps, HIDDEN=hidden, BLOCK_H=config.block_h,
                                 BLOCK_T=config.block_t, num_warps=config.warps)
    else:
        raise ValueError(f"no kernel {config.kernel!r}; known: {KERNELS}")
    return out


def into_stream(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)`` for [tokens, in] ``x`` as an [out, tokens] result. An exported layer with column-major results
    writes it so (its transpose is free); a plain Linear goes through ``addmm`` (``W @ x^T + b``), which cuBLAS
    writes [out, tokens] directly, where ``linear(x).t()`` would leave a row-major result."""
    if isinstance(linear, SemiStructuredLinear):
        return linear(x).t()
    if linear.bias is None:
        return linear.weight @ x.t()
    return torch.addmm(linear.bias[:, None], linear.weight, x.t())


def transposed_stream_logits(model: nn.Module, ids: torch.Tensor, ln_config: str = DEFAULT_LN_CONFIG
                             ) -> torch.Tensor:
    """A BERT classifier's logits for full-length rows (no attention mask, no dropout: inference only, BERT's
    post-LayerNorm layers), with the residual stream kept [hidden, tokens]. Query, key, value and the
    up-projection read it column-major and write row-major results (head split, GELU); the attention output and
    down-projections write into it (exported with column-major results, or through ``addmm``)."""
    bert = model.bert
    batch, seq = ids.shape
    hidden = bert.embeddings(input_ids=ids)
    width = hidden.shape[-1]
    stream = hidden.reshape(batch * seq, width).t().contiguous()  # [hidden, tokens]
    for layer in bert.encoder.layer:
        attn = layer.attention
        heads, head_dim = attn.self.num_attention_heads, attn.self.attention_head_size
        x = stream.t()  # [tokens, hidden], column-major: no copy
        q, k, v = (proj(x).view(batch, seq, heads, head_dim).transpose(1, 2)
                   for proj in (attn.self.query, attn.self.key, attn.self.value))
        context = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch * seq, width)
        stream = add_layer_norm_t(into_stream(attn.output.dense, context), stream, attn.output.LayerNorm, ln_config)
        up = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(stream.t()))
        stream = add_layer_norm_t(into_stream(layer.output.dense, up), stream, layer.output.LayerNorm, ln_config)
    first = stream[:, ::seq].t()  # each sequence's first token, [batch, hidden]
    pooled = bert.pooler.activation(bert.pooler.dense(first))
    return model.classifier(model.dropout(pooled))


def row_major_add_layer_norm(x: torch.Tensor, y: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """What the row-major variants compile to: add + LayerNorm over the last, contiguous dimension."""
    return F.layer_norm(x + y, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def transposed_add_layer_norm(x_t: torch.Tensor, y_t: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    return layer_norm_t(x_t + y_t, norm)


@torch.inference_mode()
def bench_layer_norms(args: argparse.Namespace) -> list[dict]:
    """Per hidden size and batch: the row-major compiled add + LayerNorm (what the other variants run), the
    transposed one compiled by torch.compile, and every Triton configuration, alternating over ``--repeats``."""
    rows = []
    for hidden in args.hidden:
        for batch in args.batches:
            tokens = batch * args.seq
            g = torch.Generator(device="cuda").manual_seed(hidden * tokens)
            a, b = (torch.randn(hidden, tokens, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
            norm = nn.LayerNorm(hidden, eps=1e-12, device="cuda", dtype=torch.bfloat16)
            nn.init.normal_(norm.weight, 1.0, 0.1, generator=g)
            nn.init.normal_(norm.bias, 0.0, 0.1, generator=g)
            a_rows, b_rows = a.t().contiguous(), b.t().contiguous()
            torch._dynamo.reset()  # a fresh static-shape graph per shape
            row_major = torch.compile(row_major_add_layer_norm)
            transposed = torch.compile(transposed_add_layer_norm)
            reference = F.layer_norm((a.float() + b.float()).t(), (hidden,), norm.weight.float(), norm.bias.float(),
                                     norm.eps).t()
            fns = {"row-major compiled": partial(row_major, a_rows, b_rows, norm),
                   "transposed compiled": partial(transposed, a, b, norm)}
            errors, failed = {}, {}
            for name, config in LN_CONFIGS.items():
                fn = partial(launch_layer_norm_t, a, b, norm.weight, norm.bias, norm.eps, config)
                try:  # into NaN: an element the kernel leaves unwritten shows as NaN
                    checked = fn(out=torch.full_like(a, float("nan")))
                except Exception as e:  # a configuration Triton cannot build (registers, shared memory)
                    failed[name] = f"{type(e).__name__}: {str(e)[:200]}"
                    print(f"  hidden {hidden} batch {batch} {name}: {failed[name][:120]}")
                    continue
                if checked.isnan().any():
                    failed[name] = "left elements of its output unwritten (NaN)"
                else:
                    errors[name] = (checked.float() - reference).abs().max().item()
                    if errors[name] > LN_TOLERANCE:
                        failed[name] = f"max |difference| {errors[name]:.3g} from a fp32 LayerNorm"
                if name in failed:
                    print(f"  hidden {hidden} batch {batch} {name}: {failed[name]}; not timed")
                    continue
                fns[name] = fn
            runs: dict[str, list[float]] = {k: [] for k in fns}
            for _ in range(args.repeats):
                for name, fn in list(fns.items()):
                    try:
                        runs[name].append(graph_ms(fn))
                    except Exception as e:  # a capture failure: drop the candidate, keep the others
                        failed[name] = f"{type(e).__name__}: {str(e)[:200]}"
                        del fns[name], runs[name]
            ms = {k: statistics.median(v) for k, v in runs.items()}
            traffic = 3 * hidden * tokens * 2  # two bf16 inputs read, one written: effective GB/s
            best = min((k for k in ms if k in LN_CONFIGS), key=ms.__getitem__, default=None)
            rows.append({"hidden": hidden, "batch": batch, "tokens": tokens, "ms": ms, "runs": runs,
                         "effective_gb_per_s": {k: traffic / v / 1e6 for k, v in ms.items()},
                         "max_abs_diff": errors, "failed": failed, "best_triton": best})
            cells = [f"{ms[k]:.4f}" if k in ms else "-" for k in ("row-major compiled", "transposed compiled")]
            cells += ([best, f"{ms[best]:.4f}", f"{ms['row-major compiled'] / ms[best]:.2f}"]
                      if best and "row-major compiled" in ms else ["-", "-", "-"])
            print(f"| {hidden} | {batch} | " + " | ".join(cells) + " |", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, nargs="+", default=[1024, 768])
    p.add_argument("--batches", type=int, nargs="+", default=[256])
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if not torch.cuda.is_available() or triton is None:
        sys.exit("bench/transposed_stream.py needs a CUDA GPU and Triton")
    card = torch.cuda.get_device_name()
    print(f"{card}: add + LayerNorm of two bf16 [hidden, tokens] tensors, ms per call; the best Triton "
          "configuration and its speed against the row-major compiled kernel\n| hidden | batch | row-major compiled | "
          "transposed compiled | best Triton | ms | vs row-major |\n|---|---|---|---|---|---|---|", flush=True)
    rows = bench_layer_norms(args)
    if args.out:
        atomic_write_json(args.out, {"card": card, "date": date.today().isoformat(), "commit": git_commit(ROOT),
                                     "torch": torch.__version__, "triton": triton.__version__, "seq": args.seq,
                                     "repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    main()
