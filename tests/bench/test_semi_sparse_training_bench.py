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
    """The check reads the weight a layer multiplies by through its forward, not from ``.weight``: a dense weight
    masked to 2:4 in the forward passes. Refused: 3 of some 4 inputs kept (even with half kept in all), a quarter
    kept, and an output that is not the product of the weight read back (here: scaled)."""
    bench = load_module(BENCH)
    torch.manual_seed(0)
    keep = torch.zeros(8, 4, 4, dtype=torch.bool)
    keep[..., :2] = True  # the first 2 of every 4 inputs of each output
    keep = keep.reshape(8, 16)

    class MaskedInForward(nn.Linear):  # its .weight stays dense: only its product is 2:4
        def __init__(self, keep: torch.Tensor):
            super().__init__(16, 8)
            self.keep = keep

        def forward(self, x):
            scale = 2 if getattr(self, "scaled", False) and x.shape[0] != self.in_features else 1
            return nn.functional.linear(x, self.weight * self.keep, self.bias) * scale

    x = torch.randn(32, 16)
    assert bench.check_2_4(MaskedInForward(keep), x) == {"relative_error": pytest.approx(0, abs=1e-6), "kept": 0.5}
    three_and_one = keep.clone()
    three_and_one[0, 2] = True  # 3 of output 0's first 4 inputs, 1 of its next 4: half in all still
    three_and_one[0, 5] = False
    with pytest.raises(ValueError, match="up to 3 of 4 kept, 0.500 of all"):
        bench.check_2_4(MaskedInForward(three_and_one), x)
    quarter = keep.clone()
    quarter[:, 1::4] = False
    with pytest.raises(ValueError, match="up to 1 of 4 kept, 0.250 of all"):
        bench.check_2_4(MaskedInForward(quarter), x)
    scaled = MaskedInForward(keep)
    scaled.scaled = True  # the identity's product reads the weight; every other input's output is doubled
    with pytest.raises(ValueError, match="output off by"):
        bench.check_2_4(scaled, x)
