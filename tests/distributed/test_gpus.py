"""--gpus: which GPUs are chosen (NVML itself needs a GPU and is not exercised here)."""

from __future__ import annotations

import pytest

from sparsebert.distributed.gpus import (
    GpuState,
    allowed_gpus,
    least_used,
    pick_gpus,
    torchrun_command,
    without_gpus_flag,
)
from sparsebert.errors import SparseBertError

NODE = [GpuState(0, 1_000, 95), GpuState(1, 70_000, 0), GpuState(2, 80_000, 0), GpuState(3, 40_000, 10)]


def test_count_takes_the_least_busy():
    assert pick_gpus("1", NODE) == [2]  # idle, most free memory
    assert pick_gpus("2", NODE) == [1, 2]
    assert pick_gpus("3", NODE) == [1, 2, 3]


def test_explicit_ids():
    assert pick_gpus("0,3", NODE) == [0, 3]
    assert pick_gpus("3,", NODE) == [3]


@pytest.mark.parametrize("spec, message", [("5", "has 4 GPU"), ("0", "has 4 GPU"), ("0,7", "GPU 7 is not available"),
                                           ("two", "expected a count"), ("0,0", "distinct"), (",", "distinct")])
def test_bad_specs(spec, message):
    with pytest.raises(SparseBertError, match=message):
        pick_gpus(spec, NODE)


def test_relaunch_drops_the_flag():
    argv = ["bert_100k", "--gpus", "2", "--set", "train.max_steps=10", "--gpus=3"]
    assert without_gpus_flag(argv) == ["bert_100k", "--set", "train.max_steps=10"]
    cmd = torchrun_command("run.py", argv, 2)
    assert cmd[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    assert cmd[6:] == ["run.py", "bert_100k", "--set", "train.max_steps=10"]


def test_a_schedulers_visible_devices_bound_the_choice():
    assert pick_gpus("1", allowed_gpus(NODE, "0,3")) == [3]  # GPUs 1 and 2 are idler, but not this job's
    assert pick_gpus("0,3", allowed_gpus(NODE, "3,0")) == [0, 3]
    with pytest.raises(SparseBertError, match="GPU 1 is not available"):
        pick_gpus("1,", allowed_gpus(NODE, "0,3"))
    assert allowed_gpus(NODE, "") == NODE
    with pytest.raises(SparseBertError, match="UUID"):
        allowed_gpus(NODE, "GPU-8f2e")


def test_a_child_gets_the_least_used_gpu():
    """Side-by-side finetuning runs and search trials alike: the GPU with the fewest running children, the first of
    a tie; None (the child sees what its parent sees) with one GPU or none."""
    assert least_used(["0", "1", "2"], ["0", "1", "0"]) == "2"
    assert least_used(["0", "1"], ["1"]) == "0"
    assert least_used(["0", "1"], []) == "0"
    assert least_used(["0"], ["0", "0"]) is None and least_used([], []) is None

