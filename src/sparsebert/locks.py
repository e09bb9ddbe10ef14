"""One writer at a time: a lock file that names its holder (host, pid, start time).

``FileLock(path, what)`` guards one thing (a run directory, a feature-cache entry) through a lock file beside
it. Exclusion is an ``fcntl.flock`` on that file: the kernel drops it when the holding process ends, however it
ends, so a process that was killed never keeps a lock on its own host. The file also records its holder, which
a refused or waiting process names. The holder removes the file when it releases the lock; a file left by a
killed process (its record names a process of this host that no longer runs) is stale and taken over with a
warning.

Why not ``filelock`` (installed): its flock lock records no holder (no "in use by process N on host H"), leaves its
file behind on release, and cannot tell a stale record from a live one; its soft lock records the holder but is
an exclusive-create file the kernel does not release when the holder dies.

A record of another host cannot be checked from here, and file locks do not reach other nodes on every shared
file system: with ``honour_other_hosts`` such a record counts as held, and the message says which file to
delete once that process is gone. Without it (the feature cache, where two builders only duplicate work) the
flock alone decides.

Forked children (data-loader and featurizer workers) inherit the open file and with it the lock; they end with
their parent.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from sparsebert.errors import SparseBertError

log = logging.getLogger(__name__)

HOST = socket.gethostname()
# flock unsupported on this file system (some network file systems): the record alone keeps writers apart
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    started: str

    def __str__(self) -> str:
        if self == STARTING:
            return "another process (it took the lock a moment ago)"
        return f"process {self.pid} on host {self.host} (started {self.started})"

    @classmethod
    def me(cls) -> Holder:
        return cls(HOST, os.getpid(), time.strftime("%Y-%m-%dT%H:%M:%S%z"))


# the holder of a lock whose record is not written yet (it took the lock a moment ago)
STARTING = Holder("?", 0, "just now")


class LockHeld(SparseBertError):
    """Another process holds the lock: the message names it (``holder``)."""

    def __init__(self, message: str, holder: Holder):
        super().__init__(message)
        self.holder = holder


class FileLock:
    """An exclusive lock on ``path`` (created when taken, removed when released); ``what`` names the guarded
    thing in messages. Taking it raises ``OSError`` when the folder cannot be written."""

    def __init__(self, path: str | os.PathLike, what: str, honour_other_hosts: bool = True):
        self.path = Path(path)
        self.what = what
        self.honour_other_hosts = honour_other_hosts
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock now, or raise :class:`LockHeld` naming its holder."""
        holder = self.try_acquire()
        if holder is not None:
            raise LockHeld(self.refusal(holder), holder)

    def acquire_waiting(self, poll_s: float = 0.2, report_every_s: float = 60.0) -> None:
        """Take the lock, waiting while another process holds it (logged when the wait begins, then every
        ``report_every_s``)."""
        reported = 0.0
        while (holder := self.try_acquire()) is not None:
            if time.monotonic() - reported >= report_every_s:
                log.info("waiting for %s, which holds %s", holder, self.what)
                reported = time.monotonic()
            time.sleep(poll_s)

    def try_acquire(self) -> Holder | None:
        """Take the lock if it is free: None when taken, else the holder that has it."""
        assert self._fd is None, f"{self.path} is already held by this object"
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                locked = _flock(fd)
            except BlockingIOError:
                holder = _read(fd) or STARTING
                os.close(fd)
                return holder
            except BaseException:
                os.close(fd)
                raise
            if not _names(fd, self.path):  # released (and removed) by its holder since we opened it: again
                os.close(fd)
                continue
            previous = _read(fd)
            if previous is not None and self._still_held(previous, locked):
                os.close(fd)
                return previous
            if previous is not None:
                log.warning("%s: taking over the lock of %s, which no longer runs", self.what, previous)
            _write(fd, Holder.me())
            self._fd = fd
            return None

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if _names(fd, self.path):  # removed first: a process waiting on this file then opens a fresh one
                self.path.unlink()
        finally:
            os.close(fd)

    def refusal(self, holder: Holder) -> str:
        message = f"{self.what} is in use by {holder}"
        if holder.host not in (HOST, STARTING.host):
            message += f"; if that process no longer runs, delete {self.path}"
        return message

    def _still_held(self, previous: Holder, locked: bool) -> bool:
        """Whether the record of a lock file we could flock still stands for a running holder."""
        if previous.host != HOST:
            return self.honour_other_hosts
        # with a working flock, a record of this host is a dead holder's (or of a process that reused its pid)
        return not locked and previous.pid != os.getpid() and _alive(previous.pid)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _flock(fd: int) -> bool:
    """Take the flock without blocking: True; False where the file system has none. BlockingIOError: held."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:  # BlockingIOError (EWOULDBLOCK) is not among these
        if e.errno in _NO_FLOCK:
            return False
        raise
    return True


def _names(fd: int, path: Path) -> bool:
    """Whether ``path`` still is the file open as ``fd``."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (current.st_dev, current.st_ino)


def _read(fd: int) -> Holder | None:
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode())
        return Holder(str(record["host"]), int(record["pid"]), str(record["started"]))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None  # empty (its holder has not written it yet) or not ours


def _write(fd: int, holder: Holder) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"host": holder.host, "pid": holder.pid, "started": holder.started}).encode(), 0)
    os.fsync(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
