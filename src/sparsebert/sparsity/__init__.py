"""Sparse training core: select weights, build and apply masks, evolve them with RigL or GMP, and report; export
2:4 masked Linear layers for inference, to torch's semi-structured sparse tensors or to our own sm90 kernel.

Plain PyTorch on purpose (nothing from ``transformers``): it works on any ``nn.Module`` whose parameter names
the include/exclude regexes can address.
"""

from . import communication
from .config import DEFAULT_INCLUDE, GMPConfig, RigLConfig, SparsityConfig
from .controller import SparsityController
from .distribution import erk_densities, explicit_densities, layer_densities, uniform_densities
from .gmp import (
    accumulate_movement,
    gmp_prune,
    gmp_prune_global,
    gmp_sparsity,
    gmp_update_due,
    rewound_linear_factor,
)
from .masks import nm_mask
from .report import layer_type, sparsity_report
from .rigl import MaskChange, rigl_drop_fraction, rigl_global_change, rigl_layer_change, rigl_update_due
from .selection import select_parameters
from .semi_structured import SemiStructuredLinear, feed_forward_names, is_two_four, to_semi_structured
from .sparse24_kernel import Sparse24Linear, to_sparse24_kernel

__all__ = [
    "communication",
    "accumulate_movement",
    "DEFAULT_INCLUDE",
    "GMPConfig",
    "MaskChange",
    "RigLConfig",
    "SemiStructuredLinear",
    "Sparse24Linear",
    "SparsityConfig",
    "SparsityController",
    "erk_densities",
    "explicit_densities",
    "feed_forward_names",
    "gmp_prune",
    "gmp_prune_global",
    "gmp_sparsity",
    "gmp_update_due",
    "is_two_four",
    "layer_densities",
    "layer_type",
    "nm_mask",
    "rigl_drop_fraction",
    "rigl_global_change",
    "rigl_layer_change",
    "rewound_linear_factor",
    "rigl_update_due",
    "select_parameters",
    "sparsity_report",
    "to_semi_structured",
    "to_sparse24_kernel",
    "uniform_densities",
]
