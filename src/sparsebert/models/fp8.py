"""``train.precision=fp8``: the encoder's Linear layers multiply in FP8, everything else as under bf16.

The layers are swapped for torchao's ``Float8Linear`` by Accelerate's converter (``accelerate.utils.ao``, what
``Accelerator(mixed_precision="fp8")`` runs with its torchao backend), here before the Trainer exists: the
Trainer builds its Accelerator from TrainingArguments, which has no FP8 setting, and the swap must come before
``torch.compile`` and DDP wrap the model. A ``Float8Linear`` keeps the Linear's own weight and bias Parameters
(fp32 master weights, the same objects the sparsity masks, the optimizer and DDP hold); each step it casts the
weight, the input and the output gradient to FP8 with one scale per tensor (or per row) and multiplies on the
GPU's FP8 units (sm89 and later: Ada, Hopper, Blackwell). A zero weight stays an exact zero in FP8, so masked
weights stay zero in the master weights and outputs; RigL's dense gradient still comes from the same backward.

Which layers (``train.fp8_layers``): ``encoder``, every encoder-layer (``encoder.layer.N.``) Linear whose sides
are multiples of 16 (FP8 matrix products need it); ``auto``, of those only the ones torchao's shape heuristic
expects to gain (H100 measurements: for the tensorwise recipe it skips layers with K <= 4096 and N <= 1024, so
BERT-base keeps only its FFN up-projection in FP8; under fused QKV it judges each projection's own shape, so Q, K
and V stay bf16). Embeddings are lookups, not products; the pooler, the MLM head and task heads stay bf16: they
are small or, for the MLM decoder (vocabulary 30 522, not a multiple of 16), cannot run in FP8. Each product's
token dimension is padded to a multiple of 16 (``pad_inner_dim``: a weight gradient's inner dimension is batch x
length, which dynamic padding leaves at any multiple of 8).

Recipes (``train.fp8_recipe``): torchao's ``tensorwise``, ``rowwise`` and ``rowwise_with_gw_hp``, and
``tensorwise_with_gw_hp``: tensorwise scales for the output and input-gradient products, the weight-gradient
product in bf16 (as torchao's ``rowwise_with_gw_hp`` does for rowwise). That product needs the input and the
output gradient transposed, which in FP8 means two more casts of activation-sized tensors per layer; in bf16 it
reads what the forward saved; it is not faster for it (docs/performance.md). Under ``model.fused_qkv`` the fused
Q/K/V product multiplies in FP8 too (one cast of the input instead of three; ``FP8FusedQKVSelfAttention``).

Two side effects: evaluation during training also runs the FP8 layers (a finetuning run's dev metrics are those
of the FP8 forward; the saved checkpoint is a plain BERT one that ``--predict`` runs in bf16), and torchao's
conversion patches Inductor's min/max code generation for the whole process.
"""

from __future__ import annotations

import dataclasses
import logging
import re

import torch
from torch import nn

from sparsebert.config.sections import FP8_LAYERS, FP8_RECIPES
from sparsebert.models.fused_qkv import FusedQKVSelfAttention

log = logging.getLogger(__name__)

ENCODER_LAYER = re.compile(r"(^|\.)encoder\.layer\.\d+\.")


def fp8_unavailable_reason() -> str | None:
    """Why this process cannot train in FP8 (no CUDA GPU, a GPU before sm89, no torchao), or None."""
    if not torch.cuda.is_available():
        return "train.precision=fp8 needs a CUDA GPU with FP8 matrix products (sm89 or later); there is none here"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        return (f"train.precision=fp8 needs FP8 matrix products (sm89 or later: Ada, Hopper); "
                f"{torch.cuda.get_device_name()} is sm{major}{minor}: use bf16")
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return "train.precision=fp8 needs torchao: pip install 'sparsebert[fp8]' (or pip install torchao)"
    return None


