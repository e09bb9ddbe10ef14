"""Exporting 2:4 models for inference to torch's semi-structured tensors: the 2:4 test, the refusals (CPU only;
the GPU path is tests/gpu/test_semi_structured_gpu.py), the column-major suffixes, the feed-forward names."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sparsebert.export import feed_forward_names, is_two_four, to_semi_structured
from sparsebert.export.semi_structured import ends_with_any
from sparsebert.sparsity import SparsityConfig, SparsityController

pytestmark = pytest.mark.usefixtures("one_thread")


def _two_four(**kwargs) -> SparsityConfig:
    return SparsityConfig(
        **{"sparsity": 0.5, "pattern": "2:4", "init": "magnitude", "include": ["weight$"], **kwargs}
    )


def test_is_two_four():
    assert is_two_four(torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 3.0]]))
    assert is_two_four(torch.zeros(4, 8))
    assert not is_two_four(torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    assert not is_two_four(torch.zeros(2, 6))  # groups of 4 do not tile the row
    assert not is_two_four(torch.zeros(8))


def test_to_semi_structured_needs_cuda(monkeypatch, mlp):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError) as err:
        to_semi_structured(mlp)
    assert str(err.value).startswith("semi-structured sparse kernels need a CUDA GPU (sm80+)")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("capability", "backend", "message"),
    [
        ((7, 5), "auto", "semi-structured sparse kernels need a CUDA GPU (sm80+); this one is sm7x"),
        ((9, 0), "cutlass", "torch's CUTLASS semi-structured kernels run only on sm8x GPUs, this one is sm9x"),
        ((9, 0), "triton", "backend must be one of auto, cutlass, cusparselt"),
    ],
)
def test_to_semi_structured_refuses_unusable_kernels(monkeypatch, mlp, capability, backend, message):
    # Pretend to be on a GPU: every refusal comes before anything touches CUDA.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    with pytest.raises((RuntimeError, ValueError)) as err:
        to_semi_structured(mlp, backend=backend)
    assert str(err.value).startswith(message)


def test_to_semi_structured_wants_the_model_on_the_gpu(monkeypatch, mlp):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.backends.cusparselt, "is_available", lambda: True)
    SparsityController(mlp, _two_four())
    with pytest.raises(RuntimeError, match="0 is on cpu: move the model to the CUDA GPU before exporting"):
        to_semi_structured(mlp)


def test_column_major_suffixes_match_whole_dotted_parts():
    name = "bert.encoder.layer.0.intermediate.dense"
    assert ends_with_any(name, ("intermediate.dense",)) and ends_with_any(name, ("dense",))
    assert ends_with_any(name, (name,))
    assert not ends_with_any(name, ("ense",)) and not ends_with_any(name, ("output.dense",))
    assert not ends_with_any("bert.encoder.layer.0.attention.output.dense", ("intermediate.dense",))
    assert not ends_with_any(name, ())


def test_to_semi_structured_refuses_a_bare_string_of_suffixes(mlp):
    with pytest.raises(TypeError, match=r"sequence of name suffixes, e.g. \('intermediate.dense',\)"):
        to_semi_structured(mlp, column_major="intermediate.dense")


def test_feed_forward_names_are_each_layers_up_and_down_projections(tiny_bert, mlp):
    names = feed_forward_names(tiny_bert)
    assert names == [
        f"bert.encoder.layer.{i}.{part}.dense" for i in range(2) for part in ("intermediate", "output")
    ]
    assert all(isinstance(tiny_bert.get_submodule(n), nn.Linear) for n in names)
    with pytest.raises(ValueError, match="no BERT feed-forward layers"):
        feed_forward_names(mlp)
