"""GAP classifiers on a BERT encoder: pronoun → A / B / NEITHER from the mention token states.

Heads:
- ``concat``: linear layer over [h_P; h_A; h_B] (first token of each mention) → 3 logits.
- ``mul``: q = W h_P; logits = (q·h_A, q·h_B, q·n) / sqrt(hidden) with a learned NEITHER vector n.
- ``segment``: token_type_ids mark the pronoun (1), A (2) and B (3); the encoder's token-type table is
  enlarged to 4 rows, all initialized from row 0 (so at step 0 the encoder sees exactly what it saw in
  pretraining for single-segment input and only learns the markers); classify from the [CLS] state.

The module is a plain ``nn.Module`` whose parameters share no storage, so the HF Trainer can save its
state dict with safetensors; its ``forward`` takes the ``featurize_gap`` columns by name. A run saves that state dict
alone; an export adds a config naming the head (:func:`exported_config`), which :meth:`GapClassifier.from_config`
builds the model from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

from sparsebert.errors import SparseBertError

HEADS = ("concat", "mul", "segment")
SEGMENT_TYPE_VOCAB = 4  # 0 = other, 1 = pronoun, 2 = A, 3 = B


def _enlarge_token_types(encoder: PreTrainedModel) -> None:
    """Give the encoder a 4-row token-type table, every row a copy of the old row 0 (idempotent)."""
    emb = encoder.embeddings.token_type_embeddings
    if emb.num_embeddings == SEGMENT_TYPE_VOCAB:
        return
    new = nn.Embedding(
        SEGMENT_TYPE_VOCAB, emb.embedding_dim, device=emb.weight.device, dtype=emb.weight.dtype
    )
    with torch.no_grad():
        # clone → a fresh contiguous tensor, no storage shared with the old table
        new.weight.copy_(emb.weight[0].detach().clone().expand(SEGMENT_TYPE_VOCAB, -1))
    encoder.embeddings.token_type_embeddings = new
    encoder.config.type_vocab_size = SEGMENT_TYPE_VOCAB  # so a saved config reloads with the 4-row table


class GapClassifier(nn.Module):
    def __init__(self, encoder: PreTrainedModel, head: str, dropout: float = 0.1) -> None:
        super().__init__()
        if head not in HEADS:
            raise SparseBertError(f"GapClassifier: unknown head {head!r}; choose one of {', '.join(HEADS)}")
        if not hasattr(encoder, "embeddings") or not hasattr(encoder.embeddings, "token_type_embeddings"):
            raise SparseBertError(
                "GapClassifier: the encoder must be a BertModel-like model with token types"
            )
        if getattr(encoder, "pooler", None) is not None:
            # no head reads the pooled [CLS] vector: an unused pooler would stall DistributedDataParallel,
            # which here runs with find_unused_parameters=False (train.ddp)
            encoder.pooler = None
        self.encoder = encoder
        self.head = head
        self.config = encoder.config  # lets the runner save the encoder config next to the state dict
        hidden = encoder.config.hidden_size
        self.dropout = nn.Dropout(dropout)
        if head == "concat":
            self.classifier = nn.Linear(3 * hidden, 3)
        elif head == "mul":
            self.query = nn.Linear(hidden, hidden)
            self.neither = nn.Parameter(torch.randn(hidden) * encoder.config.initializer_range)
        else:
            _enlarge_token_types(encoder)
            self.classifier = nn.Linear(hidden, 3)

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> GapClassifier:
        """A classifier with fresh weights, shaped by an exported config: the encoder's config with the head in
        ``gap_head`` (see :func:`exported_config`)."""
        head = getattr(config, "gap_head", None)
        if head not in HEADS:
            raise SparseBertError(f"GapClassifier: the config names no GAP head (gap_head={head!r}; one of "
                                  f"{', '.join(HEADS)})")
        return cls(AutoModel.from_config(config), head)

    @classmethod
    def from_pretrained_encoder(cls, path_or_name: str, head: str, encoder_kwargs: dict | None = None,
                                **kw) -> GapClassifier:
        """Load the encoder with ``AutoModel.from_pretrained(path_or_name, **encoder_kwargs)``; ``kw`` go to
        ``__init__``."""
        return cls(AutoModel.from_pretrained(path_or_name, **(encoder_kwargs or {})), head, **kw)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor,
        p_idx: torch.Tensor,
        a_idx: torch.Tensor,
        b_idx: torch.Tensor,
        labels: torch.Tensor | None = None,
    ) -> SequenceClassifierOutput:
        states = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state  # (B, T, H)
        rows = torch.arange(states.size(0), device=states.device)
        if self.head == "segment":
            logits = self.classifier(self.dropout(states[:, 0]))
        else:
            h_p, h_a, h_b = (self.dropout(states[rows, idx.long()]) for idx in (p_idx, a_idx, b_idx))
            if self.head == "concat":
                logits = self.classifier(torch.cat([h_p, h_a, h_b], dim=-1))
            else:
                q = self.query(h_p)
                others = torch.stack([h_a, h_b, self.neither.expand_as(h_a)], dim=1)  # (B, 3, H)
                logits = torch.einsum("bh,bkh->bk", q, others) / math.sqrt(q.size(-1))
        loss = nn.functional.cross_entropy(logits, labels.long()) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


def encoder_config(state: Mapping[str, torch.Tensor], encoder_source: str) -> PretrainedConfig:
    """The encoder config of a GAP model's saved weights ``state``: the config of ``encoder_source`` (the model the
    run started from; a run's ``model/`` holds only the state dict) with as many layers as the weights have (a run
    with ``model.num_layers`` kept fewer)."""
    try:
        config = AutoConfig.from_pretrained(encoder_source)
    except (OSError, ValueError) as e:
        raise SparseBertError(f"cannot load the config of {encoder_source}, the encoder the GAP run started "
                              f"from: {str(e).splitlines()[0]}") from None
    layers = {k.split(".")[3] for k in state if k.startswith("encoder.encoder.layer.")}
    if layers:  # (BERT-style names; other encoders keep their config's count)
        config.num_hidden_layers = len(layers)
    return config


def exported_config(state: Mapping[str, torch.Tensor], encoder_source: str, head: str) -> PretrainedConfig:
    """The config an export of a GAP run carries, so that it loads without the run: the encoder's, naming
    ``GapClassifier`` as its architecture and the head in ``gap_head`` (:meth:`GapClassifier.from_config`)."""
    config = encoder_config(state, encoder_source)
    config.architectures = [GapClassifier.__name__]
    config.gap_head = head
    if head == "segment":
        config.type_vocab_size = SEGMENT_TYPE_VOCAB
    return config
