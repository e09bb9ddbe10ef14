"""Run registry: one SQLite file in the output root (``registry.sqlite``) that records every run.

Several runs (processes) write to the same file at once, so:

* the database is in WAL mode: readers never block the writer and a crash mid-write leaves no torn row;
* every connection has a busy timeout, and on top of it each operation is retried with exponential backoff
  when SQLite still reports ``database is locked`` (the busy handler is not consulted for every lock, e.g.
  switching the journal mode or creating the schema while another process does the same);
* a connection lives for one operation only, so a registry object is safe to keep across ``fork``/``spawn``;
* all values go through SQL parameters, never string formatting;
* metrics are stored as JSON text (plain data, never pickle);
* reading (``read_only``, for tables and plots) never writes: a database with no write-ahead log in use is read
  as an immutable file, so neither write access to its folder nor the ``-wal``/``-shm`` files that SQLite would
  create there are needed, and the read is repeated if a writer changed the file meanwhile. While a writer's
  log exists it is read through SQLite's read-only mode, which sees the log.

The schema version lives in ``PRAGMA user_version``; the schema is created (or migrated) on first use.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from sparsebert.errors import SparseBertError

REGISTRY_FILENAME = "registry.sqlite"
SCHEMA_VERSION = 2
STATUSES = ("running", "done", "failed")

_T = TypeVar("_T")

# Statements that bring the schema from version N-1 to version N; databases written by an older sparsebert are
# upgraded in place on first (read-write) use.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """
        CREATE TABLE IF NOT EXISTS runs (
            run_dir            TEXT PRIMARY KEY NOT NULL,
            experiment         TEXT NOT NULL,
            task               TEXT NOT NULL,
            model              TEXT NOT NULL,
            seed               INTEGER NOT NULL,
            status             TEXT NOT NULL,
            sparsity           REAL,
            metrics            TEXT NOT NULL DEFAULT '{}',
            steps              INTEGER,
            wall_time_s        REAL,
            samples_per_second REAL,
            git_commit         TEXT,
            pretrain_metrics   TEXT NOT NULL DEFAULT '{}',
            group_label        TEXT,
            created_at         TEXT NOT NULL,
            updated_at         TEXT NOT NULL
        )
        """,
        "CREATE INDEX IF NOT EXISTS runs_experiment ON runs (experiment)",
        "CREATE INDEX IF NOT EXISTS runs_task ON runs (task)",
    ),
    # version 2: the one-line error of a failed run
    2: ("ALTER TABLE runs ADD COLUMN error TEXT",),
}
# versions a read-only registry can read as they are (the columns a version lacks read as their defaults)
_READABLE_VERSIONS = (1, 2)

_COLUMNS = (
    "run_dir", "experiment", "task", "model", "seed", "status", "sparsity", "metrics", "steps",
    "wall_time_s", "samples_per_second", "git_commit", "pretrain_metrics", "group_label",
    "created_at", "updated_at", "error",
)  # fmt: skip

# Upsert keyed on run_dir.  A row recorded as "running" is the run starting (again: --resume, --overwrite), so
# created_at becomes this recording's time; a run recorded later as "done" or "failed" keeps its start time. A
# created_at the caller set explicitly always wins.
_UPSERT_SQL = (
    f"INSERT INTO runs ({', '.join(_COLUMNS)}) VALUES ({', '.join(':' + c for c in _COLUMNS)}) "
    "ON CONFLICT (run_dir) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS if c not in ("run_dir", "created_at"))
    + ", created_at = CASE WHEN :created_at_given OR excluded.status = 'running' THEN excluded.created_at "
    "ELSE runs.created_at END"
)


@dataclass
class RunRecord:
    """One run as the registry stores it (``run_dir`` is the unique key)."""

    run_dir: str  # unique key: re-recording the same run_dir updates the row (upsert)
    experiment: str
    task: str  # "mlm", "glue:cola", "squad_v1", "gap", "csv", ...
    model: str  # what the run started from (a run dir, a hub name, "minilm", or a size like "base")
    seed: int
    status: str  # "running" (from its start; a killed run stays so) | "done" | "failed"
    sparsity: float | None = None  # final sparsity of the sparse layers (None = dense)
    metrics: dict[str, float] = field(default_factory=dict)
    steps: int | None = None
    wall_time_s: float | None = None
    samples_per_second: float | None = None
    git_commit: str | None = None
    # eval loss / perplexity of the pretrained model the run started from
    pretrain_metrics: dict[str, float] = field(default_factory=dict)
    group: str | None = None  # the experiment's row label in tables (defaults to experiment)
    created_at: str = ""  # ISO time, set by the registry when empty
    error: str | None = None  # a failed run's one-line error

    @property
    def label(self) -> str:
        """The row label in result tables: ``group`` when set, else ``experiment``."""
        return self.group or self.experiment


class RunRegistry:
    """The run registry stored in one SQLite file; see the module docstring for the concurrency design."""

    def __init__(
        self,
        path: str | os.PathLike,
        busy_timeout_s: float = 30.0,
        max_attempts: int = 20,
        read_only: bool = False,
    ) -> None:
        """``read_only``: for tables and plots. The file must exist; it is read without writing anything (see the
        module docstring), so a registry in a read-only folder (or owned by a colleague) can be read."""
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self.max_attempts = max_attempts
        self.read_only = read_only
        if read_only:
            if not self.path.is_file():
                raise SparseBertError(f"no results registry at {self.path}")
            version = self._with_retry(lambda conn: conn.execute("PRAGMA user_version").fetchone()[0])
            if version not in _READABLE_VERSIONS:
                fix = "upgrade sparsebert" if version > SCHEMA_VERSION else "open it once read-write to migrate it"
                raise SparseBertError(f"run registry {self.path} has schema version {version}, this sparsebert "
                                      f"reads versions {_READABLE_VERSIONS[0]}-{SCHEMA_VERSION}: {fix}")
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._with_retry(self._initialize)

    @classmethod
    def in_output_root(cls, output_root: str | os.PathLike, **kwargs: Any) -> RunRegistry:
        """The registry of an output root: ``<output_root>/registry.sqlite``."""
        return cls(Path(output_root) / REGISTRY_FILENAME, **kwargs)

    # -- public API ------------------------------------------------------------------------------------

    def record(self, rec: RunRecord) -> None:
        """Insert the run, or update it when its ``run_dir`` is already recorded."""
        params = _to_params(rec)  # validate before touching the database
        self._with_retry(lambda conn: conn.execute(_UPSERT_SQL, params))

    def forget_tree(self, run_dir: str | os.PathLike) -> int:
        """Delete the rows of ``run_dir`` and of every run recorded below it (``<run_dir>/...``), in one statement
        (one transaction): before a run directory is deleted to start over, so that no table reports a run whose
        directory is gone, even if the process dies before the new runs are recorded. Returns how many rows went."""
        key = str(run_dir).rstrip("/") or "/"
        below = key.rstrip("/") + "/"
        # substr instead of LIKE: directory names contain "_" and may contain "%", which LIKE would treat as wildcards
        sql = "DELETE FROM runs WHERE run_dir = ? OR substr(run_dir, 1, ?) = ?"
        return self._with_retry(lambda conn: conn.execute(sql, (key, len(below), below)).rowcount)

    def runs(
        self,
        experiments: list[str] | None = None,
        task_prefix: str | None = None,
        status: str | None = "done",
    ) -> list[RunRecord]:
        """Recorded runs, oldest first.

        ``experiments``: only these experiments (``None`` = all; an empty list matches nothing).
        ``task_prefix``: only tasks starting with it, e.g. ``"glue:"`` (a plain prefix: ``_`` and ``%`` are
        not wildcards).  ``status``: only runs with this status (``None`` = any status).
        """
        if isinstance(experiments, str):  # a lone name would otherwise be split into characters
            experiments = [experiments]
        clauses: list[str] = []
        params: list[Any] = []
        if experiments is not None:
            if not experiments:
                return []
            clauses.append(f"experiment IN ({', '.join('?' * len(experiments))})")
            params.extend(experiments)
        if task_prefix is not None:
            # substr instead of LIKE: task names contain "_", which LIKE would treat as a wildcard
            clauses.append("substr(task, 1, ?) = ?")
            params.extend([len(task_prefix), task_prefix])
        if status is not None:
            clauses.append("status = ?")
            params.append(status)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT * FROM runs{where} ORDER BY created_at, run_dir"
        rows = self._with_retry(lambda conn: conn.execute(sql, params).fetchall())
        return [_from_row(row) for row in rows]

    def get(self, run_dir: str | os.PathLike) -> RunRecord | None:
        """The run recorded under ``run_dir``, or ``None``."""
        rows = self._with_retry(
            lambda conn: conn.execute("SELECT * FROM runs WHERE run_dir = ?", (str(run_dir),)).fetchall()
        )
        return _from_row(rows[0]) if rows else None

    # -- internals -------------------------------------------------------------------------------------

    def _connect(self, immutable: bool = False) -> sqlite3.Connection:
        # isolation_level=None: autocommit; a single upsert is its own atomic transaction and the schema
        # setup uses an explicit BEGIN IMMEDIATE.  timeout= installs SQLite's busy handler.
        if self.read_only:
            uri = f"{self.path.resolve().as_uri()}?mode=ro" + ("&immutable=1" if immutable else "")
            conn = sqlite3.connect(uri, uri=True, timeout=self.busy_timeout_s, isolation_level=None)
        else:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        conn.row_factory = sqlite3.Row
        return conn

    def _unlogged_state(self) -> tuple[int, int, int] | None:
        """For a read-only registry whose write-ahead log is absent or empty (no writer has changes pending): the
        file's identity, size and mtime, which an immutable read compares before and after. None otherwise."""
        if not self.read_only:
            return None
        wal = self.path.with_name(self.path.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            return None
        st = self.path.stat()
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _with_retry(self, op: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``op`` on a fresh connection, retrying with backoff while the database is locked (or, read as an
        immutable file, was changed by a writer during the read)."""
        delay = 0.02
        for attempt in range(1, self.max_attempts + 1):
            before = self._unlogged_state()
            conn = self._connect(immutable=before is not None)
            try:
                result = op(conn)
            except sqlite3.DatabaseError as e:  # OperationalError (locks among them) is one
                changed = before is not None and before != self._unlogged_state()
                if not changed and not (isinstance(e, sqlite3.OperationalError) and _is_lock_error(e)):
                    # not a database, a corrupt one, a read-only folder: one line that names the file
                    raise SparseBertError(f"run registry {self.path}: {e}") from e
                if attempt == self.max_attempts:
                    raise SparseBertError(
                        f"run registry {self.path} stayed locked after {attempt} attempts: {e}; "
                        "is another process holding a long transaction on it?"
                    ) from e
            else:
                if before is None or before == self._unlogged_state():
                    return result
            finally:
                conn.close()  # also rolls back a transaction the failed op left open
            # jitter so that processes that collided do not retry in lockstep
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)
        raise SparseBertError(f"run registry {self.path} changed during each of {self.max_attempts} reads")

    def _initialize(self, conn: sqlite3.Connection) -> None:
        # WAL is a property of the file (persistent), so setting it once per open is cheap and idempotent.
        conn.execute("PRAGMA journal_mode=WAL")
        # BEGIN IMMEDIATE takes the write lock up front, so two processes creating the schema at the same
        # time serialize here instead of both reading version 0 and racing.
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise SparseBertError(
                    f"run registry {self.path} has schema version {version}, newer than this sparsebert "
                    f"understands ({SCHEMA_VERSION}): upgrade sparsebert"
                )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target]:
                    conn.execute(statement)
            # PRAGMA takes no parameters; the value is our own integer constant, never user input.
            conn.execute(f"PRAGMA user_version = {int(SCHEMA_VERSION)}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise


def _is_lock_error(e: sqlite3.OperationalError) -> bool:
    msg = str(e).lower()
    return "locked" in msg or "busy" in msg


def _now() -> str:
    # microseconds so that runs recorded in the same second still sort in recording order
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _metrics_json(name: str, rec: RunRecord, metrics: Mapping[str, Any]) -> str:
    clean: dict[str, float] = {}
    for key, value in metrics.items():
        if hasattr(value, "item"):  # numpy / torch scalars
            value = value.item()
        if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, int | float):
            raise SparseBertError(
                f"run {rec.run_dir}: {name}[{key!r}] = {value!r} is not a number; metrics must map names to numbers"
            )
        clean[key] = float(value)
    # NaN/inf (a diverged run) are kept: Python's json writes and reads them back as NaN/Infinity.
    return json.dumps(clean)


def _optional_number(name: str, rec: RunRecord, value: Any, kind: type) -> Any:
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SparseBertError(f"run {rec.run_dir}: {name} = {value!r} is not a number")
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise SparseBertError(f"run {rec.run_dir}: {name} = {value!r} is not an integer")
        return int(value)
    return float(value)


def _to_params(rec: RunRecord) -> dict[str, Any]:
    if not rec.run_dir:
        raise SparseBertError("a run record needs a non-empty run_dir (the registry's key)")
    if rec.status not in STATUSES:
        raise SparseBertError(f"run {rec.run_dir}: status {rec.status!r} is not one of {', '.join(STATUSES)}")
    now = _now()
    seed = _optional_number("seed", rec, rec.seed, int)
    if seed is None:
        raise SparseBertError(f"run {rec.run_dir}: seed is required")
    sparsity = _optional_number("sparsity", rec, rec.sparsity, float)
    if sparsity is not None and not 0.0 <= sparsity <= 1.0:  # also rejects NaN
        raise SparseBertError(f"run {rec.run_dir}: sparsity {sparsity} is not a fraction in [0, 1]")
    return {
        "run_dir": str(rec.run_dir),
        "experiment": str(rec.experiment),
        "task": str(rec.task),
        "model": str(rec.model),
        "seed": seed,
        "status": rec.status,
        "sparsity": sparsity,
        "metrics": _metrics_json("metrics", rec, rec.metrics),
        "steps": _optional_number("steps", rec, rec.steps, int),
        "wall_time_s": _optional_number("wall_time_s", rec, rec.wall_time_s, float),
        "samples_per_second": _optional_number("samples_per_second", rec, rec.samples_per_second, float),
        "git_commit": rec.git_commit,
        "pretrain_metrics": _metrics_json("pretrain_metrics", rec, rec.pretrain_metrics),
        "group_label": rec.group,
        "created_at": rec.created_at or now,
        "updated_at": now,
        "created_at_given": bool(rec.created_at),
        "error": None if rec.error is None else str(rec.error),
    }


def _from_row(row: sqlite3.Row) -> RunRecord:
    return RunRecord(
        run_dir=row["run_dir"],
        experiment=row["experiment"],
        task=row["task"],
        model=row["model"],
        seed=row["seed"],
        status=row["status"],
        sparsity=row["sparsity"],
        metrics=json.loads(row["metrics"]),
        steps=row["steps"],
        wall_time_s=row["wall_time_s"],
        samples_per_second=row["samples_per_second"],
        git_commit=row["git_commit"],
        pretrain_metrics=json.loads(row["pretrain_metrics"]),
        group=row["group_label"],
        created_at=row["created_at"],
        # a version-1 file read as it is has no error column ("in row" would test the values)
        error=row["error"] if "error" in row.keys() else None,  # noqa: SIM118
    )
