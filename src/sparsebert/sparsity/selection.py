"""Which parameters of a model are sparse."""

from __future__ import annotations

import re

from torch import nn

from .config import MLM_HEAD_PATTERN, WORD_EMBEDDINGS_PATTERN, SparsityConfig


def select_parameters(model: nn.Module, config: SparsityConfig) -> dict[str, nn.Parameter]:
    """The prunable parameters of ``model``, by name, in ``named_parameters()`` order.

    ``named_parameters()`` yields a tied tensor once (under its first name), so the MLM decoder that shares the
    word embeddings is never a second mask on the same storage. Tensors with fewer than 2 dimensions (biases,
    LayerNorm) are skipped even if a pattern matches: pruning them saves nothing and hurts accuracy.
    """
    include = [re.compile(p) for p in config.include]
    if config.include_embeddings:
        include.append(re.compile(WORD_EMBEDDINGS_PATTERN))
    if config.include_mlm_head:
        include.append(re.compile(MLM_HEAD_PATTERN))
    exclude = [re.compile(p) for p in config.exclude]

    selected = {
        name: param
        for name, param in model.named_parameters()
        if param.dim() >= 2
        and any(p.search(name) for p in include)
        and not any(p.search(name) for p in exclude)
    }
    if not selected:
        sample = ", ".join(name for name, _ in list(model.named_parameters())[:3])
        raise ValueError(
            f"sparsity.include/exclude select no weight of the model (its parameters look like: {sample}, ...)"
        )
    return selected
