"""Inference export of 2:4 sparse Linear layers to PyTorch semi-structured sparse tensors.

A weight trained with ``pattern: "2:4"`` masks is still stored dense; sparse tensor cores (NVIDIA sm80+) only
skip the zeros once the weight is compressed into values + metadata. ``to_semi_structured`` does that for every
eligible ``nn.Linear`` of a model, in place, for inference (the compressed weights take no gradient and are not
meant for ``state_dict`` round trips: keep the dense checkpoint and convert after loading).

Torch's constraints (``torch/sparse/semi_structured.py``): CUDA tensors only; 2-D; contiguous; per backend a
dtype table whose (min rows, min cols) both bound and divide the weight's shape. For bf16/fp16 that is (16, 16)
with cuSPARSELt and (32, 64) with CUTLASS; float32 runs only on CUTLASS, (32, 32). torch's CUTLASS kernels run
only on sm8x (Ampere/Ada): on Hopper and newer only cuSPARSELt works. The sparse matmul itself is 2-D only, so
``SemiStructuredLinear`` flattens leading (batch, seq) dimensions around it.

Layouts: cuSPARSELt multiplies the transposed problem, sparse weight first (``W @ x^T``), and its speed depends on
which operands are transposed. Row-major activations in and row-major results out is its slowest combination for
BERT's shapes; a column-major result, or a column-major input, is faster (docs/performance.md). So a layer
listed in ``column_major`` returns its result column-major (a transposed view, no copy): BERT's feed-forward
up-projection, whose output goes only through GELU (elementwise,
keeps the layout) into the down-projection, which then reads it as a contiguous transposed operand (when the row
count needs no padding; padding copies it to row-major) and writes a row-major result again. Every other layer
returns row-major results, as attention's head split and LayerNorm want. The values are the same either way.

``SemiStructuredLinear`` calls torch's cuSPARSELt matmul itself (``cslt_sparse_mm``, upstream/torch_ops.py)
rather than torch's semi-structured ``F.linear`` so that it, not the torch version, decides the layouts: torch
2.11's ``F.linear`` returns the result as a transposed view everywhere. Either way cuSPARSELt sets up its plan
on the host at every call (pytorch/pytorch#153825), so eager 2:4 inference is host-bound; a CUDA graph removes
that. Measure on the target card.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.sparse import (
    SparseSemiStructuredTensor,
    SparseSemiStructuredTensorCUSPARSELT,
    SparseSemiStructuredTensorCUTLASS,
)

from sparsebert.sparsity.masks import nm_violations
from sparsebert.sparsity.report import layer_type
from sparsebert.upstream.torch_ops import cslt_sparse_mm, semi_structured_limits

log = logging.getLogger(__name__)

BACKENDS = ("auto", "cutlass", "cusparselt")
# Name suffixes of the Linear layers whose result stays column-major by default: BERT-family feed-forward
# up-projections (BERT, RoBERTa, ELECTRA, MiniLM all call them "intermediate.dense").
COLUMN_MAJOR_DEFAULT = ("intermediate.dense",)
# int8 / float8 need scaled matmuls with their own scales: out of scope for a drop-in Linear.
_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def is_two_four(weight: torch.Tensor) -> bool:
    """True if ``weight`` [out, in] has at most 2 non-zeros in every group of 4 consecutive entries of a row.

    A weight whose input dimension is not a multiple of 4 (or that is not 2-D) cannot be 2:4: False.
    """
    if weight.dim() != 2 or weight.shape[1] % 4:
        return False
    return nm_violations(weight) == 0


class SemiStructuredLinear(nn.Linear):
    """An ``nn.Linear`` whose weight is a ``SparseSemiStructuredTensor``; inference only.

    The sparse matmul is 2-D only, so leading (batch, seq) dimensions are flattened around it (``reshape``: a
    free view for contiguous or column-major inputs, a copy otherwise). Inputs are cast to the weight's dtype and
    the output back to the input's dtype, so converting some layers of an fp32 model leaves the rest of it as it
    was (both casts are no-ops when the model already runs in the export dtype). ``column_major_output``: the
    result is a column-major view instead of row-major (cuSPARSELt weights only; see the module docstring).
    """

    column_major_output: bool = False

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        dtype: torch.dtype,
        sparse_cls: type[SparseSemiStructuredTensor],
        column_major_output: bool = False,
    ) -> SemiStructuredLinear:
        # Built on the meta device so no dense weight is allocated only to be replaced.
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        dense = linear.weight.detach().to(dtype).contiguous()
        new.weight = nn.Parameter(sparse_cls.from_dense(dense), requires_grad=False)
        if linear.bias is not None:
            # cuSPARSELt fuses the bias only in the weight's dtype.
            new.bias = nn.Parameter(linear.bias.detach().to(dtype), requires_grad=False)
        new.column_major_output = column_major_output and sparse_cls is SparseSemiStructuredTensorCUSPARSELT
        new.train(linear.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2d = x.reshape(-1, x.shape[-1]).to(self.weight.dtype)
        if isinstance(self.weight, SparseSemiStructuredTensorCUSPARSELT):
            out = cusparselt_linear(x2d, self.weight, self.bias, self.column_major_output)
        else:
            out = F.linear(x2d, self.weight, self.bias)
        return out.view(*lead, out.shape[-1]).to(x.dtype)

    def extra_repr(self) -> str:
        return super().extra_repr() + (", column_major_output=True" if self.column_major_output else "")


def cusparselt_linear(
    x: torch.Tensor,
    weight: SparseSemiStructuredTensorCUSPARSELT,
    bias: torch.Tensor | None,
    column_major_output: bool = False,
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a 2-D ``x`` as one cuSPARSELt call: ``W @ x^T``, with ``x^T`` passed as
    a view. cuSPARSELt reads a row-major or a column-major ``x`` without a copy; any other strides (a slice such
    as ``hidden[:, 0]``) are copied first, since torch's op tells the two layouts apart by ``is_contiguous`` alone
    and would read other strides wrongly. The result is row-major [rows, out] (cuSPARSELt writes it transposed),
    or with ``column_major_output`` the [out, rows] result's transposed view."""
    if x.dim() != 2 or x.shape[1] != weight.shape[1] or x.dtype != weight.dtype:
        raise ValueError(
            f"cusparselt_linear: x must be 2-D [rows, {weight.shape[1]}] in {weight.dtype}; "
            f"got {tuple(x.shape)} in {x.dtype}"
        )
    rows = x.shape[0]
    if rows == 0:
        return x.new_empty((0, weight.shape[0]))
    if not (x.is_contiguous() or x.t().is_contiguous()):
        x = x.contiguous()
    # cuSPARSELt wants the dense operand's row count to be a multiple of the dtype's minimum (8 for bf16/fp16)
    pad = -rows % semi_structured_limits(weight)[x.dtype].dense_min_rows
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    # torch's shape function takes the output size from the compressed weight's first dimension: give it
    # [out, -1] (the kernel reads only the storage), so torch.compile traces the right shapes
    packed = weight.packed
    if packed.dim() == 1 and packed.numel() % weight.shape[0] == 0:
        packed = packed.view(weight.shape[0], -1)
    out = cslt_sparse_mm(
        packed, x.t(), bias, transpose_result=not column_major_output, alg_id=weight.alg_id_cusparselt
    )
    if column_major_output:
        out = out.t()
    return out[:rows] if pad else out


