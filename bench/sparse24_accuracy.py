"""A finetuned 2:4 model through our kernel: its GLUE dev accuracy against the same masked weights run dense.

Loads a finetuned run's ``model/`` (e.g. ``runs/minilm_glue_2to4/...``), checks that its encoder Linear weights
are 2:4, and scores the task's dev set twice in bf16: the model as it is (dense matmuls over the masked weights),
and a copy converted with ``to_sparse24_kernel`` (every encoder Linear through our CUTLASS kernel, GELU fused).
Every sequence padded to ``--seq`` with its attention mask, batches of ``--batch``. Prints and writes both
accuracies, how many predictions agree, and the largest logit difference.

    python bench/sparse24_accuracy.py --model RUN/model --data-dir DATA [--task sst2] --out F
"""

from __future__ import annotations

import argparse
import copy
import sys
from datetime import date
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForSequenceClassification, AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from semi_structured import encoder_layers  # noqa: E402

from sparsebert.data.glue import get_glue_task, read_glue_split  # noqa: E402
from sparsebert.env_info import git_commit  # noqa: E402
from sparsebert.export import is_two_four, to_sparse24_kernel  # noqa: E402
from sparsebert.io import atomic_write_json  # noqa: E402


@torch.inference_mode()
def logits_of(model: nn.Module, batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    return torch.cat([model(**batch).logits.float() for batch in batches])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="a finetuned run's model/ directory")
    p.add_argument("--tokenizer", type=Path, default=None, help="default: the model directory")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--task", default="sst2")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    task = get_glue_task(args.task)
    if task.is_regression:
        sys.exit(f"sparse24_accuracy.py: {task.name} is a regression task; accuracy needs a classification one")
    rows = read_glue_split(args.data_dir, task, "dev")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    labels = torch.tensor([r["label"] for r in rows], device="cuda")
    batches = []
    for start in range(0, len(rows), args.batch):
        chunk = rows[start:start + args.batch]
        pair = [r["text_b"] for r in chunk] if chunk[0].get("text_b") is not None else None
        enc = tokenizer([r["text_a"] for r in chunk], pair, padding="max_length", truncation=True,
                        max_length=args.seq, return_tensors="pt")
        batches.append({k: v.cuda() for k, v in enc.items()})

    dense = AutoModelForSequenceClassification.from_pretrained(args.model).cuda().to(torch.bfloat16).eval()
    encoder = encoder_layers(dense)
    not_two_four = [n for n in encoder if not is_two_four(dense.get_submodule(n).weight)]
    if not_two_four:
        sys.exit(f"sparse24_accuracy.py: {len(not_two_four)} encoder Linear weights are not 2:4 (e.g. "
                 f"{not_two_four[0]}): not a 2:4 run's model")
    sparse = copy.deepcopy(dense)
    sizes = sorted({b["input_ids"].numel() for b in batches})
    converted = to_sparse24_kernel(sparse, rows=sizes, names=encoder)
    fused = sum(sparse.get_submodule(n).gelu for n in converted)

    dense_logits, sparse_logits = logits_of(dense, batches), logits_of(sparse, batches)
    dense_pred, sparse_pred = dense_logits.argmax(-1), sparse_logits.argmax(-1)
    result = {
        "card": torch.cuda.get_device_name(), "date": date.today().isoformat(), "commit": git_commit(ROOT),
        "torch": torch.__version__, "model": str(args.model), "task": task.name, "examples": len(rows),
        "seq": args.seq, "batch": args.batch, "converted_layers": len(converted), "gelu_fused": fused,
        "dense_accuracy": (dense_pred == labels).float().mean().item(),
        "sparse24_accuracy": (sparse_pred == labels).float().mean().item(),
        "predictions_agree": (dense_pred == sparse_pred).sum().item(),
        "max_abs_logit_diff": (dense_logits - sparse_logits).abs().max().item(),
        "max_abs_logit": dense_logits.abs().max().item(),
    }
    print(result)
    atomic_write_json(args.out, result)


if __name__ == "__main__":
    main()
