"""MLM pretraining data: documents -> document-level train/eval split -> packed fixed-length blocks.

Tokenization runs through :func:`sparsebert.data.featurize.featurize` (worker processes, an on-disk cache keyed
by the corpus files' content, the tokenizer and the settings), so a second run with the same corpus, tokenizer
and settings loads the blocks instead of tokenizing again. Blocks are ``[CLS] tokens... [SEP]`` of exactly
``max_seq_length`` tokens cut from the concatenated documents (``[SEP]`` between documents): no padding.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerBase

from sparsebert.config.sections import DataConfig
from sparsebert.data.corpus import corpus_files, iter_documents
from sparsebert.data.featurize import default_num_proc, featurize, files_digest, source_digest
from sparsebert.data.paths import HOW_TO_POINT
from sparsebert.errors import SparseBertError
from sparsebert.models.bert import static_prediction_rows
from sparsebert.upstream.libraries import fingerprint

log = logging.getLogger(__name__)


@dataclass
class PretrainData:
    train: Any  # datasets.Dataset with input_ids
    eval: Any  # datasets.Dataset with input_ids and fixed labels (masked once, the same at every evaluation)
    train_documents: int
    eval_documents: int


def _generate(files: tuple[str, ...], fmt: str, max_documents: int | None, contents: str,
              reader_source: str | None):
    # ``contents`` (a digest of the corpus files' bytes) and ``reader_source`` (a digest of the readers' module)
    # are unused here: they are in gen_kwargs so that the datasets cache fingerprint changes when a corpus file
    # changes, not only when its path does, and when the reader code changes (datasets hashes this function by its
    # module and name, not its code, let alone the readers' code).
    yield from iter_documents(list(files), fmt, max_documents)


def local_corpus_files(cfg: DataConfig, data_dir: Path | None) -> list[Path] | None:
    """The corpus files a local corpus is read from; None for a hub dataset."""
    if cfg.format == "hub" or data_dir is None:
        return None
    root = data_dir / cfg.corpus
    if not root.exists():
        raise SparseBertError(f"corpus '{cfg.corpus}' not found in data directory {data_dir}; {HOW_TO_POINT}")
    return corpus_files(root, cfg.max_files)


def load_documents(cfg: DataConfig, data_dir: Path | None, files: list[Path] | None = None,
                   contents: str | None = None):
    """The corpus as a ``datasets.Dataset`` of whole documents (columns id, title, text).

    Args:
        files: the corpus files (default: ``local_corpus_files``).
        contents: ``files_digest(files)`` where the caller has it (the digest reads every byte).
    """
    import datasets

    if cfg.format == "hub" or data_dir is None:
        return _load_hub_documents(cfg, data_dir)
    root = data_dir / cfg.corpus
    files = files or local_corpus_files(cfg, data_dir)
    # the documents are cached under the files' contents: size and mtime missed an edit of the same length whose
    # mtime was kept (cp -p, rsync -a, tar x), and the stale documents were then packed under the new contents' key
    contents = contents or files_digest(files)
    try:
        docs = datasets.Dataset.from_generator(
            _generate,
            # tuples, not lists: datasets treats list arguments as shards and would call the generator once
            # per file, applying max_documents per file instead of to the whole corpus
            gen_kwargs={"files": tuple(str(p) for p in files), "fmt": cfg.format,
                        "max_documents": cfg.max_documents, "contents": contents,
                        "reader_source": source_digest(iter_documents)},
        )
    except Exception as e:  # datasets wraps reader errors in DatasetGenerationError
        cause = e
        while cause is not None and not isinstance(cause, SparseBertError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise cause from None
        raise
    if len(docs) == 0:
        raise SparseBertError(f"corpus {root} holds no documents")
    return docs


def _load_hub_documents(cfg: DataConfig, data_dir: Path | None):
    import datasets

    try:
        ds = datasets.load_dataset(cfg.hub_name, cfg.hub_config, split=cfg.hub_split)
    except Exception as e:
        where = "no local data directory was found" if data_dir is None else "data.format is 'hub'"
        raise SparseBertError(f"could not load hub dataset '{cfg.hub_name}' ({where}): "
                              f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; "
                              f"{HOW_TO_POINT}") from None
    if cfg.text_column not in ds.column_names:
        raise SparseBertError(f"hub dataset '{cfg.hub_name}' has no column '{cfg.text_column}' "
                              f"(columns: {', '.join(ds.column_names)}); set data.text_column")
    if cfg.max_documents:
        ds = ds.select(range(min(cfg.max_documents, len(ds))))
    ds = ds.rename_column(cfg.text_column, "text") if cfg.text_column != "text" else ds
    return ds.select_columns(["text"])


def pack_batch(batch: dict[str, list], tokenizer: PreTrainedTokenizerBase, max_seq_length: int) -> dict:
    """Tokenize a batch of documents and cut the concatenation into full blocks (the remainder is dropped)."""
    ids = tokenizer(batch["text"], add_special_tokens=False, verbose=False)["input_ids"]
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    stream: list[int] = []
    for doc in ids:
        stream.extend(doc)
        stream.append(sep_id)
    body = max_seq_length - 2
    blocks = [[cls_id, *stream[i:i + body], sep_id] for i in range(0, len(stream) - body + 1, body)]
    return {"input_ids": blocks}


PACK_BATCH_SIZE = 256  # documents packed together: each batch's remainder (< one block) is dropped


def pack_documents(docs, tokenizer: PreTrainedTokenizerBase, max_seq_length: int, num_proc: int | None = None,
                   desc: str = "pretrain-pack", *, input_digest: str | None = None,
                   key_parts: dict[str, Any] | None = None, batch_size: int = PACK_BATCH_SIZE,
                   cache_dir: str | Path | None = None):
    """Documents -> packed blocks through the featurizer; the same for any ``num_proc``.

    ``input_digest``/``key_parts`` identify ``docs`` for the cache (e.g. the corpus files' digest and how they
    were read and split); without them the documents' content is hashed.
    """
    return featurize(docs, pack_batch, name=desc, tokenizer=tokenizer,
                     fn_kwargs={"tokenizer": tokenizer, "max_seq_length": max_seq_length},
                     input_digest=input_digest, key_parts=key_parts, num_proc=num_proc, batch_size=batch_size,
                     remove_columns=docs.column_names, cache_dir=cache_dir)


def cap_masked_tokens(inputs: torch.Tensor, labels: torch.Tensor, limit: int,
                      generator: torch.Generator | None = None) -> None:
    """Unmask randomly chosen masked positions (in place: the original token back, label -100) until at most
    ``limit`` remain."""
    masked = (labels.view(-1) != -100).nonzero().squeeze(1)
    excess = len(masked) - limit
    if excess <= 0:
        return
    drop = masked[torch.randperm(len(masked), generator=generator)[:excess]]
    inputs.view(-1)[drop] = labels.view(-1)[drop]
    labels.view(-1)[drop] = -100


@dataclass
class MLMCollator(DataCollatorForLanguageModeling):
    """BERT masking (15 %, 80/10/10) for training batches; eval batches arrive already masked.

    With ``mask_seed`` set, a batch's masks are a pure function of (mask_seed, its token ids): a run is
    reproducible whatever the global RNG does, and a resumed run masks every batch exactly like the
    uninterrupted one would (Accelerate collates one batch ahead, before the checkpoint's RNG state is saved,
    so masks drawn from the global RNG differ after a resume). Shuffling changes batch contents every epoch,
    so masks still change every epoch. Special tokens are found with one ``isin``, not a call per sequence.
    """

    mask_seed: int | None = None
    static_mask_count: bool = False  # never more masked tokens than static_prediction_rows (data.static_mask_count)

    @classmethod
    def for_data(cls, data: DataConfig, tokenizer: PreTrainedTokenizerBase,
                 mask_seed: int | None = None) -> MLMCollator:
        """The training collator of an MLM experiment's data section."""
        return cls(tokenizer, mlm_probability=data.mlm_probability, mask_seed=mask_seed,
                   static_mask_count=data.static_mask_count)

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        if "labels" in examples[0]:  # pre-masked evaluation blocks: stack as they are
            return {k: torch.tensor([ex[k] for ex in examples]) for k in ("input_ids", "labels")}
        batch = super().torch_call(examples)
        if "attention_mask" in batch and bool(batch["attention_mask"].all()):
            # packed blocks have no padding. An all-ones mask makes the eager model ask the GPU whether it is
            # all ones (a host-GPU sync every step), and a compiled model, which cannot ask, hands attention a
            # dense mask; without it attention takes its unmasked kernels, as it does for the eval blocks
            del batch["attention_mask"]
        return batch

    def torch_mask_tokens(self, inputs, special_tokens_mask=None, offset_mapping=None):
        if special_tokens_mask is None:
            special = torch.tensor(self.tokenizer.all_special_ids, dtype=inputs.dtype)
            special_tokens_mask = torch.isin(inputs, special)
        if self.mask_seed is not None:
            digest = hashlib.blake2b(inputs.numpy().tobytes(), digest_size=8,
                                     key=self.mask_seed.to_bytes(8, "little", signed=True)).digest()
            self.generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
        inputs, labels = super().torch_mask_tokens(inputs, special_tokens_mask, offset_mapping)
        if self.static_mask_count:
            cap_masked_tokens(inputs, labels, static_prediction_rows(labels.numel(), self.mlm_probability),
                              self.generator)
        return inputs, labels


