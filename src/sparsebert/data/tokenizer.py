"""Tokenizers: the package MiniLM's uncased WordPiece vocab, a local path, or a hub name; and vocab training."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from sparsebert.errors import SparseBertError
from sparsebert.models.pretrained import resolve_pretrained


def load_tokenizer(name: str, output_root: Path | None = None) -> PreTrainedTokenizerBase:
    source = resolve_pretrained(name, output_root)
    try:
        tok = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as e:
        raise SparseBertError(f"cannot load tokenizer '{name}': {str(e).splitlines()[0]}") from None
    if not tok.is_fast:
        raise SparseBertError(f"tokenizer '{name}' has no fast (Rust) implementation; sparsebert needs one")
    return tok
