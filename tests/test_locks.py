"""The one-writer lock between real processes: refused or waited for while held, taken over when its holder is
gone, never left behind by a holder that released it."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading

import multiprocess
import pytest

from sparsebert.locks import FileLock, LockHeld


def hold(path: str, ready, release) -> None:
    """In a child process: take the lock, say so, keep it until told."""
    with FileLock(path, "the thing"):
        ready.set()
        release.wait(60)


@pytest.fixture
def held(tmp_path):
    """The lock file of a lock that a child process holds: (path, the child's pid, release event)."""
    ctx = multiprocess.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    path = tmp_path / "thing.lock"
    child = ctx.Process(target=hold, args=(str(path), ready, release))
    child.start()
    assert ready.wait(30)
    yield path, child.pid, release
    release.set()
    child.join(30)


def test_a_held_lock_is_refused_naming_its_holder(held):
    path, pid, _ = held
    with pytest.raises(LockHeld, match=f"the thing is in use by process {pid} on host {socket.gethostname()}") as e:
        FileLock(path, "the thing").acquire()
    assert e.value.holder.pid == pid
    assert json.loads(path.read_text())["pid"] == pid  # the refused process left the holder's record alone


def test_a_waiting_process_gets_the_lock_when_it_is_released(held, caplog):
    path, pid, release = held
    threading.Timer(1.0, release.set).start()
    lock = FileLock(path, "the thing")
    with caplog.at_level(logging.INFO, logger="sparsebert.locks"):
        lock.acquire_waiting(poll_s=0.05)
    assert f"waiting for process {pid}" in caplog.text
    assert json.loads(path.read_text())["pid"] != pid
    lock.release()
    assert not path.exists()  # released locks leave no file


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_lock_left_by_a_dead_process_of_this_host_is_taken_over(tmp_path, caplog):
    path = tmp_path / "thing.lock"
    gone = dead_pid()
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": gone, "started": "earlier"}))
    lock = FileLock(path, "the thing")
    with caplog.at_level(logging.WARNING, logger="sparsebert.locks"):
        lock.acquire()
    assert f"taking over the lock of process {gone}" in caplog.text
    assert json.loads(path.read_text())["pid"] != gone
    lock.release()


def test_a_record_of_another_host_is_honoured_where_asked(tmp_path):
    path = tmp_path / "thing.lock"
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": "earlier"}))
    with pytest.raises(LockHeld, match=f"process 1 on host elsewhere .*delete {path}"):
        FileLock(path, "the thing").acquire()
    lock = FileLock(path, "the thing", honour_other_hosts=False)  # where two holders would only repeat work
    lock.acquire()
    lock.release()


def test_a_released_lock_can_be_taken_again(tmp_path):
    path = tmp_path / "thing.lock"
    for _ in range(2):
        with FileLock(path, "the thing"):
            assert path.is_file()
        assert not path.exists()
