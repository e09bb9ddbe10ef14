"""Model transforms applied before the Trainer is built: they change modules of the trained model (never a
distillation teacher's), so they belong to the model, not to the Trainer's step.

- ``model.fast_dropout``: dropout with counter-hash random bits under torch.compile (fast_dropout.py);
- ``model.half_precision_residual``: LayerNorm outputs in bf16 under bf16 training (residual_precision.py);
- ``model.fused_qkv``: each attention layer's Q, K and V as one matrix product (fused_qkv.py);
- ``train.precision=fp8``: the encoder's Linear layers multiply in FP8 (fp8.py).

How the model is compiled is not a transform of the model: Accelerate's compile plugin and Inductor's settings
are set by SparseBertTrainer (trainer/compile_options.py), which compiles the model, after DDP wraps it, at
the start of ``train()``.
"""

from __future__ import annotations

import logging

from torch import nn

from sparsebert.config import ExperimentConfig
from sparsebert.errors import SparseBertError
from sparsebert.models.fast_dropout import apply_fast_dropout
from sparsebert.models.fp8 import use_fp8_matmuls
from sparsebert.models.fused_qkv import use_fused_qkv
from sparsebert.models.precision import resolve_precision
from sparsebert.models.residual_precision import apply_half_precision_residual

log = logging.getLogger(__name__)


def prepare_model(model: nn.Module, cfg: ExperimentConfig) -> nn.Module:
    """Applies the experiment's model transforms to ``model`` in place (parameters and state_dict keys stay as
    they are) and returns it."""
    compiled = cfg.train.torch_compile
    if cfg.model.half_precision_residual:
        apply_half_precision_residual(model, _precision(cfg.train.precision))
    if cfg.model.fast_dropout:
        apply_fast_dropout(model, compiled)
    if cfg.model.fused_qkv:  # before the FP8 swap, which then makes the fused product an FP8 one
        swapped = use_fused_qkv(model)
        log.info("model.fused_qkv: %d attention layers compute Q, K and V in one matrix product", swapped)
        if swapped == 0:
            log.warning("model.fused_qkv: no encoder self-attention of this model can be fused (not BERT's, a "
                        "decoder, no biases or projections other than nn.Linear); nothing changes")
    if cfg.train.precision == "fp8":
        use_fp8_matmuls(model, cfg.train.fp8_recipe, cfg.train.fp8_layers)
    return model


def _precision(precision: str) -> str:
    """The dtype the residual stream's autocast runs in: fp8 runs everything but its FP8 layers under bf16."""
    try:
        return "bf16" if precision == "fp8" else resolve_precision(precision)
    except SparseBertError:  # reported where the Trainer's arguments are built
        return precision
