"""The one featurizer every task goes through: parallel batched tokenization, cached on disk, written atomically.

``featurize(dataset, fn, ...)`` runs ``fn`` over ``dataset`` in batches (``datasets.map(batched=True)``) and
returns the result as a memory-mapped Arrow ``datasets.Dataset``, so every training process on a node shares
the same pages instead of holding its own copy.

The mapping is ``datasets.map``; its cache is not used because it keeps no checksum of the files it wrote (a
damaged cache file is read as it is, not rebuilt): this cache checks every shard, rebuilds a damaged one, and
takes a writer lock per entry (locks.py), both of which the tests pin.

Parallelism. The rows are cut into contiguous shards whose boundaries fall on multiples of ``batch_size`` (a
batch per shard, at most ``SHARDS_PER_PROC`` shards per worker); ``num_proc`` worker processes map them, each shard
into its own Arrow file. Shards are handed out longest first (estimated from the bytes of their text and list
columns) and a worker takes the next one whenever it is free, so long documents leave no straggler. The
function, its kwargs (the tokenizer too) and the input reach a worker once, inherited through fork and never
pickled (under spawn or forkserver: serialized once for all workers); a job is a shard index and its row range.
A worker starts on a job as soon as it is forked, and writes, fsyncs and counts its shard itself, so the parent
only writes the manifest. Because the batches are exactly those of a serial run, the output is identical to
``num_proc=1``, row order included, even for functions whose output depends on the batch (pretraining packs each
batch's documents into blocks); as in a serial run, shards that yield no rows are left out and every shard takes
the schema of the first one with rows. Workers run with ``TOKENIZERS_PARALLELISM=false`` and one torch thread, so N
workers use N cores, not N x cores; a serial run maps in the calling process and leaves the tokenizers' thread
pool as it finds it. A worker that dies outright (killed, out of memory) fails the build instead of hanging it.

Cache key: sha256 of a canonical JSON of
  - ``FEATURIZE_VERSION`` (bump it when featurization changes in a way the rest of the key cannot see),
  - the function's qualified name and a digest of its module's source file (editing that module re-featurizes),
  - the input's identity: ``input_digest`` from the caller (e.g. ``files_digest`` of the corpus files plus how
    they are read, via ``key_parts``) or else a digest of the dataset's content (Arrow IPC stream of its rows),
  - the tokenizer: its Rust definition (``backend_tokenizer.to_str()`` without the per-call truncation and
    padding state), special tokens, padding/truncation side, model_max_length, and the library versions,
  - every parameter: ``fn_kwargs`` (the tokenizer replaced by the marker above), ``key_parts``, ``name``,
    ``batch_size``, ``remove_columns`` and ``features``. ``num_proc`` is not in it: it does not change the output.

Layout: ``<cache_dir>/<name>-<key[:32]>/`` holds ``shard-00000.arrow ...`` and ``manifest.json``. The cache
directory is ``cache_dir``, else ``$SPARSEBERT_CACHE``, else ``~/.cache/sparsebert/features``.

Atomic protocol. Shards are built in a temporary sibling directory ``.<entry>.tmp-<host>-<pid>-<random>``;
when every shard is written and fsynced, ``manifest.json`` (shard file names, row counts, byte sizes, an
xxh3-128 checksum of each shard's bytes, key, version; for information, ``build``: processes, shards, seconds per
stage) is written last, the directory is fsynced and renamed into place. An entry is trusted only if its
manifest parses, names this key and version, and every shard exists with the recorded size and checksum, opens
as Arrow, has the recorded row count and the first shard's schema: bytes damaged on disk or in a copy are found
even where the file still parses. Anything else is logged as a warning naming the path, removed and rebuilt. A
failed featurization removes its temporary directory; one killed outright leaves only a temporary directory,
which is never read and is removed by the next build of that entry on the same host once its process is gone.

One builder per entry: a build holds the lock file ``<cache_dir>/.<entry>.lock`` (:mod:`sparsebert.locks`,
naming its host and process); a second process that needs the same entry waits for it and loads the result,
and a lock left by a killed process is taken over. Where file locks do not reach other nodes, two nodes may
both build: both finish, the first rename wins, the other discards its copy and loads the winner's. A cache
folder that cannot be written is read where it holds the entry, and otherwise replaced, with a warning, by a
private temporary folder removed when the process ends.

Under multi-process training, ``featurize`` runs inside ``process_state().local_main_process_first()``: the
local main process of each node featurizes (or finds and verifies the cache), the other ranks wait and then
load it without hashing it again.
"""

