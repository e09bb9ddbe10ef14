"""scripts/upstream_study.sh on CPU at tiny size: the dense teacher and the upstream run first, then the transfers
from the upstream model with its masks, distilled from that teacher: one process per seed; the
downstream oBERT recipe from the same teacher; and a search over the transfer's settings after both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "upstream_study.sh"
UPSTREAM_SET = ("--set model.num_layers=2 --set data.max_files=1 --set data.eval_documents=4 "
                "--set data.max_eval_samples=8 --set data.max_seq_length=64 --set train.global_batch_size=8 "
                "--set train.max_steps=6 --set train.warmup_steps=0 --set train.eval_steps=6 --set train.save_steps=6 "
                "--set gmp.frequency=2 --set gmp.obs_num_grads=2 --set gmp.obs_block_size=4")
TASK_SET = ("--set model.num_layers=2 --set finetune.max_train_samples=16 --set finetune.max_eval_samples=16 "
            "--set train.epochs=1 --set finetune.runs_per_task={} --set finetune.max_seq_length=64")

pytestmark = pytest.mark.slow


def test_transfers_wait_for_their_upstream_model_and_teacher(data_dir, minilm_path, tmp_path):
    root = tmp_path / "out"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(SCRIPT.parents[1] / "src"), "STUDY_GPUS": "cpu", "STUDY_TASKS": "rte",
           "STUDY_UPSTREAM": "80_obs", "STUDY_DOWNSTREAM": "rte",
           "STUDY_DOWNSTREAM_VARIANTS": "_downstream80_obs", "STUDY_UPSTREAM_SET": UPSTREAM_SET,
           "STUDY_TASK_SET": TASK_SET, "STUDY_SEED_LANES": "1",
           "STUDY_SEARCH": "rte", "STUDY_SEARCH_SPACE": "tiny", "STUDY_SEARCH_TRIALS": "1", "STUDY_SEARCH_PARALLEL": "1"}
    subprocess.run(["bash", str(SCRIPT), str(root), str(data_dir), minilm_path, "500"], env=env,
                   cwd=SCRIPT.parents[1], check=True, capture_output=True, timeout=600)
    logs = sorted(p.name for p in (root / "logs").iterdir())
    assert logs == ["rte-dense.log", "rte-downstream80_obs.log", *(f"rte-from80_obs-s{seed}.log" for seed in (42, 43, 44)),
                    "rte-search.log", "upstream80_obs.log"]
    upstream = root / "upstream" / "minilm_upstream_sparse80_obs"
    teacher = root / "rte" / "minilm_glue" / "glue_rte" / "run0"
    assert (upstream / "DONE").is_file() and (teacher / "DONE").is_file()
    downstream = root / "rte" / "minilm_glue_downstream80_obs" / "glue_rte" / "run0"
    assert (downstream / "DONE").is_file(), (root / "logs" / "rte-downstream80_obs.log").read_text()[-2000:]
    assert json.loads((downstream / "config.json").read_text())["gmp"]["score"] == "obs"
    for seed in (42, 43, 44):
        # each seed is run0 of its own output root, trained with that seed (the variants' lanes: test_upstream_study_lanes)
        transfer = root / "rte" / f"seed{seed}" / "minilm_glue_from_upstream80_obs" / "glue_rte" / "run0"
        assert (transfer / "DONE").is_file(), (root / "logs" / f"rte-from80_obs-s{seed}.log").read_text()[-2000:]
        config = json.loads((transfer / "config.json").read_text())
        assert config["seed"] == seed and config["model"]["init_from"] == str(upstream)
        assert config["kd"]["teacher"] == str(root / "rte" / "minilm_glue")
        started = (transfer.parents[1] / "config.json").stat().st_mtime
        assert started >= (upstream / "DONE").stat().st_mtime and started >= (teacher / "DONE").stat().st_mtime
        report = json.loads((transfer / "sparsity.json").read_text())
        assert report["selected"]["sparsity"] == pytest.approx(0.8, abs=1e-4)
    # the search over the transfer's settings: after the same upstream model and teacher, its masks fixed
    trial = root / "rte" / "search" / "minilm_glue_from_upstream80_obs-tiny" / "trial000"
    assert (trial / "DONE").is_file(), (root / "logs" / "rte-search.log").read_text()[-2000:]
    config = json.loads((trial / "config.json").read_text())
    assert config["model"]["init_from"] == str(upstream) and config["kd"]["teacher"] == str(root / "rte" / "minilm_glue")
    assert (trial.parent / "summary.md").is_file()
    assert (trial / "config.json").stat().st_mtime >= (upstream / "DONE").stat().st_mtime


def test_a_search_lane_without_optuna_is_refused_before_anything_runs(data_dir, minilm_path, tmp_path):
    shadow = tmp_path / "shadow"  # an optuna that cannot be imported, ahead of the installed one
    shadow.mkdir()
    (shadow / "optuna.py").write_text("raise ImportError('no optuna here')\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": f"{shadow}{os.pathsep}{SCRIPT.parents[1] / 'src'}", "STUDY_GPUS": "cpu",
           "STUDY_SEARCH": "rte"}
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), str(data_dir), minilm_path, "60"], env=env,
                          cwd=SCRIPT.parents[1], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == ("upstream_study.sh: STUDY_SEARCH needs optuna (pip install optuna), which this "
                                   "python cannot import")
    assert not (tmp_path / "out" / "logs").exists()  # no lane started
