"""What every ``from_pretrained`` of a model to be trained gets from the experiment's model section (which run or
directory it starts from: ``results/runs.py``)."""

from __future__ import annotations

from typing import Any

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
