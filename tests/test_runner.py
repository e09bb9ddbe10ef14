"""run_experiment's handling of a run directory that holds a finished run, or that another process is using."""

from __future__ import annotations

import json
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
from sparsebert.cli import main
from sparsebert.config import ExperimentRegistry, to_dict
from sparsebert.errors import SparseBertError
from sparsebert.io import atomic_write_json
from sparsebert.results import RunRecord, RunRegistry
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


class FakeJob:
    """What make_job returns, without the model and data (training itself is tested elsewhere): ``train`` calls
    ``during`` with the run directory, then returns a metric."""

    def __init__(self, during=lambda run_dir: None) -> None:
        self.during = during

    def prepare(self) -> None:
        pass

    def train(self, run_dir: Path, resume: bool) -> dict:
        self.during(run_dir)
        return {"eval_loss": 1.0}


def fake_training(monkeypatch, during=lambda run_dir: None) -> None:
    monkeypatch.setattr(runner, "make_job", lambda cfg, opts, callbacks=None: FakeJob(during))
    monkeypatch.setattr(runner, "check_train_settings", lambda cfg: None)


def test_overwrite_forgets_the_runs_it_deletes_before_it_trains(tmp_path, monkeypatch):
    """The registry rows of the runs in a directory --overwrite deletes (the experiment's own, a finetuning job's
    task runs) are gone before training starts: a run killed then leaves none behind, and a smaller set of tasks
    does not keep the old ones in the tables. Other experiments' rows stay; the new row starts at its own time."""
    cfg = finished_run(tmp_path, ["train.max_steps=20"])
    run_dir = (tmp_path / cfg.name).resolve()
    registry = RunRegistry.in_output_root(tmp_path)
    old_start = "2020-01-01T00:00:00+00:00"
    for run in ["", "/glue_rte/run0", "/glue_stsb/run0", "_sparse", "_sparse/glue_rte/run0"]:
        registry.record(RunRecord(run_dir=f"{run_dir}{run}", experiment=cfg.name, task="glue:rte", model="m", seed=0,
                                  status="done", created_at=old_start))
    while_training = []
    fake_training(monkeypatch, lambda run_dir: while_training.extend(registry.runs(status=None)))
    run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=tmp_path, overwrite=True))
    assert sorted((r.run_dir, r.status) for r in while_training) == [
        (str(run_dir), "running"), (f"{run_dir}_sparse", "done"), (f"{run_dir}_sparse/glue_rte/run0", "done")]
    (running,) = [r for r in while_training if r.run_dir == str(run_dir)]
    (now,) = [r for r in registry.runs() if r.run_dir == str(run_dir)]
    assert now.created_at == running.created_at != old_start and now.metrics["eval_loss"] == 1.0


def test_a_resume_is_added_to_env_json_beside_the_environment_that_started_the_run(tmp_path, monkeypatch):
    """--resume rewrote env.json, so the run looked as if the resume's command and commit had made all of it (and
    the model card of a finetuning run trained before the resume named them)."""
    fake_training(monkeypatch)
    cfg = ExperimentRegistry.builtin().build("bert_tiny_quick", ["train.max_steps=20"])
    env_file = tmp_path / cfg.name / "env.json"
    for commit, flags in (("aaaaaaa", []), ("bbbbbbb", ["--resume"]), ("ccccccc", ["--resume", "--gpus", "1"])):
        monkeypatch.setenv("SPARSEBERT_COMMIT", commit)
        monkeypatch.setattr(sys, "argv", ["run.py", cfg.name, *flags])
        (tmp_path / cfg.name / DONE).unlink(missing_ok=True)
        run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=tmp_path, resume=bool(flags)))
    env = json.loads(env_file.read_text())
    # the start on top, as readers of env.json have always read it
    assert (env["git_commit"], env["argv"], env["seed"]) == ("aaaaaaa", ["run.py", cfg.name], cfg.seed)
    assert "world_size" in env["hardware"]
    assert [(r["git_commit"], r["argv"][2:]) for r in env["resumes"]] == [
        ("bbbbbbb", ["--resume"]), ("ccccccc", ["--resume", "--gpus", "1"])]
    assert all(r["resumed_at"] and "hardware" in r for r in env["resumes"])
    # the run's registry row names the invocation that finished it, the last one
    assert RunRegistry.in_output_root(tmp_path).get(str(env_file.parent.resolve())).git_commit == "ccccccc"
    monkeypatch.setattr(sys, "argv", ["run.py", cfg.name, "--overwrite"])
    run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=tmp_path, overwrite=True))
    assert "resumes" not in json.loads(env_file.read_text())  # a run started over is a new run


