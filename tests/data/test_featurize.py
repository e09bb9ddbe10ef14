"""The featurizer on real data slices: parallel output identical to serial for every task, cache hits and
misses, interrupted and corrupt caches.

Batches are made small (``DEFAULT_BATCH_SIZE`` patched to 64) so that every slice spans several batches and
``num_proc=2`` really runs worker processes over several shards.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import random
import signal
import time
from pathlib import Path

import datasets
import multiprocess
import pytest
from transformers import AutoTokenizer

import sparsebert.data.featurize as fz
import sparsebert.io
from sparsebert.config import DataConfig
from sparsebert.data.csv_task import CsvTaskConfig, build_csv_datasets
from sparsebert.data.featurize import (
    dataset_digest,
    featurize,
    file_digest,
    files_digest,
    shard_bounds,
    tokenizer_digest,
)
from sparsebert.data.gap import featurize_gap, gap_features, read_gap
from sparsebert.data.glue import encode_glue_batch, featurize_glue, load_glue
from sparsebert.data.mlm_data import (
    build_pretrain_data,
    load_documents,
    mask_once,
    pack_batch,
    pack_documents,
)
from sparsebert.data.squad import prepare_train_features, read_squad
from sparsebert.jobs.finetune.squad import squad_features

CORPUS = "wikipedia-enwiki-2015-wikiextractor"
BATCH = 64


@pytest.fixture(autouse=True)
def small_batches(monkeypatch):
    monkeypatch.setattr(fz, "DEFAULT_BATCH_SIZE", BATCH)


@pytest.fixture(scope="module", autouse=True)
def private_hf_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_datasets"))
        yield


@pytest.fixture(scope="module")
def wiki_dir(tmp_path_factory, data_dir) -> Path:
    """A data dir whose corpus is symlinks to the first two real Wikipedia files."""
    root = tmp_path_factory.mktemp("wiki")
    (root / CORPUS).mkdir()
    for name in ("wiki_00.gz", "wiki_01.gz"):
        (root / CORPUS / name).symlink_to(data_dir / CORPUS / "text" / "AA" / name)
    return root


@pytest.fixture(scope="module")
def docs(wiki_dir):
    return load_documents(DataConfig(max_files=2), wiki_dir)


@pytest.fixture(scope="module")
def squad_examples(data_dir) -> list[dict]:
    return read_squad(data_dir / "squad" / "dev-v1.1.json")[:300]


@pytest.fixture(scope="module")
def gap_examples(data_dir):
    return read_gap(data_dir / "gap" / "gap-development.tsv")[:200]


@pytest.fixture(scope="module")
def rte(data_dir):
    return load_glue("rte", data_dir)


def entries(cache: Path) -> dict[str, int]:
    """Trusted cache entries -> their manifest's mtime (a rewrite changes it)."""
    return {p.parent.name: p.stat().st_mtime_ns for p in cache.glob("*/manifest.json")}


def assert_same(a: datasets.Dataset, b: datasets.Dataset) -> None:
    assert a.features == b.features
    assert len(a) == len(b) > 0
    assert a[:] == b[:]


def shards_of(ds: datasets.Dataset) -> int:
    return len({f["filename"] for f in ds.cache_files})


# --- helpers ---------------------------------------------------------------------------------------------------


