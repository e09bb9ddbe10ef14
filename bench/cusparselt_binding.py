"""A ctypes binding of the cuSPARSELt C API, for what ``torch._cslt_sparse_mm`` does not expose.

torch's binding always puts the 2:4 weight in operand A, row-major, with the dense operand in either layout and
the result in either order, and it sets no epilogue but a bias. cuSPARSELt itself also takes the sparse matrix
as operand B, either operand in either order with or without a transpose, a GELU (or ReLU) epilogue, and a C
input (``D = act(alpha * op(A) op(B) + beta * C + bias)``). This module calls the library that torch has already
loaded, through its C API (``cusparseLt.h``, 0.8.0: every opaque struct is 512 bytes, 16-byte aligned), so that a
bench can time those forms on the same kernels.

One ``Matmul`` is one cuSPARSELt plan: fixed shapes, layouts, epilogue and algorithm. Build it, ``compress`` the
2:4 operand once, then call it with tensors whose memory matches the descriptors (checked: sizes and strides).
The call launches on torch's current stream and allocates nothing, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

# cusparse.h / library_types.h enums
ORDER_COL, ORDER_ROW = 1, 2
OP_N, OP_T = 0, 1
CUDA_DTYPES = {torch.bfloat16: 14, torch.float16: 2, torch.float32: 0}  # cudaDataType
COMPUTE_32F = 2  # cusparseComputeType
# cusparseLtMatmulDescAttribute_t (declaration order, no explicit values in the header)
ATTR_ACTIVATION_RELU, ATTR_ACTIVATION_GELU, ATTR_BIAS_POINTER = 0, 3, 8
# cusparseLtMatmulAlgAttribute_t
ALG_CONFIG_ID, ALG_CONFIG_MAX_ID, ALG_SPLIT_K, ALG_SPLIT_K_MODE = 0, 1, 3, 4
SPARSITY_50_PERCENT = 0
OPAQUE_BYTES = 512


class CuSparseLtError(RuntimeError):
    def __init__(self, what: str, status: int, name: str) -> None:
        super().__init__(f"cuSPARSELt {what} failed: {name} ({status})")
        self.status = status


def library_path() -> str:
    """The libcusparseLt torch has loaded (so both use one copy), else the pip package's beside torch."""
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and "libcusparseLt" in fields[5]:
                return fields[5]
    except OSError:
        pass
    for root in sys.path:
        found = sorted(glob.glob(os.path.join(root, "nvidia", "cusparselt", "lib", "libcusparseLt.so*")))
        if found:
            return found[0]
    raise OSError("libcusparseLt not found: torch has not loaded it and no nvidia-cusparselt package is installed")


class _Opaque:
    """One of cuSPARSELt's opaque 512-byte structs, 16-byte aligned inside a Python-owned buffer."""

    def __init__(self) -> None:
        self._buffer = ctypes.create_string_buffer(OPAQUE_BYTES + 16)
        address = ctypes.addressof(self._buffer)
        self.ptr = ctypes.c_void_p(address + (-address) % 16)


class Library:
    """The loaded library and one cuSPARSELt handle (per process; cuSPARSELt handles are per device)."""

    _instance: Library | None = None

    def __init__(self) -> None:
        self.lib = ctypes.CDLL(library_path())
        self.lib.cusparseLtGetErrorName.restype = ctypes.c_char_p
        self.handle = _Opaque()
        self.check(self.lib.cusparseLtInit(self.handle.ptr), "cusparseLtInit")

    @classmethod
    def get(cls) -> Library:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def check(self, status: int, what: str) -> None:
        if status != 0:
            raise CuSparseLtError(what, status, self.lib.cusparseLtGetErrorName(status).decode())

    def version(self) -> str:
        parts = []
        for prop in range(3):  # libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            value = ctypes.c_int()
            self.check(self.lib.cusparseLtGetProperty(prop, ctypes.byref(value)), "cusparseLtGetProperty")
            parts.append(str(value.value))
        return ".".join(parts)


