"""A ctypes binding of the cuSPARSELt C API, for what ``torch._cslt_sparse_mm`` does not expose.

torch's binding always puts the 2:4 weight in operand A, row-major, with the dense operand in either layout and
the result in either order; of the epilogue it exposes a bias and alpha scaling, no activation. cuSPARSELt itself
also takes the sparse matrix
as operand B, either operand in either order with or without a transpose, a GELU (or ReLU) epilogue, and a C
input (``D = act(alpha * op(A) op(B) + beta * C + bias)``). This module calls the library that torch has already
loaded, through its C API, so that a bench can time those forms on the same kernels. The structs and enums below
are those of ``cusparseLt.h`` 0.8.0 (every opaque struct 512 bytes, 16-byte aligned), unchanged to 0.10.0; another
version is refused.

One ``Matmul`` is one cuSPARSELt plan: fixed shapes, layouts, dtype, epilogue and algorithm. Build it,
``compress`` the 2:4 operand once, then call it with tensors whose memory matches the descriptors (checked:
sizes, strides, dtype, device, and the compressed buffer's size). The call launches on torch's current stream and
allocates nothing, so it can be captured in a CUDA graph. A plan is for the device current when it is built.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

# cusparse.h / library_types.h enums
ORDER_COL, ORDER_ROW = 1, 2
OP_N, OP_T = 0, 1
CUDA_DTYPES = {torch.bfloat16: 14, torch.float16: 2}  # cudaDataType; the 2:4 types (float32 would be 1:2)
COMPUTE_32F = 2  # cusparseComputeType
# cusparseLtMatmulDescAttribute_t (declaration order, no explicit values in the header)
ATTR_ACTIVATION_RELU, ATTR_ACTIVATION_GELU, ATTR_BIAS_POINTER = 0, 3, 8
# cusparseLtMatmulAlgAttribute_t
ALG_CONFIG_ID, ALG_CONFIG_MAX_ID = 0, 1
SPARSITY_50_PERCENT = 0
OPAQUE_BYTES = 512
SUPPORTED_VERSIONS = ((0, 8), (0, 10))  # (major, minor), inclusive: headers compared, same structs and enums

_P, _I64, _U32, _INT, _SIZE = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint32, ctypes.c_int, ctypes.c_size_t
_SIGNATURES = {  # every function used, as cusparseLt.h declares it (all return cusparseStatus_t, an int)
    "cusparseLtInit": [_P],
    "cusparseLtGetProperty": [_INT, _P],
    "cusparseLtDenseDescriptorInit": [_P, _P, _I64, _I64, _I64, _U32, _INT, _INT],
    "cusparseLtStructuredDescriptorInit": [_P, _P, _I64, _I64, _I64, _U32, _INT, _INT, _INT],
    "cusparseLtMatDescriptorDestroy": [_P],
    "cusparseLtMatmulDescriptorInit": [_P, _P, _INT, _INT, _P, _P, _P, _P, _INT],
    "cusparseLtMatmulDescSetAttribute": [_P, _P, _INT, _P, _SIZE],
    "cusparseLtMatmulAlgSelectionInit": [_P, _P, _P, _INT],
    "cusparseLtMatmulAlgSelectionDestroy": [_P],
    "cusparseLtMatmulAlgSetAttribute": [_P, _P, _INT, _P, _SIZE],
    "cusparseLtMatmulAlgGetAttribute": [_P, _P, _INT, _P, _SIZE],
    "cusparseLtMatmulPlanInit": [_P, _P, _P, _P],
    "cusparseLtMatmulPlanDestroy": [_P],
    "cusparseLtMatmulGetWorkspace": [_P, _P, _P],
    "cusparseLtSpMMACompressedSize": [_P, _P, _P, _P],
    "cusparseLtSpMMACompress": [_P, _P, _P, _P, _P, _P],
    "cusparseLtMatmul": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, ctypes.c_int32],
}


class CuSparseLtError(RuntimeError):
    def __init__(self, what: str, status: int, name: str) -> None:
        super().__init__(f"cuSPARSELt {what} failed: {name} ({status})")
        self.status = status


def loaded_library_path() -> str | None:
    """The libcusparseLt this process has loaded (torch loads it with its CUDA libraries); None if none or
    unreadable (``/proc/self/maps``, Linux only)."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    # a maps line: address, permissions, offset, device, inode, then the path (which may hold spaces)
    paths = {fields[5] for line in maps if "libcusparseLt" in line and len(fields := line.split(maxsplit=5)) == 6}
    return paths.pop() if len(paths) == 1 else None


def loaded_version() -> str | None:
    """The version the loaded libcusparseLt reports of itself ("0.8.0"), or None. torch's
    ``torch.backends.cusparselt.version()`` is the version torch was built against, whatever is loaded."""
    path = loaded_library_path()
    if path is None:
        return None
    try:
        return ".".join(map(str, _version(ctypes.CDLL(path))))
    except (OSError, AttributeError, RuntimeError):  # not loadable, no such function, or an error status
        return None


