"""The one featurizer every task goes through: parallel batched tokenization, cached on disk, written atomically.

``featurize(dataset, fn, ...)`` runs ``fn`` over ``dataset`` in batches (``datasets.map(batched=True)``) and
returns the result as a memory-mapped Arrow ``datasets.Dataset``, so every training process on a node shares
the same pages instead of holding its own copy.

Parallelism. The rows are cut into contiguous shards (``SHARDS_PER_PROC`` per worker) whose boundaries fall on
multiples of ``batch_size``; ``num_proc`` worker processes map them, each shard into its own Arrow file, the
next shard going to whichever worker is free (documents differ in length, so equal shards take unequal time). The function, its kwargs and
the tokenizer travel to a worker once per shard, never per row. Because the batches are exactly those of a
serial run, the output is identical to ``num_proc=1``, row order included, even for functions whose output
depends on the batch (pretraining packs each batch's documents into blocks). Workers run with
``TOKENIZERS_PARALLELISM=false`` and one torch thread, so N workers use N cores, not N x cores.

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
when every shard is written and fsynced, ``manifest.json`` (shard file names, row counts, byte sizes, key,
version) is written last and the directory is renamed into place. An entry is trusted only if its manifest
parses, names this key and version, and every shard exists with the recorded size, opens as Arrow and has the
recorded row count. Anything else is logged as a warning naming the path, removed and rebuilt. A failed
featurization removes its temporary directory; one killed outright leaves only a temporary directory, which
is never read and is removed by the next build of that entry on the same host once its process is gone.
Two builders racing (two nodes on a shared file system) both finish; the first rename wins, the other
discards its copy and loads the winner's.

Under multi-process training, ``featurize`` runs inside ``PartialState().local_main_process_first()``: the
local main process of each node featurizes (or finds the cache), the other ranks wait and then load it.
"""

