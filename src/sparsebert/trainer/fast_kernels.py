"""FastKernelsMixin: cheaper GELU and dropout arithmetic in compiled runs (``model.fast_gelu``,
``model.fast_dropout``; the modules and what they compute are in models/fast_kernels.py).

Applied to the trained model only, like the bf16 residual stream: a distillation teacher keeps its modules.
"""

from __future__ import annotations

import logging

from sparsebert.models.fast_kernels import use_fast_gelu, use_hash_dropout

log = logging.getLogger(__name__)


class FastKernelsMixin:
    def __init__(self, *args, fast_gelu: bool = False, fast_dropout: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        for on, swap, key, what in ((fast_gelu, use_fast_gelu, "model.fast_gelu", "GELU activations"),
                                    (fast_dropout, use_hash_dropout, "model.fast_dropout", "dropout modules")):
            if not on:
                continue
            swapped = swap(self.model)
            if swapped == 0:
                log.warning("%s: this model has no %s; nothing changes", key, what)
            elif not self.args.torch_compile:
                log.info("%s changes nothing without train.torch_compile (eager runs torch's own kernels)", key)
            else:
                log.info("%s: %d %s computed by the cheaper compiled kernels", key, swapped, what)
