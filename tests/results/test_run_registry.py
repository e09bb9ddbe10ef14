"""The run registry: round trip, upsert, filters, SQL injection safety and several writer processes."""

from __future__ import annotations

import math
import multiprocessing as mp
import sqlite3
from pathlib import Path

import pytest

from sparsebert.errors import SparseBertError
from sparsebert.results import REGISTRY_FILENAME, RunRecord, RunRegistry
from sparsebert.results.run_registry import SCHEMA_VERSION


def _rec(run_dir: str, **overrides) -> RunRecord:
    fields = dict(
        run_dir=run_dir,
        experiment="exp",
        task="glue:rte",
        model="base",
        seed=0,
        status="done",
        metrics={"accuracy": 0.66, "score": 0.66},
    )
    fields.update(overrides)
    return RunRecord(**fields)


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    reg = RunRegistry.in_output_root(tmp_path)
    assert (tmp_path / REGISTRY_FILENAME).is_file()
    rec = RunRecord(
        run_dir="runs/exp/rte-s1",
        experiment="exp",
        task="glue:rte",
        model="runs/pretrain/base",
        seed=1,
        status="done",
        sparsity=0.9,
        metrics={"accuracy": 0.6715, "score": 0.6715},
        steps=1234,
        wall_time_s=56.5,
        samples_per_second=101.25,
        git_commit="abc123",
        pretrain_metrics={"perplexity": 4.5678, "eval_loss": 1.519},
        group="sparse 90%",
    )
    reg.record(rec)
    (got,) = reg.runs()
    assert got.created_at  # filled in by the registry
    assert got == RunRecord(**{**rec.__dict__, "created_at": got.created_at})
    assert got.label == "sparse 90%"
    assert reg.get("runs/exp/rte-s1") == got
    assert reg.get("nope") is None
    # None stays None (dense run, no group); NaN (a diverged run) survives the JSON round trip
    reg.record(_rec("dense", metrics={"eval_loss": float("nan")}))
    dense = reg.get("dense")
    assert dense is not None
    assert math.isnan(dense.metrics["eval_loss"])
    assert (dense.sparsity, dense.steps, dense.group, dense.label, dense.pretrain_metrics) == (
        None,
        None,
        None,
        "exp",
        {},
    )


def test_schema_version_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "reg.sqlite"
    RunRegistry(path)
    RunRegistry(path)  # reopening an existing registry is a no-op
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        con.commit()
    finally:
        con.close()
    with pytest.raises(SparseBertError, match="newer"):
        RunRegistry(path)


def test_upsert_by_run_dir_keeps_created_at(tmp_path: Path) -> None:
    reg = RunRegistry(tmp_path / "reg.sqlite")
    reg.record(_rec("r1", status="running", metrics={}))
    first = reg.runs(status=None)
    assert [r.status for r in first] == ["running"]
    reg.record(_rec("r1", status="done", metrics={"accuracy": 0.7, "score": 0.7}, steps=10))
    (row,) = reg.runs(status=None)
    assert (row.status, row.metrics, row.steps) == ("done", {"accuracy": 0.7, "score": 0.7}, 10)
    assert row.created_at == first[0].created_at  # the run's start time survives the update
    reg.record(_rec("r1", created_at="2020-01-01T00:00:00+00:00"))  # an explicit time wins
    assert reg.get("r1").created_at == "2020-01-01T00:00:00+00:00"
    assert len(reg.runs(status=None)) == 1


def test_a_run_recorded_as_running_again_starts_at_its_own_time(tmp_path: Path) -> None:
    """A re-run (--resume of a failed run, a finetuning run redone) is recorded as running when it starts: its start
    time is that one, not the earlier attempt's; its done row keeps it."""
    reg = RunRegistry(tmp_path / "reg.sqlite")
    reg.record(_rec("r1", status="running", metrics={}))
    reg.record(_rec("r1", status="failed", metrics={}, error="boom"))
    first_start = reg.get("r1").created_at
    reg.record(_rec("r1", status="running", metrics={}))
    restarted = reg.get("r1").created_at
    assert restarted > first_start
    reg.record(_rec("r1", status="done"))
    assert reg.get("r1").created_at == restarted


