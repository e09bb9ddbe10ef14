"""2:4 export on a GPU: the semi-structured model computes what the masked dense model computes (bf16), with
row-major and column-major results.

Skipped, with the reason, where there is no CUDA GPU of compute capability 8.0 or newer (CI has none).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from sparsebert.export import SemiStructuredLinear, feed_forward_names, to_semi_structured
from sparsebert.sparsity import SparsityConfig, SparsityController, nm_mask

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


@pytest.mark.parametrize("column_major", [(), ("0",)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_exported_model_matches_masked_dense(backend, column_major):
    dense = _masked_ffn()
    sparse = copy.deepcopy(dense)
    assert to_semi_structured(sparse, backend=backend, column_major=column_major) == ["0", "2"]
    assert isinstance(sparse[0], SemiStructuredLinear) and isinstance(sparse[2], SemiStructuredLinear)
    assert type(sparse[3]) is nn.Linear and type(sparse[4]) is nn.Linear  # not 2:4; 2 rows are too few
    cusparselt = type(sparse[0].weight).BACKEND == "cusparselt"
    assert sparse[0].column_major_output == (cusparselt and column_major == ("0",))
    assert not sparse[2].column_major_output
    generator = torch.Generator(device="cuda").manual_seed(0)
    inputs = [
        torch.randn(64, 768, device="cuda", dtype=torch.bfloat16, generator=generator),
        torch.randn(4, 128, 768, device="cuda", dtype=torch.bfloat16, generator=generator),
        torch.randn(768, 4, 24, device="cuda", dtype=torch.bfloat16, generator=generator).permute(1, 2, 0),
        torch.randn(3, 33, 768, device="cuda", dtype=torch.bfloat16, generator=generator),
        torch.randn(16, 8, 768, device="cuda", dtype=torch.bfloat16, generator=generator)[:, 0],
        torch.randn(3, 768, device="cuda", dtype=torch.bfloat16, generator=generator),
    ]  # 2-D, 3-D, 3-D column-major, 99 rows (not a multiple of the 8 cuSPARSELt wants: padded), a slice that is
    # neither row- nor column-major (16 rows, no padding: copied first), and fewer rows than 8
    with torch.inference_mode():
        for x in inputs:
            _close(sparse(x), dense(x))
            up = sparse[0](x)
            _close(up, dense[0](x))
            if sparse[0].column_major_output:  # a transposed view: rows adjacent in memory (padded rows after)
                assert up.reshape(-1, up.shape[-1]).stride()[0] == 1
            else:
                assert up.is_contiguous()


def test_fp32_model_keeps_its_dtype_around_bf16_sparse_layers():
    dense = _masked_ffn().float()
    sparse = copy.deepcopy(dense)
    assert to_semi_structured(sparse, names=["0"]) == ["0"]
    assert sparse[0].weight.dtype == torch.bfloat16 and sparse[2].weight.dtype == torch.float32
    x = torch.randn(8, 16, 768, device="cuda")
    with torch.inference_mode():
        _close(sparse(x), dense(x))


def _masked_bert() -> nn.Module:
    """A small BERT classifier (bf16, on the GPU, eval) with magnitude 2:4 masks on its encoder Linear weights."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512
    )
    dense = BertForSequenceClassification(config).cuda().eval()
    SparsityController(dense, SparsityConfig(sparsity=0.5, pattern="2:4", init="magnitude"))
    return dense.to(torch.bfloat16)


def _token_ids() -> torch.Tensor:
    return torch.randint(0, 512, (4, 40), device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))


def test_bert_export_keeps_attention_row_major_and_the_feed_forward_column_major():
    """A small BERT classifier with magnitude 2:4 masks: with the default layouts the exported logits match the
    masked dense model's, the up-projections hand GELU a column-major result and everything else is row-major."""
    dense = _masked_bert()
    sparse = copy.deepcopy(dense)
    converted = to_semi_structured(sparse)
    assert len(converted) == 12  # 6 encoder Linear layers per layer; pooler and classifier have no 2:4 masks
    layouts: dict[str, bool] = {}

    def record(name):
        def hook(module, args, out):
            layouts[name] = out.reshape(-1, out.shape[-1]).is_contiguous()

        return hook

    for name in converted:
        sparse.get_submodule(name).register_forward_hook(record(name))
    ids = _token_ids()
    with torch.inference_mode():
        _close(sparse(input_ids=ids).logits, dense(input_ids=ids).logits)
    cusparselt = type(sparse.get_submodule(converted[0]).weight).BACKEND == "cusparselt"
    for name in converted:
        assert layouts[name] == (not (cusparselt and name.endswith("intermediate.dense"))), name


def test_bert_feed_forward_export_leaves_attention_dense():
    """``names=feed_forward_names(model)``, the fastest export on an H100: only the up- and down-projections become
    semi-structured, attention's projections stay ordinary Linear layers, and the logits match."""
    dense = _masked_bert()
    sparse = copy.deepcopy(dense)
    names = feed_forward_names(sparse)
    assert len(names) == 4 and to_semi_structured(sparse, names=names) == names
    exported = {n for n, m in sparse.named_modules() if isinstance(m, SemiStructuredLinear)}
    assert exported == set(names)
    assert type(sparse.get_submodule("bert.encoder.layer.0.attention.self.query")) is nn.Linear
    ids = _token_ids()
    with torch.inference_mode():
        _close(sparse(input_ids=ids).logits, dense(input_ids=ids).logits)


def test_cusparselt_linear_checks_its_input_and_handles_no_rows():
    from sparsebert.export.semi_structured import cusparselt_linear

    if not torch.backends.cusparselt.is_available():
        pytest.skip("this torch build has no cuSPARSELt")
    sparse = copy.deepcopy(_masked_ffn())
    to_semi_structured(sparse, backend="cusparselt")
    layer = sparse[0]
    with pytest.raises(ValueError, match=r"x must be 2-D \[rows, 768\] in torch.bfloat16"):
        cusparselt_linear(torch.randn(4, 768, device="cuda"), layer.weight, layer.bias)
    with pytest.raises(ValueError, match=r"got \(4, 384\)"):
        cusparselt_linear(torch.randn(4, 384, device="cuda", dtype=torch.bfloat16), layer.weight, layer.bias)
    with torch.inference_mode():
        assert layer(torch.empty(0, 768, device="cuda", dtype=torch.bfloat16)).shape == (0, 3072)


def test_exported_model_compiles_as_one_graph():
    """torch.compile traces the cuSPARSELt calls (the compressed weight is handed over as [out, -1], which
    torch's shape function needs) and computes what the eager export computes."""
    dense = _masked_ffn()
    sparse = copy.deepcopy(dense)
    to_semi_structured(sparse, column_major=("0",))
    compiled = torch.compile(sparse, fullgraph=True)
    x = torch.randn(4, 128, 768, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        out = compiled(x)
        _close(out, sparse(x))
        _close(out, dense(x))
