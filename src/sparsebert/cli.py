"""``python run.py``: list, run experiments in sequence, with --set overrides."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from sparsebert.config import ConfigError, Registry
from sparsebert.errors import SparseBertError

OUTPUT_ENV = "SPARSEBERT_OUTPUT"
log = logging.getLogger("sparsebert")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="run.py",
        description="Run sparsebert experiments in sequence, e.g. python run.py bert_100k sparse_80_rigl",
    )
    p.add_argument("experiments", nargs="*", metavar="NAME", help="experiments to run, in order")
    p.add_argument("--list", action="store_true", help="list every experiment with a one-line description")
    p.add_argument("--output-dir", type=Path, default=None,
                   help=f"output root (default: ${OUTPUT_ENV}, else runs/)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="data directory (default: $SPARSEBERT_DATA, else ./data if present, else the HF hub)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting, e.g. --set train.max_steps=1000 (repeatable)")
    p.add_argument("--resume", action="store_true", help="continue unfinished runs from their last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="delete an existing run directory and start over")
    p.add_argument("--experiments-dir", type=Path, default=None, help=argparse.SUPPRESS)
    return p


def output_root(explicit: Path | None) -> Path:
    if explicit is not None:
        return explicit
    return Path(os.environ.get(OUTPUT_ENV) or "runs")


def main(argv: list[str] | None = None, experiments_dir: Path | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        registry = Registry.from_directory(args.experiments_dir or experiments_dir or Path("experiments"))
        if args.list:
            width = max(map(len, registry.names()))
            for name in registry.names():
                print(f"{name:<{width}}  {registry.description(name)}")
            return 0
        if not args.experiments:
            print("run.py: name at least one experiment (python run.py --list shows them)", file=sys.stderr)
            return 2
        # build every experiment first: a typo in the third name must not surface after two long runs
        configs = [registry.build(name, args.overrides) for name in args.experiments]
        from sparsebert.data.paths import resolve_data_dir
        from sparsebert.runner import RunOptions, run_experiment

        opts = RunOptions(output_root=output_root(args.output_dir), data_dir=resolve_data_dir(args.data_dir),
                          resume=args.resume, overwrite=args.overwrite)
        for cfg in configs:
            log.info("running %s -> %s", cfg.name, opts.output_root / cfg.name)
            metrics = run_experiment(cfg, opts)
            if metrics is not None:
                log.info("%s finished: %s", cfg.name, _headline(metrics))
        return 0
    except (ConfigError, SparseBertError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _headline(metrics: dict) -> str:
    keys = ("eval_loss", "perplexity", "masked_accuracy", "train_samples_per_second")
    return ", ".join(f"{k}={metrics[k]:.4g}" for k in keys if isinstance(metrics.get(k), int | float))
