"""BERT self-attention with its query, key and value projections as one matrix product (``model.fused_qkv``).

Transformers computes Q, K and V with three products of the same input (hidden x hidden each). Concatenating the
three weights per step makes that one product of three times the width, which a GPU runs closer to its peak,
and in the backward one input-gradient product instead of three plus two sums. The parameters stay the three
``nn.Linear`` weights (checkpoints, state_dict keys, sparsity masks and optimizer state unchanged); the
concatenation is a copy of 3 x hidden x hidden values per layer and step, which Inductor fuses with the casts to
bf16 that autocast makes of the three weights anyway. The sum order inside the product may differ from three
separate products, so results agree to rounding, not bit for bit.

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
    """BertSelfAttention whose Q, K and V come from one product. Only for encoders (``use_fused_qkv`` leaves
    decoders, which keep a key/value cache, as they are)."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        # an encoder's cache is always None; the argument's name differs between transformers versions
        kwargs.pop("cache", None)
        kwargs.pop("past_key_values", None)
        projections = (self.query, self.key, self.value)
        weight = torch.cat([p.weight for p in projections])
        bias = torch.cat([p.bias for p in projections])
        input_shape = hidden_states.shape[:-1]
        qkv = self.project(hidden_states, weight, bias).view(*input_shape, 3, -1, self.attention_head_size)
        query, key, value = (qkv.select(-3, i).transpose(1, 2) for i in range(3))  # (batch, heads, seq, head)
        attention = modeling_bert.ALL_ATTENTION_FUNCTIONS.get_interface(
            attn_implementation(self.config), modeling_bert.eager_attention_forward)
        out, weights = attention(self, query, key, value, attention_mask,
                                 dropout=self.dropout.p if self.training else 0.0, scaling=self.scaling, **kwargs)
        return out.reshape(*input_shape, -1).contiguous(), weights

    def project(self, hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """The one product of the concatenated weights (the FP8 subclass, models/fp8.py, multiplies in FP8)."""
        return F.linear(hidden_states, weight, bias)


def use_fused_qkv(model: nn.Module) -> int:
    """Make every encoder BertSelfAttention of ``model`` a :class:`FusedQKVSelfAttention` in place; returns how
    many. Left as they are: decoders (a key/value cache), projections without a bias, and projections that are
    not plain ``nn.Linear`` (a 2:4 kernel export), whose forward the fused product would bypass. Forward hooks
    on the three projections are bypassed too: register them before fusing only on purpose."""
    swapped = 0
    for module in model.modules():
        projections = (getattr(module, "query", None), getattr(module, "key", None), getattr(module, "value", None))
        if type(module) is BertSelfAttention and not module.is_decoder and all(
                type(p) is nn.Linear and p.bias is not None for p in projections):
            module.__class__ = FusedQKVSelfAttention
            swapped += 1
    return swapped
