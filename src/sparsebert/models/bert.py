"""BertForMaskedLM from a named size or a checkpoint."""

from __future__ import annotations

from pathlib import Path

from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerBase

from sparsebert.config.sections import MODEL_SIZES, ModelConfig
from sparsebert.errors import SparseBertError
from sparsebert.models.pretrained import resolve_pretrained


def bert_config(cfg: ModelConfig, vocab_size: int, pad_token_id: int) -> BertConfig:
    layers, hidden = MODEL_SIZES[cfg.size]
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        intermediate_size=4 * hidden,
        max_position_embeddings=cfg.max_position_embeddings,
        hidden_dropout_prob=cfg.hidden_dropout,
        attention_probs_dropout_prob=cfg.attention_dropout,
        pad_token_id=pad_token_id,
    )


def build_mlm_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase, max_seq_length: int,
                    output_root: Path | None = None) -> BertForMaskedLM:
    if cfg.init_from:
        source = resolve_pretrained(cfg.init_from, output_root)
        try:
            model = BertForMaskedLM.from_pretrained(source, attn_implementation=cfg.attn_implementation)
        except OSError as e:
            raise SparseBertError(f"cannot load model '{cfg.init_from}': {str(e).splitlines()[0]}") from None
    else:
        model = BertForMaskedLM(bert_config(cfg, len(tokenizer), tokenizer.pad_token_id))
        model.config._attn_implementation = cfg.attn_implementation
    if max_seq_length > model.config.max_position_embeddings:
        raise SparseBertError(f"data.max_seq_length={max_seq_length} is beyond the model's "
                              f"{model.config.max_position_embeddings} position embeddings")
    if model.config.vocab_size < len(tokenizer):
        raise SparseBertError(f"the tokenizer has {len(tokenizer)} tokens but the model only "
                              f"{model.config.vocab_size} embeddings")
    return model
