"""ctypes binding of our CUTLASS 2:4 Linear (``bench/cutlass24/sparse24.cu``), and a module that uses it.

``y = act(x W^T + b)`` with W 2:4 along its input features, x and y row-major, the bias and an optional exact GELU
fused into the GEMM's epilogue. The library is built by ``bash bench/cutlass24/build.sh`` (no GPU needed) into
``bench/cutlass24/build/libsparse24.so``; ``SPARSEBERT_SPARSE24_LIB`` points elsewhere. It links the CUDA runtime
statically and takes torch's current stream, so calls order with torch's kernels and can be captured in a CUDA
graph. Under ``torch.compile`` the call is a custom op, opaque to Inductor.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import nn

LIBRARY_PATH = Path(__file__).resolve().parent / "cutlass24" / "build" / "libsparse24.so"


class Sparse24Error(RuntimeError):
    pass


class Library:
    _instance: Library | None = None

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise Sparse24Error(f"{path} not found: build it with `bash bench/cutlass24/build.sh`")
        lib = ctypes.CDLL(str(path))
        i32, i64, ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
        signatures = {
            "sb24_last_error": ([], ctypes.c_char_p),
            "sb24_num_configs": ([], i32),
            "sb24_config_name": ([i32], ctypes.c_char_p),
            "sb24_compressed_sizes": ([i32, i32, ctypes.POINTER(i64), ctypes.POINTER(i64)], i32),
            "sb24_compress_workspace_size": ([i32, i32], i64),
            "sb24_compress": ([ptr, ptr, ptr, i32, i32, ptr, ptr], i32),
            "sb24_workspace_size": ([i32, i32, i32, i32, i32], i64),
            "sb24_linear": ([i32, i32, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, ptr, ptr], i32),
        }
        for name, (argtypes, restype) in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, restype
        self.lib = lib
        self.configs = [lib.sb24_config_name(i).decode() for i in range(lib.sb24_num_configs())]
        self._workspaces: dict[tuple, torch.Tensor] = {}

    @classmethod
    def get(cls) -> Library:
        if cls._instance is None:
            cls._instance = cls(Path(os.environ.get("SPARSEBERT_SPARSE24_LIB", LIBRARY_PATH)))
        return cls._instance

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise Sparse24Error(f"{what}: {self.lib.sb24_last_error().decode()}")

    def workspace(self, config: int, gelu: bool, m: int, n: int, k: int, device: torch.device) -> int:
        """Pointer to a workspace for this call (0 when it needs none), kept for later calls of the same shape."""
        key = (config, gelu, m, n, k, device)
        if key not in self._workspaces:
            size = self.lib.sb24_workspace_size(config, int(gelu), m, n, k)
            if size < 0:
                raise Sparse24Error(f"workspace size: {self.lib.sb24_last_error().decode()}")
            self._workspaces[key] = torch.empty(size, dtype=torch.uint8, device=device)
        ws = self._workspaces[key]
        return ws.data_ptr() if ws.numel() else 0


@dataclass
class Sparse24Weight:
    """A 2:4 weight [out, in] in CUTLASS's compressed form: half its values and their positions (metadata)."""

    values: torch.Tensor
    metadata: torch.Tensor
    out_features: int
    in_features: int

    @classmethod
    def compress(cls, weight: torch.Tensor) -> Sparse24Weight:
        if weight.dim() != 2 or weight.dtype != torch.bfloat16 or not weight.is_cuda:
            raise ValueError(f"Sparse24Weight: needs a 2-D bf16 CUDA weight; got {tuple(weight.shape)} "
                             f"{weight.dtype} on {weight.device}")
        out_features, in_features = weight.shape
        if in_features % 16 or out_features % 8:
            raise ValueError(f"Sparse24Weight: in_features must be a multiple of 16 and out_features of 8; "
                             f"got {out_features}x{in_features}")
        nonzero = (weight.view(out_features, in_features // 4, 4) != 0).sum(-1)
        if int(nonzero.max()) > 2:
            raise ValueError("Sparse24Weight: the weight is not 2:4 (a group of four along `in` has >2 non-zeros)")
        lib = Library.get()
        n_values, n_meta = ctypes.c_int64(), ctypes.c_int64()
        lib.check(lib.lib.sb24_compressed_sizes(out_features, in_features, ctypes.byref(n_values),
                                                 ctypes.byref(n_meta)), "compressed sizes")
        weight = weight.contiguous()
        values = torch.zeros(n_values.value, dtype=torch.bfloat16, device=weight.device)
        metadata = torch.zeros(n_meta.value, dtype=torch.uint8, device=weight.device)
        workspace = torch.zeros(lib.lib.sb24_compress_workspace_size(out_features, in_features),
                                dtype=torch.uint8, device=weight.device)
        lib.check(lib.lib.sb24_compress(weight.data_ptr(), values.data_ptr(), metadata.data_ptr(), out_features,
                                        in_features, workspace.data_ptr(), torch.cuda.current_stream().cuda_stream),
                  "compress")
        return cls(values, metadata, out_features, in_features)


@torch.library.custom_op("sparsebert_bench::sparse24_linear", mutates_args=())
def sparse24_linear_op(x: torch.Tensor, values: torch.Tensor, metadata: torch.Tensor, bias: torch.Tensor,
                       out_features: int, gelu: bool, config: int) -> torch.Tensor:
    """``act(x W^T + bias)`` for a row-major 2-D bf16 ``x`` [rows, in]; the result [rows, out] is row-major."""
    lib = Library.get()
    x = x.contiguous()
    rows, in_features = x.shape
    y = torch.empty(rows, out_features, dtype=x.dtype, device=x.device)
    if rows == 0:
        return y
    workspace = lib.workspace(config, gelu, out_features, rows, in_features, x.device)
    lib.check(lib.lib.sb24_linear(config, int(gelu), values.data_ptr(), metadata.data_ptr(), x.data_ptr(),
                                  bias.data_ptr(), y.data_ptr(), out_features, rows, in_features, workspace,
                                  torch.cuda.current_stream().cuda_stream), "linear")
    return y


@sparse24_linear_op.register_fake
def _(x, values, metadata, bias, out_features, gelu, config):  # noqa: ANN001, ANN202
    return x.new_empty(x.shape[0], out_features)


class Sparse24Linear(nn.Module):
    """A bf16 ``nn.Linear`` whose 2:4 weight is kept compressed for our CUTLASS kernel, with ``gelu`` fused when
    the layer is followed by one (BERT's up-projection). ``config`` picks the kernel's tile shape: one index for
    every input, or a dict from row count to index (the largest row count's entry serves rows not listed)."""

    def __init__(self, linear: nn.Linear, gelu: bool = False, config: int | dict[int, int] = 0) -> None:
        super().__init__()
        weight = Sparse24Weight.compress(linear.weight.detach().to(torch.bfloat16))
        self.register_buffer("values", weight.values)
        self.register_buffer("metadata", weight.metadata)
        bias = linear.bias if linear.bias is not None else torch.zeros(linear.out_features)
        self.register_buffer("bias", bias.detach().to(device=weight.values.device, dtype=torch.bfloat16))
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.gelu = gelu
        self.configs = config if isinstance(config, dict) else {0: config}

    def config_for(self, rows: int) -> int:
        return self.configs.get(rows, self.configs[max(self.configs)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, self.in_features)
        y = sparse24_linear_op(x2d, self.values, self.metadata, self.bias, self.out_features, self.gelu,
                               self.config_for(x2d.shape[0]))
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, gelu={self.gelu}, configs={self.configs}"


class Sparse24Intermediate(nn.Module):
    """BERT's feed-forward up-projection and its GELU as one call of our kernel (GELU in the epilogue)."""

    def __init__(self, up: Sparse24Linear) -> None:
        super().__init__()
        self.dense = up

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.dense(hidden)


_fastest: dict[tuple[int, int, bool, int], int] = {}


@torch.inference_mode()
def fastest_config(linear: nn.Linear, gelu: bool, rows: int) -> int:
    """The tile configuration that runs this layer's shape fastest at ``rows`` rows (CUDA graphs of 20 calls, the
    best of three rounds), remembered per shape."""
    from cuda_timing import graph_ms

    key = (linear.out_features, linear.in_features, gelu, rows)
    if key not in _fastest:
        x = torch.randn(rows, linear.in_features, device="cuda", dtype=torch.bfloat16)
        layer = Sparse24Linear(linear, gelu=gelu)
        times = []
        for config in range(len(Library.get().configs)):
            layer.configs = {rows: config}
            times.append(min(graph_ms(partial(layer, x)) for _ in range(3)))
        _fastest[key] = min(range(len(times)), key=times.__getitem__)
    return _fastest[key]