@dataclass(frozen=True)
class Operand:
    """How one matrix is stored: ``rows`` x ``cols`` in ``order`` (the stored matrix, before ``op``)."""

    rows: int
    cols: int
    order: int  # ORDER_ROW or ORDER_COL
    op: int = OP_N  # what the matmul applies to it (operands A and B only)

    @property
    def ld(self) -> int:
        return self.cols if self.order == ORDER_ROW else self.rows

    @property
    def shape_after_op(self) -> tuple[int, int]:
        return (self.rows, self.cols) if self.op == OP_N else (self.cols, self.rows)

    def matches(self, t: torch.Tensor) -> bool:
        """``t`` holds this matrix densely: row-major [rows, cols] or column-major (a transposed contiguous)."""
        if t.dim() != 2 or tuple(t.shape) != (self.rows, self.cols):
            return False
        return t.stride() == ((self.cols, 1) if self.order == ORDER_ROW else (1, self.rows))

    @staticmethod
    def of(t: torch.Tensor, op: int = OP_N) -> Operand:
        """The operand a 2-D tensor's memory is: row-major if its rows are contiguous, column-major if its columns."""
        rows, cols = t.shape
        if t.stride() == (cols, 1):
            return Operand(rows, cols, ORDER_ROW, op)
        if t.stride() == (1, rows):
            return Operand(rows, cols, ORDER_COL, op)
        raise ValueError(f"a {tuple(t.shape)} tensor with strides {t.stride()} is neither row- nor column-major")


