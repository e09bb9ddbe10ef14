"""Bitmask + values storage of sparse tensors, bit-exact.

A tensor is *sparse* here when at least ``MIN_ZERO_FRACTION`` of its elements are zero and it has two or more
dimensions: the weights a sparsity section prunes (encoder Linear weights) and nothing else in a BERT comes close,
so the rule needs no ``sparsity.json`` and also works on a model pruned elsewhere. Each such tensor ``NAME`` is
stored as two tensors in ``model.compressed.safetensors``:

* ``NAME.__mask__``: uint8, its "non-zero" flags in row-major order packed 8 per byte, most significant bit first
  (``numpy.packbits`` order), the last byte padded with zero bits;
* ``NAME.__values__``: 1-D, the original dtype, the flagged elements in row-major order.

Every other tensor is stored as it is under its own name. The round trip gives back every tensor with its dtype,
shape and values (``torch.equal``), bit for bit (NaN payloads included) with one exception: a zero comes back as
``+0.0``. Masked weights are ``w * 0``, so about half of them are ``-0.0``; keeping their signs would take another
bit per zero (80 % sparse fp32: 3.9x instead of 4.3x) for no difference in any sum or product the model computes.
The shapes and the names of the compressed tensors are in the file's metadata.

At 80 % sparsity an fp32 tensor takes 1/8 + 0.2 x 4 bytes per element in place of 4: 4.3x smaller. That is the
pruned tensors alone: the embeddings, LayerNorms, head and tokenizer stay dense, so a whole export directory shrinks
far less (``run.py --export --compressed`` prints the whole-directory ratio against the plain export's).

Not the ``compressed-tensors`` sparse-bitmask format: compressed-tensors (PR #610) and transformers 5 (PR #46342)
dropped its support, and transformers 5 loads such a checkpoint's weights as unexpected keys, re-initialising the
layers they belong to.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import torch
from safetensors.torch import save_file

from sparsebert.errors import SparseBertError
from sparsebert.export.bitmask_loader import (  # the reader lives there: it is copied into each export
    FORMAT,
    MASK_SUFFIX,
    VALUES_SUFFIX,
    read_bitmask_file,
)

MIN_ZERO_FRACTION = 0.5

_BIT_WEIGHTS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


def _nonzero(t: torch.Tensor) -> torch.Tensor:
    """Bool tensor of ``t``'s shape: True where the element is not zero (NaN is not zero, -0.0 is)."""
    return t != 0


def pack_bits(flags: torch.Tensor) -> torch.Tensor:
    """Pack a bool tensor (flattened row-major) into uint8, 8 flags per byte, most significant bit first.

    Args:
        flags: any shape, dtype bool.
    Returns:
        1-D uint8 tensor of ``ceil(flags.numel() / 8)`` bytes (the same bytes as ``numpy.packbits``).
    """
    flat = flags.reshape(-1).to(torch.uint8)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    # the sum of 8 distinct powers of two fits a uint8; sum() would promote to int64, so convert back
    return (flat.view(-1, 8) * _BIT_WEIGHTS).sum(dim=1, dtype=torch.uint8)


def is_sparse(t: torch.Tensor, min_zero_fraction: float = MIN_ZERO_FRACTION) -> bool:
    """Whether ``t`` is stored as bitmask + values: 2-D or more, and mostly (bit pattern) zeros."""
    if t.dim() < 2 or t.numel() == 0 or t.is_complex():
        return False
    zeros = t.numel() - int(_nonzero(t).sum())
    return zeros >= min_zero_fraction * t.numel()


def compress_state_dict(
    state: Mapping[str, torch.Tensor], min_zero_fraction: float = MIN_ZERO_FRACTION
) -> tuple[dict[str, torch.Tensor], dict[str, list[int]]]:
    """Split each sparse tensor of ``state`` into ``NAME.__mask__`` + ``NAME.__values__``.

    Args:
        state: tensor name -> tensor (a model's state dict, as ``save_pretrained`` wrote it).
        min_zero_fraction: the zero fraction from which a tensor of 2 or more dimensions is compressed.
    Returns:
        the tensors to save, and the shape of each compressed tensor by its name.
    """
    out: dict[str, torch.Tensor] = {}
    shapes: dict[str, list[int]] = {}
    for name, t in state.items():
        if name.endswith((MASK_SUFFIX, VALUES_SUFFIX)):
            raise SparseBertError(f"tensor name {name} ends like a compressed tensor's part; cannot compress it")
        t = t.detach().cpu().contiguous()
        if not is_sparse(t, min_zero_fraction):
            out[name] = t
            continue
        flags = _nonzero(t)
        out[name + MASK_SUFFIX] = pack_bits(flags)
        out[name + VALUES_SUFFIX] = t.reshape(-1)[flags.reshape(-1)].clone()
        shapes[name] = list(t.shape)
    return out, shapes


def save_compressed(state: Mapping[str, torch.Tensor], path: str | os.PathLike,
                    min_zero_fraction: float = MIN_ZERO_FRACTION) -> dict[str, list[int]]:
    """Write ``state`` compressed to the safetensors file ``path``; returns the compressed tensors' shapes."""
    tensors, shapes = compress_state_dict(state, min_zero_fraction)
    save_file(tensors, str(path), metadata={"format": "pt", "sparsebert_format": FORMAT,
                                            "shapes": json.dumps(shapes)})
    return shapes


def read_compressed(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The dense state dict stored in the compressed safetensors file ``path`` (see the module docstring)."""
    try:
        return read_bitmask_file(path)
    except ValueError as e:
        raise SparseBertError(str(e)) from None
