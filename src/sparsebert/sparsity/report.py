"""What is actually sparse: per layer, per layer type, selected totals and the whole model.

Numbers count actual zeros in the weights, not mask bits, so the report cannot overstate sparsity (e.g. if
something wrote into masked weights). The headline says what was pruned and what was not, because "80% sparse
BERT" usually means 80% of the encoder Linear weights, which is far from 80% of the whole model. For 2:4 masks it
says "2:4 semi-structured" only if the weights really are 2:4, since that is what the sparse kernels need.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from .masks import nm_violations

_LAYER_TYPES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("query", r"attention\.self\.query\.weight$"),
        ("key", r"attention\.self\.key\.weight$"),
        ("value", r"attention\.self\.value\.weight$"),
        ("attention_output", r"attention\.output\.dense\.weight$"),
        ("intermediate", r"intermediate\.dense\.weight$"),
        ("output", r"layer\.\d+\.output\.dense\.weight$"),
        ("word_embeddings", r"word_embeddings\.weight$"),
        ("mlm_head", r"predictions\.transform\.dense\.weight$"),
    )
)
_ENCODER_LINEAR = {"query", "key", "value", "attention_output", "intermediate", "output"}
_EMBEDDINGS = re.compile(r"(^|\.)embeddings\.")


def layer_type(name: str) -> str:
    """The BERT role of a parameter, or "other"."""
    return next((kind for kind, pattern in _LAYER_TYPES if pattern.search(name)), "other")


# short names of the encoder Linears, as plots and tracker tags show them
LAYER_LABELS = {"query": "Q", "key": "K", "value": "V", "attention_output": "O", "intermediate": "FFN in",
                "output": "FFN out"}
_LAYER_INDEX = re.compile(r"(?:^|\.)layer\.(\d+)\.")


def module_label(name: str) -> str:
    """``bert.encoder.layer.3.intermediate.dense.weight`` -> ``layer 3 FFN in``; a parameter that is no encoder
    Linear keeps its name (without ``.weight``)."""
    kind, index = layer_type(name), _LAYER_INDEX.search(name)
    if kind in LAYER_LABELS and index:
        return f"layer {index.group(1)} {LAYER_LABELS[kind]}"
    return name.removesuffix(".weight")


def sparsity_report(
    model: nn.Module, masks: Mapping[str, torch.Tensor], pattern: str = "unstructured"
) -> dict[str, Any]:
    """JSON-serializable sparsity summary of ``model`` whose selected (masked) weights are ``masks``' keys.

    ``pattern`` is the mask pattern of the sparsity config; for "2:4" the selected totals also count the
    tensors whose weights are actually 2:4 (``two_four_tensors``).
    """
    params = dict(model.named_parameters())
    layers = []
    for name, mask in masks.items():
        weight = params[name]
        layers.append(
            {
                "name": name,
                "type": layer_type(name),
                "shape": list(weight.shape),
                "active": int(mask.sum()),
                **_count([weight]),
            }
        )
    by_type: dict[str, dict[str, Any]] = {}
    for layer in layers:
        group = by_type.setdefault(layer["type"], {"tensors": 0, "total": 0, "active": 0, "nonzero": 0})
        group["tensors"] += 1
        for key in ("total", "active", "nonzero"):
            group[key] += layer[key]
    for group in by_type.values():
        group["sparsity"] = _sparsity(group["nonzero"], group["total"])
    selected = {
        "tensors": len(layers),
        "total": sum(layer["total"] for layer in layers),
        "active": sum(layer["active"] for layer in layers),
        "nonzero": sum(layer["nonzero"] for layer in layers),
    }
    selected["sparsity"] = _sparsity(selected["nonzero"], selected["total"])
    if pattern == "2:4":
        selected["two_four_tensors"] = sum(nm_violations(params[name]) == 0 for name in masks)
    whole = _count(params.values())
    without_embeddings = _count(p for name, p in params.items() if not _EMBEDDINGS.search(name))
    return {
        "layers": layers,
        "by_type": by_type,
        "selected": selected,
        "model": whole,
        "model_excluding_embeddings": without_embeddings,
        "pattern": pattern,
        "headline": _headline(by_type, selected, whole, without_embeddings, pattern),
    }


def _count(tensors: Iterable[torch.Tensor]) -> dict[str, Any]:
    total = nonzero = 0
    for tensor in tensors:
        total += tensor.numel()
        nonzero += int(torch.count_nonzero(tensor.detach()))
    return {"total": total, "nonzero": nonzero, "sparsity": _sparsity(nonzero, total)}


def _sparsity(nonzero: int, total: int) -> float:
    return 1.0 - nonzero / total if total else 0.0


def _headline(by_type: dict, selected: dict, whole: dict, without_embeddings: dict, pattern: str) -> str:
    parts = []
    if _ENCODER_LINEAR & by_type.keys():
        parts.append("encoder linear layers")
    if "word_embeddings" in by_type:
        parts.append("word embeddings")
    if "mlm_head" in by_type:
        parts.append("MLM head")
    if "other" in by_type:
        parts.append("other layers")
    what = f"{' + '.join(parts)} ({selected['tensors']} tensors)"
    text = f"{selected['sparsity']:.1%} sparse {what}"
    if pattern == "2:4":
        off = selected["tensors"] - selected["two_four_tensors"]
        if off:  # something wrote into masked weights: the kernels cannot use these tensors as they are
            text = f"2:4 masks, but {off} of {selected['tensors']} tensors not 2:4 in the weights: {text}"
        else:
            text = f"2:4 semi-structured ({selected['sparsity']:.1%} sparse) {what}"
    if "word_embeddings" not in by_type:
        text += "; embeddings dense"
    return (
        f"{text}; whole model {whole['sparsity']:.1%} sparse "
        f"({without_embeddings['sparsity']:.1%} excluding embeddings)"
    )