def to_semi_structured(
    model: nn.Module,
    dtype: torch.dtype = torch.bfloat16,
    names: Iterable[str] | None = None,
    backend: str = "auto",
    column_major: Iterable[str] = COLUMN_MAJOR_DEFAULT,
) -> list[str]:
    """Replace each eligible ``nn.Linear`` of ``model`` (on a CUDA sm80+ GPU) by a ``SemiStructuredLinear``.

    Eligible: the weight is 2:4 (``is_two_four``) and its shape meets the backend's constraints for ``dtype``.
    ``names``: module names (as in ``named_modules()``) to consider; None: every Linear. A named module that is
    not a Linear is an error; ineligible ones are skipped and logged with the reason. ``backend``: "cusparselt",
    "cutlass" (what torch's global force-CUTLASS flag selects; sm8x only), or "auto" (cuSPARSELt where this
    torch build has it, else CUTLASS). The chosen class is called directly rather than flipping the
    global flag. The capability check uses the current CUDA device, where the model is expected to be.
    ``column_major``: name suffixes (whole dotted parts) of the layers that return column-major results
    (cuSPARSELt only; see the module docstring); ``()`` keeps every result row-major. Returns the names of the
    converted modules; the rest of the model is untouched.
    """
    if isinstance(column_major, str):  # a bare string would be taken as a sequence of one-letter suffixes
        raise TypeError(f"column_major must be a sequence of name suffixes, e.g. ({column_major!r},)")
    suffixes = tuple(column_major)
    if not torch.cuda.is_available():
        raise RuntimeError("semi-structured sparse kernels need a CUDA GPU (sm80+); CUDA is not available here")
    sparse_cls = _backend_class(backend, torch.cuda.get_device_capability())
    if dtype not in _FLOAT_DTYPES or dtype not in semi_structured_limits(sparse_cls):
        supported = [d for d in _FLOAT_DTYPES if d in semi_structured_limits(sparse_cls)]
        raise ValueError(f"dtype {dtype} is not supported by the {sparse_cls.BACKEND} backend; use one of {supported}")
    limits = semi_structured_limits(sparse_cls)[dtype]
    min_rows, min_cols = limits.sparse_min_rows, limits.sparse_min_cols

    modules = dict(model.named_modules())
    if names is None:
        candidates = [n for n, m in modules.items() if isinstance(m, nn.Linear) and n]
    else:
        candidates = list(names)
        for name in candidates:
            if not name or not isinstance(modules.get(name), nn.Linear):
                raise ValueError(f"{name!r} is not an nn.Linear submodule of the model")

    converted: list[str] = []
    skipped: list[str] = []
    for name in candidates:
        linear = modules[name]
        weight = linear.weight
        if isinstance(linear, SemiStructuredLinear) or isinstance(weight, SparseSemiStructuredTensor):
            skipped.append(f"{name} (already semi-structured)")
            continue
        if not weight.is_cuda:
            raise RuntimeError(f"{name} is on {weight.device}: move the model to the CUDA GPU before exporting")
        rows, cols = weight.shape
        if not is_two_four(weight):
            skipped.append(f"{name} (not 2:4)")
        elif rows % min_rows or cols % min_cols:  # multiples of a positive minimum are also >= it
            skipped.append(f"{name} (shape {rows}x{cols} is not a multiple of ({min_rows}, {min_cols}))")
        else:
            parent, _, child = name.rpartition(".")
            sparse = SemiStructuredLinear.from_linear(
                linear, dtype, sparse_cls, column_major_output=ends_with_any(name, suffixes)
            )
            setattr(model.get_submodule(parent), child, sparse)
            converted.append(name)
    if skipped:
        log.info(
            "semi-structured export (%s) kept %d Linear layers as they were: %s",
            sparse_cls.BACKEND,
            len(skipped),
            ", ".join(skipped),
        )
    return converted