class Matmul:
    """``D = act(op(A) @ op(B) + bias)`` with one of A, B 2:4 sparse (compressed), as one cuSPARSELt plan.

    ``bias`` (length = D's rows, the result's dtype) and ``activation`` ("gelu", "relu" or None) are cuSPARSELt's
    epilogue. ``alg_id`` picks the kernel configuration (0 .. ``max_alg_id``)."""

    def __init__(self, a: Operand, b: Operand, d: Operand, sparse_a: bool, dtype: torch.dtype = torch.bfloat16,
                 bias: torch.Tensor | None = None, activation: str | None = None, alg_id: int = 0) -> None:
        (m, k), (k2, n) = a.shape_after_op, b.shape_after_op
        if k != k2 or (d.rows, d.cols) != (m, n) or d.op != OP_N:
            raise ValueError(f"shapes do not chain: op(A) {m}x{k}, op(B) {k2}x{n}, D {d.rows}x{d.cols}")
        self.lt = Library.get()
        lib, handle, check = self.lt.lib, self.lt.handle.ptr, self.lt.check
        self.a, self.b, self.d, self.sparse_a, self.dtype = a, b, d, sparse_a, dtype
        cuda_type = CUDA_DTYPES[dtype]
        self._descs = {name: _Opaque() for name in ("a", "b", "d")}
        for name, operand in (("a", a), ("b", b)):
            args = (handle, self._descs[name].ptr, ctypes.c_int64(operand.rows), ctypes.c_int64(operand.cols),
                    ctypes.c_int64(operand.ld), ctypes.c_uint32(16), cuda_type, operand.order)
            if (name == "a") == sparse_a:
                check(lib.cusparseLtStructuredDescriptorInit(*args, SPARSITY_50_PERCENT), f"structured {name}")
            else:
                check(lib.cusparseLtDenseDescriptorInit(*args), f"dense {name}")
        check(lib.cusparseLtDenseDescriptorInit(handle, self._descs["d"].ptr, ctypes.c_int64(d.rows),
                                                ctypes.c_int64(d.cols), ctypes.c_int64(d.ld), ctypes.c_uint32(16),
                                                cuda_type, d.order), "dense d")
        self._matmul = _Opaque()
        check(lib.cusparseLtMatmulDescriptorInit(handle, self._matmul.ptr, a.op, b.op, self._descs["a"].ptr,
                                                 self._descs["b"].ptr, self._descs["d"].ptr, self._descs["d"].ptr,
                                                 COMPUTE_32F), "matmul descriptor")
        self.bias = bias
        if bias is not None:
            if bias.dtype != dtype or bias.numel() != d.rows or not bias.is_contiguous():
                raise ValueError(f"bias must be {d.rows} contiguous {dtype} values (one per row of D)")
            self._set(ATTR_BIAS_POINTER, ctypes.c_void_p(bias.data_ptr()))
        if activation is not None:
            attribute = {"gelu": ATTR_ACTIVATION_GELU, "relu": ATTR_ACTIVATION_RELU}[activation]
            self._set(attribute, ctypes.c_int(1))
        self.activation = activation
        self._alg = _Opaque()
        check(lib.cusparseLtMatmulAlgSelectionInit(handle, self._alg.ptr, self._matmul.ptr, 0), "algorithm selection")
        max_id = ctypes.c_int()
        check(lib.cusparseLtMatmulAlgGetAttribute(handle, self._alg.ptr, ALG_CONFIG_MAX_ID, ctypes.byref(max_id),
                                                  ctypes.sizeof(max_id)), "max algorithm id")
        self.max_alg_id = max_id.value
        self.alg_id = alg_id
        alg = ctypes.c_int(alg_id)
        check(lib.cusparseLtMatmulAlgSetAttribute(handle, self._alg.ptr, ALG_CONFIG_ID, ctypes.byref(alg),
                                                  ctypes.sizeof(alg)), f"algorithm {alg_id}")
        self._plan = _Opaque()
        check(lib.cusparseLtMatmulPlanInit(handle, self._plan.ptr, self._matmul.ptr, self._alg.ptr), "plan")
        size = ctypes.c_size_t()
        check(lib.cusparseLtMatmulGetWorkspace(handle, self._plan.ptr, ctypes.byref(size)), "workspace size")
        self.workspace = torch.empty(max(size.value, 1), dtype=torch.uint8, device="cuda")
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def _set(self, attribute: int, value: ctypes._SimpleCData) -> None:
        self.lt.check(self.lt.lib.cusparseLtMatmulDescSetAttribute(
            self.lt.handle.ptr, self._matmul.ptr, attribute, ctypes.byref(value), ctypes.sizeof(value)),
            f"matmul attribute {attribute}")

    @property
    def sparse_operand(self) -> Operand:
        return self.a if self.sparse_a else self.b

    def compress(self, dense: torch.Tensor) -> torch.Tensor:
        """The 2:4 operand, stored as its descriptor says, compressed for this plan (a uint8 buffer)."""
        if not self.sparse_operand.matches(dense) or dense.dtype != self.dtype:
            raise ValueError(f"the sparse operand must be {self.sparse_operand} in {self.dtype}")
        lib, handle = self.lt.lib, self.lt.handle.ptr
        size, buffer_size = ctypes.c_size_t(), ctypes.c_size_t()
        self.lt.check(lib.cusparseLtSpMMACompressedSize(handle, self._plan.ptr, ctypes.byref(size),
                                                        ctypes.byref(buffer_size)), "compressed size")
        compressed = torch.empty(size.value, dtype=torch.uint8, device=dense.device)
        scratch = torch.empty(max(buffer_size.value, 1), dtype=torch.uint8, device=dense.device)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.lt.check(lib.cusparseLtSpMMACompress(handle, self._plan.ptr, ctypes.c_void_p(dense.data_ptr()),
                                                  ctypes.c_void_p(compressed.data_ptr()),
                                                  ctypes.c_void_p(scratch.data_ptr()), stream), "compress")
        torch.cuda.current_stream().synchronize()  # the scratch buffer is freed on return
        return compressed

    def __call__(self, compressed: torch.Tensor, dense: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write the product into ``out`` (D's layout) and return it."""
        dense_operand = self.b if self.sparse_a else self.a
        if not dense_operand.matches(dense) or not self.d.matches(out):
            raise ValueError(f"dense operand {tuple(dense.shape)}{dense.stride()} or out {tuple(out.shape)}"
                             f"{out.stride()} does not match the plan ({dense_operand}, {self.d})")
        a, b = (compressed, dense) if self.sparse_a else (dense, compressed)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.lt.check(self.lt.lib.cusparseLtMatmul(
            self.lt.handle.ptr, self._plan.ptr, ctypes.byref(self._alpha), ctypes.c_void_p(a.data_ptr()),
            ctypes.c_void_p(b.data_ptr()), ctypes.byref(self._beta), ctypes.c_void_p(out.data_ptr()),
            ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(self.workspace.data_ptr()), ctypes.byref(stream), 1),
            "matmul")
        return out
