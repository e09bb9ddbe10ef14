"""Fast dropout: dropout with counter-hash random bits in compiled runs (``model.fast_dropout``; the module
and what it computes are in models/fast_dropout.py).

Applied to the trained model only, before the Trainer is built (trainer/prepare.py), like the bf16 residual
stream: a distillation teacher keeps its modules.
"""

from __future__ import annotations

import logging

from sparsebert.models.fast_dropout import use_hash_dropout

log = logging.getLogger(__name__)


def apply_fast_dropout(model, torch_compile: bool) -> int:
    swapped = use_hash_dropout(model)
    if swapped == 0:
        log.warning("model.fast_dropout: this model has no nn.Dropout; nothing changes")
    elif not torch_compile:
        log.info("model.fast_dropout changes nothing without train.torch_compile (eager runs torch's dropout)")
    else:
        log.info("model.fast_dropout: %d nn.Dropout modules swapped (those only read for their p, as the "
                 "attention's, work as before)", swapped)
    return swapped