def feed_forward_names(model: nn.Module) -> list[str]:
    """The names of a BERT-style encoder's feed-forward Linear layers, ``...intermediate.dense`` and the
    ``...output.dense`` after it (not ``...attention.output.dense``), for ``to_semi_structured(model,
    names=feed_forward_names(model))``. Exporting only these is the fastest 2:4 model on this path: attention's
    projections are slower as 2:4 than dense in the row-major layout that its head split and LayerNorm need
    (docs/performance.md). A model with none of them is an error rather than an export that converts nothing."""
    names = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and layer_type(f"{name}.weight") in ("intermediate", "output")
    ]
    if not names:
        raise ValueError(
            "no BERT feed-forward layers (encoder Linear modules named ...intermediate.dense or ...output.dense "
            "outside attention) in this model"
        )
    return names


def ends_with_any(name: str, suffixes: Iterable[str]) -> bool:
    """True if the dotted module ``name`` ends with one of ``suffixes`` as whole dotted parts:
    ``"layer.0.intermediate.dense"`` ends with ``"intermediate.dense"`` and ``"dense"``, not with ``"ense"``."""
    return any(name == suffix or name.endswith("." + suffix) for suffix in suffixes)


def _backend_class(backend: str, capability: tuple[int, int]) -> type[SparseSemiStructuredTensor]:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if capability < (8, 0):
        raise RuntimeError(f"semi-structured sparse kernels need a CUDA GPU (sm80+); this one is sm{capability[0]}x")
    has_cusparselt = torch.backends.cusparselt.is_available()
    if backend == "cusparselt" and not has_cusparselt:
        raise RuntimeError('backend "cusparselt": this torch build has no cuSPARSELt; use "cutlass" or "auto"')
    if backend == "cusparselt" or (backend == "auto" and has_cusparselt):
        return SparseSemiStructuredTensorCUSPARSELT
    if capability[0] != 8:  # the kernels would fail at the first matmul, long after the export "worked"
        raise RuntimeError(
            f"torch's CUTLASS semi-structured kernels run only on sm8x GPUs, this one is sm{capability[0]}x: "
            'use backend "cusparselt"'
        )
    return SparseSemiStructuredTensorCUTLASS