def test_forget_tree_deletes_a_run_and_the_runs_below_it_only(tmp_path: Path) -> None:
    """What --overwrite deletes with a run directory: its row and those of the runs inside it, not those of a
    sibling whose name starts the same, nor a name that LIKE's wildcards would match."""
    reg = RunRegistry(tmp_path / "reg.sqlite")
    gone = ["/out/tiny_glue", "/out/tiny_glue/glue_rte/run0", "/out/tiny_glue/glue_stsb/run1"]
    kept = ["/out/tiny_glue_sparse/glue_rte/run0", "/out/tiny_glue2", "/out/tinyxglue/glue_rte/run0", "/out"]
    for run_dir in gone + kept:
        reg.record(_rec(run_dir))
    assert reg.forget_tree("/out/tiny_glue") == 3
    assert sorted(r.run_dir for r in reg.runs(status=None)) == sorted(kept)
    assert reg.forget_tree("/out/tiny_glue/") == 0  # nothing left there; a trailing slash names the same directory


def test_filters(tmp_path: Path) -> None:
    reg = RunRegistry(tmp_path / "reg.sqlite")
    reg.record(_rec("a1", experiment="a", task="glue:rte"))
    reg.record(_rec("a2", experiment="a", task="squad_v1", status="failed"))
    reg.record(_rec("a3", experiment="a", task="mlm", status="running"))
    reg.record(_rec("b1", experiment="b", task="glue:cola"))
    reg.record(_rec("c1", experiment="c", task="squadxv1"))  # "_" must not act as a LIKE wildcard

    def dirs(**kw) -> list[str]:
        return [r.run_dir for r in reg.runs(**kw)]

    assert dirs() == ["a1", "b1", "c1"]  # default: done only, oldest first
    assert dirs(status=None) == ["a1", "a2", "a3", "b1", "c1"]
    assert dirs(status="failed") == ["a2"]
    assert dirs(status="running") == ["a3"]
    assert dirs(experiments=["b", "a"]) == ["a1", "b1"]
    assert dirs(experiments="a") == ["a1"]  # a lone name is not split into characters
    assert dirs(experiments=[]) == []
    assert dirs(task_prefix="glue:") == ["a1", "b1"]
    assert dirs(task_prefix="squad_", status=None) == ["a2"]
    assert dirs(experiments=["a"], task_prefix="glue:cola") == []


def test_sql_injection_is_stored_verbatim(tmp_path: Path) -> None:
    reg = RunRegistry(tmp_path / "reg.sqlite")
    evil = "x'; DROP TABLE runs; --"
    reg.record(_rec(f"runs/{evil}", experiment=evil, task=evil, model=evil, group=evil, git_commit=evil))
    reg.record(_rec("other"))
    assert [r.run_dir for r in reg.runs(experiments=[evil], task_prefix=evil)] == [f"runs/{evil}"]
    got = reg.get(f"runs/{evil}")
    assert (got.experiment, got.task, got.model, got.group, got.git_commit) == (evil,) * 5
    assert len(reg.runs()) == 2  # the table is still there


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"status": "finished"}, "status"),
        ({"run_dir": ""}, "run_dir"),
        ({"metrics": {"accuracy": "high"}}, "not a number"),
        ({"pretrain_metrics": {"perplexity": None}}, "not a number"),
        ({"sparsity": 1.5}, "sparsity"),
        ({"steps": 2.5}, "integer"),
    ],
)
def test_bad_records_are_rejected(tmp_path: Path, overrides: dict, match: str) -> None:
    reg = RunRegistry(tmp_path / "reg.sqlite")
    with pytest.raises(SparseBertError, match=match):
        reg.record(_rec(**{"run_dir": "r", **overrides}))
    assert reg.runs(status=None) == []


def test_numpy_scalars_are_stored_as_plain_numbers(tmp_path: Path) -> None:
    import numpy as np
    reg = RunRegistry(tmp_path / "reg.sqlite")
    reg.record(_rec("r", metrics={"accuracy": np.float32(0.5)}, steps=np.int64(7), sparsity=np.float64(0.8)))
    got = reg.get("r")
    assert got.metrics == {"accuracy": 0.5} and type(got.metrics["accuracy"]) is float
    assert got.steps == 7 and got.sparsity == 0.8


# -- several writer processes --------------------------------------------------------------------------

N_PROCS = 4
N_PER_PROC = 50


def _writer(db: str, worker: int, barrier, busy_timeout_s: float) -> None:
    # Each process opens its own RunRegistry (on a not-yet-created file, so schema creation races too) and
    # records runs one transaction at a time, starting together to maximise lock contention.
    barrier.wait()
    reg = RunRegistry(db, busy_timeout_s=busy_timeout_s, max_attempts=60)
    for i in range(N_PER_PROC):
        reg.record(
            _rec(
                f"runs/w{worker}/r{i}",
                experiment=f"w{worker}",
                seed=i,
                metrics={"accuracy": i / 100, "score": i / 100},
            )
        )


