"""Saving the sparsity state next to a checkpoint: ``masks.safetensors`` + ``sparsity_state.json``.

Both files are written atomically (temp file + ``os.replace``), so a crash never leaves a torn file. The step is
stored in both, so a checkpoint where only one of the two files was replaced is detected on load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sparsebert.io import atomic_path, atomic_write_json

MASKS_FILE = "masks.safetensors"
STATE_FILE = "sparsity_state.json"
FORMAT_VERSION = 1


def save_sparsity_state(directory: str | os.PathLike, state: dict[str, Any]) -> None:
    """Write a controller ``state_dict()`` (bool masks stored as uint8, which safetensors supports everywhere)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {f"mask/{n}": m.to(torch.uint8).cpu().contiguous() for n, m in state["masks"].items()}
    tensors |= {
        f"initial/{n}": m.to(torch.uint8).cpu().contiguous() for n, m in state["initial_masks"].items()
    }
    # movement pruning's accumulated scores, so a resumed run prunes by the same scores
    tensors |= {f"score/{n}": t.float().cpu().contiguous() for n, t in state.get("movement_scores", {}).items()}
    _atomic_save_safetensors(tensors, directory / MASKS_FILE, {"step": str(state["step"])})
    atomic_write_json(
        directory / STATE_FILE,
        {
            "format_version": FORMAT_VERSION,
            "step": state["step"],
            "layers": {n: list(m.shape) for n, m in state["masks"].items()},
        },
    )


def load_sparsity_state(directory: str | os.PathLike) -> dict[str, Any]:
    """Read what ``save_sparsity_state`` wrote, as a ``state_dict()`` with CPU bool masks."""
    directory = Path(directory)
    for file in (MASKS_FILE, STATE_FILE):
        if not (directory / file).is_file():
            raise FileNotFoundError(f"no {file} in {directory}: not a sparsity checkpoint")
    meta = json.loads((directory / STATE_FILE).read_text(encoding="utf-8"))
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{directory / STATE_FILE} has format_version {meta.get('format_version')}, expected {FORMAT_VERSION}"
        )
    with safe_open(directory / MASKS_FILE, framework="pt") as f:
        header_step = (f.metadata() or {}).get("step")
        if header_step != str(meta["step"]):
            raise ValueError(
                f"{directory}: {MASKS_FILE} is from step {header_step} but {STATE_FILE} from step {meta['step']}"
            )
        state = {
            "step": meta["step"],
            "masks": {n: f.get_tensor(f"mask/{n}").bool() for n in meta["layers"]},
            "initial_masks": {n: f.get_tensor(f"initial/{n}").bool() for n in meta["layers"]},
        }
        stored = set(f.keys())
        if all(f"score/{n}" in stored for n in meta["layers"]):
            state["movement_scores"] = {n: f.get_tensor(f"score/{n}") for n in meta["layers"]}
        return state


def _atomic_save_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
