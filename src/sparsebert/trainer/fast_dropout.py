"""FastDropoutMixin: dropout with counter-hash random bits in compiled runs (``model.fast_dropout``; the module
and what it computes are in models/fast_dropout.py).

Applied to the trained model only, like the bf16 residual stream: a distillation teacher keeps its modules.
"""

from __future__ import annotations

import logging

from sparsebert.models.fast_dropout import use_hash_dropout

log = logging.getLogger(__name__)


class FastDropoutMixin:
    def __init__(self, *args, fast_dropout: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if not fast_dropout:
            return
        swapped = use_hash_dropout(self.model)
        if swapped == 0:
            log.warning("model.fast_dropout: this model has no nn.Dropout; nothing changes")
        elif not self.args.torch_compile:
            log.info("model.fast_dropout changes nothing without train.torch_compile (eager runs torch's dropout)")
        else:
            log.info("model.fast_dropout: %d nn.Dropout modules swapped (those only read for their p, as the "
                     "attention's, work as before)", swapped)
