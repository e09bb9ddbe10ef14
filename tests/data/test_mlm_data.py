"""MLM pretraining data on two real Wikipedia files: packing, the document-level split, fixed eval masks,
the feature cache, the training collator and the hub fallback."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
import torch

from sparsebert.config import DataConfig
from sparsebert.data.corpus import iter_documents, iter_wikiextractor
from sparsebert.data.paths import HOW_TO_POINT
from sparsebert.data.mlm_data import MLMCollator, build_pretrain_data, load_documents, mask_once, pack_batch
from sparsebert.errors import SparseBertError

CORPUS = "wikipedia-enwiki-2015-wikiextractor"
SEQ = 64
SEED = 42


def config(**overrides) -> DataConfig:
    # max_eval_samples below the ~358 eval blocks of the 5 held-out documents, so the cap is exercised too
    settings = {"max_files": 2, "eval_documents": 5, "max_seq_length": SEQ, "num_proc": 1, "max_eval_samples": 300}
    settings.update(overrides)
    return DataConfig(**settings)


@pytest.fixture(scope="module")
def wiki_dir(tmp_path_factory, data_dir) -> Path:
    """A data dir whose corpus is symlinks to the first two real Wikipedia files."""
    root = tmp_path_factory.mktemp("wiki_data")
    corpus = root / CORPUS
    corpus.mkdir()
    for name in ("wiki_00.gz", "wiki_01.gz"):
        (corpus / name).symlink_to(data_dir / CORPUS / "text" / "AA" / name)
    return root


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory):
    """A private datasets cache for this module (restored afterwards)."""
    path = tmp_path_factory.mktemp("hf_datasets")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", path)
        yield path


@pytest.fixture(scope="module")
def feature_cache(tmp_path_factory):
    """A private feature cache ($SPARSEBERT_CACHE) for this module (restored afterwards)."""
    path = tmp_path_factory.mktemp("features")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARSEBERT_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def built(hf_cache, feature_cache, wiki_dir, tokenizer):
    return build_pretrain_data(config(), tokenizer, wiki_dir, SEED)


@pytest.fixture(scope="module")
def special_ids(tokenizer) -> set[int]:
    return set(tokenizer.all_special_ids)


def unmasked(input_ids: list[int], labels: list[int]) -> list[int]:
    """The block before masking: the label where a token was chosen, else the input."""
    return [lab if lab != -100 else tok for tok, lab in zip(input_ids, labels)]


# --- pack_batch ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_texts(asset_data_dir) -> list[str]:
    # 4 real articles (0.6-2.2 KB) of the checked-in corpus slice: packing needs real text, not the whole corpus
    docs = iter_wikiextractor(asset_data_dir / CORPUS / "text" / "AA" / "wiki_00")
    return [next(docs)["text"][:3000] for _ in range(4)]


def token_stream(tokenizer, texts: list[str]) -> list[int]:
    stream: list[int] = []
    for text in texts:
        stream += tokenizer.encode(text, add_special_tokens=False)
        stream.append(tokenizer.sep_token_id)
    return stream


@pytest.mark.parametrize("max_seq_length", [16, 64, 128])
def test_pack_batch_blocks_are_full_and_lose_nothing_but_the_tail(tokenizer, real_texts, max_seq_length):
    blocks = pack_batch({"text": real_texts}, tokenizer, max_seq_length)["input_ids"]
    stream = token_stream(tokenizer, real_texts)
    body = max_seq_length - 2
    assert len(blocks) == len(stream) // body > 0
    for block in blocks:
        assert len(block) == max_seq_length
        assert block[0] == tokenizer.cls_token_id
        assert block[-1] == tokenizer.sep_token_id
        assert tokenizer.pad_token_id not in block
        assert tokenizer.cls_token_id not in block[1:]
    bodies = [tok for block in blocks for tok in block[1:-1]]
    assert bodies == stream[: len(bodies)]
    assert 0 <= len(stream) - len(bodies) < body
    # documents are separated by [SEP] inside the stream: one per document
    assert stream.count(tokenizer.sep_token_id) == len(real_texts)


def test_pack_batch_exact_fit_keeps_everything(tokenizer):
    texts = ["The quick brown fox jumps over the lazy dog.", "A second document."]
    stream = token_stream(tokenizer, texts)
    blocks = pack_batch({"text": texts}, tokenizer, len(stream) + 2)["input_ids"]
    assert blocks == [[tokenizer.cls_token_id, *stream, tokenizer.sep_token_id]]
    assert pack_batch({"text": texts}, tokenizer, len(stream) + 3)["input_ids"] == []  # one token short


# --- build_pretrain_data: the split --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def split(built, wiki_dir):
    docs = load_documents(config(), wiki_dir)
    return docs, docs.train_test_split(test_size=5, seed=SEED, shuffle=True)


def test_split_is_by_whole_document(built, split):
    docs, parts = split
    assert len(docs) == 38 + 53
    train, test = parts["train"], parts["test"]
    assert built.eval_documents == len(test) == 5
    assert built.train_documents == len(train) == len(docs) - 5
    assert set(train["id"]).isdisjoint(test["id"])
    assert set(train["title"]).isdisjoint(test["title"])
    assert set(train["id"]) | set(test["id"]) == set(docs["id"])


def test_train_blocks_are_exactly_the_training_documents(built, split, tokenizer):
    _, parts = split
    expected = pack_batch(parts["train"][:], tokenizer, SEQ)["input_ids"]
    assert built.train["input_ids"] == expected


def test_eval_blocks_come_only_from_held_out_documents(built, split, tokenizer):
    _, parts = split
    expected = pack_batch(parts["test"][:], tokenizer, SEQ)["input_ids"]
    got = [unmasked(ids, labels) for ids, labels in zip(built.eval["input_ids"], built.eval["labels"])]
    assert len(expected) > 300
    assert len(got) == 300  # data.max_eval_samples: the first blocks, in order
    assert got == expected[:300]


def test_no_eval_span_appears_in_training_blocks(built):
    """Independent of how the split is drawn: no 24-token span of an eval block is in any training block."""
    n = 24
    train_spans = {tuple(ids[i:i + n]) for ids in built.train["input_ids"] for i in range(1, len(ids) - n)}
    eval_blocks = [unmasked(ids, labels) for ids, labels in zip(built.eval["input_ids"], built.eval["labels"])]
    shared = sum(tuple(ids[i:i + n]) in train_spans for ids in eval_blocks for i in range(1, len(ids) - n, n))
    checked = sum(len(range(1, len(ids) - n, n)) for ids in eval_blocks)
    assert checked > 100
    assert shared == 0


# --- build_pretrain_data: the eval masks -----------------------------------------------------------------------


def test_eval_masks_cover_about_15_percent_and_never_special_tokens(built, tokenizer, special_ids):
    chosen = eligible = as_mask = 0
    for ids, labels in zip(built.eval["input_ids"], built.eval["labels"]):
        assert len(ids) == len(labels) == SEQ
        original = unmasked(ids, labels)
        assert original[0] == tokenizer.cls_token_id and original[-1] == tokenizer.sep_token_id
        for tok, orig, lab in zip(ids, original, labels):
            if orig in special_ids:
                assert lab == -100 and tok == orig, "a special token was masked"
                continue
            eligible += 1
            if lab != -100:
                chosen += 1
                as_mask += tok == tokenizer.mask_token_id
            else:
                assert tok != tokenizer.mask_token_id
    assert eligible > 10_000
    assert 0.10 <= chosen / eligible <= 0.20
    assert 0.7 <= as_mask / chosen <= 0.9


def test_eval_labels_are_fixed_across_builds(built, wiki_dir, tokenizer, tmp_path):
    with pytest.MonkeyPatch.context() as mp:  # fresh caches: the masks are recomputed, not reloaded
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "other_cache")
        mp.setenv("SPARSEBERT_CACHE", str(tmp_path / "other_features"))
        again = build_pretrain_data(config(), tokenizer, wiki_dir, SEED)
    assert again.eval.cache_files[0]["filename"] != built.eval.cache_files[0]["filename"]
    assert again.eval["input_ids"] == built.eval["input_ids"]
    assert again.eval["labels"] == built.eval["labels"]
    assert again.train["input_ids"] == built.train["input_ids"]


def test_mask_once_is_a_function_of_the_seed(built, tokenizer):
    blocks = built.train.select(range(32))
    a = mask_once(blocks, tokenizer, 0.15, seed=1)
    b = mask_once(blocks, tokenizer, 0.15, seed=1)
    c = mask_once(blocks, tokenizer, 0.15, seed=2)
    assert a["labels"] == b["labels"] and a["input_ids"] == b["input_ids"]
    assert a["labels"] != c["labels"]


# --- the caches ----------------------------------------------------------------------------------------------


def arrow_files(*roots: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for root in roots for p in root.rglob("*.arrow")}


def test_second_build_reuses_the_cache(built, hf_cache, feature_cache, wiki_dir, tokenizer):
    before = arrow_files(hf_cache, feature_cache)
    again = build_pretrain_data(config(), tokenizer, wiki_dir, SEED)
    assert again.train._fingerprint == built.train._fingerprint
    assert again.eval._fingerprint == built.eval._fingerprint
    assert again.train.cache_files == built.train.cache_files
    assert again.train.cache_files and Path(again.train.cache_files[0]["filename"]).is_relative_to(feature_cache)
    assert arrow_files(hf_cache, feature_cache) == before, "the second build wrote or rewrote cache files"


def test_other_max_seq_length_is_another_cache_entry(built, hf_cache, wiki_dir, tokenizer):
    other = build_pretrain_data(config(max_seq_length=32), tokenizer, wiki_dir, SEED)
    assert other.train._fingerprint != built.train._fingerprint
    assert other.train.cache_files != built.train.cache_files
    assert {len(ids) for ids in other.train["input_ids"][:50]} == {32}


def _text_corpus(tmp_path: Path, text: str) -> tuple[Path, DataConfig]:
    """A one-file plain-text corpus under ``tmp_path/data`` and the data section that reads it."""
    corpus = tmp_path / "data" / "corpus.txt"
    corpus.parent.mkdir()
    corpus.write_text(text)
    return corpus, DataConfig(corpus="corpus.txt", format="text")


def test_changed_corpus_file_is_read_again(hf_cache, tmp_path):
    corpus, cfg = _text_corpus(tmp_path, "first document\n\nsecond document\n")
    assert load_documents(cfg, tmp_path / "data")["text"] == ["first document", "second document"]
    corpus.write_text("a changed document, longer than before\n")
    assert load_documents(cfg, tmp_path / "data")["text"] == ["a changed document, longer than before"]


def test_an_edit_of_the_same_length_with_its_mtime_kept_is_read_again(hf_cache, tmp_path):
    """cp -p, rsync -a and tar x keep a file's mtime: the document cache follows the bytes, not size and mtime."""
    import os

    corpus, cfg = _text_corpus(tmp_path, "alpha document\n\nsecond document\n")
    assert load_documents(cfg, tmp_path / "data")["text"] == ["alpha document", "second document"]
    stat = corpus.stat()
    corpus.write_text("omega document\n\nsecond document\n")
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert corpus.stat().st_size == stat.st_size and corpus.stat().st_mtime_ns == stat.st_mtime_ns
    assert load_documents(cfg, tmp_path / "data")["text"] == ["omega document", "second document"]


