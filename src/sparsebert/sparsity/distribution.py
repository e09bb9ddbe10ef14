"""How an overall density budget is split across layers.

All functions return a density (fraction of weights kept, = 1 - sparsity) per layer, such that the number of
kept weights summed over layers equals ``density * total`` up to per-layer rounding.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from .config import SparsityConfig

Shapes = Mapping[str, tuple[int, ...]]


def uniform_densities(shapes: Shapes, density: float) -> dict[str, float]:
    """Every layer keeps the same fraction of its weights."""
    return {name: density for name in shapes}


def erk_densities(shapes: Shapes, density: float) -> dict[str, float]:
    """Erdős–Rényi(-Kernel): density ∝ sum(shape) / prod(shape), i.e. (n_in + n_out) / (n_in·n_out) for a Linear.

    Small layers get denser, large ones sparser, at the same total budget. Scaling can push a small layer above
    density 1; such layers are made dense and the scale is re-solved for the rest. Making a layer dense frees
    budget, which only raises the scale, so every layer over 1 can be fixed in the same round.
    """
    numel = {name: math.prod(shape) for name, shape in shapes.items()}
    raw = {name: sum(shape) / numel[name] for name, shape in shapes.items()}
    budget = density * sum(numel.values())
    dense: set[str] = set()
    while True:
        free = [name for name in shapes if name not in dense]
        if not free:
            break
        remaining = budget - sum(numel[name] for name in dense)
        scale = remaining / sum(raw[name] * numel[name] for name in free)
        too_dense = {name for name in free if scale * raw[name] > 1.0}
        if not too_dense:
            break
        dense |= too_dense
    return {name: 1.0 if name in dense else scale * raw[name] for name in shapes}


def explicit_densities(names: list[str], per_layer: Mapping[str, float]) -> dict[str, float]:
    """``per_layer`` maps regex -> sparsity; the first pattern (in order) that matches a name decides."""
    compiled = [(re.compile(pattern), sparsity) for pattern, sparsity in per_layer.items()]
    densities = {}
    for name in names:
        match = next((sparsity for pattern, sparsity in compiled if pattern.search(name)), None)
        if match is None:
            raise ValueError(f"sparsity.per_layer has no pattern matching the selected layer {name!r}")
        densities[name] = 1.0 - match
    return densities


def layer_densities(config: SparsityConfig, shapes: Shapes) -> dict[str, float]:
    """Per-layer target densities for the selected layers, by ``config.distribution``."""
    density = 1.0 - config.sparsity
    if config.distribution == "uniform":
        return uniform_densities(shapes, density)
    if config.distribution == "erk":
        return erk_densities(shapes, density)
    return explicit_densities(list(shapes), config.per_layer or {})


def kept_count(density: float, numel: int) -> int:
    """Number of active weights for a layer: the one rounding rule every mask builder uses."""
    return min(numel, max(0, round(density * numel)))
