"""Featurization throughput: a per-example tokenizer loop, single-process batched ``datasets.map``, and the
featurizer (``sparsebert.data.featurize``) at 1, 2, 4, 8, 16 worker processes, side by side in one run.

Workloads:
  squad  SQuAD v1.1 dev (10570 questions): training windows, max_seq_length 384, doc_stride 128, query 64,
         256 questions per batch (the featurizer's default)
  wiki   the Wikipedia mirror: documents packed into blocks of 128 tokens (256 documents per batch); all its
         files by default, the first N with ``--wiki-files N``, and ``--wiki-repeat K`` feeds the documents K
         times over (a larger input than the mirror, for the process counts where small inputs run out of batches)

Reported per method: seconds (the best of ``--repeats``), examples/s (questions or documents), MB/s (UTF-8 bytes of
the text that is tokenized: question + context per question, document text), CPU seconds of the process tree
(this process and its reaped workers) and cores used (CPU / wall: about 1.0 for every one-process method, which
makes the efficiency denominator one core), peak summed RSS of the process tree, parallel efficiency
speed(N) / (N * speed(1)) against the featurizer at one process, whether the output is identical to the serial
featurizer's (a digest of every column), and the cached reload: a second ``featurize`` call on the same inputs
(input digest + manifest check + memory-mapping) and its speedup over featurizing. For each featurizer run, the
stages from its manifest's ``build`` record: cache key, worker starts (forks), mapping, finishing, loading; how
long the workers took to start and how long the last worker ran after the first one ran out of shards.

Memory. Timed runs sample only the summed RSS (every 50 ms, cheap). PSS (shared pages divided among the
processes that map them: what the tree really occupies) is measured in one extra run at the largest process
count: reading it walks every process's page tables (~10 ms per process per sample), which would slow the
timed runs it watches.

Cores. ``TOKENIZERS_PARALLELISM=false`` by default, so one process is one core everywhere (the per-example loop,
``datasets.map`` and the featurizer at one process, all in this process; the featurizer's workers set it
themselves); ``--rust-threads`` leaves the tokenizer's own thread pool on, and cores used then shows it. The
per-example loop calls the same featurization function on one example at a time and keeps only counts (no Arrow
output): what older multiprocessing scripts did per item. Its inputs (Python lists of the texts) are dropped
before the featurizer runs, so the process the workers fork from holds only what a training process would.

    python bench/featurize.py --data-dir ../shared/data --procs 1,2,4,8,16 --out featurize_bench.json
    python bench/featurize.py --workloads wiki --wiki-all --wiki-repeat 4 --no-baselines --repeats 2
    python bench/featurize.py --wiki-files 4 --procs 1,2          # a quick CPU check
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

CORPUS = "wikipedia-enwiki-2015-wikiextractor"


class PeakRSS:
    """Peak memory of this process plus all its descendants, sampled in a thread: the summed RSS (every
    ``interval`` s; pages shared between processes count once per process) and, with ``pss``, the summed PSS
    every ``pss_every`` samples (shared pages divided among their processes, so it adds up to what the tree
    really occupies; costly to read, see the module docstring)."""

    def __init__(self, interval: float = 0.05, pss: bool = False, pss_every: int = 4):
        import psutil

        self.proc, self.interval, self.pss, self.pss_every = psutil.Process(), interval, pss, pss_every
        self.peak = self.peak_pss = 0
        self._stop = threading.Event()

    def sample(self, pss: bool) -> None:
        import psutil

        rss = pss_total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # a worker that just exited
                if pss:
                    info = p.memory_full_info()
                    rss, pss_total = rss + info.rss, pss_total + info.pss
                else:
                    rss += p.memory_info().rss
        self.peak = max(self.peak, rss)
        if pss:
            self.peak_pss = max(self.peak_pss, pss_total)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            self.sample(pss=self.pss and n % self.pss_every == 0)
            n += 1
            self._stop.wait(self.interval)

    def __enter__(self):
        self.sample(pss=self.pss)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample(pss=self.pss)


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and of its children that have been waited for."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def measure(run: Callable[[], object], pss: bool = False) -> tuple[object, dict]:
    """(result, {seconds, cpu_seconds, peak_rss_mb, peak_pss_mb (None unless ``pss``), parent_rss_mb}) of a call."""
    import psutil

    parent_rss = psutil.Process().memory_info().rss / 2**20
    with PeakRSS(interval=0.2 if pss else 0.05, pss=pss, pss_every=1) as mem:
        cpu = cpu_seconds()
        start = time.perf_counter()
        result = run()
        seconds = time.perf_counter() - start
        cpu = cpu_seconds() - cpu
    return result, {"seconds": seconds, "cpu_seconds": cpu, "peak_rss_mb": mem.peak / 2**20,
                    "peak_pss_mb": mem.peak_pss / 2**20 if pss else None, "parent_rss_mb": parent_rss}


# ---------------------------------------------------------------------------------------------- workloads


def squad_workload(args, tokenizer):
    import datasets

    from sparsebert.data.featurize import DEFAULT_BATCH_SIZE
    from sparsebert.data.squad import prepare_train_features, read_squad

    path = Path(args.data_dir) / "squad" / "dev-v1.1.json"
    examples = read_squad(path)
    raw = datasets.Dataset.from_list(examples)
    kwargs = {"tokenizer": tokenizer, "max_seq_length": 384, "doc_stride": 128, "max_query_length": 64}

    def loop(limit: int | None) -> int:
        windows = 0
        for ex in examples[:limit]:
            out = prepare_train_features({k: [v] for k, v in ex.items()}, **kwargs)
            windows += len(out["input_ids"])
        return windows

    return {
        "name": "squad", "what": f"SQuAD v1.1 dev ({path.name}), train windows 384/128/64",
        "dataset": raw, "fn": prepare_train_features, "fn_kwargs": kwargs, "batch_size": DEFAULT_BATCH_SIZE,
        "input_digest": None, "examples": len(examples), "unit": "questions",
        "input_bytes": sum(len(ex["question"].encode()) + len(ex["context"].encode()) for ex in examples),
        "loop": loop,
    }


def wiki_workload(args, tokenizer):
    import datasets

    from sparsebert.config import DataConfig
    from sparsebert.data.corpus import corpus_files
    from sparsebert.data.featurize import files_digest
    from sparsebert.data.mlm_data import PACK_BATCH_SIZE, load_documents, pack_batch

    wiki = Path(args.wiki_dir)
    files = corpus_files(wiki, args.wiki_files)
    docs = load_documents(DataConfig(corpus=wiki.name, max_files=args.wiki_files), wiki.parent)
    texts = list(docs["text"])
    repeat = max(1, args.wiki_repeat)
    if repeat > 1:
        docs = datasets.concatenate_datasets([docs] * repeat)  # memory-mapped: the same file K times
        texts = texts * repeat
    kwargs = {"tokenizer": tokenizer, "max_seq_length": 128}

    def loop(limit: int | None) -> int:
        # one tokenizer call per document, one global token stream cut into blocks
        cls, sep, body = tokenizer.cls_token_id, tokenizer.sep_token_id, 126
        stream: list[int] = []
        tokens_out = 0  # blocks are built, counted and dropped: nothing is kept
        for text in texts[:limit]:
            stream.extend(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
            stream.append(sep)
            start = 0
            while len(stream) - start >= body:
                tokens_out += len([cls, *stream[start:start + body], sep])
                start += body
            del stream[:start]
        return tokens_out // (body + 2)

    mib = sum(f.stat().st_size for f in files) / 2**20
    return {
        "name": "wiki", "what": f"Wikipedia mirror, {len(files)} files ({mib:.1f} MiB compressed)"
                                + (f" x {repeat}" if repeat > 1 else "") + ", packed at 128",
        "dataset": docs, "fn": pack_batch, "fn_kwargs": kwargs, "batch_size": PACK_BATCH_SIZE,
        "input_digest": f"files:{files_digest(files)}" + (f":x{repeat}" if repeat > 1 else ""),
        "examples": len(docs), "unit": "documents", "input_bytes": sum(len(t.encode()) for t in texts),
        "loop": loop, "files": len(files), "repeat": repeat,
    }


# ---------------------------------------------------------------------------------------------- one workload


def stages(out, m: dict) -> dict | None:
    """Where one featurizer run's time went, from its manifest's build record (None for a cache hit)."""
    manifest = Path(out.cache_files[0]["filename"]).parent / "manifest.json"
    build = json.loads(manifest.read_text()).get("build")
    if not build:
        return None
    shards = build["shard_timings"]
    ends: dict[int, float] = {}
    for t in shards:
        ends[t["pid"]] = max(ends.get(t["pid"], 0.0), t["began"] + t["seconds"])
    busy = sum(t["seconds"] for t in shards)
    window = build["pool_start_seconds"] + build["map_seconds"] if build.get("workers") else build["map_seconds"]
    workers = max(1, build.get("workers") or 1)
    return {
        "shards": build["shards"], "workers": build.get("workers"), "start_method": build.get("start_method"),
        "key_s": build.get("key_seconds"), "prepare_s": build["prepare_seconds"],
        "fork_s": build.get("pool_start_seconds", 0.0), "map_s": build["map_seconds"],
        "finish_s": build["finish_seconds"], "build_s": build["seconds"],
        # the rest of the call: the cache look-up miss, the manifest write and rename, the final load
        "load_s": m["seconds"] - build["seconds"] - (build.get("key_seconds") or 0.0),
        "first_shard_s": min(t["began"] for t in shards),
        "last_worker_start_s": max(build.get("worker_began") or [0.0]),
        # how long the last worker ran on after the first one found no shard left
        "tail_s": max(ends.values()) - min(ends.values()) if len(ends) > 1 else 0.0,
        "busy_fraction": busy / (workers * window) if window > 0 else None,
        "shard_cpu_s": sum(t["cpu_seconds"] for t in shards),
    }


def run_workload(w: dict, args, tokenizer, cache_root: Path) -> dict:
    from sparsebert.data.featurize import dataset_digest, featurize

    raw = w["dataset"]
    mb = w["input_bytes"] / 1e6
    rows: list[dict] = []
    runs = 0

    def row(method: str, procs: int | None, m: dict, examples: int | None = None, **extra):
        n = examples if examples is not None else w["examples"]
        seconds = m["seconds"]
        rows.append({"method": method, "procs": procs, "examples": n, "examples_per_s": n / seconds,
                     "mb_per_s": mb * n / w["examples"] / seconds, "cores_used": m["cpu_seconds"] / seconds,
                     **m, **extra})
        r = rows[-1]
        pss = f", PSS {r['peak_pss_mb']:6.0f} MB" if r.get("peak_pss_mb") is not None else ""
        print(f"  {method:<22} procs={procs!s:<3} {seconds:8.2f} s {r['examples_per_s']:9.1f} {w['unit']}/s "
              f"{r['mb_per_s']:7.2f} MB/s {r['cores_used']:5.2f} cores  peak RSS {r['peak_rss_mb']:6.0f} MB{pss}"
              + (f", {extra['shards']} shards" if extra.get("shards") else "")
              + (f", efficiency {extra['efficiency']:.2f}" if extra.get("efficiency") is not None else ""), flush=True)
        st = extra.get("stages")
        if st and st.get("workers"):
            print(f"      key {st['key_s']:.3f} s, forks {st['fork_s']:.3f} s (first shard at {st['first_shard_s']:.3f} s, "
                  f"last worker up at {st['last_worker_start_s']:.3f} s), map {st['map_s']:.3f} s, finish "
                  f"{st['finish_s']:.3f} s, load {st['load_s']:.3f} s; tail {st['tail_s']:.3f} s, workers busy "
                  f"{st['busy_fraction']:.0%}", flush=True)

    if args.baselines:
        limit = args.loop_limit if args.loop_limit and args.loop_limit < w["examples"] else None
        _, m = measure(lambda: w["loop"](limit))
        row("per-example loop", 1, m, examples=limit or w["examples"], identical=None)
    w.pop("loop")  # and with it the Python lists of texts: the workers fork from a process without them
    gc.collect()

    def call(num_proc: int, cache_dir: Path):
        return featurize(raw, w["fn"], name=f"bench-{w['name']}", tokenizer=tokenizer, fn_kwargs=w["fn_kwargs"],
                         input_digest=w["input_digest"], num_proc=num_proc, batch_size=w["batch_size"],
                         remove_columns=raw.column_names, cache_dir=cache_dir)

    def fresh_dir() -> Path:
        nonlocal runs
        runs += 1
        return cache_root / f"{w['name']}-{runs}"

    def best_of(num_proc: int) -> tuple[object, dict, list[float], Path]:
        """The fastest of ``--repeats`` fresh builds (another cache directory each time; the others removed)."""
        tries = []
        for _ in range(args.repeats):
            cache_dir = fresh_dir()
            out, m = measure(lambda cache_dir=cache_dir: call(num_proc, cache_dir))
            tries.append((m["seconds"], out, m, cache_dir))
        seconds, out, m, cache_dir = min(tries, key=lambda t: t[0])
        for t in tries:
            if t[3] != cache_dir:
                shutil.rmtree(t[3], ignore_errors=True)
        return out, m, [t[0] for t in tries], cache_dir

    serial, m1, all1, serial_dir = best_of(1)
    serial_digest = dataset_digest(serial)
    out_rows = len(serial)
    serial_stages = stages(serial, m1)
    del serial
    shutil.rmtree(serial_dir, ignore_errors=True)

    if args.baselines:
        with tempfile.TemporaryDirectory(dir=cache_root) as tmp:
            mapped, m = measure(lambda: raw.map(
                w["fn"], batched=True, batch_size=w["batch_size"], fn_kwargs=w["fn_kwargs"],
                remove_columns=raw.column_names, cache_file_name=str(Path(tmp) / "map.arrow"),
                load_from_cache_file=False, desc="datasets.map"))
            row("batched datasets.map", 1, m, identical=dataset_digest(mapped) == serial_digest)
            del mapped

    seconds1 = m1["seconds"]
    row("featurize", 1, m1, identical=True, efficiency=1.0, shards=1, all_seconds=all1, stages=serial_stages)
    speed1 = w["examples"] / seconds1
    best = seconds1
    reload_dir = None
    for n in args.procs:
        if n == 1:
            continue
        out, m, tries, cache_dir = best_of(n)
        best = min(best, m["seconds"])
        # fewer shards than processes when the input has fewer batches: efficiency is then against those
        shards = len({f["filename"] for f in out.cache_files})
        row("featurize", n, m, identical=dataset_digest(out) == serial_digest,
            efficiency=(w["examples"] / m["seconds"]) / (n * speed1), shards=shards, all_seconds=tries,
            stages=stages(out, m))
        del out
        if reload_dir is not None:
            shutil.rmtree(reload_dir, ignore_errors=True)
        reload_dir = cache_dir  # the largest process count's entry is reloaded below

    memory = None
    if args.pss:
        n = max(args.procs)
        cache_dir = fresh_dir()
        out, m = measure(lambda: call(n, cache_dir), pss=True)
        memory = {"procs": n, "seconds": m["seconds"], "peak_rss_mb": m["peak_rss_mb"],
                  "peak_pss_mb": m["peak_pss_mb"], "identical": dataset_digest(out) == serial_digest}
        print(f"  memory run, {n} processes: peak RSS {m['peak_rss_mb']:.0f} MB summed, PSS {m['peak_pss_mb']:.0f} MB "
              f"({m['seconds']:.2f} s, slowed by the PSS sampling)", flush=True)
        del out
        shutil.rmtree(cache_dir, ignore_errors=True)

    if reload_dir is None:  # one process only
        reload_dir = fresh_dir()
        call(1, reload_dir)
    reloads = []
    for _ in range(3):
        again, m = measure(lambda: call(max(args.procs), reload_dir))
        reloads.append((m["seconds"], m))
    seconds, m = min(reloads, key=lambda t: t[0])
    reload = {"seconds": seconds, "peak_rss_mb": m["peak_rss_mb"], "speedup_vs_1_proc": seconds1 / seconds,
              "speedup_vs_best": best / seconds, "identical": dataset_digest(again) == serial_digest,
              "shards": len({f["filename"] for f in again.cache_files})}
    print(f"  cached reload: {seconds:.3f} s ({seconds1 / seconds:.0f}x faster than featurizing at 1 process, "
          f"{best / seconds:.0f}x than the fastest run; {reload['shards']} shards)", flush=True)
    return {"what": w["what"], "unit": w["unit"], "examples": w["examples"], "input_mb": mb,
            "output_rows": out_rows, "batch_size": w["batch_size"],
            "batches": -(-w["examples"] // w["batch_size"]), "results": rows, "memory_run": memory,
            "cached_reload": reload}


def markdown(report: dict) -> str:
    lines = ["| workload | method | procs | seconds | examples/s | MB/s | cores used | peak RSS (MB) | efficiency "
             "| identical |", "|---|---|---|---|---|---|---|---|---|---|"]
    stage_lines = ["| workload | procs | shards | key | forks (last worker up) | first shard | map | finish | load "
                   "| tail | workers busy |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, w in report["workloads"].items():
        for r in w["results"]:
            eff = f"{r['efficiency']:.2f}" if r.get("efficiency") is not None else "-"
            same = {None: "-", True: "yes", False: "NO"}[r.get("identical")]
            procs = f"{r['procs']} ({r['shards']} shards)" if (r.get("shards") or 1) < (r["procs"] or 1) else r["procs"]
            lines.append(f"| {name} | {r['method']} | {procs} | {r['seconds']:.2f} | {r['examples_per_s']:.1f} "
                         f"| {r['mb_per_s']:.2f} | {r['cores_used']:.2f} | {r['peak_rss_mb']:.0f} | {eff} | {same} |")
            st = r.get("stages")
            if st and st.get("workers"):
                stage_lines.append(
                    f"| {name} | {r['procs']} | {st['shards']} | {st['key_s']:.3f} | {st['fork_s']:.3f} "
                    f"({st['last_worker_start_s']:.3f}) | {st['first_shard_s']:.3f} | {st['map_s']:.3f} "
                    f"| {st['finish_s']:.3f} | {st['load_s']:.3f} | {st['tail_s']:.3f} | {st['busy_fraction']:.0%} |")
        c = w["cached_reload"]
        lines.append(f"| {name} | cached reload | - | {c['seconds']:.3f} | - | - | - | {c['peak_rss_mb']:.0f} | "
                     f"{c['speedup_vs_1_proc']:.0f}x vs 1 proc, {c['speedup_vs_best']:.0f}x vs best | "
                     f"{'yes' if c['identical'] else 'NO'} |")
        mem = w.get("memory_run")
        if mem:
            lines.append(f"| {name} | memory run (PSS sampled) | {mem['procs']} | {mem['seconds']:.2f} | - | - | - "
                         f"| {mem['peak_rss_mb']:.0f} (PSS {mem['peak_pss_mb']:.0f}) | - "
                         f"| {'yes' if mem['identical'] else 'NO'} |")
    return "\n".join(lines) + "\n\nStages of each parallel run (seconds):\n\n" + "\n".join(stage_lines)


def cpu_topology() -> dict[str, object]:
    """CPU model and how many logical CPUs share a physical core (SMT): two workers on one core's two threads
    share its execution units, so per-process speed drops and parallel efficiency with it. Linux only."""
    info: dict[str, object] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    cores, logical = set(), 0
    physical = core = None
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "processor":
            logical += 1
        elif key == "model name":
            info.setdefault("cpu_model", value)
        elif key == "physical id":
            physical = value
        elif key == "core id":
            core = value
            cores.add((physical, core))
    if cores:
        info["physical_cores"] = len(cores)
        info["threads_per_core"] = round(logical / len(cores), 2)
    return info


def main(argv: list[str] | None = None) -> int:
    default_data = os.environ.get("SPARSEBERT_DATA") or str(ROOT.parent / "shared" / "data")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=default_data)
    p.add_argument("--wiki-dir", default=None, help=f"default: <data-dir>/{CORPUS}/text")
    p.add_argument("--wiki-files", "--max-files", dest="wiki_files", type=int, default=None,
                   help="the first N Wikipedia files (default: all of them)")
    p.add_argument("--wiki-all", action="store_true", help="every file of the mirror (overrides --wiki-files)")
    p.add_argument("--wiki-repeat", type=int, default=1, help="feed the Wikipedia documents K times over")
    p.add_argument("--tokenizer", default="minilm", help="a tokenizer path (default: the package MiniLM)")
    p.add_argument("--procs", default="1,2,4,8,16", help="worker processes to try (capped at os.cpu_count())")
    p.add_argument("--repeats", type=int, default=1, help="time each featurizer run N times, keep the fastest")
    p.add_argument("--workloads", default="squad,wiki")
    p.add_argument("--cache-dir", default=None, help="feature cache root (default: a fresh temporary directory)")
    p.add_argument("--loop-limit", type=int, default=None, help="time the per-example loop on the first N only")
    p.add_argument("--no-baselines", dest="baselines", action="store_false",
                   help="skip the per-example loop and the plain datasets.map (featurizer scaling only)")
    p.add_argument("--no-pss", dest="pss", action="store_false", help="skip the PSS memory run")
    p.add_argument("--rust-threads", action="store_true", help="leave TOKENIZERS_PARALLELISM as it is")
    p.add_argument("--out", default=None, help="write the JSON report here")
    args = p.parse_args(argv)
    if args.wiki_all:
        args.wiki_files = None
    args.repeats = max(1, args.repeats)
    if not args.rust_threads:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    args.wiki_dir = args.wiki_dir or str(Path(args.data_dir) / CORPUS / "text")
    cpus = os.cpu_count() or 1
    args.procs = sorted({n for n in (int(x) for x in args.procs.split(",")) if 1 <= n <= cpus} | {1})

    import datasets
    import multiprocess
    import tokenizers
    import transformers

    from sparsebert.data.tokenizer import load_tokenizer

    datasets.disable_progress_bars()
    tokenizer = load_tokenizer(args.tokenizer)
    builders = {"squad": squad_workload, "wiki": wiki_workload}
    with tempfile.TemporaryDirectory(prefix="featurize-bench-") as tmp:
        cache_root = Path(args.cache_dir) if args.cache_dir else Path(tmp)
        cache_root.mkdir(parents=True, exist_ok=True)
        datasets.config.HF_DATASETS_CACHE = Path(tmp) / "hf"  # the corpus read by from_generator
        from sparsebert.env_info import git_commit

        report = {
            "date": date.today().isoformat(),
            "commit": git_commit(ROOT),  # $SPARSEBERT_COMMIT where the tree travels without .git
            "machine": {"cpu_count": cpus, "platform": platform.platform(), "processor": platform.processor(),
                        "python": platform.python_version(), **cpu_topology()},
            "versions": {"datasets": datasets.__version__, "tokenizers": tokenizers.__version__,
                         "transformers": transformers.__version__},
            "settings": {"procs": args.procs, "tokenizer": args.tokenizer, "wiki_files": args.wiki_files,
                         "wiki_repeat": args.wiki_repeat, "repeats": args.repeats, "loop_limit": args.loop_limit,
                         "baselines": args.baselines, "start_method": multiprocess.get_start_method(),
                         "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "default")},
            "workloads": {},
        }
        for name in args.workloads.split(","):
            started = time.perf_counter()
            w = builders[name](args, tokenizer)
            print(f"\n{name}: {w['what']}: {w['examples']} {w['unit']} in "
                  f"{-(-w['examples'] // w['batch_size'])} batches, {w['input_bytes'] / 1e6:.1f} MB of text "
                  f"(read in {time.perf_counter() - started:.1f} s)", flush=True)
            report["workloads"][name] = run_workload(w, args, tokenizer, cache_root)
            del w
            gc.collect()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print()
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