def test_a_new_run_directory_forgets_rows_left_by_a_deleted_one(tmp_path, monkeypatch):
    """Rows whose run directory is gone (deleted by hand, or by an --overwrite of an older sparsebert that was
    killed) are dropped when the experiment starts afresh there."""
    registry = RunRegistry.in_output_root(tmp_path)
    stale = tmp_path.resolve() / "bert_tiny_quick" / "glue_stsb" / "run0"
    registry.record(RunRecord(run_dir=str(stale), experiment="bert_tiny_quick", task="glue:stsb", model="m", seed=0,
                              status="done"))
    fake_training(monkeypatch)
    cfg = ExperimentRegistry.builtin().build("bert_tiny_quick", ["train.max_steps=20"])
    run_experiment(cfg, RunOptions(output_root=tmp_path, data_dir=tmp_path))
    assert [r.run_dir for r in registry.runs(status=None)] == [str(tmp_path.resolve() / "bert_tiny_quick")]


@pytest.mark.slow
def test_the_glue_table_forgets_a_task_an_overwrite_dropped(tmp_path, data_dir, capsys):
    """The reviewer's case through the CLI: tiny_glue on RTE and STS-B, then --overwrite with RTE alone; the table
    and --runs show the runs that exist, and glue_from the finished experiment names a run to start from."""
    out = str(tmp_path / "runs")
    small = ["--set", "finetune.runs_per_task={}", "--set", "finetune.max_train_samples=8", "--set",
             "finetune.max_eval_samples=8", "--set", "train.report_to=[]", "--data-dir", str(data_dir)]
    assert main(["tiny_glue", "--output-dir", out, "--set", 'finetune.glue_tasks=["rte","stsb"]', *small]) == 0
    assert main(["tiny_glue", "--output-dir", out, "--set", 'finetune.glue_tasks=["rte"]', *small, "--overwrite"]) == 0
    capsys.readouterr()
    assert main(["--table", "glue", "--output-dir", out, "--format", "csv"]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    table = dict(zip(header.split(","), row.split(","), strict=True))
    assert table["stsb_pearson"] == "" and table["average_glue_tasks"] == "rte"
    assert main(["--runs", "--output-dir", out, "--format", "csv"]) == 0
    assert [line.split(",")[0] for line in capsys.readouterr().out.strip().splitlines()[1:]] == ["tiny_glue/glue_rte/run0"]
    assert refused(["glue_from=tiny_glue", "--output-dir", out, *small], capsys) == (
        f"error: model.init_from tiny_glue: {out}/tiny_glue is a finetuning experiment, whose models are those of its "
        "runs: name one, e.g. tiny_glue/glue_rte/run0")


def refused(argv: list[str], capsys) -> str:
    """The one error line of a refused ``sparsebert`` command."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("flags", [[], ["--resume"]])
def test_a_damaged_config_json_is_a_one_line_error_naming_it(tmp_path, capsys, flags):
    finished_run(tmp_path, ["train.max_steps=20"])
    config = tmp_path / "bert_tiny_quick" / "config.json"
    with open(config, "r+") as f:  # as `truncate -s 100` leaves it
        f.truncate(100)
    line = refused(["bert_tiny_quick", "--output-dir", str(tmp_path), "--set", "train.max_steps=20", *flags], capsys)
    assert line == (f"error: {config} is damaged (not a JSON object of settings), so its settings cannot be compared "
                    "with these: pass --overwrite to start over, or use another --output-dir")


def test_resume_refuses_a_run_without_its_config_json_and_takes_an_empty_directory(tmp_path, capsys, monkeypatch):
    """config.json is the first file a run writes: a directory with a checkpoint but no config.json has lost it (its
    settings cannot be compared), while an empty one (a run stopped before it wrote it) has nothing to compare."""
    run_dir = tmp_path / "bert_tiny_quick"
    (run_dir / "checkpoint-10").mkdir(parents=True)
    argv = ["bert_tiny_quick", "--output-dir", str(tmp_path), "--set", "train.max_steps=20", "--resume"]
    assert refused(argv, capsys) == (f"error: {run_dir} holds a run without its config.json, so its settings cannot be "
                                     "compared with these: pass --overwrite to start over, or use another --output-dir")
    (run_dir / "checkpoint-10").rmdir()
    fake_training(monkeypatch)
    assert main(argv) == 0 and (run_dir / DONE).is_file()


@pytest.mark.parametrize("flags", [[], ["--resume"], ["--overwrite"]])
def test_a_file_where_the_run_directory_goes_is_a_one_line_error_and_is_left_alone(tmp_path, capsys, flags):
    in_the_way = tmp_path / "bert_tiny_quick"
    in_the_way.write_text("notes")
    line = refused(["bert_tiny_quick", "--output-dir", str(tmp_path), *flags], capsys)
    assert line == (f"error: a file is in the way of the run directory: {in_the_way} is not a directory; move it "
                    "away, or use another --output-dir")
    assert in_the_way.read_text() == "notes"


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