from __future__ import annotations

import atexit
import functools
import gc
import hashlib
import inspect
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from sparsebert.environ import environ
from sparsebert.io import publish_permissions
from sparsebert.locks import FileLock
from sparsebert.upstream.libraries import row_indices

log = logging.getLogger(__name__)

# 2: shards carry a content checksum (entries of version 1 have none and are rebuilt)
FEATURIZE_VERSION = 2
MANIFEST = "manifest.json"
MAX_NUM_PROC = 16  # default cap on worker processes; $SPARSEBERT_NUM_PROC overrides it
# rows per call of the function; also the unit of work split among workers, so kept small enough that a
# 10k-example input still has ~40 batches to spread over 16 processes (no slower than 1000 at one process)
DEFAULT_BATCH_SIZE = 256
# at most this many shards per worker process (a shard is one batch or more): documents differ in length, so
# equal-row shards take unequal time; handed out longest first to whichever worker is free, several small shards
# per process leave no straggler tail. A shard costs its own map set-up and a file; 4 per process kept the
# simulated efficiency at 16 processes >= 0.8 on SQuAD dev and Wikipedia batches (per-batch times measured)
SHARDS_PER_PROC = 4
_CHUNK = 1 << 20


# ---------------------------------------------------------------------------------------------- settings


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$SPARSEBERT_CACHE``, else ``~/.cache/sparsebert/features``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("SPARSEBERT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sparsebert" / "features"


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # respects taskset / cgroup cpusets
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_num_proc(num_proc: int | None = None) -> int:
    """``num_proc`` when given, else the available cores capped at ``$SPARSEBERT_NUM_PROC`` (default 16)."""
    if num_proc:
        return max(1, int(num_proc))
    return max(1, min(available_cores(), int(os.environ.get("SPARSEBERT_NUM_PROC") or MAX_NUM_PROC)))


# ---------------------------------------------------------------------------------------------- digests


def _hexdigest(path: str | os.PathLike, h: Any) -> str:
    """``h`` (a hashlib-style object) fed a file's bytes in 1 MiB chunks."""
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes."""
    return _hexdigest(path, hashlib.sha256())


def shard_checksum(path: str | os.PathLike) -> str:
    """xxh3-128 of a file's bytes: reads at memory speed, so it costs little next to the load it guards."""
    import xxhash

    return _hexdigest(path, xxhash.xxh3_128())


def files_digest(paths: Iterable[str | os.PathLike]) -> str:
    """One digest of several files' contents, in the given order (names and locations do not count)."""
    h = hashlib.sha256()
    for path in paths:
        h.update(file_digest(path).encode() + b"\n")
    return h.hexdigest()


class _HashSink:
    """A write-only file object that feeds a hash (the sink of an Arrow IPC stream)."""

    def __init__(self, h):
        self.h, self.closed = h, False

    def write(self, data) -> int:
        self.h.update(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def dataset_digest(dataset, batch_size: int = 10_000) -> str:
    """sha256 of a ``datasets.Dataset``'s content: its features and its rows (indices mapping applied)."""
    import pyarrow as pa

    h = hashlib.sha256(json.dumps(dataset.features.to_dict(), sort_keys=True).encode())
    h.update(str(len(dataset)).encode())
    writer = None
    sink = pa.PythonFile(_HashSink(h), mode="w")
    for table in dataset.with_format("arrow").iter(batch_size=batch_size):
        # the schema metadata holds a fingerprint, and chunking depends on how the table was built: neither is
        # content
        table = table.replace_schema_metadata(None).combine_chunks()
        if writer is None:
            writer = pa.ipc.new_stream(sink, table.schema)
        writer.write_table(table)
    if writer is not None:
        writer.close()
    return h.hexdigest()


def tokenizer_digest(tokenizer) -> str:
    """sha256 of everything about a fast tokenizer that decides what its calls return."""
    import tokenizers
    import transformers

    identity = {
        "class": type(tokenizer).__qualname__,
        "backend": _backend_digest(tokenizer.backend_tokenizer.to_str()),
        "special_tokens": tokenizer.special_tokens_map,
        "special_ids": tokenizer.all_special_ids,
        "padding_side": tokenizer.padding_side,
        "truncation_side": tokenizer.truncation_side,
        "model_max_length": tokenizer.model_max_length,
        "versions": [tokenizers.__version__, transformers.__version__],
    }
    return hashlib.sha256(_canonical(identity).encode()).hexdigest()


@functools.lru_cache(maxsize=16)
def _backend_digest(serialized: str) -> str:
    """sha256 of a Rust tokenizer's JSON without its truncation / padding, which are per-call state left by the
    last call, not identity. Cached: every featurization asks, and the JSON holds the whole vocabulary."""
    backend = json.loads(serialized)
    backend.pop("truncation", None)
    backend.pop("padding", None)
    return cache_key(backend)


def source_digest(fn: Callable) -> str | None:
    """Digest of the source file of ``fn``'s module (None when there is no file, e.g. a REPL function)."""
    try:
        path = inspect.getsourcefile(fn)
    except TypeError:
        return None
    return file_digest(path) if path and os.path.isfile(path) else None


def _canonical(obj: Any) -> str:
    def refuse(value):
        if isinstance(value, set | frozenset):
            return sorted(value)
        raise TypeError(f"featurize: {type(value).__name__} value {value!r} cannot be part of a cache key; "
                        "pass plain values (str, int, float, bool, None, lists, dicts)")

    return json.dumps(obj, sort_keys=True, default=refuse, ensure_ascii=False)


def cache_key(material: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(material).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------- featurize


def featurize(
    dataset,
    fn: Callable[..., dict],
    *,
    name: str,
    tokenizer,
    fn_kwargs: dict[str, Any] | None = None,
    input_digest: str | None = None,
    key_parts: dict[str, Any] | None = None,
    num_proc: int | None = None,
    batch_size: int | None = None,
    remove_columns: list[str] | None = None,
    features=None,
    cache_dir: str | os.PathLike | None = None,
):
    """``dataset.map(fn, batched=True, ...)``, parallel and cached; returns a memory-mapped ``Dataset``.

    ``fn(batch, **fn_kwargs)`` maps a batch (dict of column lists) to a dict of output column lists.
    ``tokenizer`` is the one in ``fn_kwargs`` (or the one ``fn`` uses): it is keyed by its definition.
    ``input_digest`` identifies the input (e.g. ``files_digest`` of the source files; describe how they were
    read in ``key_parts``); without it the dataset's content is hashed. ``key_parts`` holds anything else that
    decides the output and is not in ``fn_kwargs``. ``num_proc`` None: :func:`default_num_proc`;
    ``batch_size`` None: ``DEFAULT_BATCH_SIZE``. A 0-row input gives a 0-row output with the columns of
    ``features`` (without ``features``: the input's columns that are not removed, as ``datasets.map`` does).
    """
    if len(dataset) == 0:
        return _empty(dataset, remove_columns, features)
    started = time.perf_counter()
    fn_kwargs = dict(fn_kwargs or {})
    batch_size = batch_size or DEFAULT_BATCH_SIZE
    material = {
        "version": FEATURIZE_VERSION,
        "name": name,
        "function": f"{fn.__module__}.{fn.__qualname__}",
        "function_source": source_digest(fn),
        "input": input_digest or f"content:{dataset_digest(dataset)}",
        "tokenizer": tokenizer_digest(tokenizer),
        "fn_kwargs": {k: "<tokenizer>" if v is tokenizer else v for k, v in fn_kwargs.items()},
        "key_parts": key_parts or {},
        "batch_size": batch_size,
        "remove_columns": remove_columns,
        "features": features.to_dict() if features is not None else None,
    }
    key = cache_key(material)
    entry = cache_root(cache_dir) / f"{_safe(name)}-{key[:32]}"
    from sparsebert.distributed import process_state

    state = process_state()
    with state.local_main_process_first():
        # the other ranks of a node load what its local main process checked or built a moment ago
        verify = state.is_local_main_process
        found = _load(entry, key, verify=verify, remove_bad=False)  # the usual case: no lock needed
        if found is not None:
            log.info("%s: %d rows from the feature cache %s", name, len(found), entry)
            return found

        def build(target: Path) -> int:
            return _build(dataset, fn, fn_kwargs, batch_size, remove_columns, features, num_proc, target, key,
                          material, key_seconds=time.perf_counter() - started)

        found, procs, entry = _build_locked(entry, key, verify, build)
        if procs:
            log.info("%s: featurized %d rows into %d in %.1f s with %d process%s -> %s", name, len(dataset),
                     len(found), time.perf_counter() - started, procs, "es" if procs > 1 else "", entry)
        else:
            log.info("%s: %d rows from the feature cache %s", name, len(found), entry)
        return found


def _build_locked(entry: Path, key: str, verify: bool, build: Callable[[Path], int]) -> tuple[Any, int, Path]:
    """(dataset, processes used or 0 when loaded, entry) holding the entry's lock: a process that waited for
    another's build loads its result. Where the cache cannot be written, the entry goes to a private folder."""
    lock = _lock_entry(entry)
    if lock is None:
        entry = _private_cache() / entry.name
    try:
        found = _load(entry, key, verify=verify)  # the build we waited for; a bad entry is removed here
        if found is not None:
            return found, 0, entry
        procs = build(entry)
        found = _load(entry, key)
    finally:
        if lock is not None:
            lock.release()
    if found is None:
        raise RuntimeError(f"feature cache {entry} is unreadable right after it was written")
    return found, procs, entry


def _lock_entry(entry: Path) -> FileLock | None:
    """The build lock of ``entry``, taken (waiting while another process builds the entry); None, with a
    warning, when the cache folder cannot be written."""
    lock = FileLock(entry.parent / f".{entry.name}.lock", f"feature cache entry {entry}", honour_other_hosts=False)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire_waiting()
    except OSError as e:
        log.warning("feature cache %s cannot be written (%s): featurizing into a temporary folder removed when "
                    "this process ends; set $SPARSEBERT_CACHE to a writable folder to keep features between runs",
                    entry.parent, e.strerror or e)
        return None
    return lock


_PRIVATE_CACHE: Path | None = None


def _private_cache() -> Path:
    """This process's stand-in for a cache folder it cannot write: made once, removed at exit."""
    global _PRIVATE_CACHE
    if _PRIVATE_CACHE is None:
        _PRIVATE_CACHE = Path(tempfile.mkdtemp(prefix="sparsebert-features-"))
        atexit.register(shutil.rmtree, _PRIVATE_CACHE, ignore_errors=True)
    return _PRIVATE_CACHE


def _empty(dataset, remove_columns: list[str] | None, features):
    """The output for a 0-row input, not cached (there is nothing to compute).

    ``datasets.map`` returns such an input as it is, without calling the function or writing a file; the
    declared ``features`` say which columns a non-empty input would have given.
    """
    import datasets

    if features is None:
        return dataset.remove_columns(remove_columns or [])
    return datasets.Dataset.from_dict({name: [] for name in features}, features=features)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64] or "features"


# ---------------------------------------------------------------------------------------------- loading


class _Corrupt(Exception):
    pass


def _load(entry: Path, key: str, verify: bool = True, remove_bad: bool = True):
    """The cached dataset of a valid entry; None when there is none. A bad one is removed with a warning, or
    with ``remove_bad=False`` left for the caller to handle under the entry's lock. ``verify``: compare each
    shard's bytes with its checksum."""
    import datasets
    from datasets.table import MemoryMappedTable, concat_tables

    if not entry.exists():
        return None
    try:
        try:
            manifest = json.loads((entry / MANIFEST).read_text())
        except FileNotFoundError:
            raise _Corrupt("no manifest.json") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise _Corrupt(f"manifest.json is not valid JSON: {e}") from None
        if not isinstance(manifest, dict) or manifest.get("version") != FEATURIZE_VERSION:
            raise _Corrupt(f"manifest version {manifest.get('version') if isinstance(manifest, dict) else None} "
                           f"is not {FEATURIZE_VERSION}")
        if manifest.get("key") != key:
            raise _Corrupt("manifest key does not match the entry")
        shards = []
        for shard in manifest["shards"]:
            path = entry / shard["file"]
            if path.parent != entry:
                raise _Corrupt(f"shard name {shard['file']!r} points outside the entry")
            if not path.is_file():
                raise _Corrupt(f"shard {path.name} is missing")
            size = path.stat().st_size
            if size != shard["bytes"]:
                raise _Corrupt(f"shard {path.name} has {size} bytes, the manifest says {shard['bytes']}")
            if verify and shard_checksum(path) != shard["xxh3_128"]:
                raise _Corrupt(f"shard {path.name} does not match its checksum: its bytes changed after it was "
                               "written")
            try:
                table = MemoryMappedTable.from_file(str(path))
            except Exception as e:
                raise _Corrupt(f"shard {path.name} is not readable Arrow: {type(e).__name__}: {e}") from None
            if table.num_rows != shard["num_rows"]:
                raise _Corrupt(f"shard {path.name} has {table.num_rows} rows, the manifest says {shard['num_rows']}")
            if shards and not table.schema.equals(shards[0].schema, check_metadata=False):
                raise _Corrupt(f"shard {path.name} has another schema than {manifest['shards'][0]['file']}")
            shards.append(table)
        if not shards or sum(t.num_rows for t in shards) != manifest["num_rows"]:
            raise _Corrupt("shard row counts do not add up to the manifest's num_rows")
        # one memory-mapped table over all shards (what concatenate_datasets of Dataset.from_file per shard gives,
        # without building a Dataset per shard: several times faster to load at 64 shards)
        return datasets.Dataset(shards[0] if len(shards) == 1 else concat_tables(shards))
    except (_Corrupt, KeyError, TypeError, OSError) as e:
        if not remove_bad:
            return None
        reason = (str(e) if isinstance(e, _Corrupt) else f"unreadable: {e}" if isinstance(e, OSError)
                  else f"malformed manifest ({type(e).__name__}: {e})")
        log.warning("feature cache %s is corrupt (%s): removing it and featurizing again", entry, reason)
        shutil.rmtree(entry, ignore_errors=True)
        return None


# ---------------------------------------------------------------------------------------------- building


def shard_bounds(num_rows: int, batch_size: int, num_shards: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) row ranges, one per shard, cut on multiples of ``batch_size``."""
    batches = max(1, -(-num_rows // batch_size))
    num_shards = max(1, min(num_shards, batches))
    cuts = [i * batches // num_shards * batch_size for i in range(num_shards)] + [num_rows]
    return [(min(a, num_rows), min(b, num_rows)) for a, b in zip(cuts, cuts[1:])]


def shard_count(num_rows: int, batch_size: int, procs: int) -> int:
    """How many shards to cut: one batch each, at most ``SHARDS_PER_PROC`` per process (1 when serial).

    A shard costs a worker a few milliseconds (its ``map`` set-up, Arrow writer and fsync) and a cached load
    about one more; a batch costs tens of milliseconds to seconds. So small shards are cheap, and they balance:
    the longest go first and each worker takes the next one when it is free.
    """
    if procs <= 1:
        return 1
    batches = max(1, -(-num_rows // batch_size))
    return min(batches, procs * SHARDS_PER_PROC)


def shard_weights(dataset, bounds: list[tuple[int, int]]) -> list[float]:
    """Estimated work of each [start, stop) row range: its rows plus the bytes of their text and list columns.

    Read from the Arrow offsets (no row is decoded); an indices mapping (a split, a shuffle) is followed.
    Anything unexpected falls back to the row count.
    """
    import numpy as np

    rows = [float(b - a) for a, b in bounds]
    try:
        import pyarrow as pa
        import pyarrow.compute as pc

        table = dataset.data.table
        per_row = np.ones(table.num_rows)
        for column in table.columns:
            kind = column.type
            if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
                    or pa.types.is_large_binary(kind):
                sizes = pc.binary_length(column)
            elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
                sizes = pc.list_value_length(column)
            else:
                continue
            per_row += sizes.fill_null(0).to_numpy()
        indices = row_indices(dataset)
        if indices is not None:
            per_row = per_row[indices.column(0).to_numpy()]
        if len(per_row) != len(dataset):
            return rows
        cumulative = np.concatenate([[0.0], np.cumsum(per_row)])
        return [float(cumulative[b] - cumulative[a]) for a, b in bounds]
    except Exception as e:  # an estimate only: never a reason to fail
        log.debug("shard weights unavailable (%s: %s); using row counts", type(e).__name__, e)
        return rows


def _map_shard(shared: dict[str, Any], index: int, start: int, stop: int) -> dict[str, Any]:
    """Map rows [start, stop) into ``shard-<index>.arrow``, fsync it; its row count, size, features, timings."""
    began, cpu = time.time(), time.process_time()
    source = shared["source"]
    shard = source if (start, stop) == (0, len(source)) else source.select(range(start, stop))
    path = os.path.join(shared["dir"], f"shard-{index:05d}.arrow")
    out = shard.map(
        shared["fn"], batched=True, batch_size=shared["batch_size"], fn_kwargs=shared["fn_kwargs"],
        remove_columns=shared["remove_columns"], features=shared["features"], cache_file_name=path,
        load_from_cache_file=False, new_fingerprint=f"{shared['fingerprint']}-{index}", desc=shared["desc"],
    )
    features, num_rows = out.features, out.num_rows
    del out
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    return {"index": index, "path": path, "num_rows": num_rows, "bytes": os.path.getsize(path),
            "xxh3_128": shard_checksum(path), "features": features, "rows": [start, stop], "pid": os.getpid(),
            "began": began, "seconds": time.time() - began, "cpu_seconds": time.process_time() - cpu}


# In a worker process: what every shard of the build shares (function, kwargs with the tokenizer, the input),
# set once by _init_worker. Under fork it is inherited from the parent, never pickled; under spawn or
# forkserver it arrives pickled once per worker, serialized once for all of them.
_SHARED: dict[str, Any] | None = None


def _init_worker(shared: dict[str, Any] | bytes) -> None:
    global _SHARED
    if isinstance(shared, bytes):
        import dill

        shared = dill.loads(shared)
    _SHARED = shared
    # objects inherited from the parent are never freed here: keep the collector off them, or its first full
    # pass would touch (and so copy) every page of the parent's heap
    gc.freeze()
    import datasets

    datasets.disable_progress_bars()  # the parent shows one bar over all shards
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


class _RemoteTraceback(Exception):
    def __str__(self) -> str:
        return self.args[0]


def _worker(shared, jobs: list[tuple[int, int, int]], next_job, results, send_lock) -> None:
    """A worker process: take the next job until none is left, send each shard's result (or its error)."""
    began = time.time()
    _init_worker(shared)
    while True:
        with next_job.get_lock():
            k = next_job.value
            next_job.value = k + 1
        if k >= len(jobs):
            return
        try:
            message = ("done", {**_map_shard(_SHARED, *jobs[k]), "worker_began": began})
        except BaseException as e:
            import traceback

            message = ("error", e, "".join(traceback.format_exception(e)))
        try:
            with send_lock:
                results.send(message)
        except Exception:  # an exception that does not pickle: send its text
            with send_lock:
                results.send(("error", RuntimeError(f"{type(message[1]).__name__}: {message[1]}"), message[2]))
        if message[0] == "error":
            return


def _map_parallel(shared: dict[str, Any], dataset, bounds: list[tuple[int, int]], procs: int,
                  stats: dict[str, Any]) -> list[dict[str, Any]]:
    """Map the shards in ``procs`` worker processes, longest first; results in shard order.

    Each worker takes the next job as soon as it is started (it does not wait for the other workers to be
    forked: a fork costs milliseconds per GB of the parent's heap). A worker that dies outright (killed, out
    of memory) fails the build instead of hanging it.
    """
    import datasets
    import multiprocess
    from multiprocess.connection import wait

    context = multiprocess.get_context()
    stats["start_method"] = method = context.get_start_method()
    if method == "fork":
        payload: dict[str, Any] | bytes = shared  # inherited by every worker with the rest of the parent
    else:
        import dill

        if not dataset.cache_files:
            # in-memory input: write it once, so the workers memory-map it instead of each unpickling a copy
            shared["source"] = dataset.flatten_indices(
                cache_file_name=os.path.join(shared["dir"], "input.arrow"),
                new_fingerprint=f"{shared['fingerprint']}-input")
        payload = dill.dumps(shared)
    weights = shard_weights(shared["source"], bounds)
    jobs = [(i, *bounds[i]) for i in sorted(range(len(bounds)), key=lambda i: (-weights[i], i))]
    results: list[dict[str, Any] | None] = [None] * len(bounds)
    reader, writer = context.Pipe(duplex=False)
    next_job, send_lock = context.Value("q", 0), context.Lock()
    workers = []
    began = time.time()
    try:
        # set before the workers start: they then neither warn about nor use the tokenizers thread pool
        with environ(TOKENIZERS_PARALLELISM="false"):
            for _ in range(procs):
                if next_job.value >= len(jobs):
                    break  # the workers started so far have taken every job (a tiny input)
                worker = context.Process(target=_worker, args=(payload, jobs, next_job, writer, send_lock),
                                         daemon=True)
                worker.start()
                workers.append(worker)
        writer.close()  # the workers hold the sending end now
        stats["workers"] = len(workers)
        stats["pool_start_seconds"] = time.time() - began  # the forks (the first workers are at work meanwhile)
        running = {w.sentinel: w for w in workers}
        done = 0
        with datasets.utils.tqdm(total=len(dataset), unit=" examples",
                                 desc=f"{shared['name']} ({procs} processes)",
                                 disable=not datasets.utils.is_progress_bar_enabled()) as bar:
            while done < len(bounds):
                ready = wait([reader, *running], timeout=10)
                for sentinel in [s for s in ready if s in running]:
                    worker = running.pop(sentinel)
                    worker.join()
                    if worker.exitcode != 0:
                        raise RuntimeError(f"featurize: worker process {worker.pid} died (exit code "
                                           f"{worker.exitcode}) with {len(bounds) - done} shards unwritten")
                if reader in ready or reader.poll():
                    try:
                        kind, *body = reader.recv()
                    except EOFError:  # every worker has exited
                        kind, body = "lost", []
                    if kind == "error":
                        raise body[0] from _RemoteTraceback(f"\n\nin a featurize worker:\n{body[1]}")
                    if kind == "done":
                        results[body[0]["index"]] = body[0]
                        done += 1
                        bar.update(body[0]["rows"][1] - body[0]["rows"][0])
                        continue
                if not running:
                    raise RuntimeError(f"featurize: the workers exited with {len(bounds) - done} shards unwritten")
        for worker in workers:
            worker.join()
    finally:
        for worker in workers:
            if worker.exitcode is None:
                worker.terminate()
        for worker in workers:
            worker.join()
        reader.close()
        writer.close()
    return results  # type: ignore[return-value]


def _build(dataset, fn, fn_kwargs, batch_size, remove_columns, features, num_proc, entry: Path, key: str,
           material: dict[str, Any], key_seconds: float | None = None) -> int:
    """Featurize into a temporary directory and rename it to ``entry``; returns the processes used.

    The manifest's ``build`` records how: processes, shards, start method and the seconds of each stage
    (``key_seconds``: the cache key and the cache look-up before the build), and per shard its rows, worker, start,
    duration and CPU time. Informational only: loading never reads it.
    """
    import datasets

    began = time.time()
    entry.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(entry)
    host = socket.gethostname().replace("-", "_")
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-{host}-{os.getpid()}-", dir=entry.parent))
    try:
        procs = default_num_proc(num_proc)
        bounds = shard_bounds(len(dataset), batch_size, shard_count(len(dataset), batch_size, procs))
        procs = min(procs, len(bounds))
        shared = {"source": dataset, "fn": fn, "fn_kwargs": fn_kwargs, "batch_size": batch_size,
                  "remove_columns": remove_columns, "features": features, "dir": str(tmp),
                  "fingerprint": key[:40], "name": material["name"], "desc": material["name"]}
        stats: dict[str, Any] = {"procs": procs, "shards": len(bounds), "key_seconds": key_seconds}
        mapping = time.time()
        stats["prepare_seconds"] = mapping - began
        if len(bounds) == 1:
            results = [_map_shard(shared, 0, 0, len(dataset))]
            stats["workers"] = 0
        else:
            results = _map_parallel(shared, dataset, bounds, procs, stats)
        finishing = time.time()
        stats["map_seconds"] = finishing - mapping - stats.get("pool_start_seconds", 0.0)
        (tmp / "input.arrow").unlink(missing_ok=True)
        # A shard without rows (packing: its documents together shorter than one block) has its input's schema,
        # not the output's. A serial run skips empty batches and writes with the first non-empty batch's schema:
        # leave empty shards out likewise, keeping the first only when all are empty (what a serial run writes)
        written = [r for r in results if r["num_rows"] > 0] or results[:1]
        for r in results:
            if r["num_rows"] == 0 and r is not written[0]:
                os.unlink(r["path"])
        first = written[0]["features"]
        for r in written:
            if r["features"] != first:
                # a serial run writes every batch with the first batch's schema: do the same for this shard
                path = r["path"]
                cast = datasets.Dataset.from_file(path).cast(first, cache_file_name=path + ".cast")
                del cast
                os.replace(path + ".cast", path)
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
                r["bytes"], r["xxh3_128"] = os.path.getsize(path), shard_checksum(path)
        shards = [{"file": Path(r["path"]).name, "num_rows": r["num_rows"], "bytes": r["bytes"],
                   "xxh3_128": r["xxh3_128"]} for r in written]
        # per shard: its input rows, the worker's pid, when it began (seconds after the build began), how long
        # it took and the CPU time it used
        stats["shard_timings"] = [{"rows": r["rows"], "pid": r["pid"], "began": r["began"] - began,
                                   "seconds": r["seconds"], "cpu_seconds": r["cpu_seconds"]} for r in results]
        # when each worker process started, seconds after the build began (forks are sequential)
        stats["worker_began"] = sorted({r["worker_began"] - began for r in results if "worker_began" in r})
        manifest = {
            "version": FEATURIZE_VERSION, "key": key, "name": material["name"],
            "function": material["function"], "num_rows": sum(s["num_rows"] for s in shards), "shards": shards,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "key_material": material, "build": stats,
        }
        stats["finish_seconds"] = time.time() - finishing  # (the manifest's own write, fsync and rename excluded)
        stats["seconds"] = time.time() - began
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        publish_permissions(tmp)  # mkdtemp made it 0700: other users of a shared cache must be able to read it
        try:
            os.rename(tmp, entry)
        except OSError:
            if not entry.exists():
                raise
            log.info("%s was written by another process meanwhile; using that one", entry)
        else:
            _fsync_dir(entry.parent)
        return procs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_stale_builds(entry: Path) -> None:
    """Remove temporary directories of this entry left by processes of this host that no longer run."""
    host = socket.gethostname().replace("-", "_")
    for tmp in entry.parent.glob(f".{entry.name}.tmp-{host}-*"):
        try:
            pid = int(tmp.name[len(f".{entry.name}.tmp-{host}-"):].split("-")[0])
        except ValueError:
            continue
        if not _alive(pid):
            log.info("removing %s, left by an interrupted featurization", tmp)
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
