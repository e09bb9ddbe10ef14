"""run_in_processes: each call a spawned process, at most N at once; the first failure stops what is queued (a job's
runs in worker processes: tests/jobs/test_finetune.py)."""

from __future__ import annotations

import pytest
from parallel_helpers import call, refuse, touch

from sparsebert.errors import SparseBertError
from sparsebert.jobs.finetune.parallel import run_in_processes


def test_the_first_failure_is_raised_in_one_line_and_nothing_queued_starts(tmp_path):
    first, after = tmp_path / "first", tmp_path / "after"
    with pytest.raises(SparseBertError, match=r"^second failed: no such teacher$"):
        run_in_processes(call, [(touch, str(first)), (refuse, "no such teacher"),
                                                (touch, str(after))], workers=1, names=["first", "second", "third"])
    assert first.is_file()
    assert not after.exists()  # queued behind the failure: never started

