"""Our 2:4 H100 kernel, the parts that run without a GPU: its build (atomic, one-line failure), loading a missing
library, the GELU fusion test on BERT's real activation modules, and the refusal on a machine without sm90.
The kernel's numbers are checked on an H100 by tests/gpu/test_sparse24_kernel_gpu.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from module_loading import load_module
from torch import nn
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertIntermediate

from sparsebert.export.sparse24_kernel import Library, Sparse24Error, _exact_gelu, to_sparse24_kernel

SRC = Path(__file__).resolve().parents[2] / "src"
GPU_TESTS = Path(__file__).resolve().parents[1] / "gpu"


def _fake_toolchain(cache: Path, nvcc_body: str) -> None:
    """A toolchain cache whose nvcc is a shell script: the build's own logic runs, not CUDA's compiler."""
    bin_dir = cache / "root" / "nvidia" / "cu13" / "bin"
    bin_dir.mkdir(parents=True)
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(f"#!/bin/sh\nfor a in \"$@\"; do out=\"$a\"; done\n{nvcc_body}\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    (cache / "root" / ".complete").touch()


def _build(tmp_path: Path, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "sparsebert.kernels.build", "--out", str(tmp_path / "out" / "lib.so"),
                           "--cache", str(cache)], capture_output=True, text=True, env=env)


def test_failed_build_leaves_no_library(tmp_path):
    cache = tmp_path / "cache"
    _fake_toolchain(cache, 'echo partial > "$out"; echo "nvcc: error" >&2; exit 1')  # half-written, then fails
    result = _build(tmp_path, cache)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith("sparsebert.kernels.build:")
    assert list((tmp_path / "out").iterdir()) == []  # neither the library nor the temporary file


def test_build_writes_the_library_where_asked(tmp_path):
    cache = tmp_path / "cache"
    _fake_toolchain(cache, 'case "$*" in *sm_90a*sparse24.cu*) echo built > "$out";; *) exit 3;; esac')
    result = _build(tmp_path, cache)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "lib.so").read_text() == "built\n"
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["lib.so"]


def test_missing_library_names_the_build_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEBERT_SPARSE24_LIB", str(tmp_path / "nowhere.so"))
    monkeypatch.setattr(Library, "_instance", None)
    with pytest.raises(Sparse24Error, match=r"nowhere\.so not found: build it with `python -m sparsebert\.kernels\.build`"):
        Library.get()


@pytest.mark.parametrize("gpu_test", ["test_predict_sparse24_gpu.py", "test_sparse24_kernel_gpu.py"])
def test_the_kernels_gpu_tests_skip_with_the_reason_on_a_gpu_without_the_library(tmp_path, monkeypatch, gpu_test):
    """On an H100 where the library was not built, every GPU test of the kernel skips and says why (the predict
    test used to fail there instead)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setenv("SPARSEBERT_SPARSE24_LIB", str(tmp_path / "nowhere.so"))
    monkeypatch.setattr(Library, "_instance", None)
    skip = load_module(GPU_TESTS / gpu_test).pytestmark.mark
    assert skip.name == "skipif" and skip.args == (True,)
    assert skip.kwargs["reason"].startswith("needs the kernel library: ") and "nowhere.so not found" in \
        skip.kwargs["reason"]


def test_a_library_that_does_not_load_is_one_error_naming_the_rebuild(tmp_path, monkeypatch):
    broken = tmp_path / "libsparse24.so"
    broken.write_bytes(b"not an ELF file")  # a truncated download or a half-written build
    monkeypatch.setenv("SPARSEBERT_SPARSE24_LIB", str(broken))
    monkeypatch.setattr(Library, "_instance", None)
    with pytest.raises(Sparse24Error, match=r"does not load .*rebuild it with `python -m sparsebert\.kernels\.build`"):
        Library.get()


@pytest.mark.parametrize(("hidden_act", "fused"), [("gelu", True), ("gelu_new", False), ("relu", False)])
def test_gelu_is_fused_only_where_bert_computes_the_exact_gelu(hidden_act, fused):
    intermediate = BertIntermediate(BertConfig(hidden_size=32, intermediate_size=64, hidden_act=hidden_act))
    assert _exact_gelu(intermediate.intermediate_act_fn) is fused
    assert _exact_gelu(nn.GELU(approximate="tanh")) is False
    assert _exact_gelu(nn.GELU()) is True


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0),
                    reason="an sm90 GPU is here: tests/gpu/test_sparse24_kernel_gpu.py covers the conversion")
def test_refuses_without_an_sm90_gpu():
    model = nn.Sequential(nn.Linear(128, 128))
    with pytest.raises(Sparse24Error, match="needs an sm90 GPU"):
        to_sparse24_kernel(model)
    assert type(model[0]) is nn.Linear  # left as it was
