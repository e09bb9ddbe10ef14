"""Tokenizers: the package MiniLM's uncased WordPiece vocab, a local path, or a hub name; and vocab training."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from sparsebert.errors import SparseBertError
from sparsebert.io import atomic_dir
from sparsebert.results.runs import resolve_pretrained

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # BERT's, in the ids 0-4 BERT gives them


def load_tokenizer(name: str, output_root: Path | None = None) -> PreTrainedTokenizerBase:
    """``minilm``, a run or model directory, a directory written by ``--train-tokenizer``, or a hub name."""
    path = Path(name)
    is_tokenizer_dir = (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()
    source = str(path) if is_tokenizer_dir else resolve_pretrained(name, output_root, "tokenizer")
    try:
        tok = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as e:
        raise SparseBertError(f"cannot load tokenizer '{name}': {str(e).splitlines()[0]}") from None
    if not tok.is_fast:
        raise SparseBertError(f"tokenizer '{name}' has no fast (Rust) implementation; sparsebert needs one")
    return tok


def train_wordpiece(files: list[Path], fmt: str, out_dir: Path, vocab_size: int = 30522,
                    lowercase: bool = True, min_frequency: int = 2):
    """Train a BERT WordPiece vocab on a corpus with the ``tokenizers`` library; save it loadable by name.

    The result is a fast BERT tokenizer (``[PAD] [UNK] [CLS] [SEP] [MASK]``) written to ``out_dir`` with
    ``save_pretrained``: ``model.tokenizer=<out_dir>`` uses it. ``out_dir`` must be new (or an empty directory): a
    model or tokenizer directory there is never overwritten. The tokenizer is written beside it and renamed into
    place, so ``out_dir`` holds a whole tokenizer or nothing.

    Raises:
        SparseBertError: for a vocab size below the special tokens or an ``out_dir`` that is taken, before
            training.
    """
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizerFast

    from sparsebert.data.corpus import iter_documents
    from sparsebert.upstream.libraries import tokenizer_object

    out_dir = Path(out_dir)
    _check_vocab_size(vocab_size)

    def texts():
        for doc in iter_documents([str(f) for f in files], fmt):
            yield from doc["text"].split("\n")

    # entered before training: a taken or unwritable place fails at once
    with atomic_dir(out_dir, f"--train-tokenizer {out_dir}") as tmp:
        trainer = BertWordPieceTokenizer(lowercase=lowercase, strip_accents=lowercase)
        trainer.train_from_iterator(texts(), vocab_size=vocab_size, min_frequency=min_frequency,
                                    special_tokens=list(SPECIAL_TOKENS))
        tokenizer = BertTokenizerFast(tokenizer_object=tokenizer_object(trainer), do_lower_case=lowercase,
                                      unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
                                      mask_token="[MASK]")
        tokenizer.save_pretrained(str(tmp))
    return tokenizer


def _check_vocab_size(vocab_size: int) -> None:
    if vocab_size < len(SPECIAL_TOKENS):
        raise SparseBertError(f"--vocab-size {vocab_size}: need at least {len(SPECIAL_TOKENS)}, the special tokens "
                              f"{' '.join(SPECIAL_TOKENS)} (BERT's vocab has 30522)")
