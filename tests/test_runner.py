"""run_experiment's handling of a run directory that already holds a finished run (no training needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparsebert.config import Registry, to_dict
from sparsebert.errors import SparseBertError
from sparsebert.io import atomic_write_json
from sparsebert.runner import DONE, RunOptions, run_experiment

REPO = Path(__file__).resolve().parents[1]


def finished_run(root: Path, overrides: list[str]):
    cfg = Registry.from_directory(REPO / "experiments").build("bert_tiny_quick", overrides)
    run_dir = root / cfg.name
    run_dir.mkdir(parents=True)
    atomic_write_json(run_dir / "config.json", to_dict(cfg))
    (run_dir / DONE).write_text("2026-11-26\n")
    return cfg


def test_a_finished_run_is_skipped_only_with_the_same_settings(tmp_path):
    cfg = finished_run(tmp_path, ["train.max_steps=20"])
    opts = RunOptions(output_root=tmp_path, data_dir=tmp_path)
    assert run_experiment(cfg, opts) is None  # the same settings: nothing to do
    changed = Registry.from_directory(REPO / "experiments").build("bert_tiny_quick", ["train.max_steps=30"])
    with pytest.raises(SparseBertError, match=r"holds a finished run of bert_tiny_quick with other settings "
                                              r"\(train.max_steps\); use --overwrite"):
        run_experiment(changed, opts)
