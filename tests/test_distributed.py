"""Two processes on CPU (gloo) through torchrun: every rank must end with identical weights and masks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

FAST = ["data.max_files=1", "data.eval_documents=4", "data.max_eval_samples=16", "data.max_seq_length=64",
        "train.global_batch_size=8", "train.max_steps=12", "train.eval_steps=6", "train.save_steps=6",
        "train.logging_steps=2", "train.report_to=[]", "rigl.update_freq=3", "train.dataloader_workers=0"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_end_with_identical_masks_and_weights(data_dir, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(REPO / "tests/helpers/ddp_worker.py"),
           str(tmp_path), str(data_dir), "sparse_tiny_rigl", *FAST]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["world"] == ranks[1]["world"] == 2
    assert ranks[0]["zeros"] == ranks[1]["zeros"]  # the same masks after 3 RigL updates
    assert ranks[0]["weights"] == ranks[1]["weights"]  # and the same weights, bit for bit
    state = json.loads((tmp_path / "sparse_tiny_rigl" / "checkpoint-12" / "sparsity_state.json").read_text())
    assert state["step"] == 12
    history = json.loads((tmp_path / "sparse_tiny_rigl" / "checkpoint-12" / "trainer_state.json").read_text())
    assert any("rigl/drop_fraction" in h for h in history["log_history"])  # RigL did update under DDP
    metrics = json.loads((tmp_path / "sparse_tiny_rigl" / "metrics.json").read_text())
    assert metrics["sparsity"] == pytest.approx(0.8, abs=1e-4)
