"""bench/semi_sparse_training.py on CPU: the products it times and its refusals (the timing needs a GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from module_loading import load_module

BENCH = Path(__file__).resolve().parents[2] / "bench" / "semi_sparse_training.py"


def test_one_layers_products_under_fused_qkv():
    bench = load_module(BENCH)
    assert bench.layer_products(768) == {"qkv": (768, 2304), "attention output": (768, 768),
                                         "feed-forward up": (768, 3072), "feed-forward down": (3072, 768)}


def test_unknown_sizes_and_a_missing_gpu_are_one_line_errors():
    for extra, message in ((["--sizes", "base,huge"], "--sizes: unknown ['huge']"),
                           ([], "needs a CUDA GPU")):
        done = subprocess.run([sys.executable, str(BENCH), *extra], capture_output=True, text=True,
                              env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
        assert done.returncode != 0 and message in done.stderr.strip().splitlines()[-1], done.stderr
