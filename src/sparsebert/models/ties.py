"""Tied weights (the MLM decoder is the word embeddings, its bias the head's bias) are stored once: loading a state
dict reports the other names as missing although their tensors were loaded."""

from __future__ import annotations

from torch import nn


def loaded_through_a_tie(model: nn.Module, missing_keys: list[str]) -> set[str]:
    """The names among ``missing_keys`` whose parameter is the same tensor as one under a name that was loaded."""
    names: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    missing = set(missing_keys)
    return {name for aliases in names.values() if not set(aliases) <= missing for name in aliases if name in missing}
