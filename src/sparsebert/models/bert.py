"""BertForMaskedLM from a named size or a checkpoint, with the vocabulary projection at masked positions only."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerBase
from transformers.modeling_outputs import MaskedLMOutput

from sparsebert.config.sections import MODEL_SIZES, DataConfig, ModelConfig
from sparsebert.errors import SparseBertError
from sparsebert.models.pretrained import config_overrides
from sparsebert.results.runs import resolve_pretrained
from sparsebert.upstream.libraries import set_attn_implementation


def static_prediction_rows(num_tokens: int, mlm_probability: float) -> int:
    """Decoder rows per training batch under ``data.static_mask_count``: the expected number of masked tokens
    plus 8 standard deviations, rounded up to a multiple of 64 (at most every token). A batch masks more only
    with probability < 1e-15, and MLMCollator caps it there."""
    mean = num_tokens * mlm_probability
    spread = math.sqrt(num_tokens * mlm_probability * (1 - mlm_probability))
    return min(num_tokens, math.ceil((mean + 8 * spread) / 64) * 64)


class BertForMaskedLMAtMasked(BertForMaskedLM):
    """BERT MLM whose decoder runs only where a label is set (about 15 % of the tokens).

    The vocabulary projection (hidden x 30522) is the largest matrix product of a small BERT; computing it at
    every position wastes about 85 % of it. With labels, ``logits`` holds one row per masked token, in the
    row-major order of ``labels != -100``, and the loss equals ``BertForMaskedLM``'s. Without labels the model
    behaves exactly like ``BertForMaskedLM``. Weights and checkpoints are interchangeable with it.

    With ``static_mlm_probability`` set (``data.static_mask_count``), a training forward computes the decoder on a
    fixed number of rows (:func:`static_prediction_rows` of the batch's token count): the masked positions in the
    same order, then unmasked filler rows whose label is ignored. The loss is the same, and nothing in the step
    has a data-dependent shape, so ``torch.compile`` makes one graph of it and CUDA graphs can replay it.
    Evaluation keeps the exact path.
    """

    static_mlm_probability: float | None = None

    def _uses_bert_model(self, input_ids, attention_mask, kwargs) -> bool:
        """Whether the inputs need BertModel's own forward (a mask, a decoder, embeddings given)."""
        return attention_mask is not None or self.config.is_decoder or input_ids is None \
            or kwargs.get("inputs_embeds") is not None

    def encode(self, input_ids, attention_mask=None, token_type_ids=None, **kwargs) -> torch.Tensor:
        """The encoder's last hidden state. Without an attention mask (packed blocks have no padding) the layers
        get no mask at all, so attention runs its unmasked fused kernel. BertModel would build one: under
        torch.compile, transformers 5.17 cannot tell while tracing that no mask means no padding and hands
        attention an all-true 4-D mask, for which sdpa falls back to its unfused math kernels
        (docs/performance.md)."""
        if self._uses_bert_model(input_ids, attention_mask, kwargs):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                             **kwargs).last_hidden_state
        embedded = self.bert.embeddings(input_ids=input_ids, token_type_ids=token_type_ids,
                                        position_ids=kwargs.get("position_ids"))
        return self.bert.encoder(embedded, attention_mask=None, **kwargs).last_hidden_state

    def encode_layers(self, input_ids, attention_mask=None, token_type_ids=None,
                      **kwargs) -> tuple[torch.Tensor, ...]:
        """Like ``encode``, but the embeddings' output and every layer's, as BertModel's ``hidden_states``."""
        if self._uses_bert_model(input_ids, attention_mask, kwargs):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                             output_hidden_states=True, **kwargs).hidden_states
        states = [self.bert.embeddings(input_ids=input_ids, token_type_ids=token_type_ids,
                                       position_ids=kwargs.get("position_ids"))]
        for layer in self.bert.encoder.layer:  # BertEncoder's loop, keeping each layer's output
            states.append(layer(states[-1], None, **kwargs))
        return tuple(states)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                num_items_in_batch=None, output_hidden_states=None, **kwargs):
        if labels is None:
            if output_hidden_states is not None:
                kwargs["output_hidden_states"] = output_hidden_states
            return super().forward(input_ids=input_ids, attention_mask=attention_mask,
                                   token_type_ids=token_type_ids, **kwargs)
        states = None  # the layers' outputs for kd.hidden_weight, else only the last
        if output_hidden_states:
            states = self.encode_layers(input_ids, attention_mask, token_type_ids, **kwargs)
            hidden = states[-1]
        else:
            hidden = self.encode(input_ids, attention_mask, token_type_ids, **kwargs)
        if self.training and self.static_mlm_probability is not None:
            flat = labels.reshape(-1)
            rows = static_prediction_rows(flat.numel(), self.static_mlm_probability)
            # masked positions first, in row-major order (a stable sort of "is unmasked"), then filler rows
            order = torch.argsort((flat == -100).to(torch.int8), stable=True)[:rows]
            selected = hidden.reshape(-1, hidden.size(-1)).index_select(0, order)
            targets = flat.index_select(0, order)  # -100 on filler rows: cross_entropy ignores them
        else:
            masked = labels != -100
            selected, targets = hidden[masked], labels[masked]
        logits = self.cls(selected)
        if num_items_in_batch is None:
            loss = F.cross_entropy(logits.float(), targets)
        else:
            # the Trainer's convention: sum over this micro-batch / masked tokens of the whole optimizer step
            # (all micro-batches and processes), so accumulation and DDP weight every token equally
            loss = F.cross_entropy(logits.float(), targets, reduction="sum") / num_items_in_batch
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=states)


