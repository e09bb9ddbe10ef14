"""Sparse training core: select weights, build and apply masks, evolve them with RigL or GMP (by a pruning score:
magnitude, movement or oBERT's, ``scores.py``), report and persist them. (The all-reduce that sends only active
gradients is in ``distributed/``; 2:4 inference export in ``export/``.)

Plain PyTorch on purpose (nothing from ``transformers``): it works on any ``nn.Module`` whose parameter names
the include/exclude regexes can address.
"""

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