def mask_batch(batch: dict[str, list], tokenizer: PreTrainedTokenizerBase, mlm_probability: float,
               seed: int) -> dict[str, list]:
    collator = MLMCollator(tokenizer, mlm_probability=mlm_probability, mask_seed=seed)
    out = collator([{"input_ids": ids} for ids in batch["input_ids"]])
    return {"input_ids": out["input_ids"].tolist(), "labels": out["labels"].tolist()}


def mask_once(blocks, tokenizer: PreTrainedTokenizerBase, mlm_probability: float, seed: int,
              num_proc: int | None = None, cache_dir: str | Path | None = None):
    """Mask evaluation blocks once, so every evaluation scores the same masked tokens."""
    return featurize(blocks, mask_batch, name="pretrain-eval-masks", tokenizer=tokenizer,
                     fn_kwargs={"tokenizer": tokenizer, "mlm_probability": mlm_probability, "seed": seed},
                     num_proc=num_proc, batch_size=512, cache_dir=cache_dir)


def build_pretrain_data(cfg: DataConfig, tokenizer: PreTrainedTokenizerBase, data_dir: Path | None,
                        seed: int, cache_dir: str | Path | None = None, mask_eval: bool = True) -> PretrainData:
    """Packed train and eval blocks; ``mask_eval``: the eval blocks masked once for MLM (else as they are)."""
    files = local_corpus_files(cfg, data_dir)
    # the input's identity: the corpus files' bytes and how they are read and split (a hub dataset: its
    # fingerprint, which names the cached hub files and every step applied to them)
    corpus = files_digest(files) if files is not None else None
    docs = load_documents(cfg, data_dir, files, contents=corpus)
    if len(docs) <= cfg.eval_documents:
        raise SparseBertError(f"the corpus has {len(docs)} documents; data.eval_documents={cfg.eval_documents} "
                              "would leave none for training")
    split = docs.train_test_split(test_size=cfg.eval_documents, seed=seed, shuffle=True)
    num_proc = default_num_proc(cfg.num_proc)
    blocks = {}
    for side, name in (("train", "pretrain-pack-train"), ("test", "pretrain-pack-eval")):
        key_parts = {"format": cfg.format, "max_documents": cfg.max_documents, "eval_documents": cfg.eval_documents,
                     "split_seed": seed, "side": side, "reader_source": source_digest(iter_documents)}
        if files is None:
            key_parts.update(hub=[cfg.hub_name, cfg.hub_config, cfg.hub_split, cfg.text_column])
        blocks[side] = pack_documents(
            split[side], tokenizer, cfg.max_seq_length, num_proc, name, key_parts=key_parts, cache_dir=cache_dir,
            input_digest=f"files:{corpus}" if corpus else f"fingerprint:{fingerprint(split[side])}")
    train, eval_blocks = blocks["train"], blocks["test"]
    if len(train) == 0 or len(eval_blocks) == 0:
        raise SparseBertError(f"the corpus is too small for blocks of {cfg.max_seq_length} tokens")
    if cfg.max_eval_samples and len(eval_blocks) > cfg.max_eval_samples:
        eval_blocks = eval_blocks.select(range(cfg.max_eval_samples))
    if mask_eval:
        eval_blocks = mask_once(eval_blocks, tokenizer, cfg.mlm_probability, seed, num_proc, cache_dir)
    log.info("pretraining data: %d train blocks from %d documents, %d eval blocks from %d held-out documents",
             len(train), len(split["train"]), len(eval_blocks), len(split["test"]))
    return PretrainData(train, eval_blocks, len(split["train"]), len(split["test"]))
