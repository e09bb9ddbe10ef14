"""run_in_processes: each call a spawned process, at most N at once, spread over the GPUs it is given; the first
failure stops what is queued (a job's runs in worker processes: tests/jobs/test_finetune.py)."""

from __future__ import annotations

import multiprocessing
import os

import pytest
from parallel_helpers import call, record_gpu, refuse, touch

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


def test_each_process_starts_seeing_the_gpu_with_the_fewest_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")  # what this process sees; each worker is given one of them
    seen = [tmp_path / f"run{i}" for i in range(4)]
    run_in_processes(call, [(record_gpu, str(path)) for path in seen], workers=4,
                     names=[f"run{i}" for i in range(4)], gpus=["2", "5"])
    # all four start at once, two on each GPU; each saw its GPU already while it imported the target's modules
    # (where CUDA's driver may start), and this process's own setting is as it was
    assert [path.read_text() for path in seen] == ["2 2", "5 5", "2 2", "5 5"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,5"


@pytest.mark.parametrize("gpus", [[], ["7"]])
def test_one_gpu_or_none_leaves_the_workers_environment_alone(tmp_path, monkeypatch, gpus):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    run_in_processes(call, [(record_gpu, str(tmp_path / "run"))], workers=2, names=["run"], gpus=gpus)
    assert (tmp_path / "run").read_text() == "3 3"
