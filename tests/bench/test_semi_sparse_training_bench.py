"""bench/semi_sparse_training.py on CPU: the products it times and its refusals (the timing needs a GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from module_loading import load_module
from torch import nn

BENCH = Path(__file__).resolve().parents[2] / "bench" / "semi_sparse_training.py"


def test_one_layers_products_under_fused_qkv():
    bench = load_module(BENCH)
    assert bench.layer_products(768) == {"qkv": (768, 2304), "attention output": (768, 768),
                                         "feed-forward up": (768, 3072), "feed-forward down": (3072, 768)}


def test_unknown_sizes_and_a_missing_gpu_are_one_line_errors():
    for extra, message in ((["--sizes", "base,huge"], "--sizes: unknown ['huge']"),
                           (["--backends", "cutlass,csr"], "--backends: unknown ['csr']"),
                           ([], "needs a CUDA GPU")):
        done = subprocess.run([sys.executable, str(BENCH), *extra], capture_output=True, text=True,
                              env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
        assert done.returncode != 0 and message in done.stderr.strip().splitlines()[-1], done.stderr


def test_the_2_4_check_reads_the_weight_back_through_the_layer():
    """A layer whose product is 2:4 passes; one that keeps 3 of some 4 weights, or whose output is not the product
    of the weight it reads back (here: a scaled output), is refused."""
    bench = load_module(BENCH)
    torch.manual_seed(0)
    layer = nn.Linear(16, 8)
    keep = torch.zeros(8, 4, 4, dtype=torch.bool)
    keep[..., :2] = True  # the first 2 of every 4 inputs of each output
    with torch.no_grad():
        layer.weight.mul_(keep.reshape(8, 16))
    x = torch.randn(32, 16)
    assert bench.check_2_4(layer, x) == {"relative_error": pytest.approx(0, abs=1e-6), "kept": 0.5}
    with torch.no_grad():
        layer.weight[0, 2] = 1.0  # 3 of the first 4 inputs of output 0
    with pytest.raises(ValueError, match="up to 3 of 4 kept"):
        bench.check_2_4(layer, x)

    class Scaled(nn.Linear):  # its output is not its weight's product: the read-back weight is, scaled
        def forward(self, x):
            return super().forward(x) * (2 if x.shape[0] != self.in_features else 1)

    scaled = Scaled(16, 8)
    with torch.no_grad():
        scaled.weight.mul_(keep.reshape(8, 16))
    with pytest.raises(ValueError, match="output off by"):
        bench.check_2_4(scaled, x)
