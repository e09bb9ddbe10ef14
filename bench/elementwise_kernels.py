"""Dropout + residual + LayerNorm alone, compiled, at BERT-base's shapes: torch's dropout against
``model.fast_dropout`` (sparsebert/models/fast_dropout.py), with a floor that does the same work without dropout,
so the table shows what the random numbers cost.

    python bench/elementwise_kernels.py [--batch 256] [--out FILE.json]

Each row: one compiled function, forward alone (no_grad) and forward + backward (``torch.autograd.grad``, so no
``.grad`` accumulation is timed), microseconds per call, median of 5 x 50 calls; bf16 activations as under
autocast, batch x 128 tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from cuda_timing import ms_per_call  # noqa: E402

from sparsebert.models.fast_dropout import hash_dropout  # noqa: E402

HIDDEN, SEQ = 768, 128


def time_us(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], grad_out: torch.Tensor) -> dict[str, float]:
    compiled = torch.compile(fn)

    def forward():
        with torch.no_grad():
            compiled(*inputs)

    def forward_backward():
        torch.autograd.grad(compiled(*inputs), inputs, grad_out)

    for _ in range(5):
        forward()
        forward_backward()
    torch.cuda.synchronize()
    out = {}
    for key, call in (("forward_us", forward), ("forward_backward_us", forward_backward)):
        out[key] = round(1000 * statistics.median(ms_per_call(call, 50) for _ in range(5)), 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--out", default="")
    args = p.parse_args()
    torch.manual_seed(0)
    tokens, dev, bf16 = args.batch * SEQ, "cuda", torch.bfloat16
    a = torch.randn(tokens, HIDDEN, device=dev, dtype=bf16, requires_grad=True)
    r = torch.randn(tokens, HIDDEN, device=dev, dtype=bf16, requires_grad=True)
    ln = torch.nn.LayerNorm(HIDDEN, device=dev)

    def norm(x):  # LayerNorm in fp32, bf16 out (model.half_precision_residual)
        return F.layer_norm(x.float(), (HIDDEN,), ln.weight, ln.bias).to(bf16)

    rows = [
        ("torch dropout 0.1 + residual + LayerNorm",
         lambda x, y: norm(F.dropout(x, 0.1, True) + y), [a, r]),
        ("hash dropout 0.1 (model.fast_dropout) + residual + LayerNorm",
         lambda x, y: norm(hash_dropout(x, 0.1) + y), [a, r]),
        ("no dropout + residual + LayerNorm (floor)", lambda x, y: norm(x + y), [a, r]),
    ]
    from sparsebert.env_info import git_commit

    results = {"card": torch.cuda.get_device_name(), "date": date.today().isoformat(), "commit": git_commit(ROOT),
               "torch": torch.__version__, "batch": args.batch, "rows": []}
    for label, fn, inputs in rows:
        grad_out = torch.randn_like(inputs[0])
        row = {"variant": label, **time_us(fn, inputs, grad_out)}
        results["rows"].append(row)
        print(f"{label:70s} fwd {row['forward_us']:7.1f} us   fwd+bwd {row['forward_backward_us']:7.1f} us",
              flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