from __future__ import annotations

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
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FEATURIZE_VERSION = 1
MANIFEST = "manifest.json"
MAX_NUM_PROC = 16  # default cap on worker processes; $SPARSEBERT_NUM_PROC overrides it
# rows per call of the function; also the unit of work split among workers, so kept small enough that a
# 10k-example input still has ~40 batches to spread over 16 processes (no slower than 1000 at one process)
DEFAULT_BATCH_SIZE = 256
# shards per worker process: documents differ in length, so equal-row shards take unequal time; with several
# small shards per process the pool hands the next shard to whichever worker is free (no straggler tail)
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


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


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

    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    # truncation / padding in the Rust object are per-call state left by the last call, not identity
    backend.pop("truncation", None)
    backend.pop("padding", None)
    identity = {
        "class": type(tokenizer).__qualname__,
        "backend": backend,
        "special_tokens": tokenizer.special_tokens_map,
        "special_ids": tokenizer.all_special_ids,
        "padding_side": tokenizer.padding_side,
        "truncation_side": tokenizer.truncation_side,
        "model_max_length": tokenizer.model_max_length,
        "versions": [tokenizers.__version__, transformers.__version__],
    }
    return hashlib.sha256(_canonical(identity).encode()).hexdigest()


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
    ``batch_size`` None: ``DEFAULT_BATCH_SIZE``.
    """
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
    root = cache_root(cache_dir)
    entry = root / f"{_safe(name)}-{key[:32]}"
    from accelerate import PartialState

    with PartialState().local_main_process_first():
        found = _load(entry, key)
        if found is not None:
            log.info("%s: %d rows from the feature cache %s", name, len(found), entry)
            return found
        started = time.perf_counter()
        procs = _build(dataset, fn, fn_kwargs, batch_size, remove_columns, features, num_proc, entry, key,
                       material)
        found = _load(entry, key)
        if found is None:
            raise RuntimeError(f"feature cache {entry} is unreadable right after it was written")
        log.info("%s: featurized %d rows into %d in %.1f s with %d process%s -> %s", name, len(dataset),
                 len(found), time.perf_counter() - started, procs, "es" if procs > 1 else "", entry)
        return found


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64] or "features"


# ---------------------------------------------------------------------------------------------- loading


class _Corrupt(Exception):
    pass


def _load(entry: Path, key: str):
    """The cached dataset of a valid entry; None when there is none (a bad one is removed with a warning)."""
    import datasets

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
            try:
                ds = datasets.Dataset.from_file(str(path))
            except Exception as e:
                raise _Corrupt(f"shard {path.name} is not readable Arrow: {type(e).__name__}: {e}") from None
            if len(ds) != shard["num_rows"]:
                raise _Corrupt(f"shard {path.name} has {len(ds)} rows, the manifest says {shard['num_rows']}")
            shards.append(ds)
        if not shards or sum(len(s) for s in shards) != manifest["num_rows"]:
            raise _Corrupt("shard row counts do not add up to the manifest's num_rows")
        return shards[0] if len(shards) == 1 else datasets.concatenate_datasets(shards)
    except (_Corrupt, KeyError, TypeError) as e:
        reason = str(e) if isinstance(e, _Corrupt) else f"malformed manifest ({type(e).__name__}: {e})"
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
    """One shard per process, or ``SHARDS_PER_PROC`` per process when every shard still gets 4+ batches.

    Measured on a 16-core host (docs/benchmarks.md): small shards balance long documents better, but each shard
    costs a fixed start-up, so a small input (SQuAD dev: 42 batches) is faster with one shard per process.
    """
    if procs <= 1:
        return 1
    batches = -(-num_rows // batch_size)
    return procs * SHARDS_PER_PROC if batches >= 4 * procs * SHARDS_PER_PROC else procs


def _run_shard(job: dict[str, Any]) -> tuple[str, Any]:
    """Map one shard into its Arrow file (in a worker process, or in-process when serial)."""
    import datasets

    if job["index"] > 0:
        datasets.disable_progress_bars()  # one bar (the first shard's) is enough
    out = job["shard"].map(
        job["fn"], batched=True, batch_size=job["batch_size"], fn_kwargs=job["fn_kwargs"],
        remove_columns=job["remove_columns"], features=job["features"], cache_file_name=job["path"],
        load_from_cache_file=False, new_fingerprint=job["fingerprint"], desc=job["desc"],
    )
    return job["path"], out.features


def _init_worker() -> None:
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


@contextmanager
def _env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _build(dataset, fn, fn_kwargs, batch_size, remove_columns, features, num_proc, entry: Path, key: str,
           material: dict[str, Any]) -> int:
    """Featurize into a temporary directory and rename it to ``entry``; returns the processes used."""
    import datasets

    entry.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(entry)
    host = socket.gethostname().replace("-", "_")
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-{host}-{os.getpid()}-", dir=entry.parent))
    try:
        procs = default_num_proc(num_proc)
        bounds = shard_bounds(len(dataset), batch_size, shard_count(len(dataset), batch_size, procs))
        source = dataset
        if len(bounds) > 1 and not dataset.cache_files:
            # in-memory input: write it once, so each worker gets a memory-mapped slice (a path), not a copy
            source = dataset.flatten_indices(cache_file_name=str(tmp / "input.arrow"),
                                             new_fingerprint=f"{key[:40]}-input")
        jobs = [{
            "index": i, "shard": source.select(range(a, b)) if len(bounds) > 1 else source, "fn": fn,
            "fn_kwargs": fn_kwargs, "batch_size": batch_size, "remove_columns": remove_columns,
            "features": features, "path": str(tmp / f"shard-{i:05d}.arrow"), "fingerprint": f"{key[:40]}-{i}",
            "desc": f"{material['name']}" + (f" (shard 1 of {len(bounds)})" if len(bounds) > 1 else ""),
        } for i, (a, b) in enumerate(bounds)]
        if len(jobs) == 1:
            results = [_run_shard(jobs[0])]
        else:
            import multiprocess

            # set before the fork: workers then neither warn about nor use the tokenizers thread pool
            with _env(TOKENIZERS_PARALLELISM="false"):
                pool = multiprocess.Pool(min(procs, len(jobs)), initializer=_init_worker)
            with pool:  # results come back in shard order; shards go to whichever worker is free
                results = pool.map(_run_shard, jobs, chunksize=1)
        (tmp / "input.arrow").unlink(missing_ok=True)
        first = results[0][1]
        shards = []
        for path, shard_features in results:
            if shard_features != first:
                # a serial run writes every batch with the first batch's schema: do the same for this shard
                cast = datasets.Dataset.from_file(path).cast(first, cache_file_name=path + ".cast")
                del cast
                os.replace(path + ".cast", path)
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            shards.append({"file": Path(path).name, "num_rows": datasets.Dataset.from_file(path).num_rows,
                           "bytes": os.path.getsize(path)})
        manifest = {
            "version": FEATURIZE_VERSION, "key": key, "name": material["name"],
            "function": material["function"], "num_rows": sum(s["num_rows"] for s in shards), "shards": shards,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "key_material": material,
        }
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.rename(tmp, entry)
        except OSError:
            if not entry.exists():
                raise
            log.info("%s was written by another process meanwhile; using that one", entry)
        else:
            _fsync_dir(entry.parent)
        return min(procs, len(jobs))
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
