"""Every run in the registry: running from its start, done or failed (with the error; a terminated run too), a
killed run left running; ``--runs`` lists them, ``--table`` ignores the unfinished ones; registries of schema
version 1 still read."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from sparsebert import runner
from sparsebert.cli import main as cli_main
from sparsebert.config import ExperimentRegistry
from sparsebert.errors import SparseBertError
from sparsebert.results import REGISTRY_FILENAME, RunRecord, RunRegistry
from sparsebert.results.run_registry import _MIGRATIONS, SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def experiments() -> ExperimentRegistry:
    return ExperimentRegistry.builtin()


class FakePretrainJob:
    """Stands in for PretrainJob: the runner's recording around it is what these tests check."""

    def __init__(self, seen: list[str | None], fail: Exception | None = None) -> None:
        self.seen, self.fail = seen, fail

    def prepare(self) -> None:
        pass

    def train(self, run_dir: Path, resume: bool) -> dict:
        record = RunRegistry.in_output_root(run_dir.parent).get(str(run_dir.resolve()))
        self.seen.append(record.status if record else None)  # the row as it is while training
        if self.fail is not None:
            raise self.fail
        return {"eval_loss": 2.5, "perplexity": 12.2, "global_step": 7, "train_samples_per_second": 3.0}


def test_pretraining_run_is_running_then_done(experiments, tmp_path: Path, monkeypatch) -> None:
    seen: list[str | None] = []
    monkeypatch.setattr(runner, "make_job", lambda cfg, opts, callbacks=None: FakePretrainJob(seen))
    cfg = experiments.build("bert_tiny_quick")
    runner.run_experiment(cfg, runner.RunOptions(output_root=tmp_path, data_dir=None))
    assert seen == ["running"]
    rec = RunRegistry.in_output_root(tmp_path).get(str((tmp_path / cfg.name).resolve()))
    assert (rec.status, rec.task, rec.experiment, rec.steps, rec.error) == ("done", "mlm", cfg.name, 7, None)
    assert rec.metrics["eval_loss"] == 2.5 and rec.samples_per_second == 3.0 and rec.wall_time_s is not None


def test_failed_pretraining_run_records_the_one_line_error(experiments, tmp_path: Path, monkeypatch) -> None:
    boom = RuntimeError("CUDA out of memory.\nTried to allocate 2 GiB")
    monkeypatch.setattr(runner, "make_job", lambda cfg, opts, callbacks=None: FakePretrainJob([], boom))
    cfg = experiments.build("bert_tiny_quick")
    with pytest.raises(RuntimeError):
        runner.run_experiment(cfg, runner.RunOptions(output_root=tmp_path, data_dir=None))
    (rec,) = RunRegistry.in_output_root(tmp_path).runs(status=None)
    assert (rec.status, rec.error) == ("failed", "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB")
    assert not (tmp_path / cfg.name / "DONE").exists()
    # --resume records it again: running while it trains, done at the end, the old error cleared
    seen: list[str | None] = []
    monkeypatch.setattr(runner, "make_job", lambda cfg, opts, callbacks=None: FakePretrainJob(seen))
    runner.run_experiment(cfg, runner.RunOptions(output_root=tmp_path, data_dir=None, resume=True))
    (rec,) = RunRegistry.in_output_root(tmp_path).runs(status=None)
    assert seen == ["running"] and (rec.status, rec.error) == ("done", None)


