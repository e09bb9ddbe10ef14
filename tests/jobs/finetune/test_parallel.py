"""run_in_processes: each call a spawned process, at most N at once; the first failure stops what is queued (a job's
runs in worker processes: tests/jobs/test_finetune.py)."""

from __future__ import annotations

import multiprocessing

import pytest
from parallel_helpers import call, refuse, touch

from sparsebert.errors import SparseBertError
from sparsebert.jobs.finetune.parallel import run_in_processes


def test_the_first_failure_is_raised_in_one_line_and_nothing_queued_starts(tmp_path):
    first, after = tmp_path / "first", tmp_path / "after"
    with pytest.raises(SparseBertError, match=r"^second failed: no such teacher$"):
        run_in_processes(call, [(touch, str(first)), (refuse, "no such teacher"), (touch, str(after))], workers=1,
                         names=["first", "second", "third"])
    # its DataLoader workers would start as this process's do (in a spawned process, spawn is the default: each
    # worker would import torch again)
    assert first.read_text() == multiprocessing.get_start_method()
    assert not after.exists()  # queued behind the failure: never started


def test_a_run_beside_the_failure_ends_on_its_own(tmp_path):
    beside = tmp_path / "beside"
    with pytest.raises(SparseBertError, match=r"^first failed: bad row 7$"):
        run_in_processes(call, [(refuse, "bad row 7"), (touch, str(beside))], workers=2, names=["first", "second"])
    assert beside.is_file()  # started with it, not stopped by it