def scatter_masked_predictions(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Argmax predictions laid out like ``labels`` (-100 where nothing was predicted).

    Eval gathers only these token ids, not vocabulary-sized logits, and keeps the (batch, seq) shape the
    Trainer expects when it concatenates batches and gathers across processes.
    """
    preds = torch.full_like(labels, -100)
    if logits.dim() == 2:  # BertForMaskedLMAtMasked: one row per masked token
        preds[labels != -100] = logits.argmax(dim=-1)
    else:
        preds = logits.argmax(dim=-1)
    return preds


def bert_config(cfg: ModelConfig, vocab_size: int, pad_token_id: int) -> BertConfig:
    layers, hidden = MODEL_SIZES[cfg.size]
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        intermediate_size=4 * hidden,
        max_position_embeddings=cfg.max_position_embeddings,
        hidden_dropout_prob=0.1 if cfg.hidden_dropout is None else cfg.hidden_dropout,
        attention_probs_dropout_prob=0.1 if cfg.attention_dropout is None else cfg.attention_dropout,
        pad_token_id=pad_token_id,
    )


def load_mlm_model(source: str, attn_implementation: str = "sdpa", **config_overrides) -> BertForMaskedLMAtMasked:
    try:
        return BertForMaskedLMAtMasked.from_pretrained(source, attn_implementation=attn_implementation,
                                                       **config_overrides)
    except OSError as e:
        raise SparseBertError(f"cannot load model '{source}': {str(e).splitlines()[0]}") from None


def build_mlm_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase, data: DataConfig,
                    output_root: Path | None = None) -> BertForMaskedLMAtMasked:
    """The model an MLM experiment trains: from ``model.init_from`` or a named size, checked against the
    data's sequence length and the tokenizer, with the static decoder rows of ``data.static_mask_count``."""
    if cfg.init_from:
        model = load_mlm_model(resolve_pretrained(cfg.init_from, output_root, "model.init_from"), cfg.attn_implementation,
                               **config_overrides(cfg))
    else:
        model = BertForMaskedLMAtMasked(bert_config(cfg, len(tokenizer), tokenizer.pad_token_id))
        set_attn_implementation(model.config, cfg.attn_implementation)
    if data.max_seq_length > model.config.max_position_embeddings:
        raise SparseBertError(f"data.max_seq_length={data.max_seq_length} is beyond the model's "
                              f"{model.config.max_position_embeddings} position embeddings")
    if model.config.vocab_size < len(tokenizer):
        raise SparseBertError(f"the tokenizer has {len(tokenizer)} tokens but the model only "
                              f"{model.config.vocab_size} embeddings")
    if data.static_mask_count:
        model.static_mlm_probability = data.mlm_probability
    return model