def test_each_finetuning_run_is_recorded_and_a_failure_names_its_error(experiments, tmp_path: Path,
                                                                       monkeypatch) -> None:
    from sparsebert.jobs.finetune import job as finetune

    cfg = experiments.build("tiny_glue")
    job = finetune.FinetuneJob(cfg, None, tmp_path)
    job.tasks, job.inputs = ["glue:rte"], {"glue:rte": None}
    job.ctx = SimpleNamespace(cfg=cfg, pretrain_metrics={"eval_loss": 1.5})
    seen = []

    def run_glue(ctx, inputs, seed, run_dir):  # run0 finishes (finish_run's record), run1 fails
        seen.append(RunRegistry.in_output_root(tmp_path).get(str(run_dir.resolve())).status)
        if seed == cfg.seed + 1:
            raise SparseBertError("glue/RTE/train.tsv row 3: no label")
        RunRegistry.in_output_root(tmp_path).record(RunRecord(
            run_dir=str(run_dir.resolve()), experiment=cfg.name, task="glue:rte", model="", seed=seed,
            status="done", metrics={"accuracy": 0.5, "score": 0.5}))
        return {"accuracy": 0.5, "score": 0.5}

    monkeypatch.setitem(finetune.RUNNERS, "glue", run_glue)
    with pytest.raises(SparseBertError):
        job.train(tmp_path / cfg.name, resume=False)
    assert seen == ["running", "running"]
    rows = {Path(r.run_dir).name: r for r in RunRegistry.in_output_root(tmp_path).runs(status=None)}
    assert (rows["run0"].status, rows["run1"].status) == ("done", "failed")
    assert rows["run1"].error == "glue/RTE/train.tsv row 3: no label"  # our own errors need no type in front
    assert rows["run1"].pretrain_metrics == {"eval_loss": 1.5} and rows["run1"].seed == cfg.seed + 1


TERMINATED_RUN = """
import os, sys, time
from pathlib import Path
from sparsebert import cli, runner

class Job:
    def prepare(self):
        pass
    def train(self, run_dir, resume):
        child = os.fork()  # a forked helper (a loader or featurize worker), in the same process group
        if child == 0:
            try:
                time.sleep(600)
            finally:  # runs only if the signal unwinds the helper's copy of the run instead of ending it
                Path(sys.argv[2] + ".unwound").write_text("the helper ran the run's cleanup")
            os._exit(0)
        Path(sys.argv[2]).write_text(str(child))
        time.sleep(600)

runner.make_job = lambda cfg, opts, callbacks=None: Job()
runner.check_train_settings = lambda cfg: None  # (it imports the Trainer: seconds this test does not need)
sys.exit(cli.main(["bert_tiny_quick", "--output-dir", sys.argv[1]]))
"""


def test_a_run_terminated_mid_way_is_recorded_as_failed(tmp_path: Path) -> None:
    """SIGTERM to the whole process group (what a scheduler or ``timeout`` sends) while the run trains: run.py
    exits 143 with one line, the registry row says failed, terminated, instead of staying running for ever, and
    a forked helper process dies of the signal as it would without the handler (no traceback of its own)."""
    script, started = tmp_path / "run.py", tmp_path / "started"
    script.write_text(TERMINATED_RUN)
    root = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(started)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() or not started.read_text():
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the run did not start training"
            time.sleep(0.2)
        child = psutil.Process(int(started.read_text()))
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        child.wait(timeout=30)  # it died of the signal (the script never reaps it: init does)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stderr = proc.stderr.read()
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "error: terminated by SIGTERM", stderr
    assert stderr.count("error:") == 1 and not Path(f"{started}.unwound").exists()  # the helper just died
    (rec,) = RunRegistry.in_output_root(root).runs(status=None)
    assert (rec.status, rec.task, rec.error) == ("failed", "mlm", "terminated by SIGTERM")
    assert not (root / "bert_tiny_quick" / "DONE").exists()


