"""Multi-GPU scaling of `run.py` itself, the way a user runs and reads it: `torchrun run.py EXPERIMENT` on 1..N
GPUs of one machine in turn, each run's own logged samples/s (one value per `train.logging_steps` interval, the
whole global batch) over a window after warm-up. bench/scaling.py times the bare step on random data; this one
keeps everything a run does: the featurized corpus through the data loader, logging, RigL updates (the window
holds some), the sparse all-reduce.

Efficiency at N GPUs = samples/s(N) / (N * samples/s(1)) at the same per-GPU batch, all runs in one call. The
window's samples/s is its samples over its seconds (the harmonic mean of the equal-length intervals); the median
and the range of the intervals are reported beside it.

    python bench/real_loop_scaling.py --data-dir DATA --tokenizer DIR --gpus 1,2,4 --out real_loop_scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from scaling import free_port  # noqa: E402  (bench/ on the path first)


def run_command(args: argparse.Namespace, gpus: int, out_root: Path, port: int) -> list[str]:
    """The torchrun command line of one run (a 1-GPU run goes through torchrun too: the same code path)."""
    overrides = [
        f"model.tokenizer={args.tokenizer}", f"data.max_files={args.max_files}",
        f"train.global_batch_size={args.per_gpu_batch * gpus}", f"train.max_steps={args.steps}",
        f"train.logging_steps={args.logging_steps}", f"train.eval_steps={args.steps}",
        f"train.save_steps={args.steps}", "train.eval_at_start=false", "train.report_to=[]", *args.set,
    ]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(gpus),
            "--master-addr", "127.0.0.1", "--master-port", str(port),
            str(ROOT / "run.py"), args.experiment, "--run-name", f"{args.experiment}_{gpus}gpu",
            "--output-dir", str(out_root), "--data-dir", str(args.data_dir), "--overwrite",  # the bench's own runs
            *(part for o in overrides for part in ("--set", o))]


def window_rates(log_history: list[dict], start: int, end: int) -> list[float]:
    """The logged samples/s of the intervals that end in (start, end]: the intervals after warm-up."""
    return [h["samples_per_second"] for h in log_history
            if "samples_per_second" in h and start < h.get("step", 0) <= end]


def summarize(rates: list[float]) -> dict:
    """Window samples/s (samples over seconds: equal intervals, so the harmonic mean), median, range."""
    if not rates:
        raise ValueError("no logged samples/s in the window: lower --window-start or raise --steps")
    return {"samples_per_second": len(rates) / sum(1.0 / r for r in rates), "median": statistics.median(rates),
            "min": min(rates), "max": max(rates), "intervals": len(rates)}


def efficiencies(results: dict[int, dict], key: str = "samples_per_second") -> dict[int, float]:
    """samples/s(N) / (N * samples/s(1)) for every N measured beside a 1-GPU run."""
    if 1 not in results:
        return {}
    one = results[1][key]
    return {n: r[key] / (n * one) for n, r in results.items()}


def measure(args: argparse.Namespace, gpus: int, out_root: Path) -> dict:
    cmd = run_command(args, gpus, out_root, free_port())
    log = out_root / f"{gpus}gpu.log"
    with log.open("w") as handle:
        done = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        tail = log.read_text().splitlines()[-15:]
        raise SystemExit(f"{gpus}-GPU run failed (exit {done.returncode}); its log ends:\n" + "\n".join(tail))
    run_dir = out_root / f"{args.experiment}_{gpus}gpu"
    history = json.loads((run_dir / "log_history.json").read_text())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    rates = window_rates(history, args.window_start, args.steps)
    return {"gpus": gpus, **summarize(rates), "rates": rates,
            "recompiles_after_warmup": metrics.get("recompiles_after_warmup"),
            "eval_loss": metrics.get("eval_loss"), "command": " ".join(cmd[2:])}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True, type=Path, help="holds the Wikipedia mirror")
    p.add_argument("--tokenizer", default="minilm")
    p.add_argument("--experiment", default="sparse_80_rigl")
    p.add_argument("--gpus", default="1,2,4")
    p.add_argument("--per-gpu-batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--logging-steps", type=int, default=50)
    p.add_argument("--window-start", type=int, default=300,
                   help="the window holds the logging intervals ending after this step (compile and warm-up before)")
    p.add_argument("--max-files", type=int, default=24, help="Wikipedia files to featurize (the first N)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="more run.py overrides, e.g. train.ddp.comm_hook=sparse")
    p.add_argument("--work-dir", type=Path, default=None, help="run directories (default: a temporary one)")
    p.add_argument("--out", type=Path, default=None)
    return p


def main() -> None:
    args = build_parser().parse_args()
    if not args.window_start < args.steps:
        raise SystemExit(f"--window-start ({args.window_start}) must be below --steps ({args.steps})")
    gpus = [int(g) for g in args.gpus.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        out_root = args.work_dir or Path(tmp)
        out_root.mkdir(parents=True, exist_ok=True)
        results = {}
        for n in gpus:
            results[n] = measure(args, n, out_root)
            r = results[n]
            print(f"{n} GPU(s): {r['samples_per_second']:.0f} samples/s over {r['intervals']} intervals "
                  f"(median {r['median']:.0f}, {r['min']:.0f}-{r['max']:.0f}), recompiles after warm-up "
                  f"{r['recompiles_after_warmup']}", flush=True)
    window = efficiencies(results)
    median = efficiencies(results, "median")
    for n in gpus:
        if n in window:
            print(f"efficiency at {n} GPU(s): {window[n]:.3f} (window), {median[n]:.3f} (medians)")
    from sparsebert.env_info import git_commit

    report = {"bench": "real_loop_scaling", "date": str(date.today()), "commit": git_commit(ROOT),
              "args": {k: str(v) for k, v in vars(args).items()}, "runs": list(results.values()),
              "efficiency_window": window, "efficiency_median": median}
    if args.out:
        tmp_out = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp_out.write_text(json.dumps(report, indent=1))
        tmp_out.replace(args.out)


if __name__ == "__main__":
    main()
