"""Sparse training core: select weights, build and apply masks, evolve them with RigL or GMP (by a pruning score:
magnitude, movement or oBERT's, ``scores.py``), report and persist them. (The all-reduce that sends only active
gradients is in ``distributed/``; 2:4 inference export in ``export/``.)

Plain PyTorch on purpose (nothing from ``transformers``): it works on any ``nn.Module`` whose parameter names
the include/exclude regexes can address.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names for type checkers and editors; at run time they load on first use
    from .config import DEFAULT_INCLUDE, GMPConfig, RigLConfig, SparsityConfig
    from .controller import SparsityController
    from .distribution import erk_densities, explicit_densities, layer_densities, uniform_densities
    from .gmp import (
        accumulate_movement,
        gmp_next_update,
        gmp_prune,
        gmp_prune_global,
        gmp_sparsity,
        gmp_update_due,
        rewound_linear_factor,
    )
    from .masks import nm_mask
    from .report import layer_type, sparsity_report
    from .rigl import MaskChange, rigl_drop_fraction, rigl_global_change, rigl_layer_change, rigl_update_due
    from .scores import MagnitudeScore, MovementScore, OBSScore, PruningScore, make_score, obs_memory_bytes
    from .selection import select_parameters

# the submodule of each name: importing the package (e.g. for its config dataclasses, which every command
# line reads) does not import torch until a name that needs it is used
_SUBMODULE = {
    "DEFAULT_INCLUDE": "config",
    "GMPConfig": "config",
    "RigLConfig": "config",
    "SparsityConfig": "config",
    "SparsityController": "controller",
    "erk_densities": "distribution",
    "explicit_densities": "distribution",
    "layer_densities": "distribution",
    "uniform_densities": "distribution",
    "accumulate_movement": "gmp",
    "gmp_next_update": "gmp",
    "gmp_prune": "gmp",
    "gmp_prune_global": "gmp",
    "gmp_sparsity": "gmp",
    "gmp_update_due": "gmp",
    "rewound_linear_factor": "gmp",
    "nm_mask": "masks",
    "layer_type": "report",
    "sparsity_report": "report",
    "MaskChange": "rigl",
    "rigl_drop_fraction": "rigl",
    "rigl_global_change": "rigl",
    "rigl_layer_change": "rigl",
    "rigl_update_due": "rigl",
    "MagnitudeScore": "scores",
    "MovementScore": "scores",
    "OBSScore": "scores",
    "PruningScore": "scores",
    "make_score": "scores",
    "obs_memory_bytes": "scores",
    "select_parameters": "selection",
}


def __getattr__(name: str):
    if name not in _SUBMODULE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_SUBMODULE[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "accumulate_movement",
    "DEFAULT_INCLUDE",
    "GMPConfig",
    "MagnitudeScore",
    "MaskChange",
    "MovementScore",
    "OBSScore",
    "PruningScore",
    "RigLConfig",
    "SparsityConfig",
    "SparsityController",
    "erk_densities",
    "explicit_densities",
    "gmp_next_update",
    "gmp_prune",
    "gmp_prune_global",
    "gmp_sparsity",
    "gmp_update_due",
    "layer_densities",
    "layer_type",
    "make_score",
    "nm_mask",
    "obs_memory_bytes",
    "rigl_drop_fraction",
    "rigl_global_change",
    "rigl_layer_change",
    "rewound_linear_factor",
    "rigl_update_due",
    "select_parameters",
    "sparsity_report",
    "uniform_densities",
]