def test_a_running_row_is_listed_as_running(tmp_path: Path, capsys) -> None:
    """The row a run writes as it starts, as ``--runs`` lists it (a run killed by SIGKILL stays so: nothing can
    run after that signal)."""
    root = tmp_path / "runs"
    RunRegistry.in_output_root(root).record(runner.run_record(root / "bert_tiny_quick", "bert_tiny_quick", "mlm", 42,
                                                           "tiny"))
    (rec,) = RunRegistry.in_output_root(root).runs(status=None)
    assert (rec.status, rec.task, rec.error) == ("running", "mlm", None)
    assert cli_main(["--runs", "--output-dir", str(root), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("run,experiment,task,seed,status,metric,value,wall_time")
    assert lines[1].startswith("bert_tiny_quick,bert_tiny_quick,mlm,") and ",running,eval_loss,," in lines[1]


def test_runs_listing_and_table_ignore_unfinished(tmp_path: Path, capsys) -> None:
    reg = RunRegistry.in_output_root(tmp_path)
    base = dict(experiment="exp", model="minilm", seed=42)
    reg.record(RunRecord(run_dir=str(tmp_path / "pre"), task="mlm", status="done", wall_time_s=3725.0,
                         metrics={"eval_loss": 2.345678, "perplexity": 10.4}, **base))
    reg.record(RunRecord(run_dir=str(tmp_path / "exp/glue_rte/run0"), task="glue:rte", status="done",
                         metrics={"accuracy": 0.625, "score": 0.625}, wall_time_s=65.0, **base))
    reg.record(RunRecord(run_dir=str(tmp_path / "exp/glue_stsb/run0"), task="glue:stsb", status="running",
                         metrics={"score": 0.9}, **base))  # metrics of an unfinished run must not count
    reg.record(RunRecord(run_dir=str(tmp_path / "exp/glue_cola/run0"), task="glue:cola", status="failed",
                         metrics={"score": 0.1}, error="RuntimeError: a | b", **base))
    reg.record(RunRecord(run_dir="/elsewhere/squad/run0", task="squad_v1", status="done",
                         metrics={"exact_match": 70.0, "f1": 80.5}, **base))

    assert cli_main(["--runs", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    cells = [[cell.strip() for cell in line.strip()[1:-1].split(" | ")] for line in out]  # padded columns
    assert cells[0][:8] == ["run", "experiment", "task", "seed", "status", "metric", "value", "wall_time"]
    assert cells[2][:8] == ["pre", "exp", "mlm", "42", "done", "eval_loss", "2.346", "1:02:05"]
    assert cells[3][:8] == ["exp/glue_rte/run0", "exp", "glue:rte", "42", "done", "score", "0.625", "1:05"]
    assert cells[4][4:7] == ["running", "score", "0.9"]
    assert cells[5][-1] == "RuntimeError: a \\| b" and len(cells[5]) == 10  # a | in a cell does not split it
    assert cells[6][0] == "/elsewhere/squad/run0" and cells[6][5:7] == ["f1", "80.5"]

    assert cli_main(["--runs", "--status", "failed", "--output-dir", str(tmp_path), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("exp/glue_cola/run0,") and lines[1].endswith(",RuntimeError: a | b")

    assert cli_main(["--table", "glue", "--output-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "average_glue over: rte (1 task)" in table  # the running stsb and failed cola rows are left out
    for fmt, rte in [("csv", ",62.5,"), ("latex", " & 62.5 & ")]:  # every format --help offers
        assert cli_main(["--table", "glue", "--format", fmt, "--output-dir", str(tmp_path)]) == 0
        assert rte in capsys.readouterr().out

    assert cli_main(["--runs", "--format", "latex", "--output-dir", str(tmp_path)]) == 0  # every --help format
    latex = capsys.readouterr().out.splitlines()
    assert latex[0] == r"\begin{tabular}{lllrllrrll}" and latex[-1] == r"\end{tabular}"
    assert any(line.startswith(r"exp/glue\_rte/run0 & exp & glue:rte & 42 & done & score & 0.625 & 1:05 & ")
               for line in latex)
    assert cli_main(["--status", "done", "--output-dir", str(tmp_path)]) == 2
    assert "with --runs" in capsys.readouterr().err
    assert cli_main(["--runs", "--output-dir", str(tmp_path / "nowhere")]) == 2
    assert "no results registry" in capsys.readouterr().err


def test_a_version_1_registry_is_read_as_is_and_migrated_on_write(tmp_path: Path) -> None:
    path = tmp_path / REGISTRY_FILENAME
    con = sqlite3.connect(path)
    for statement in _MIGRATIONS[1]:
        con.execute(statement)
    con.execute("INSERT INTO runs (run_dir, experiment, task, model, seed, status, created_at, updated_at) "
                "VALUES ('old', 'exp', 'glue:rte', 'm', 1, 'done', '2024-01-01', '2024-01-01')")
    con.execute("PRAGMA user_version = 1")
    con.commit()
    con.close()
    (old,) = RunRegistry(path, read_only=True).runs()  # read without writing: no error column yet
    assert (old.run_dir, old.error) == ("old", None)
    reg = RunRegistry(path)  # read-write: migrated in place
    reg.record(RunRecord(run_dir="new", experiment="exp", task="mlm", model="m", seed=1, status="failed",
                         error="boom"))
    assert [(r.run_dir, r.error) for r in reg.runs(status=None)] == [("old", None), ("new", "boom")]
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    con.close()
