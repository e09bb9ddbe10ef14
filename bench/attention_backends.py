"""Attention kernels for BERT-base pretraining shapes: which sdpa backend is fastest, with and without a mask.

Forward + backward of ``F.scaled_dot_product_attention`` at batch x 12 heads x seq 128 x head dim 64, bf16, with
the training dropout (0.1) and without, for torch's own choice and each backend forced (cuDNN, FlashAttention,
memory-efficient), each with no mask and with an all-ones boolean padding mask (what a collator's attention_mask
becomes). Times are CUDA-event medians of 5 blocks of 50 steps, all in one process on one card.

Then the whole BERT-base encoder (Hugging Face BertModel), eager and compiled, without a mask, with an all-ones
mask, and with the layers called directly without any mask (as sparsebert's MLM model runs unpadded blocks):
ms per forward + backward and the attention kernels that ran (``--encoder-only`` runs just this part).

    python bench/attention_backends.py --out attention_backends.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from cuda_timing import ms_per_call  # noqa: E402

BACKENDS = {"torch's choice": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def time_attention(batch: int, backend: SDPBackend | None, masked: bool, dropout: float, layers: int = 12,
                   blocks: int = 5, steps: int = 50) -> float | str:
    """Median ms of one step's attention (``layers`` x forward + backward), or why the backend refused."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, 12, 128, 64, device="cuda", dtype=torch.bfloat16, generator=g,
                           requires_grad=True) for _ in range(3))
    mask = torch.ones(batch, 1, 128, 128, device="cuda", dtype=torch.bool) if masked else None
    grad = torch.randn(batch, 12, 128, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        def step() -> None:
            for _ in range(layers):
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout).backward(grad)
        try:
            step()
        except RuntimeError as e:
            return f"refused: {str(e).splitlines()[0][:120]}"
        torch.cuda.synchronize()
        return statistics.median(ms_per_call(step, steps) for _ in range(blocks))


ATTENTION_KERNEL_MARKERS = ("sdpa", "fmha", "flash", "attention", "softmax", "cudnn")


def time_encoder(batch: int, compiled: bool, mask: str, steps: int = 20) -> dict:
    """BERT-base's encoder (Hugging Face BertModel, sdpa, dropout 0.1, bf16 autocast) forward + backward: ms per
    step and the attention kernels a profiled step ran. ``mask``: "none" (BertModel without attention_mask),
    "all-ones" (what a collator returns for unpadded rows), "direct" (embeddings, then the encoder layers with no
    mask at all, as sparsebert's MLM model runs unpadded blocks)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel._from_config(BertConfig(), attn_implementation="sdpa").cuda().train()
    ids = torch.randint(1000, 30000, (batch, 128), device="cuda")
    ones = torch.ones_like(ids)

    def forward(ids: torch.Tensor) -> torch.Tensor:
        if mask == "direct":
            return model.encoder(model.embeddings(input_ids=ids), attention_mask=None).last_hidden_state
        return model(input_ids=ids, attention_mask=ones if mask == "all-ones" else None).last_hidden_state

    fn = torch.compile(forward) if compiled else forward

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fn(ids)
        out.float().square().mean().backward()

    for _ in range(3):  # compile, warm up
        step()
    torch.cuda.synchronize()
    ms = ms_per_call(step, steps)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    for e in prof.key_averages():
        if e.device_time_total > 0 and any(m in e.key.lower() for m in ATTENTION_KERNEL_MARKERS):
            kernels[e.key[:90]] = round(e.device_time_total / 1000, 3)
    torch._dynamo.reset()
    return {"ms_per_step": ms,
            "attention_kernels_ms": dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:6])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", default="128,256", help="batches of the kernel table")
    p.add_argument("--encoder-batch", type=int, default=128, help="batch of the encoder section")
    p.add_argument("--encoder-only", action="store_true", help="only the BERT-base encoder section")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("attention_backends: needs a CUDA GPU")
    from sparsebert.env_info import git_commit

    rows = []
    for batch in [] if args.encoder_only else map(int, args.batch.split(",")):
        for dropout in (0.1, 0.0):
            for masked in (False, True):
                for name, backend in BACKENDS.items():
                    ms = time_attention(batch, backend, masked, dropout)
                    rows.append({"batch": batch, "dropout": dropout, "mask": "all-ones bool" if masked else "none",
                                 "backend": name, "ms_per_step_12_layers": ms})
                    print(json.dumps(rows[-1]), flush=True)
    card = torch.cuda.get_device_name(0)
    if rows:
        print(f"\n{card}: attention forward + backward of 12 layers (ms)\n| batch | dropout | mask | "
              + " | ".join(BACKENDS) + " |\n|---|---|---|" + "---|" * len(BACKENDS))
    for i in range(0, len(rows), len(BACKENDS)):
        group = rows[i:i + len(BACKENDS)]
        cells = [f"{r['ms_per_step_12_layers']:.2f}" if isinstance(r["ms_per_step_12_layers"], float) else "refused"
                 for r in group]
        print(f"| {group[0]['batch']} | {group[0]['dropout']} | {group[0]['mask']} | " + " | ".join(cells) + " |")
    encoder = []
    for compiled in (False, True):
        for mask in ("none", "all-ones", "direct"):
            r = {"batch": args.encoder_batch, "compiled": compiled, "mask": mask,
                 **time_encoder(args.encoder_batch, compiled, mask)}
            encoder.append(r)
            print(json.dumps(r), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"card": card, "date": date.today().isoformat(), "commit": git_commit(ROOT),
                                        "torch": torch.__version__, "rows": rows, "encoder": encoder},
                                       indent=2) + "\n")


if __name__ == "__main__":
    main()
