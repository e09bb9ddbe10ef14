"""BERT self-attention with its query, key and value projections as one matrix product (``model.fused_qkv``).

Transformers computes Q, K and V with three products of the same input (hidden x hidden each). Concatenating the
three weights per step makes that one product of three times the width, which a GPU runs closer to its peak,
and in the backward one input-gradient product instead of three plus two sums. The parameters stay the three
``nn.Linear`` weights (checkpoints, state_dict keys, sparsity masks and optimizer state unchanged); the
concatenation is a copy of 3 x hidden x hidden values per layer and step, which under autocast replaces the
three casts to bf16. The sum order inside the product may differ from three separate products, so results agree
to rounding, not bit for bit.

Inductor's own ``batch_linear_lhs`` pre-grad fusion does the same for products of 2-D inputs only; BERT's
hidden states are 3-D, so it does not apply (docs/performance.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.bert import modeling_bert
from transformers.models.bert.modeling_bert import BertSelfAttention

from sparsebert.upstream.libraries import attn_implementation


class FusedQKVSelfAttention(BertSelfAttention):
    """BertSelfAttention whose Q, K and V come from one product; with a key/value cache (a decoder) it runs
    transformers' own forward."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, *args, **kwargs):
        cached = args or kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None
        if cached or self.is_decoder:
            return super().forward(hidden_states, attention_mask, *args, **kwargs)
        kwargs.pop("cache", None)  # the cache argument's name differs between transformers versions
        kwargs.pop("past_key_values", None)
        projections = (self.query, self.key, self.value)
        weight = torch.cat([p.weight for p in projections])
        bias = torch.cat([p.bias for p in projections])
        input_shape = hidden_states.shape[:-1]
        qkv = F.linear(hidden_states, weight, bias).view(*input_shape, 3, -1, self.attention_head_size)
        query, key, value = (qkv.select(-3, i).transpose(1, 2) for i in range(3))  # (batch, heads, seq, head)
        attention = modeling_bert.ALL_ATTENTION_FUNCTIONS.get_interface(
            attn_implementation(self.config), modeling_bert.eager_attention_forward)
        out, weights = attention(self, query, key, value, attention_mask,
                                 dropout=self.dropout.p if self.training else 0.0, scaling=self.scaling, **kwargs)
        return out.reshape(*input_shape, -1).contiguous(), weights


def use_fused_qkv(model: nn.Module) -> int:
    """Make every BertSelfAttention of ``model`` a :class:`FusedQKVSelfAttention` in place; returns how many.
    Attention modules whose projections lack a bias keep transformers' forward."""
    swapped = 0
    for module in model.modules():
        if type(module) is BertSelfAttention and all(
                p.bias is not None for p in (module.query, module.key, module.value)):
            module.__class__ = FusedQKVSelfAttention
            swapped += 1
    return swapped
