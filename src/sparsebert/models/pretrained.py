"""What every ``from_pretrained`` of a model to be trained gets from the experiment's model section (which run or
directory it starts from: ``results/runs.py``)."""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

import transformers.modeling_utils

from sparsebert.config.sections import ModelConfig


def config_overrides(cfg: ModelConfig) -> dict[str, Any]:
    """The checkpoint config values an experiment overrides: its dropouts and its layer count (unset: the
    checkpoint's own). ``num_hidden_layers`` below the checkpoint's keeps its first layers' weights."""
    out: dict[str, Any] = {}
    if cfg.hidden_dropout is not None:
        out["hidden_dropout_prob"] = cfg.hidden_dropout
    if cfg.attention_dropout is not None:
        out["attention_probs_dropout_prob"] = cfg.attention_dropout
    if cfg.num_layers is not None:
        out["num_hidden_layers"] = cfg.num_layers
    return out


def pretrained_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    """What every ``from_pretrained`` of a model to be trained gets from the experiment's model section."""
    return {"attn_implementation": cfg.attn_implementation, **config_overrides(cfg)}


# -- the load report of a layer cut ---------------------------------------------------------------------------------

log = logging.getLogger(__name__)
_LAYER_KEY = re.compile(r"(?:^|\.)encoder\.layer\.(\d+)\.")


def layers_cut(unexpected_keys: set[str], kept: int) -> tuple[set[str], int]:
    """Split a load's unexpected checkpoint keys into those of the encoder layers beyond the model's ``kept`` ones
    (a ``num_hidden_layers`` below the checkpoint's: intended) and the rest.

    Args:
        unexpected_keys: the checkpoint keys the model has no parameter for.
        kept: the model's layer count.
    Returns:
        (the other unexpected keys, the checkpoint's layer count as far as the keys show it; ``kept`` without a cut).
    """
    others, layers = set(), kept
    for key in unexpected_keys:
        match = _LAYER_KEY.search(key)
        if match and int(match.group(1)) >= kept:
            layers = max(layers, int(match.group(1)) + 1)
        else:
            others.add(key)
    return others, layers


def _report_layer_cut(model, pretrained_model_name_or_path, ignore_mismatched_sizes, loading_info, logger=None):
    """transformers' load report, with the keys of the layers an experiment cut (``model.num_layers``) in one line
    instead of one table row per tensor name; other unexpected or missing keys are reported as before."""
    kept = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if isinstance(kept, int):
        others, layers = layers_cut(loading_info.unexpected_keys, kept)
        if layers > kept:
            log.info("%s: the first %d of its %d layers kept (num_hidden_layers=%d)", pretrained_model_name_or_path,
                     kept, layers, kept)
            loading_info = dataclasses.replace(loading_info, unexpected_keys=others)  # the caller's stays whole
    _original_report(model, pretrained_model_name_or_path, ignore_mismatched_sizes, loading_info, logger)


# from_pretrained reports through this module global of transformers.modeling_utils: wrapped once, on import (every
# load of a model to be trained imports this module first)
if getattr(transformers.modeling_utils.log_state_dict_report, "__wrapped__", None) is None:
    _original_report = transformers.modeling_utils.log_state_dict_report
    _report_layer_cut.__wrapped__ = _original_report
    transformers.modeling_utils.log_state_dict_report = _report_layer_cut
else:  # a re-import (importlib.reload): keep the first wrapper's original
    _original_report = transformers.modeling_utils.log_state_dict_report.__wrapped__
