"""Our 2:4 H100 kernel on the GPU: every tile configuration computes what the masked dense Linear computes (with
and without the fused GELU, odd row counts, no rows), and a BERT converted by ``to_sparse24_kernel`` gives the
masked dense model's logits, eagerly and compiled inside a CUDA graph.

Skipped, with the reason, without an sm90 GPU or without the built library (``python -m sparsebert.kernels.build``).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import sparse24_kernel_missing
from torch import nn
from transformers import BertConfig, BertForSequenceClassification

from sparsebert.export.sparse24_kernel import Library, Sparse24Linear, to_sparse24_kernel
from sparsebert.sparsity import SparsityConfig, SparsityController, nm_mask

_MISSING = sparse24_kernel_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING))


def _close(out: torch.Tensor, ref: torch.Tensor, rtol: float = 2e-2) -> None:
    # bf16 rounding and another summation order: compare relative to the reference's scale
    assert out.shape == ref.shape and not out.isnan().any()
    error = (out.float() - ref.float()).abs().max().item()
    assert error <= rtol * ref.float().abs().max().item(), error


def _masked_linear(n_out: int, n_in: int) -> nn.Linear:
    torch.manual_seed(n_out + n_in)
    linear = nn.Linear(n_in, n_out, device="cuda")
    with torch.no_grad():
        linear.weight.mul_(nm_mask(linear.weight)).div_(n_in**0.25)
    return linear.to(torch.bfloat16)


@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("rows", [1, 1000, 4096])
def test_every_configuration_matches_the_masked_dense_linear(gelu, rows):
    linear = _masked_linear(384, 256)
    x = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16)
    ref = F.linear(x.float(), linear.weight.float(), linear.bias.float())
    ref = F.gelu(ref) if gelu else ref
    layer = Sparse24Linear(linear, gelu=gelu)
    for config in range(len(Library.get().configs)):
        layer.configs = {rows: config}
        _close(layer(x), ref)


def test_no_rows_and_leading_dimensions():
    layer = Sparse24Linear(_masked_linear(128, 128))
    assert layer(torch.empty(0, 128, device="cuda", dtype=torch.bfloat16)).shape == (0, 128)
    x = torch.randn(3, 5, 128, device="cuda")  # fp32 in, fp32 out: cast around the bf16 kernel
    out = layer(x)
    assert out.shape == (3, 5, 128) and out.dtype == torch.float32


def test_refuses_weights_it_cannot_run():
    with pytest.raises(ValueError, match="not 2:4"):
        Sparse24Linear(nn.Linear(128, 128, device="cuda").to(torch.bfloat16))
    with pytest.raises(ValueError, match="multiples of 128"):
        Sparse24Linear(_masked_linear(128, 64))


def test_converted_bert_matches_masked_dense_eager_and_compiled_in_a_cuda_graph():
    torch.manual_seed(0)
    config = BertConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
                        vocab_size=1000)
    dense = BertForSequenceClassification(config).cuda().eval()
    SparsityController(dense, SparsityConfig(sparsity=0.5, pattern="2:4", init="magnitude"))
    dense = dense.to(torch.bfloat16)
    sparse = copy.deepcopy(dense)
    converted = to_sparse24_kernel(sparse, rows=[4 * 64])
    # q, k, v, attention output, up- and down-projection in each of 2 layers; the pooler and classifier are not 2:4
    assert len(converted) == 12 and all(".encoder." in f".{n}" for n in converted)
    assert sum(sparse.get_submodule(n).gelu for n in converted) == 2
    assert all(type(sparse.get_submodule(n.rpartition(".")[0]).intermediate_act_fn) is nn.Identity
               for n in converted if n.endswith("intermediate.dense"))
    ids = torch.randint(0, 1000, (4, 64), device="cuda")
    with torch.inference_mode():
        ref = dense(input_ids=ids).logits
        _close(sparse(input_ids=ids).logits, ref, rtol=5e-2)
        compiled = torch.compile(lambda i: sparse(input_ids=i).logits, dynamic=False)
        compiled(ids)
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            compiled(ids)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            out = compiled(ids)
        graph.replay()
        torch.cuda.synchronize()
        _close(out, ref, rtol=5e-2)


def test_misaligned_input_and_wrong_dtypes():
    linear = _masked_linear(128, 128)
    layer = Sparse24Linear(linear)
    flat = torch.randn(1 + 64 * 128, device="cuda", dtype=torch.bfloat16)
    x = flat[1:].view(64, 128)  # contiguous, but 2 bytes past a 16-byte boundary
    assert x.data_ptr() % 16
    _close(layer(x), F.linear(x.float(), linear.weight.float(), linear.bias.float()))
    layer.half()  # Module.half converts the buffers too: the kernel must refuse rather than misread them
    with pytest.raises(ValueError, match="must be bf16 on one GPU"):
        layer(x)