def test_edited_reader_reads_the_corpus_again(hf_cache, tmp_path, monkeypatch):
    """The document cache follows the reader code (corpus.py), as the packing cache key does: an edit of the
    readers is simulated by another reader and another digest of the readers' source."""
    import sparsebert.data.corpus
    import sparsebert.data.mlm_data

    _, cfg = _text_corpus(tmp_path, "first document\n\nsecond document\n")
    assert load_documents(cfg, tmp_path / "data")["text"] == ["first document", "second document"]

    def shouting(path):
        for doc in sparsebert.data.corpus.iter_plain_text(path):
            yield {**doc, "text": doc["text"].upper()}

    monkeypatch.setitem(sparsebert.data.corpus.READERS, "text", shouting)
    real_digest = sparsebert.data.mlm_data.source_digest
    monkeypatch.setattr(sparsebert.data.mlm_data, "source_digest",
                        lambda fn: f"edited {real_digest(fn)}" if fn is iter_documents else real_digest(fn))
    assert load_documents(cfg, tmp_path / "data")["text"] == ["FIRST DOCUMENT", "SECOND DOCUMENT"]


# --- errors --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 5, 40])
def test_max_documents_limits_the_whole_corpus(hf_cache, wiki_dir, limit):
    """data.max_documents counts documents across all corpus files, in file order."""
    docs = load_documents(config(max_documents=limit), wiki_dir)
    first = [d["id"] for d in iter_wikiextractor(wiki_dir / CORPUS / "wiki_00.gz")]
    first += [d["id"] for d in iter_wikiextractor(wiki_dir / CORPUS / "wiki_01.gz")]
    assert list(docs["id"]) == first[:limit]