def test_shard_bounds_fall_on_batch_boundaries():
    assert shard_bounds(0, 64, 4) == [(0, 0)]
    assert shard_bounds(10, 64, 4) == [(0, 10)]
    for n, batch, shards in [(1000, 64, 2), (1000, 64, 7), (129, 64, 16), (640, 64, 10), (5, 1, 3)]:
        bounds = shard_bounds(n, batch, shards)
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a < b for a, b in bounds) and all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
        assert all(a % batch == 0 for a, _ in bounds)
        assert len(bounds) == min(shards, -(-n // batch))


def test_digests(tmp_path, data_dir, tokenizer, minilm_path):
    path = data_dir / CORPUS / "text" / "AA" / "wiki_00.gz"
    assert file_digest(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("one")
    b.write_text("two")
    assert files_digest([a, b]) != files_digest([b, a]) != files_digest([a])
    rows = datasets.Dataset.from_dict({"ids": [[1, 2], [3], [], [4, 5, 6]], "text": ["a", "b", None, "d"]})
    pieces = datasets.concatenate_datasets([rows.select(range(1)), rows.select(range(1, 4))])
    assert dataset_digest(rows) == dataset_digest(pieces) == dataset_digest(rows.map(lambda b: b, batched=True))
    assert dataset_digest(rows.select(range(2))) != dataset_digest(rows.select(range(1, 3)))
    assert dataset_digest(rows.select([1, 0])) != dataset_digest(rows.select([0, 1]))
    before = tokenizer_digest(tokenizer)
    tokenizer(["some text"], truncation=True, max_length=3, padding="max_length")  # leaves per-call state
    assert tokenizer_digest(tokenizer) == before
    assert tokenizer_digest(AutoTokenizer.from_pretrained(minilm_path)) == before


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARSEBERT_CACHE", str(tmp_path / "env"))
    assert fz.cache_root() == tmp_path / "env"
    assert fz.cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("SPARSEBERT_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert fz.cache_root() == tmp_path / "home" / ".cache" / "sparsebert" / "features"


# --- parallel == serial, every task ------------------------------------------------------------------------


def pretraining(num_proc, cache, docs, tokenizer, **_):
    split = docs.train_test_split(test_size=5, seed=42)
    blocks = pack_documents(split["train"], tokenizer, 64, num_proc, batch_size=8, cache_dir=cache)
    return {"blocks": blocks, "masked": mask_once(blocks, tokenizer, 0.15, 42, num_proc, cache)}


def glue(num_proc, cache, rte, tokenizer, **_):
    return dict(featurize_glue(rte, tokenizer, 128, num_proc=num_proc, cache_dir=cache))


def squad(num_proc, cache, squad_examples, tokenizer, **_):
    window = {"max_seq_length": 192, "doc_stride": 64, "max_query_length": 32, "num_proc": num_proc,
              "cache_dir": cache}
    return {"train": squad_features(squad_examples, tokenizer, train=True, **window),
            "eval": squad_features(squad_examples, tokenizer, train=False, **window)}


def gap(num_proc, cache, gap_examples, tokenizer, **_):
    return {head: gap_features(gap_examples, tokenizer, 128, head, num_proc=num_proc, cache_dir=cache)
            for head in ("segment", "mul")}


def csv_folding(num_proc, cache, data_dir, tokenizer, **_):
    cfg = CsvTaskConfig(path="glue/SST-2/dev.tsv", text_column="sentence", fold_stride=3)
    splits, _ = build_csv_datasets(cfg, data_dir, tokenizer, 12, seed=0, num_proc=num_proc, cache_dir=cache)
    return dict(splits)


@pytest.mark.parametrize("task", [pretraining, glue, squad, gap, csv_folding], ids=lambda f: f.__name__)
def test_parallel_output_is_identical_to_serial(task, tmp_path, request, tokenizer, data_dir):
    inputs = {name: request.getfixturevalue(name) for name in ("docs", "rte", "squad_examples", "gap_examples")
              if name in task.__code__.co_varnames}
    serial = task(1, tmp_path / "serial", tokenizer=tokenizer, data_dir=data_dir, **inputs)
    parallel = task(2, tmp_path / "parallel", tokenizer=tokenizer, data_dir=data_dir, **inputs)
    assert serial.keys() == parallel.keys()
    for name in serial:
        assert shards_of(serial[name]) == 1
        assert_same(serial[name], parallel[name])
    assert max(shards_of(d) for d in parallel.values()) >= 2  # the workers did run, over several shards


def test_featurize_equals_the_old_serial_code(tmp_path, tokenizer, docs, rte, gap_examples):
    """Against what each task did before the featurizer: a plain map, or featurize_gap's dict."""
    train = rte["train"]
    kwargs = {"tokenizer": tokenizer, "max_seq_length": 128, "labeled": True}
    plain = train.map(encode_glue_batch, batched=True, batch_size=BATCH, fn_kwargs=kwargs,
                      remove_columns=["text_a", "text_b", "label"])
    assert_same(featurize_glue(train, tokenizer, 128, num_proc=2, cache_dir=tmp_path), plain)
    packed = pack_documents(docs, tokenizer, 32, 2, batch_size=8, cache_dir=tmp_path)
    assert_same(packed, docs.map(pack_batch, batched=True, batch_size=8, remove_columns=docs.column_names,
                                 fn_kwargs={"tokenizer": tokenizer, "max_seq_length": 32}))
    gap_ds = gap_features(gap_examples, tokenizer, 96, "concat", num_proc=2, cache_dir=tmp_path)
    assert gap_ds[:] == featurize_gap(gap_examples, tokenizer, 96, "concat")


# --- cache hits and misses ---------------------------------------------------------------------------------


def counting_train_features(batch, tokenizer, calls: str, **window):
    """prepare_train_features that appends one line per call to ``calls`` (works across processes)."""
    with open(calls, "a") as f:
        f.write("x\n")
    return prepare_train_features(batch, tokenizer, **window)


def count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_identical_inputs_hit_the_cache(tmp_path, tokenizer, squad_examples):
    calls = tmp_path / "calls.txt"
    raw = datasets.Dataset.from_list(squad_examples)

    def run(num_proc):
        return featurize(raw, counting_train_features, name="squad", tokenizer=tokenizer, num_proc=num_proc,
                         fn_kwargs={"tokenizer": tokenizer, "calls": str(calls), "max_seq_length": 192,
                                    "doc_stride": 64},
                         remove_columns=raw.column_names, cache_dir=tmp_path / "cache")

    first = run(2)
    assert count(calls) == -(-len(raw) // BATCH)
    before = entries(tmp_path / "cache")
    # the entry was a private mkdtemp directory until published: other users of a shared cache can read it
    (name,) = before
    assert (tmp_path / "cache" / name).stat().st_mode & 0o777 == 0o777 & ~sparsebert.io._UMASK
    files = sorted(p.name for p in (tmp_path / "cache").rglob("*"))
    for num_proc in (2, 1):  # num_proc is not part of the key
        again = run(num_proc)
        assert count(calls) == -(-len(raw) // BATCH), "a cache hit ran the function"
        assert entries(tmp_path / "cache") == before
        assert sorted(p.name for p in (tmp_path / "cache").rglob("*")) == files
        assert again.cache_files == first.cache_files
        assert_same(again, first)
    # the same content built another way (a fresh Dataset object) hits as well
    run_again = featurize(datasets.Dataset.from_list(squad_examples), counting_train_features, name="squad",
                          tokenizer=tokenizer, remove_columns=raw.column_names, cache_dir=tmp_path / "cache",
                          fn_kwargs={"tokenizer": tokenizer, "calls": str(calls), "max_seq_length": 192,
                                     "doc_stride": 64})
    assert count(calls) == -(-len(raw) // BATCH) and run_again.cache_files == first.cache_files


def gz_copy(src: Path, dst: Path, replace: tuple[str, str] | None = None) -> None:
    text = gzip.decompress(src.read_bytes()).decode()
    if replace:
        assert replace[0] in text
        text = text.replace(*replace)
    dst.write_bytes(gzip.compress(text.encode(), mtime=0))


def test_corpus_content_decides_hits(tmp_path, data_dir, tokenizer, monkeypatch):
    """A changed corpus file re-featurizes; the same bytes under a new mtime or directory do not."""
    monkeypatch.setenv("SPARSEBERT_CACHE", str(tmp_path / "cache"))
    src = data_dir / CORPUS / "text" / "AA" / "wiki_00.gz"
    corpus = tmp_path / "data" / "corpus"
    corpus.mkdir(parents=True)
    gz_copy(src, corpus / "wiki_00.gz")
    cfg = DataConfig(corpus="corpus", max_documents=12, eval_documents=2, max_seq_length=64,
                     max_eval_samples=20, num_proc=1)
    first = build_pretrain_data(cfg, tokenizer, tmp_path / "data", 42)
    seen = entries(tmp_path / "cache")
    assert len(seen) == 3  # train blocks, eval blocks, eval masks

    os.utime(corpus / "wiki_00.gz", ns=(1, 1))  # same bytes, another mtime: still a hit
    moved = tmp_path / "moved" / "corpus"
    moved.parent.mkdir()
    corpus.rename(moved)  # same bytes elsewhere: still a hit
    again = build_pretrain_data(cfg, tokenizer, tmp_path / "moved", 42)
    assert entries(tmp_path / "cache") == seen
    assert again.train.cache_files == first.train.cache_files

    gz_copy(src, moved / "wiki_00.gz", replace=(" the ", " a "))  # changed bytes: a miss
    changed = build_pretrain_data(cfg, tokenizer, tmp_path / "moved", 42)
    assert len(entries(tmp_path / "cache")) == 6
    assert changed.train["input_ids"] != first.train["input_ids"]

    for setting in ({"max_seq_length": 32}, {"eval_documents": 3}, {"max_documents": 11}):
        before = entries(tmp_path / "cache")
        build_pretrain_data(DataConfig(**{**cfg.__dict__, **setting}), tokenizer, tmp_path / "moved", 42)
        assert set(entries(tmp_path / "cache")) - set(before), f"{setting} did not re-featurize"
    before = entries(tmp_path / "cache")
    build_pretrain_data(cfg, tokenizer, tmp_path / "moved", 43)  # another split seed
    assert set(entries(tmp_path / "cache")) - set(before)


def squad_call(examples, tokenizer, cache, **overrides):
    raw = datasets.Dataset.from_list(examples)
    settings = {"name": "squad", "fn": prepare_train_features, "batch_size": None, "key_parts": None,
                "input_digest": None, "remove_columns": raw.column_names, "window": {}}
    settings.update(overrides)
    window = {"max_seq_length": 128, "doc_stride": 32, "max_query_length": 32, **settings.pop("window")}
    return featurize(raw, settings.pop("fn"), tokenizer=tokenizer, fn_kwargs={"tokenizer": tokenizer, **window},
                     cache_dir=cache, num_proc=1, **settings)


def other_train_features(batch, tokenizer, **window):
    return prepare_train_features(batch, tokenizer, **window)


CHANGES = {
    "max_seq_length": {"window": {"max_seq_length": 160}},
    "doc_stride": {"window": {"doc_stride": 48}},
    "max_query_length": {"window": {"max_query_length": 24}},
    "batch_size": {"batch_size": 32},
    "key_parts": {"key_parts": {"split": "other"}},
    "input_digest": {"input_digest": "files:0123"},
    "name": {"name": "squad-other"},
    "function": {"fn": other_train_features},
}


def test_every_parameter_is_part_of_the_key(tmp_path, tokenizer, squad_examples):
    examples = squad_examples[:40]
    squad_call(examples, tokenizer, tmp_path)
    seen = set(entries(tmp_path))
    assert squad_call(examples, tokenizer, tmp_path) is not None and set(entries(tmp_path)) == seen
    for what, change in CHANGES.items():
        squad_call(examples, tokenizer, tmp_path, **change)
        now = set(entries(tmp_path))
        assert len(now - seen) == 1, f"changing {what} did not re-featurize"
        seen = now
    squad_call(examples[:39], tokenizer, tmp_path)  # the input's content
    assert len(set(entries(tmp_path)) - seen) == 1


def test_remove_columns_and_features_are_part_of_the_key(tmp_path, tokenizer, rte):
    rows = rte["dev"].select(range(50))
    kwargs = {"tokenizer": tokenizer, "max_seq_length": 64, "labeled": True}
    for n, extra in enumerate([{}, {"remove_columns": ["text_a", "text_b", "label", "idx"]},
                               {"features": datasets.Features({
                                   "idx": datasets.Value("int32"),
                                   "input_ids": datasets.Sequence(datasets.Value("int32")),
                                   "attention_mask": datasets.Sequence(datasets.Value("int8")),
                                   "token_type_ids": datasets.Sequence(datasets.Value("int8")),
                                   "labels": datasets.Value("int64")})}], start=1):
        out = featurize(rows, encode_glue_batch, name="glue", tokenizer=tokenizer, fn_kwargs=kwargs,
                        cache_dir=tmp_path, **{"remove_columns": ["text_a", "text_b", "label"], **extra})
        assert len(entries(tmp_path)) == n
    assert out.features["input_ids"].feature.dtype == "int32"


def test_task_settings_are_part_of_the_key(tmp_path, tokenizer, gap_examples, data_dir):
    cache = tmp_path / "cache"
    runs = [lambda: gap_features(gap_examples[:20], tokenizer, 128, "mul", cache_dir=cache),
            lambda: gap_features(gap_examples[:20], tokenizer, 128, "concat", cache_dir=cache),
            lambda: gap_features(gap_examples[:20], tokenizer, 128, "mul", False, cache_dir=cache)]
    for stride in (0, 2):
        cfg = CsvTaskConfig(path="glue/SST-2/dev.tsv", text_column="sentence", fold_stride=stride)
        runs.append(lambda cfg=cfg: build_csv_datasets(cfg, data_dir, tokenizer, 16, seed=0, cache_dir=cache))
    sizes = []
    for run in runs:
        run()
        sizes.append(len(entries(cache)))
    assert sizes == [1, 2, 3, 6, 9]  # a CSV task is three splits


def test_tokenizer_changes_miss(tmp_path, tokenizer, minilm_path, rte):
    rows = rte["dev"].select(range(100))
    featurize_glue(rows, tokenizer, 64, cache_dir=tmp_path)
    added = AutoTokenizer.from_pretrained(minilm_path)
    added.add_special_tokens({"additional_special_tokens": ["[NEW]"]})
    other_mask = AutoTokenizer.from_pretrained(minilm_path, mask_token="[UNK]")
    left = AutoTokenizer.from_pretrained(minilm_path, truncation_side="left")
    for n, tok in enumerate((added, other_mask, left), start=2):
        featurize_glue(rows, tok, 64, cache_dir=tmp_path)
        assert len(entries(tmp_path)) == n
    vocab = tmp_path / "vocab"
    tokenizer.save_pretrained(vocab)
    tok_json = json.loads((vocab / "tokenizer.json").read_text())
    tok_json["model"]["vocab"]["hello"], tok_json["model"]["vocab"]["world"] = (
        tok_json["model"]["vocab"]["world"], tok_json["model"]["vocab"]["hello"])
    (vocab / "tokenizer.json").write_text(json.dumps(tok_json))
    swapped = AutoTokenizer.from_pretrained(vocab)
    assert swapped("hello")["input_ids"] != tokenizer("hello")["input_ids"]
    featurize_glue(rows, swapped, 64, cache_dir=tmp_path)
    assert len(entries(tmp_path)) == 5


def test_code_version_and_source_are_part_of_the_key(tmp_path, tokenizer, squad_examples, monkeypatch):
    examples = squad_examples[:20]
    squad_call(examples, tokenizer, tmp_path)
    monkeypatch.setattr(fz, "FEATURIZE_VERSION", fz.FEATURIZE_VERSION + 1)
    squad_call(examples, tokenizer, tmp_path)
    assert len(entries(tmp_path)) == 2
    monkeypatch.setattr(fz, "source_digest", lambda fn: "edited")
    squad_call(examples, tokenizer, tmp_path)
    assert len(entries(tmp_path)) == 3


# --- interrupted and corrupt caches ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def few_docs(docs):
    return docs.select(range(32))  # 4 batches of 8


def flaky_pack(batch, tokenizer, max_seq_length):
    """pack_batch, except that it fails (or kills its process) on the last documents when told by the env."""
    mode = os.environ.get("FLAKY_PACK")
    if mode and batch["id"][-1] == os.environ["FLAKY_LAST_ID"]:
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("featurization failed mid-way")
    return pack_batch(batch, tokenizer, max_seq_length)


def flaky_run(docs, tokenizer, cache, num_proc):
    return featurize(docs, flaky_pack, name="flaky", tokenizer=tokenizer, num_proc=num_proc, batch_size=8,
                     fn_kwargs={"tokenizer": tokenizer, "max_seq_length": 64}, cache_dir=cache,
                     remove_columns=docs.column_names)


def test_failure_in_a_worker_leaves_no_cache(tmp_path, tokenizer, few_docs, monkeypatch):
    monkeypatch.setenv("FLAKY_PACK", "raise")
    monkeypatch.setenv("FLAKY_LAST_ID", few_docs[len(few_docs) - 1]["id"])  # the second worker's last batch
    with pytest.raises(RuntimeError, match="mid-way"):
        flaky_run(few_docs, tokenizer, tmp_path, 2)
    assert list(tmp_path.iterdir()) == []  # neither an entry nor a temporary directory
    monkeypatch.delenv("FLAKY_PACK")
    rebuilt = flaky_run(few_docs, tokenizer, tmp_path, 2)
    assert_same(rebuilt, flaky_run(few_docs, tokenizer, tmp_path / "serial", 1))


def test_killed_featurization_is_never_trusted(tmp_path, tokenizer, few_docs, caplog):
    """A process killed mid-way leaves a temporary directory and its lock: the directory is not read, and the
    next build takes the lock over and removes both."""

    def killed():
        os.environ.update(FLAKY_PACK="kill", FLAKY_LAST_ID=few_docs[8 * 3 - 1]["id"])  # dies in its 3rd batch
        flaky_run(few_docs, tokenizer, tmp_path, 1)

    proc = multiprocess.get_context("fork").Process(target=killed)
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    (tmp,) = [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert list(tmp.iterdir())
    (lock,) = [p for p in tmp_path.iterdir() if p.name.endswith(".lock")]
    assert json.loads(lock.read_text())["pid"] == proc.pid
    assert entries(tmp_path) == {}
    with caplog.at_level(logging.WARNING, logger="sparsebert.locks"):
        rebuilt = flaky_run(few_docs, tokenizer, tmp_path, 1)
    assert f"process {proc.pid} on host" in caplog.text and "no longer runs" in caplog.text
    assert [p.name for p in tmp_path.iterdir()] == [Path(rebuilt.cache_files[0]["filename"]).parent.name]
    assert_same(rebuilt, flaky_run(few_docs, tokenizer, tmp_path / "fresh", 2))


def truncate(entry: Path) -> None:
    shard = entry / "shard-00001.arrow"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def zero(entry: Path) -> None:  # same size, unreadable
    shard = entry / "shard-00000.arrow"
    shard.write_bytes(b"\0" * shard.stat().st_size)


def bad_rows(entry: Path) -> None:  # a manifest that lies about the row count
    manifest = json.loads((entry / "manifest.json").read_text())
    manifest["shards"][0]["num_rows"] += 1
    (entry / "manifest.json").write_text(json.dumps(manifest))


def damaged_bytes(entry: Path) -> None:
    """4 KiB of random bytes in the middle of a shard, its size unchanged: what a bad disk or an interrupted copy
    leaves. The shard still opens as Arrow with the recorded row count: only its content tells."""
    from datasets.table import MemoryMappedTable

    shard = entry / "shard-00000.arrow"
    data = bytearray(shard.read_bytes())
    start = len(data) // 2 - 2048
    data[start:start + 4096] = random.Random(0).randbytes(4096)
    shard.write_bytes(bytes(data))
    recorded = json.loads((entry / "manifest.json").read_text())["shards"][0]["num_rows"]
    assert MemoryMappedTable.from_file(str(shard)).num_rows == recorded


CORRUPTIONS = {
    "damaged bytes": damaged_bytes,
    "truncated shard": truncate,
    "deleted shard": lambda entry: (entry / "shard-00000.arrow").unlink(),
    "unreadable shard": zero,
    "garbage manifest": lambda entry: (entry / "manifest.json").write_text("{not json"),
    "manifest of another format": lambda entry: (entry / "manifest.json").write_text('["a", 1]'),
    "wrong row count": bad_rows,
    "no manifest": lambda entry: (entry / "manifest.json").unlink(),
}


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS.values()), ids=list(CORRUPTIONS))
def test_corrupt_cache_is_detected_and_rebuilt(corrupt, tmp_path, tokenizer, few_docs, caplog):
    first = flaky_run(few_docs, tokenizer, tmp_path, 2)
    expected = first[:]
    (entry,) = [p for p in tmp_path.iterdir()]
    corrupt(entry)
    with caplog.at_level(logging.WARNING, logger="sparsebert.data.featurize"):
        rebuilt = flaky_run(few_docs, tokenizer, tmp_path, 2)
    assert any(str(entry) in r.getMessage() and "corrupt" in r.getMessage() for r in caplog.records), caplog.text
    assert rebuilt[:] == expected
    assert json.loads((entry / "manifest.json").read_text())["num_rows"] == len(rebuilt)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sparsebert.data.featurize"):
        flaky_run(few_docs, tokenizer, tmp_path, 2)
    assert not caplog.records  # and the rebuilt entry is trusted


def slow_pack(batch, tokenizer, max_seq_length):
    """pack_batch, slowly, leaving a file in $PACK_MARKS named after the process that featurized the batch."""
    (Path(os.environ["PACK_MARKS"]) / f"{os.getpid()}-{batch['id'][0]}").touch()
    time.sleep(0.5)
    return pack_batch(batch, tokenizer, max_seq_length)


def slow_run(docs, tokenizer, cache):
    return featurize(docs, slow_pack, name="slow", tokenizer=tokenizer, num_proc=1, batch_size=8,
                     fn_kwargs={"tokenizer": tokenizer, "max_seq_length": 64}, cache_dir=cache,
                     remove_columns=docs.column_names)


def test_a_second_process_waits_for_the_entry_being_built(tmp_path, tokenizer, few_docs, monkeypatch, caplog):
    marks, cache = tmp_path / "marks", tmp_path / "cache"
    marks.mkdir()
    monkeypatch.setenv("PACK_MARKS", str(marks))
    first = multiprocess.get_context("fork").Process(target=slow_run, args=(few_docs, tokenizer, cache))
    first.start()
    deadline = time.monotonic() + 60
    while not list(marks.iterdir()):  # the first process is featurizing: it holds the entry's lock
        assert first.is_alive() and time.monotonic() < deadline
        time.sleep(0.05)
    with caplog.at_level(logging.INFO, logger="sparsebert.locks"):
        second = slow_run(few_docs, tokenizer, cache)
    first.join(60)
    assert first.exitcode == 0
    assert f"waiting for process {first.pid} on host" in caplog.text
    assert {p.name.split("-")[0] for p in marks.iterdir()} == {str(first.pid)}  # the second featurized nothing
    assert second[:] == flaky_run(few_docs, tokenizer, tmp_path / "fresh", 1)[:]
    assert sorted(p.name for p in cache.iterdir()) == [Path(second.cache_files[0]["filename"]).parent.name]


def test_a_cache_folder_that_cannot_be_written_is_replaced_by_a_private_one(tmp_path, tokenizer, few_docs,
                                                                          monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # a folder under a file: nobody can create it, root included (CI runs as root, where chmod stops nothing)
    monkeypatch.setenv("SPARSEBERT_CACHE", str(blocker / "cache"))
    with caplog.at_level(logging.WARNING, logger="sparsebert.data.featurize"):
        out = flaky_run(few_docs, tokenizer, None, 1)
    assert str(blocker / "cache") in caplog.text and "SPARSEBERT_CACHE" in caplog.text
    assert out[:] == flaky_run(few_docs, tokenizer, tmp_path / "fresh", 1)[:]


def test_shard_count_is_a_batch_per_shard_up_to_a_cap():
    from sparsebert.data.featurize import SHARDS_PER_PROC, shard_count

    assert shard_count(10_000, 256, 1) == 1
    assert shard_count(100, 256, 16) == 1
    assert shard_count(42 * 256, 256, 16) == min(42, 16 * SHARDS_PER_PROC)  # SQuAD dev
    assert shard_count(25 * 256 - 3, 256, 16) == 25
    assert shard_count(10**6, 256, 16) == 16 * SHARDS_PER_PROC


def test_shard_weights_follow_the_bytes_of_each_range():
    rows = datasets.Dataset.from_dict({"text": ["a" * n for n in (10, 0, 300, 5, 7, 1000)],
                                       "ids": [[1] * n for n in (1, 2, 3, 4, 5, 6)], "label": [0] * 6})
    bounds = [(0, 2), (2, 4), (4, 6)]
    assert fz.shard_weights(rows, bounds) == [2 + 10 + 3, 2 + 305 + 7, 2 + 1007 + 11]
    shuffled = rows.select([5, 4, 3, 2, 1, 0])  # an indices mapping: its rows, not the table's
    assert fz.shard_weights(shuffled, bounds) == [2 + 1007 + 11, 2 + 305 + 7, 2 + 10 + 3]
    assert fz.shard_weights(rows.select(range(2, 6)), [(0, 2), (2, 4)]) == [2 + 305 + 7, 2 + 1007 + 11]


PICKLED: list[int] = []  # one entry per pickling of a counting tokenizer (in this process)


@pytest.fixture(scope="module")
def counting_tokenizer(minilm_path, tokenizer):
    """The MiniLM tokenizer as a subclass that records every time it is pickled."""

    class CountingTokenizer(type(tokenizer)):
        def __getstate__(self):
            PICKLED.append(os.getpid())
            return super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()

    return CountingTokenizer.from_pretrained(minilm_path)


def test_tokenizer_is_not_pickled_per_shard(tmp_path, counting_tokenizer, squad_examples):
    import dill  # what multiprocess pickles with

    dill.dumps(counting_tokenizer)
    assert len(PICKLED) == 1  # the hook works
    PICKLED.clear()
    raw = datasets.Dataset.from_list(squad_examples)
    out = featurize(raw, prepare_train_features, name="squad", tokenizer=counting_tokenizer, num_proc=2,
                    batch_size=16, remove_columns=raw.column_names, cache_dir=tmp_path,
                    fn_kwargs={"tokenizer": counting_tokenizer, "max_seq_length": 192, "doc_stride": 64})
    assert shards_of(out) == 8
    # under fork the workers inherit it; under spawn or forkserver it is serialized once for all of them
    assert len(PICKLED) <= (0 if multiprocess.get_start_method() == "fork" else 1), PICKLED


def test_many_small_shards_equal_serial(tmp_path, tokenizer, docs):
    """Packing depends on which documents share a batch: a batch per shard, handed out longest first."""
    serial = pack_documents(docs, tokenizer, 64, 1, batch_size=4, cache_dir=tmp_path / "serial")
    parallel = pack_documents(docs, tokenizer, 64, 3, batch_size=4, cache_dir=tmp_path / "parallel")
    batches = -(-len(docs) // 4)
    assert shards_of(parallel) == min(batches, 3 * fz.SHARDS_PER_PROC) > 3
    assert_same(serial, parallel)
    entry = Path(parallel.cache_files[0]["filename"]).parent
    build = json.loads((entry / "manifest.json").read_text())["build"]
    assert build["shards"] == shards_of(parallel) and 1 <= build["workers"] <= 3
    assert [tuple(t["rows"]) for t in build["shard_timings"]] == shard_bounds(len(docs), 4, build["shards"])
    assert all(t["seconds"] >= 0 and t["cpu_seconds"] >= 0 for t in build["shard_timings"])


def test_spawned_workers_equal_serial(tmp_path, tokenizer, squad_examples, monkeypatch):
    """Without fork (spawn; forkserver alike) the shared state travels pickled, an in-memory input as a file."""
    spawn = multiprocess.get_context("spawn")
    monkeypatch.setattr(multiprocess, "get_context", lambda method=None: spawn)
    raw = datasets.Dataset.from_list(squad_examples[:96])
    kwargs = {"tokenizer": tokenizer, "max_seq_length": 192, "doc_stride": 64}

    def run(num_proc, cache):
        return featurize(raw, prepare_train_features, name="squad", tokenizer=tokenizer, num_proc=num_proc,
                         batch_size=16, fn_kwargs=kwargs, remove_columns=raw.column_names, cache_dir=cache)

    parallel = run(2, tmp_path / "parallel")
    assert shards_of(parallel) == 6
    assert_same(parallel, run(1, tmp_path / "serial"))
    entry = Path(parallel.cache_files[0]["filename"]).parent
    assert json.loads((entry / "manifest.json").read_text())["build"]["start_method"] == "spawn"
    assert sorted(p.name for p in entry.iterdir()) == ["manifest.json"] + [f"shard-{i:05d}.arrow" for i in range(6)]


@pytest.mark.parametrize("short", [[1], [0], [0, 1, 2, 3]], ids=["second", "first", "all"])
def test_shards_without_rows_equal_serial(short, tmp_path, tokenizer, few_docs):
    """Packing: a batch of documents shorter than one block yields no rows. Its shard must neither set the
    schema the others are cast to nor fail that cast: the output is the serial one."""
    texts = list(few_docs["text"])
    for batch in short:  # every document of these batches of 8 is just "a"
        texts[batch * 8:(batch + 1) * 8] = ["a"] * 8
    docs = few_docs.remove_columns("text").add_column("text", texts)
    serial = pack_documents(docs, tokenizer, 64, 1, batch_size=8, cache_dir=tmp_path / "serial")
    parallel = pack_documents(docs, tokenizer, 64, 2, batch_size=8, cache_dir=tmp_path / "parallel")
    assert serial.features == parallel.features
    assert serial[:] == parallel[:]
    assert (len(serial) > 0) == (len(short) < 4)
    entry = Path(parallel.cache_files[0]["filename"]).parent
    shards = json.loads((entry / "manifest.json").read_text())["shards"]
    # shards without rows are left out (when all are empty one stays, for the schema a serial run has)
    assert len(shards) == max(1, 4 - len(short))
    assert sorted(p.name for p in entry.glob("*.arrow")) == sorted(s["file"] for s in shards)


def test_empty_input_gives_empty_output_with_the_features(tmp_path, tokenizer):
    """datasets.map returns a 0-row input as it is and writes no file: featurize returns the declared columns."""
    rows = datasets.Dataset.from_dict({"text_a": [], "text_b": [], "label": []},
                                      features=datasets.Features({"text_a": datasets.Value("string"),
                                                                  "text_b": datasets.Value("string"),
                                                                  "label": datasets.Value("int64")}))
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int64")),
                                  "attention_mask": datasets.Sequence(datasets.Value("int64")),
                                  "token_type_ids": datasets.Sequence(datasets.Value("int64")),
                                  "labels": datasets.Value("int64")})
    kwargs = {"tokenizer": tokenizer, "max_seq_length": 32, "labeled": True}
    for num_proc in (1, 2):
        out = featurize(rows, encode_glue_batch, name="glue", tokenizer=tokenizer, fn_kwargs=kwargs,
                        num_proc=num_proc, remove_columns=["text_a", "text_b", "label"], features=features,
                        cache_dir=tmp_path)
        assert len(out) == 0 and out.features == features
    # without declared features: the input's kept columns, as datasets.map would give
    out = featurize(rows, encode_glue_batch, name="glue", tokenizer=tokenizer, fn_kwargs=kwargs,
                    remove_columns=["text_b"], cache_dir=tmp_path)
    assert len(out) == 0 and out.column_names == ["text_a", "label"]


def test_killed_worker_fails_the_build(tmp_path, tokenizer, few_docs, monkeypatch):
    """A worker killed outright (the OOM killer, say) is an error, not a hang; nothing is left behind."""
    monkeypatch.setenv("FLAKY_PACK", "kill")
    monkeypatch.setenv("FLAKY_LAST_ID", few_docs[len(few_docs) - 1]["id"])
    with pytest.raises(RuntimeError, match="died"):
        flaky_run(few_docs, tokenizer, tmp_path, 2)
    assert list(tmp_path.iterdir()) == []