def _version(lib: ctypes.CDLL) -> tuple[int, int, int]:
    parts = []
    for prop in range(3):  # libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        value = ctypes.c_int()
        if lib.cusparseLtGetProperty(prop, ctypes.byref(value)) != 0:
            raise RuntimeError("cusparseLtGetProperty failed")
        parts.append(value.value)
    return parts[0], parts[1], parts[2]


def library_path() -> str:
    """The libcusparseLt torch has loaded (so both use one copy), else the pip package's beside torch."""
    loaded = loaded_library_path()
    if loaded is not None:
        return loaded
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
    """The loaded library and one cuSPARSELt handle, for the device current at the first ``get`` (the benches
    use one GPU)."""

    _instance: Library | None = None

    def __init__(self) -> None:
        self.lib = ctypes.CDLL(library_path())
        self.version_tuple = _version(self.lib)
        if not SUPPORTED_VERSIONS[0] <= self.version_tuple[:2] <= SUPPORTED_VERSIONS[1]:
            raise RuntimeError(f"cuSPARSELt {self.version()} is loaded; this binding follows the 0.8-0.10 header")
        for name, argtypes in _SIGNATURES.items():
            function = getattr(self.lib, name)
            function.argtypes, function.restype = argtypes, ctypes.c_int
        self.lib.cusparseLtGetErrorName.argtypes = [ctypes.c_int]
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
            name = self.lib.cusparseLtGetErrorName(status)
            raise CuSparseLtError(what, status, name.decode() if name else "unknown status")

    def version(self) -> str:
        return ".".join(map(str, self.version_tuple))


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
    epilogue; a combination the library does not offer raises ``CuSparseLtError`` here. ``alg_id`` picks the
    kernel configuration (0 .. ``max_alg_id``). The plan and its descriptors are destroyed with the object."""

    def __init__(self, a: Operand, b: Operand, d: Operand, sparse_a: bool, dtype: torch.dtype = torch.bfloat16,
                 bias: torch.Tensor | None = None, activation: str | None = None, alg_id: int = 0) -> None:
        (m, k), (k2, n) = a.shape_after_op, b.shape_after_op
        if k != k2 or (d.rows, d.cols) != (m, n) or d.op != OP_N:
            raise ValueError(f"shapes do not chain: op(A) {m}x{k}, op(B) {k2}x{n}, D {d.rows}x{d.cols}")
        if dtype not in CUDA_DTYPES:
            raise ValueError(f"dtype {dtype} is not one of the 2:4 types {list(CUDA_DTYPES)}")
        self.lt = Library.get()
        self.a, self.b, self.d, self.sparse_a, self.dtype = a, b, d, sparse_a, dtype
        self.activation, self.alg_id = activation, alg_id
        self._descs = {"a": self._describe(a, structured=sparse_a), "b": self._describe(b, structured=not sparse_a),
                       "d": self._describe(d, structured=False)}
        self._matmul = _Opaque()
        self.lt.check(self.lt.lib.cusparseLtMatmulDescriptorInit(
            self.lt.handle.ptr, self._matmul.ptr, a.op, b.op, self._descs["a"].ptr, self._descs["b"].ptr,
            self._descs["d"].ptr, self._descs["d"].ptr, COMPUTE_32F), "matmul descriptor")
        self.bias = bias  # kept alive: the plan holds its pointer
        if bias is not None:
            if bias.dtype != dtype or bias.numel() != d.rows or not bias.is_contiguous() or not bias.is_cuda:
                raise ValueError(f"bias must be {d.rows} contiguous {dtype} values on the GPU (one per row of D)")
            self._set(ATTR_BIAS_POINTER, ctypes.c_void_p(bias.data_ptr()))
        if activation is not None:
            self._set({"gelu": ATTR_ACTIVATION_GELU, "relu": ATTR_ACTIVATION_RELU}[activation], ctypes.c_int(1))
        self._alg, self._plan = _Opaque(), _Opaque()
        lib, handle = self.lt.lib, self.lt.handle.ptr
        self.lt.check(lib.cusparseLtMatmulAlgSelectionInit(handle, self._alg.ptr, self._matmul.ptr, 0),
                      "algorithm selection")
        self.max_alg_id = self._get_alg(ALG_CONFIG_MAX_ID)
        self._set_alg(ALG_CONFIG_ID, alg_id)
        self.lt.check(lib.cusparseLtMatmulPlanInit(handle, self._plan.ptr, self._matmul.ptr, self._alg.ptr), "plan")
        self._finalizer = weakref.finalize(self, _destroy, self.lt, self._plan, self._alg, list(self._descs.values()))
        size, buffer_size = ctypes.c_size_t(), ctypes.c_size_t()
        self.lt.check(lib.cusparseLtMatmulGetWorkspace(handle, self._plan.ptr, ctypes.byref(size)), "workspace size")
        self.workspace = torch.empty(max(size.value, 1), dtype=torch.uint8, device="cuda")
        self.lt.check(lib.cusparseLtSpMMACompressedSize(handle, self._plan.ptr, ctypes.byref(size),
                                                        ctypes.byref(buffer_size)), "compressed size")
        self.compressed_bytes, self._compress_buffer_bytes = size.value, buffer_size.value
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def _describe(self, operand: Operand, structured: bool) -> _Opaque:
        desc = _Opaque()
        args = (self.lt.handle.ptr, desc.ptr, operand.rows, operand.cols, operand.ld, 16, CUDA_DTYPES[self.dtype],
                operand.order)
        if structured:
            self.lt.check(self.lt.lib.cusparseLtStructuredDescriptorInit(*args, SPARSITY_50_PERCENT), "structured")
        else:
            self.lt.check(self.lt.lib.cusparseLtDenseDescriptorInit(*args), "dense descriptor")
        return desc

    def _set(self, attribute: int, value: ctypes.c_int | ctypes.c_void_p) -> None:
        self.lt.check(self.lt.lib.cusparseLtMatmulDescSetAttribute(
            self.lt.handle.ptr, self._matmul.ptr, attribute, ctypes.byref(value), ctypes.sizeof(value)),
            f"matmul attribute {attribute}")

    def _get_alg(self, attribute: int) -> int:
        value = ctypes.c_int()
        self.lt.check(self.lt.lib.cusparseLtMatmulAlgGetAttribute(
            self.lt.handle.ptr, self._alg.ptr, attribute, ctypes.byref(value), ctypes.sizeof(value)),
            f"algorithm attribute {attribute}")
        return value.value

    def _set_alg(self, attribute: int, value: int) -> None:
        data = ctypes.c_int(value)
        self.lt.check(self.lt.lib.cusparseLtMatmulAlgSetAttribute(
            self.lt.handle.ptr, self._alg.ptr, attribute, ctypes.byref(data), ctypes.sizeof(data)),
            f"algorithm attribute {attribute} = {value}")

    @property
    def sparse_operand(self) -> Operand:
        return self.a if self.sparse_a else self.b

    def _check_tensor(self, what: str, operand: Operand, t: torch.Tensor) -> None:
        if not operand.matches(t) or t.dtype != self.dtype or not t.is_cuda:
            raise ValueError(f"{what} {tuple(t.shape)}{t.stride()} {t.dtype} on {t.device} does not match the "
                             f"plan's {operand} in {self.dtype} on the GPU")

    def compress(self, dense: torch.Tensor) -> torch.Tensor:
        """The 2:4 operand, stored as its descriptor says, compressed for this plan (a uint8 buffer)."""
        self._check_tensor("the sparse operand", self.sparse_operand, dense)
        compressed = torch.empty(self.compressed_bytes, dtype=torch.uint8, device=dense.device)
        # freed on return while the kernel may still run: fine, torch's allocator reuses it in stream order
        scratch = torch.empty(max(self._compress_buffer_bytes, 1), dtype=torch.uint8, device=dense.device)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.lt.check(self.lt.lib.cusparseLtSpMMACompress(
            self.lt.handle.ptr, self._plan.ptr, dense.data_ptr(), compressed.data_ptr(), scratch.data_ptr(), stream),
            "compress")
        return compressed

    def __call__(self, compressed: torch.Tensor, dense: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Write the product into ``out`` (D's layout) and return it."""
        self._check_tensor("the dense operand", self.b if self.sparse_a else self.a, dense)
        self._check_tensor("out", self.d, out)
        if compressed.dtype != torch.uint8 or compressed.numel() != self.compressed_bytes or not compressed.is_cuda:
            raise ValueError(f"compressed must be this plan's {self.compressed_bytes}-byte buffer (``compress``)")
        a, b = (compressed, dense) if self.sparse_a else (dense, compressed)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.lt.check(self.lt.lib.cusparseLtMatmul(
            self.lt.handle.ptr, self._plan.ptr, ctypes.byref(self._alpha), a.data_ptr(), b.data_ptr(),
            ctypes.byref(self._beta), out.data_ptr(), out.data_ptr(), self.workspace.data_ptr(),
            ctypes.byref(stream), 1), "matmul")
        return out


def _destroy(lt: Library, plan: _Opaque, alg: _Opaque, descs: list[_Opaque]) -> None:
    """Release a plan's cuSPARSELt objects (statuses ignored: this runs at collection or exit)."""
    lt.lib.cusparseLtMatmulPlanDestroy(plan.ptr)
    lt.lib.cusparseLtMatmulAlgSelectionDestroy(alg.ptr)
    for desc in descs:
        lt.lib.cusparseLtMatDescriptorDestroy(desc.ptr)