def is_fp8_layer(module: nn.Module, name: str) -> bool:
    """An encoder layer's nn.Linear with both sides multiples of 16."""
    return (isinstance(module, nn.Linear) and ENCODER_LAYER.search(name) is not None
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def use_fp8_matmuls(model: nn.Module, recipe: str = "tensorwise", layers: str = "encoder",
                    emulate: bool = False) -> list[str]:
    """Swap the encoder's Linear layers of ``model`` for torchao's ``Float8Linear`` in place.

    Args:
        model: the model to train (never a distillation teacher).
        recipe: torchao's scaling recipe, one of ``FP8_RECIPES`` (validated with train.fp8_recipe).
        layers: ``encoder`` (every encoder Linear) or ``auto`` (those torchao's heuristic expects to gain).
        emulate: cast to FP8 but multiply in fp32 (torchao's emulation: CPU tests; no speed).

    Returns:
        The names of the swapped layers.
    """
    from accelerate.utils.ao import convert_model_to_fp8_ao
    from torchao.float8 import _auto_filter_for_recipe
    from torchao.float8.float8_linear import Float8Linear

    if recipe not in FP8_RECIPES:
        raise ValueError(f"fp8 recipe must be one of {', '.join(FP8_RECIPES)}, got {recipe!r}")
    if layers not in FP8_LAYERS:
        raise ValueError(f"fp8 layers must be one of {', '.join(FP8_LAYERS)}, got {layers!r}")
    config = dataclasses.replace(fp8_config(recipe), emulate=emulate, pad_inner_dim=True)
    chosen = is_fp8_layer
    if layers == "auto":
        # ours has torchao's tensorwise shape rule (the forward products are the same)
        rule = {"tensorwise_with_gw_hp": "tensorwise"}.get(recipe, recipe)
        profitable = _auto_filter_for_recipe(rule, filter_fqns=[])
        chosen = lambda module, name: is_fp8_layer(module, name) and profitable(module, name)  # noqa: E731
    convert_model_to_fp8_ao(model, config=config, module_filter_func=chosen)
    swapped = [name for name, module in model.named_modules() if isinstance(module, Float8Linear)]
    fused = 0
    for module in model.modules():
        if type(module) is FusedQKVSelfAttention and all(
                isinstance(p, Float8Linear) for p in (module.query, module.key, module.value)):
            module.__class__ = FP8FusedQKVSelfAttention  # one FP8 product with the projections' shared config
            fused += 1
    log.info("train.precision=fp8 (%s scaling, %s layers): %d encoder Linear layers in FP8 (in %d attention layers "
             "Q, K and V as one FP8 product); the rest in bf16", recipe, layers, len(swapped), fused)
    return swapped


def fp8_config(recipe: str):
    """torchao's ``Float8LinearConfig`` for one of ``FP8_RECIPES``."""
    from torchao.float8 import CastConfig, Float8LinearConfig, ScalingType

    if recipe == "tensorwise_with_gw_hp":
        # torchao checks that an operand's two configs name one FP8 type, even where one is not cast: e4m3 for
        # the input, e5m2 for the output gradient (its range), as in the tensorwise recipe
        keep_input = CastConfig(scaling_type=ScalingType.DISABLED, target_dtype=torch.float8_e4m3fn)
        keep_grad = CastConfig(scaling_type=ScalingType.DISABLED, target_dtype=torch.float8_e5m2)
        return Float8LinearConfig(cast_config_input_for_grad_weight=keep_input,
                                  cast_config_grad_output_for_grad_weight=keep_grad)
    return Float8LinearConfig.from_recipe_name(recipe)


class FP8FusedQKVSelfAttention(FusedQKVSelfAttention):
    """Fused Q/K/V whose one product multiplies in FP8, as its three ``Float8Linear`` projections would (their
    recipe: the query's config; the concatenated weight takes one scale under tensorwise scaling)."""

    def project(self, hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

        if torch.is_autocast_enabled("cuda"):  # as Float8Linear.forward: the input in autocast's dtype, not the weight
            hidden_states = hidden_states.to(torch.get_autocast_dtype("cuda"))
        out = matmul_with_hp_or_float8_args.apply(hidden_states, weight.t(), self.query.linear_mm_config,
                                                  self.query.config)
        return out + bias.to(out.dtype)
