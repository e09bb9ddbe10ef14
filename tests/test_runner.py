"""run_experiment's handling of a run directory that holds a finished run, or that another process is using."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparsebert import runner
from sparsebert.config import ExperimentRegistry, to_dict
from sparsebert.errors import SparseBertError
from sparsebert.io import atomic_write_json
from sparsebert.runner import DONE, RunOptions, run_experiment

REPO = Path(__file__).resolve().parents[1]


def finished_run(root: Path, overrides: list[str]):
    cfg = ExperimentRegistry.builtin().build("bert_tiny_quick", overrides)
    run_dir = root / cfg.name
    run_dir.mkdir(parents=True)
    atomic_write_json(run_dir / "config.json", to_dict(cfg))
    (run_dir / DONE).write_text("2026-11-26\n")
    return cfg


def test_a_finished_run_is_skipped_only_with_the_same_settings(tmp_path):
    cfg = finished_run(tmp_path, ["train.max_steps=20"])
    opts = RunOptions(output_root=tmp_path, data_dir=tmp_path)
    assert run_experiment(cfg, opts) is None  # the same settings: nothing to do
    changed = ExperimentRegistry.builtin().build("bert_tiny_quick", ["train.max_steps=30"])
    with pytest.raises(SparseBertError, match=r"holds a finished run of bert_tiny_quick with other settings "
                                              r"\(train.max_steps\); use --overwrite"):
        run_experiment(changed, opts)


def test_overwrite_trains_a_finished_run_again_in_an_emptied_directory(tmp_path, monkeypatch):
    """A finished run with --overwrite is not skipped: its directory is emptied and the job trains again (the
    benches' re-runs in one work directory rely on it)."""
    cfg = finished_run(tmp_path, ["train.max_steps=20"])
    stale = tmp_path / cfg.name / "stale.txt"
    stale.write_text("from the finished run")
    trained = []

    class Job:  # what make_job returns, without the model and data (training itself is tested elsewhere)
        def prepare(self) -> None:
            pass

        def train(self, run_dir: Path, resume: bool) -> dict:
            trained.append((run_dir, stale.exists()))
            return {"eval_loss": 1.0}

    monkeypatch.setattr(runner, "make_job", lambda cfg, opts, callbacks=None: Job())
    monkeypatch.setattr(runner, "check_train_settings", lambda cfg: None)
    metrics = run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=tmp_path, overwrite=True))
    assert trained == [(tmp_path / cfg.name, False)]  # trained once, in the emptied directory
    assert metrics["eval_loss"] == 1.0 and (tmp_path / cfg.name / "DONE").read_text() != "2026-11-26\n"


@pytest.mark.parametrize("experiment, section, key", [("bert_tiny_quick", "train", "stop_after_steps"),
                                                     ("sparse_tiny_rigl", "rigl", "grow_init")])
def test_a_run_made_before_a_setting_existed_still_counts_as_the_same(tmp_path, experiment, section, key):
    """config.json of an older version lacks the settings added since: at their default (None for
    stop_after_steps, "zeros" for grow_init) that is no change; at another value it is."""
    registry = ExperimentRegistry.builtin()
    cfg = registry.build(experiment, ["train.max_steps=20"])
    run_dir = tmp_path / cfg.name
    run_dir.mkdir(parents=True)
    saved = to_dict(cfg)
    del saved[section][key]  # a setting added after the run was made
    atomic_write_json(run_dir / "config.json", saved)
    (run_dir / DONE).write_text("2026-11-26\n")
    opts = RunOptions(output_root=tmp_path, data_dir=tmp_path)
    assert run_experiment(cfg, opts) is None  # skipped as finished
    other = "4" if key == "stop_after_steps" else "normal"
    changed = registry.build(experiment, ["train.max_steps=20", f"{section}.{key}={other}"])
    with pytest.raises(SparseBertError, match=rf"other settings \({section}.{key}\)"):
        run_experiment(changed, opts)


# --- one writer per run directory: real processes racing on one output root ----------------------------------

# a run long enough to still be training when the other processes have started and been refused
LONG_RUN = ["--set", "data.max_files=1", "--set", "data.max_seq_length=64", "--set", "data.max_eval_samples=32",
            "--set", "train.global_batch_size=8", "--set", "train.max_steps=100000", "--set", "train.eval_steps=50000",
            "--set", "train.save_steps=50000", "--set", "train.report_to=[]"]


@dataclass
class Started:
    proc: subprocess.Popen
    stderr: Path

    def error_line(self) -> str:
        lines = self.stderr.read_text().strip().splitlines()
        assert "Traceback" not in self.stderr.read_text() and lines and lines[-1].startswith("error:"), lines[-20:]
        return lines[-1]


def start(tmp_path: Path, out: Path, data_dir: Path, name: str, *flags: str) -> Started:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf"), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    stderr = tmp_path / f"{name}.stderr"
    with open(stderr, "w") as f:  # a file, not a pipe: a training process must never block on a full pipe
        proc = subprocess.Popen([sys.executable, str(REPO / "run.py"), "bert_tiny_quick", "--output-dir", str(out),
                                 "--data-dir", str(data_dir), *LONG_RUN, *flags], env=env, stdout=subprocess.DEVNULL,
                                stderr=f)
    return Started(proc, stderr)


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def refusal(refused: Started, holder: Started, run_dir: Path) -> None:
    assert refused.proc.wait(60) == 2
    line = refused.error_line()
    assert f"run directory {run_dir} is in use by process {holder.proc.pid} on host {socket.gethostname()}" in line


@pytest.mark.slow
def test_a_second_process_on_the_same_run_is_refused_naming_the_first(tmp_path, data_dir):
    """Two processes started a second apart (a double-submitted job): one trains, the other is refused naming
    it; then an --overwrite while the first trains is refused too, and the run directory is left alone."""
    out = tmp_path / "out"
    run_dir = out / "bert_tiny_quick"
    first = start(tmp_path, out, data_dir, "first")
    time.sleep(1)
    second = start(tmp_path, out, data_dir, "second")
    started = [first, second]
    try:
        wait_for(lambda: any(s.proc.poll() is not None for s in started), 120, "one of the two to be refused")
        refused, holder = (first, second) if first.proc.poll() is not None else (second, first)
        refusal(refused, holder, run_dir)
        wait_for(lambda: (run_dir / "env.json").is_file(), 120, "the run to start training")
        assert holder.proc.poll() is None
        overwrite = start(tmp_path, out, data_dir, "overwrite", "--overwrite")
        started.append(overwrite)
        refusal(overwrite, holder, run_dir)
        assert holder.proc.poll() is None and (run_dir / "env.json").is_file()  # still training, in its directory
    finally:
        for s in started:
            if s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait()


def test_an_output_root_that_cannot_take_the_lock_is_a_one_line_error(tmp_path):
    """Where the run's lock file cannot be made (here a directory holds its name: root, CI's user, is refused too),
    the run stops before it writes anything, naming the output root."""
    (tmp_path / ".exp.lock").mkdir()
    refused = rf"^cannot write in the output root {re.escape(str(tmp_path))}: Is a directory$"
    with pytest.raises(SparseBertError, match=refused), runner.run_lock(tmp_path / "exp"):
        raise AssertionError("the run must not start")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".exp.lock"]
