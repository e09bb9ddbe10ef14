"""2:4 export on a GPU: the semi-structured model computes what the masked dense model computes (bf16).

Skipped, with the reason, where there is no CUDA GPU of compute capability 8.0 or newer (CI has none).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from sparsebert.sparsity import SemiStructuredLinear, nm_mask, to_semi_structured

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0),
    reason="needs a CUDA GPU with semi-structured sparse kernels (sm80+)",
)

# torch's CUTLASS 2:4 kernels run only on sm8x; Hopper and newer have cuSPARSELt alone.
_SM8X = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 8
BACKENDS = ["auto"] + (["cutlass"] if _SM8X else []) + (["cusparselt"] if torch.backends.cusparselt.is_available() else [])


def _masked_ffn() -> nn.Sequential:
    """A BERT-base feed-forward block with 2:4 weights, plus a head too small for the kernels and a dense layer."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(768, 3072), nn.GELU(), nn.Linear(3072, 768), nn.Linear(768, 768), nn.Linear(768, 2)
    )
    with torch.no_grad():
        for index in (0, 2, 4):
            model[index].weight.mul_(nm_mask(model[index].weight))
    return model.to("cuda", torch.bfloat16).eval()


def _close(out: torch.Tensor, ref: torch.Tensor) -> None:
    # bf16 keeps 8 bits of mantissa and the kernels accumulate in another order: compare relative to the scale.
    assert out.shape == ref.shape and out.dtype == ref.dtype
    error = (out.float() - ref.float()).abs().max().item()
    assert error <= 2e-2 * ref.float().abs().max().item(), error


@pytest.mark.parametrize("backend", BACKENDS)
def test_exported_model_matches_masked_dense(backend):
    dense = _masked_ffn()
    sparse = copy.deepcopy(dense)
    assert to_semi_structured(sparse, backend=backend) == ["0", "2"]
    assert isinstance(sparse[0], SemiStructuredLinear) and isinstance(sparse[2], SemiStructuredLinear)
    assert type(sparse[3]) is nn.Linear and type(sparse[4]) is nn.Linear  # not 2:4; 2 rows are too few
    generator = torch.Generator(device="cuda").manual_seed(0)
    inputs = [
        torch.randn(64, 768, device="cuda", dtype=torch.bfloat16, generator=generator),
        torch.randn(4, 128, 768, device="cuda", dtype=torch.bfloat16, generator=generator),
        torch.randn(768, 4, 24, device="cuda", dtype=torch.bfloat16, generator=generator).permute(1, 2, 0),
    ]  # 2-D, 3-D, and 3-D non-contiguous with a row count (96) that is not a multiple of the kernel tile
    with torch.inference_mode():
        for x in inputs:
            _close(sparse(x), dense(x))


def test_fp32_model_keeps_its_dtype_around_bf16_sparse_layers():
    dense = _masked_ffn().float()
    sparse = copy.deepcopy(dense)
    assert to_semi_structured(sparse, names=["0"]) == ["0"]
    assert sparse[0].weight.dtype == torch.bfloat16 and sparse[2].weight.dtype == torch.float32
    x = torch.randn(8, 16, 768, device="cuda")
    with torch.inference_mode():
        _close(sparse(x), dense(x))