# busy_timeout 0 turns SQLite's own waiting off, so every collision goes through the retry/backoff loop.
@pytest.mark.parametrize("busy_timeout_s", [30.0, 0.0], ids=["busy-timeout", "retry-loop-only"])
def test_concurrent_writers_lose_nothing(tmp_path: Path, busy_timeout_s: float) -> None:
    db = str(tmp_path / "out" / REGISTRY_FILENAME)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(N_PROCS)
    procs = [ctx.Process(target=_writer, args=(db, w, barrier, busy_timeout_s)) for w in range(N_PROCS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * N_PROCS

    runs = RunRegistry(db).runs()
    assert len(runs) == N_PROCS * N_PER_PROC
    assert {r.run_dir for r in runs} == {f"runs/w{w}/r{i}" for w in range(N_PROCS) for i in range(N_PER_PROC)}
    assert all(r.metrics["score"] == r.seed / 100 for r in runs)
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == N_PROCS * N_PER_PROC
    finally:
        con.close()


def test_read_only_registry_reads_and_never_writes(tmp_path: Path) -> None:
    path = tmp_path / REGISTRY_FILENAME
    RunRegistry(path).record(_rec("runs/a"))
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    reader = RunRegistry(path, read_only=True)
    assert [r.run_dir for r in reader.runs()] == ["runs/a"]
    with pytest.raises(SparseBertError, match="readonly"):
        reader.record(_rec("runs/b"))
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir() if p.name in before} == before
    assert [r.run_dir for r in reader.runs()] == ["runs/a"]


def test_read_only_registry_must_exist_and_be_current(tmp_path: Path) -> None:
    with pytest.raises(SparseBertError, match="no results registry"):
        RunRegistry(tmp_path / "missing.sqlite", read_only=True)
    assert not (tmp_path / "missing.sqlite").exists()
    old = tmp_path / "old.sqlite"
    sqlite3.connect(old).close()  # an empty database: schema version 0
    with pytest.raises(SparseBertError, match="schema version 0"):
        RunRegistry(old, read_only=True)


@pytest.mark.parametrize("read_only", [True, False])
def test_a_file_that_is_not_a_database_is_a_one_line_error(tmp_path: Path, read_only: bool) -> None:
    path = tmp_path / REGISTRY_FILENAME
    path.write_bytes(b"these are not the bytes of a SQLite database\n" * 100)
    with pytest.raises(SparseBertError, match=f"run registry {path}: file is not a database"):
        RunRegistry(path, read_only=read_only).runs()


# -- reading never writes ---------------------------------------------------------------------------------------


def test_table_reads_a_registry_in_a_read_only_folder_and_writes_nothing(tmp_path: Path, capsys) -> None:
    """Reading needs no write access: not to the folder, where SQLite would create -wal and -shm files. The
    listing is compared, not just a write attempted, because CI runs as root, for whom chmod stops nothing."""
    from sparsebert.cli import main

    root = tmp_path / "results"
    RunRegistry.in_output_root(root).record(_rec("runs/a"))
    before = sorted(p.name for p in root.iterdir())
    root.chmod(0o555)
    try:
        assert main(["--table", "glue", "--output-dir", str(root)]) == 0
        assert sorted(p.name for p in root.iterdir()) == before == [REGISTRY_FILENAME]
    finally:
        root.chmod(0o755)
    assert "| exp" in capsys.readouterr().out


def test_a_reader_sees_rows_still_in_a_writers_log(tmp_path: Path) -> None:
    path = tmp_path / REGISTRY_FILENAME
    RunRegistry(path).record(_rec("runs/a"))
    holder = sqlite3.connect(path)  # an open connection: the log is not folded into the file when a writer closes
    try:
        holder.execute("SELECT count(*) FROM runs").fetchone()
        RunRegistry(path).record(_rec("runs/b"))
        assert (tmp_path / f"{REGISTRY_FILENAME}-wal").stat().st_size > 0
        assert [r.run_dir for r in RunRegistry(path, read_only=True).runs()] == ["runs/a", "runs/b"]
    finally:
        holder.close()


def test_a_read_during_which_a_writer_changed_the_file_is_repeated(tmp_path: Path) -> None:
    path = tmp_path / REGISTRY_FILENAME
    RunRegistry(path).record(_rec("runs/a"))
    reader = RunRegistry(path, read_only=True)
    writes = [lambda: RunRegistry(path).record(_rec("runs/b"))]

    def read(conn: sqlite3.Connection) -> list[str]:
        rows = [row["run_dir"] for row in conn.execute("SELECT run_dir FROM runs ORDER BY run_dir")]
        if writes:  # a writer commits (and folds its log into the file) while this read is open
            writes.pop()()
        return rows

    assert reader._with_retry(read) == ["runs/a", "runs/b"]
