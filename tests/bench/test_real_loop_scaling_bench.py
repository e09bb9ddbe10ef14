"""bench/real_loop_scaling.py on CPU: one real `torchrun run.py` launch of a tiny sparse run, read back the way
the bench reads a GPU run (its own logged samples/s over the window after warm-up), and the window arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from module_loading import load_module

BENCH = Path(__file__).resolve().parents[2] / "bench" / "real_loop_scaling.py"


@pytest.fixture(scope="module")
def bench():
    return load_module(BENCH)


def test_the_window_is_samples_over_seconds_of_the_intervals_after_warm_up(bench):
    history = [{"eval_loss": 9.0, "step": 0}, {"loss": 5.0, "step": 1},
               {"samples_per_second": 100.0, "step": 50}, {"samples_per_second": 400.0, "step": 100},
               {"samples_per_second": 200.0, "step": 150}, {"eval_loss": 4.0, "step": 150}]
    rates = bench.window_rates(history, start=50, end=150)
    assert rates == [400.0, 200.0]  # the first interval (compile) is out
    summary = bench.summarize(rates)
    # 2 equal intervals of B samples take B/400 + B/200 seconds: 2B / (3B/400) samples/s, not the mean 300
    assert summary["samples_per_second"] == pytest.approx(800 / 3)
    assert summary["median"] == 300.0 and summary["intervals"] == 2
    with pytest.raises(ValueError, match="no logged samples/s in the window"):
        bench.summarize(bench.window_rates(history, start=150, end=150))


def test_a_launch_in_a_used_work_directory_trains_anew(bench, tmp_path):
    """Each launch passes --overwrite (tests/test_runner.py: a finished run is then trained again, in an emptied
    directory), so a second bench call in the same --work-dir measures a new run instead of reporting the old."""
    args = bench.build_parser().parse_args(["--data-dir", str(tmp_path), "--experiment", "sparse_tiny_rigl"])
    cmd = bench.run_command(args, 2, tmp_path / "runs", 29500)
    assert "--overwrite" in cmd and cmd[cmd.index("--run-name") + 1] == "sparse_tiny_rigl_2gpu"
    assert cmd[cmd.index("--output-dir") + 1] == str(tmp_path / "runs")


def test_efficiency_is_against_n_times_one_gpu(bench):
    results = {1: {"samples_per_second": 100.0}, 2: {"samples_per_second": 190.0}, 4: {"samples_per_second": 360.0}}
    assert bench.efficiencies(results) == pytest.approx({1: 1.0, 2: 0.95, 4: 0.9})
    assert bench.efficiencies({2: {"samples_per_second": 190.0}}) == {}


@pytest.mark.slow
def test_one_real_launch_is_read_back(data_dir, tmp_path):
    out = tmp_path / "scaling.json"
    cmd = [sys.executable, str(BENCH), "--data-dir", str(data_dir), "--experiment", "sparse_tiny_rigl",
           "--gpus", "1", "--per-gpu-batch", "8", "--steps", "30", "--logging-steps", "5", "--window-start", "10",
           "--max-files", "1", "--work-dir", str(tmp_path / "runs"), "--out", str(out),
           "--set", "data.max_seq_length=64", "--set", "data.eval_documents=4", "--set", "data.max_eval_samples=32",
           "--set", "train.dataloader_workers=0", "--set", "rigl.update_freq=5"]
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    history_file = tmp_path / "runs" / "sparse_tiny_rigl_1gpu" / "log_history.json"
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    history = json.loads(history_file.read_text())
    logged = [h["samples_per_second"] for h in history if "samples_per_second" in h and 10 < h["step"] <= 30]
    assert run["rates"] == logged and run["intervals"] == 4  # steps 15, 20, 25, 30
    assert any("rigl/drop_fraction" in h and 10 < h["step"] <= 30 for h in history)  # updates in the window
    assert report["efficiency_window"] == {"1": 1.0}
    assert "1 GPU(s):" in done.stdout
