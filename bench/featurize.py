"""Featurization throughput: a per-example tokenizer loop, single-process batched ``datasets.map``, and the
featurizer (``sparsebert.data.featurize``) at 1, 2, 4, 8, 16 worker processes, side by side in one run.

Workloads:
  squad  SQuAD v1.1 dev (10570 questions): training windows, max_seq_length 384, doc_stride 128, query 64,
         256 questions per batch (the featurizer's default)
  wiki   the Wikipedia mirror: documents packed into blocks of 128 tokens (256 documents per batch)

Reported per method: seconds, examples/s (questions or documents), MB/s (UTF-8 bytes of the text that is
tokenized: question + context per question, document text), peak memory of the whole process tree (this process
and its workers: summed RSS, where shared pages count once per process, and summed PSS), parallel
efficiency speed(N) / (N * speed(1)) against the featurizer at one process, whether the output is identical to
the serial featurizer's (a digest of every column), and the cached reload: a second ``featurize`` call on the
same inputs (input digest + manifest check + memory-mapping) and its speedup over featurizing.

The per-example loop calls the same featurization function on one example at a time and keeps only counts (no
Arrow output): what older multiprocessing scripts did per item. By default ``TOKENIZERS_PARALLELISM=false``,
so one process is one core everywhere; ``--rust-threads`` leaves the tokenizer's own thread pool on.

    python bench/featurize.py --data-dir ../shared/data --procs 1,2,4,8,16 --out featurize_bench.json
    python bench/featurize.py --max-files 4 --procs 1,2          # a quick CPU check
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
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
    """Peak memory of this process plus all its descendants, sampled in a thread: the summed RSS (every 20 ms;
    pages shared between processes count once per process) and the summed PSS (every 200 ms; shared pages
    divided among their processes, so it adds up to what the tree really occupies)."""

    def __init__(self, interval: float = 0.02, pss_every: int = 10):
        import psutil

        self.proc, self.interval, self.pss_every = psutil.Process(), interval, pss_every
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
            self.sample(pss=n % self.pss_every == 0)
            n += 1
            self._stop.wait(self.interval)

    def __enter__(self):
        self.sample(pss=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample(pss=True)


def measure(run: Callable[[], object]) -> tuple[object, float, tuple[float, float]]:
    """(result, seconds, (peak RSS, peak PSS) in MB) of one call."""
    with PeakRSS() as mem:
        start = time.perf_counter()
        result = run()
        seconds = time.perf_counter() - start
    return result, seconds, (mem.peak / 2**20, mem.peak_pss / 2**20)


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
    from sparsebert.config import DataConfig
    from sparsebert.data.corpus import corpus_files
    from sparsebert.data.featurize import files_digest
    from sparsebert.data.pretrain import PACK_BATCH_SIZE, load_documents, pack_batch

    wiki = Path(args.wiki_dir)
    files = corpus_files(wiki, args.max_files)
    docs = load_documents(DataConfig(corpus=wiki.name, max_files=args.max_files), wiki.parent)
    texts = docs["text"]
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

    return {
        "name": "wiki", "what": f"Wikipedia mirror, {len(files)} files ({sum(f.stat().st_size for f in files) / 2**20:.1f} MiB "
                                f"compressed), packed at 128", "dataset": docs, "fn": pack_batch,
        "fn_kwargs": kwargs, "batch_size": PACK_BATCH_SIZE, "input_digest": f"files:{files_digest(files)}",
        "examples": len(docs), "unit": "documents", "input_bytes": sum(len(t.encode()) for t in texts),
        "loop": loop,
    }


# ---------------------------------------------------------------------------------------------- one workload


def run_workload(w: dict, args, tokenizer, cache_root: Path) -> dict:
    from sparsebert.data.featurize import dataset_digest, featurize

    raw = w["dataset"]
    mb = w["input_bytes"] / 1e6
    rows: list[dict] = []

    def row(method: str, procs: int | None, seconds: float, mem: tuple[float, float], examples: int | None = None,
            **extra):
        n = examples if examples is not None else w["examples"]
        rows.append({"method": method, "procs": procs, "seconds": seconds, "examples": n,
                     "examples_per_s": n / seconds, "mb_per_s": mb * n / w["examples"] / seconds,
                     "peak_rss_mb": mem[0], "peak_pss_mb": mem[1], **extra})
        r = rows[-1]
        print(f"  {method:<22} procs={procs!s:<3} {seconds:8.2f} s {r['examples_per_s']:9.1f} {w['unit']}/s "
              f"{r['mb_per_s']:7.2f} MB/s  peak RSS {mem[0]:6.0f} MB, PSS {mem[1]:6.0f} MB"
              + (f", {extra['shards']} shards" if extra.get("shards") else ""), flush=True)

    limit = args.loop_limit if args.loop_limit and args.loop_limit < w["examples"] else None
    _, seconds, mem = measure(lambda: w["loop"](limit))
    row("per-example loop", 1, seconds, mem, examples=limit or w["examples"], identical=None)

    def call(num_proc: int, cache_dir: Path):
        return featurize(raw, w["fn"], name=f"bench-{w['name']}", tokenizer=tokenizer, fn_kwargs=w["fn_kwargs"],
                         input_digest=w["input_digest"], num_proc=num_proc, batch_size=w["batch_size"],
                         remove_columns=raw.column_names, cache_dir=cache_dir)

    serial, seconds1, mem1 = measure(lambda: call(1, cache_root / f"{w['name']}-p1"))
    serial_digest = dataset_digest(serial)
    out_rows = len(serial)

    with tempfile.TemporaryDirectory(dir=cache_root) as tmp:
        mapped, seconds, mem = measure(lambda: raw.map(
            w["fn"], batched=True, batch_size=w["batch_size"], fn_kwargs=w["fn_kwargs"],
            remove_columns=raw.column_names, cache_file_name=str(Path(tmp) / "map.arrow"),
            load_from_cache_file=False, desc="datasets.map"))
        row("batched datasets.map", 1, seconds, mem, identical=dataset_digest(mapped) == serial_digest)
        del mapped

    row("featurize", 1, seconds1, mem1, identical=True, efficiency=1.0, shards=1)
    speed1 = w["examples"] / seconds1
    best = seconds1
    for n in args.procs:
        if n == 1:
            continue
        out, seconds, mem = measure(lambda n=n: call(n, cache_root / f"{w['name']}-p{n}"))
        best = min(best, seconds)
        # fewer shards than processes when the input has fewer batches: efficiency is then against those
        shards = len({f["filename"] for f in out.cache_files})
        row("featurize", n, seconds, mem, identical=dataset_digest(out) == serial_digest,
            efficiency=(w["examples"] / seconds) / (n * speed1), shards=shards)
        del out

    reload_dir = cache_root / f"{w['name']}-p{max(args.procs)}"
    reloads = []
    for _ in range(3):
        again, seconds, mem = measure(lambda: call(max(args.procs), reload_dir))
        reloads.append((seconds, mem))
    seconds, mem = min(reloads)
    reload = {"seconds": seconds, "peak_rss_mb": mem[0], "peak_pss_mb": mem[1], "speedup_vs_1_proc": seconds1 / seconds,
              "speedup_vs_best": best / seconds, "identical": dataset_digest(again) == serial_digest}
    print(f"  cached reload: {seconds:.3f} s ({seconds1 / seconds:.0f}x faster than featurizing at 1 process, "
          f"{best / seconds:.0f}x than the fastest run)", flush=True)
    return {"what": w["what"], "unit": w["unit"], "examples": w["examples"], "input_mb": mb,
            "output_rows": out_rows, "batch_size": w["batch_size"], "results": rows, "cached_reload": reload}


def markdown(report: dict) -> str:
    lines = ["| workload | method | procs | seconds | examples/s | MB/s | peak RSS / PSS (MB) | efficiency | identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, w in report["workloads"].items():
        for r in w["results"]:
            eff = f"{r['efficiency']:.2f}" if r.get("efficiency") is not None else "-"
            same = {None: "-", True: "yes", False: "NO"}[r.get("identical")]
            procs = f"{r['procs']} ({r['shards']} shards)" if (r.get("shards") or 1) < (r["procs"] or 1) else r["procs"]
            lines.append(f"| {name} | {r['method']} | {procs} | {r['seconds']:.2f} | {r['examples_per_s']:.1f} "
                         f"| {r['mb_per_s']:.2f} | {r['peak_rss_mb']:.0f} / {r['peak_pss_mb']:.0f} | {eff} | {same} |")
        c = w["cached_reload"]
        lines.append(f"| {name} | cached reload | - | {c['seconds']:.3f} | - | - | "
                     f"{c['peak_rss_mb']:.0f} / {c['peak_pss_mb']:.0f} | "
                     f"{c['speedup_vs_1_proc']:.0f}x vs 1 proc, {c['speedup_vs_best']:.0f}x vs best | "
                     f"{'yes' if c['identical'] else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    default_data = os.environ.get("SPARSEBERT_DATA") or str(ROOT.parent / "shared" / "data")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=default_data)
    p.add_argument("--wiki-dir", default=None, help=f"default: <data-dir>/{CORPUS}/text")
    p.add_argument("--max-files", type=int, default=None, help="first N Wikipedia files (default: all)")
    p.add_argument("--tokenizer", default="minilm", help="a tokenizer path (default: the package MiniLM)")
    p.add_argument("--procs", default="1,2,4,8,16", help="worker processes to try (capped at os.cpu_count())")
    p.add_argument("--workloads", default="squad,wiki")
    p.add_argument("--cache-dir", default=None, help="feature cache root (default: a fresh temporary directory)")
    p.add_argument("--loop-limit", type=int, default=None, help="time the per-example loop on the first N only")
    p.add_argument("--rust-threads", action="store_true", help="leave TOKENIZERS_PARALLELISM as it is")
    p.add_argument("--out", default=None, help="write the JSON report here")
    args = p.parse_args(argv)
    if not args.rust_threads:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    args.wiki_dir = args.wiki_dir or str(Path(args.data_dir) / CORPUS / "text")
    cpus = os.cpu_count() or 1
    args.procs = sorted({n for n in (int(x) for x in args.procs.split(",")) if 1 <= n <= cpus} | {1})

    import datasets
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
        report = {
            "date": date.today().isoformat(),
            "machine": {"cpu_count": cpus, "platform": platform.platform(), "processor": platform.processor(),
                        "python": platform.python_version()},
            "versions": {"datasets": datasets.__version__, "tokenizers": tokenizers.__version__,
                         "transformers": transformers.__version__},
            "settings": {"procs": args.procs, "tokenizer": args.tokenizer, "max_files": args.max_files,
                         "loop_limit": args.loop_limit,
                         "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "default")},
            "workloads": {},
        }
        for name in args.workloads.split(","):
            started = time.perf_counter()
            w = builders[name](args, tokenizer)
            print(f"\n{name}: {w['what']}: {w['examples']} {w['unit']}, {w['input_bytes'] / 1e6:.1f} MB of text "
                  f"(read in {time.perf_counter() - started:.1f} s)", flush=True)
            report["workloads"][name] = run_workload(w, args, tokenizer, cache_root)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print()
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