def test_too_few_documents_for_the_eval_split(hf_cache, wiki_dir, tokenizer):
    with pytest.raises(SparseBertError, match="eval_documents"):
        build_pretrain_data(config(max_documents=5), tokenizer, wiki_dir, SEED)


def test_missing_corpus_in_data_dir_says_how_to_point(hf_cache, tmp_path):
    with pytest.raises(SparseBertError) as e:
        load_documents(config(corpus="no_such_corpus"), tmp_path)
    assert "no_such_corpus" in str(e.value) and HOW_TO_POINT in str(e.value)


def test_corrupt_corpus_file_surfaces_as_one_error(hf_cache, tmp_path):
    bad = tmp_path / CORPUS / "wiki_00.gz"
    bad.parent.mkdir()
    bad.write_bytes(b"\x1f\x8b" + b"not really gzip" * 20)
    with pytest.raises(SparseBertError) as e:
        load_documents(config(), tmp_path)
    assert str(bad) in str(e.value)


def test_hub_fallback_offline_says_how_to_point_at_local_data(hf_cache, tmp_path, monkeypatch):
    """No data directory and no hub (offline, an empty hub cache): one line naming the dataset and the two ways
    to point at local data."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(SparseBertError) as e:
        load_documents(DataConfig(), None)
    out = str(e.value)
    assert "wikimedia/wikipedia" in out
    assert "--data-dir" in out and "SPARSEBERT_DATA" in out
    assert "\n" not in out


# --- MLMCollator ---------------------------------------------------------------------------------------------


def test_collator_masks_like_bert(built, tokenizer, special_ids):
    collator = MLMCollator(tokenizer, mlm_probability=0.15, seed=0)
    blocks = built.train["input_ids"][:256]
    chosen = as_mask = kept = eligible = 0
    for start in range(0, len(blocks), 64):
        originals = torch.tensor(blocks[start:start + 64])
        batch = collator([{"input_ids": ids} for ids in blocks[start:start + 64]])
        inputs, labels = batch["input_ids"], batch["labels"]
        assert inputs.shape == labels.shape == originals.shape == (64, SEQ)
        special = torch.isin(originals, torch.tensor(sorted(special_ids)))
        assert (labels[special] == -100).all(), "a special token was chosen for masking"
        assert (inputs[special] == originals[special]).all()
        picked = labels != -100
        assert (labels[picked] == originals[picked]).all()
        assert (inputs[~picked] == originals[~picked]).all()
        eligible += int((~special).sum())
        chosen += int(picked.sum())
        as_mask += int((inputs[picked] == tokenizer.mask_token_id).sum())
        kept += int((inputs[picked] == originals[picked]).sum())
    assert 0.12 <= chosen / eligible <= 0.18
    assert 0.7 <= as_mask / chosen <= 0.9
    assert 0.04 <= kept / chosen <= 0.17  # the 10 % left unchanged (plus rare random draws of the same token)
    random = chosen - as_mask - kept
    assert 0.04 <= random / chosen <= 0.17


def test_collator_passes_premasked_eval_examples_through(built, tokenizer):
    collator = MLMCollator(tokenizer, mlm_probability=0.15, seed=0)
    examples = [built.eval[i] for i in range(8)]
    batch = collator(examples)
    assert torch.equal(batch["input_ids"], torch.tensor([ex["input_ids"] for ex in examples]))
    assert torch.equal(batch["labels"], torch.tensor([ex["labels"] for ex in examples]))
