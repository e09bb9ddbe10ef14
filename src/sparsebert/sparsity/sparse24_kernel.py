"""Inference export of 2:4 Linear layers to our own H100 kernel (``sparsebert/kernels/sparse24.cu``).

``to_sparse24_kernel(model)`` replaces, in place, every eligible 2:4 ``nn.Linear`` with a ``Sparse24Linear``: the
weight compressed (half its values plus 2-bit positions), the product computed by a CUTLASS SM90 sparse GEMM that
reads and writes activations row-major and fuses the bias, and, for a BERT-family feed-forward up-projection,
the exact GELU that follows it. On an H100 this runs BERT-style encoders 1.2-1.35x faster than the same masked
weights dense at batch 256 (``bench/semi_structured.py``, docs/benchmarks.md), where torch's cuSPARSELt export
(``semi_structured.py``) is held back by slow row-major layouts and no bf16 GELU epilogue.

Requirements: an sm90 GPU (H100/H200), bf16, ``in_features`` and ``out_features`` multiples of 128 (other layers
are left as they are), and the library built once with ``python -m sparsebert.kernels.build`` (no GPU needed;
``SPARSEBERT_SPARSE24_LIB`` points at another build). The kernel takes torch's current stream, so it works in CUDA
graphs; under ``torch.compile`` it is a custom op that Inductor leaves alone. Inference only: no gradient.

Each layer picks a tile configuration per row count (batch x sequence) from the ones the library was built with,
by timing them on the card (``fastest_config``); rows not timed use the largest timed row count's choice.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import sparse24_library
from .semi_structured import is_two_four

log = logging.getLogger(__name__)

# The kernel's tiles are 128 wide along both weight dimensions; the compressed layout assumes whole tiles.
ALIGNMENT = 128
DEFAULT_ROWS = (256 * 128,)


class Sparse24Error(RuntimeError):
    pass


class Library:
    """The built kernel library, loaded once through ctypes."""

    _instance: Library | None = None

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise Sparse24Error(f"2:4 kernel library {path} not found: build it with "
                                "`python -m sparsebert.kernels.build`")
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
            cls._instance = cls(Path(os.environ.get("SPARSEBERT_SPARSE24_LIB", sparse24_library())))
        return cls._instance

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise Sparse24Error(f"2:4 kernel {what}: {self.lib.sb24_last_error().decode()}")

    def workspace(self, config: int, gelu: bool, m: int, n: int, k: int, device: torch.device) -> int:
        """Pointer to a workspace for this call (0 when it needs none), kept for later calls of the same shape."""
        key = (config, gelu, m, n, k, device)
        if key not in self._workspaces:
            size = self.lib.sb24_workspace_size(config, int(gelu), m, n, k)
            if size < 0:
                raise Sparse24Error(f"2:4 kernel workspace: {self.lib.sb24_last_error().decode()}")
            self._workspaces[key] = torch.empty(size, dtype=torch.uint8, device=device)
        workspace = self._workspaces[key]
        return workspace.data_ptr() if workspace.numel() else 0


@dataclass
class Sparse24Weight:
    """A 2:4 weight [out, in] in the kernel's compressed form: half its values and their positions (metadata)."""

    values: torch.Tensor
    metadata: torch.Tensor

    @classmethod
    def compress(cls, weight: torch.Tensor) -> Sparse24Weight:
        out_features, in_features = weight.shape
        if weight.dtype != torch.bfloat16 or not weight.is_cuda:
            raise ValueError(f"Sparse24Weight: needs a bf16 CUDA weight; got {weight.dtype} on {weight.device}")
        if in_features % ALIGNMENT or out_features % ALIGNMENT:
            raise ValueError(f"Sparse24Weight: both dimensions must be multiples of {ALIGNMENT}; got "
                             f"{out_features}x{in_features}")
        if not is_two_four(weight):
            raise ValueError("Sparse24Weight: the weight is not 2:4 (a group of four along `in` has >2 non-zeros)")
        lib = Library.get()
        n_values, n_metadata = ctypes.c_int64(), ctypes.c_int64()
        lib.check(lib.lib.sb24_compressed_sizes(out_features, in_features, ctypes.byref(n_values),
                                                 ctypes.byref(n_metadata)), "compressed sizes")
        weight = weight.contiguous()
        values = torch.zeros(n_values.value, dtype=torch.bfloat16, device=weight.device)
        metadata = torch.zeros(n_metadata.value, dtype=torch.uint8, device=weight.device)
        workspace = torch.zeros(lib.lib.sb24_compress_workspace_size(out_features, in_features),
                                dtype=torch.uint8, device=weight.device)
        lib.check(lib.lib.sb24_compress(weight.data_ptr(), values.data_ptr(), metadata.data_ptr(), out_features,
                                        in_features, workspace.data_ptr(), torch.cuda.current_stream().cuda_stream),
                  "compress")
        return cls(values, metadata)


def _sparse24_linear(x: torch.Tensor, values: torch.Tensor, metadata: torch.Tensor, bias: torch.Tensor,
                     out_features: int, gelu: bool, config: int) -> torch.Tensor:
    """``act(x W^T + bias)`` for a 2-D bf16 ``x`` [rows, in], W given compressed; the result is row-major."""
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


# Under torch.compile the call is a custom op that Inductor leaves alone; eagerly, Sparse24Linear calls the function
# itself, since the op's dispatch costs host time per call that an eager model is bound by.
sparse24_linear = torch.library.custom_op("sparsebert::sparse24_linear", mutates_args=())(_sparse24_linear)


@sparse24_linear.register_fake
def _(x, values, metadata, bias, out_features, gelu, config):  # noqa: ANN001, ANN202
    return x.new_empty(x.shape[0], out_features)


class Sparse24Linear(nn.Module):
    """A 2:4 ``nn.Linear`` run by our kernel; inference only. ``gelu``: the exact GELU is fused into the kernel's
    epilogue. ``configs`` maps a row count to the kernel's tile configuration (see ``fastest_config``); rows not
    listed use the largest listed row count's. Inputs are cast to bf16 and the output back to the input's dtype."""

    def __init__(self, linear: nn.Linear, gelu: bool = False, configs: dict[int, int] | None = None) -> None:
        super().__init__()
        weight = Sparse24Weight.compress(linear.weight.detach().to(torch.bfloat16))
        self.register_buffer("values", weight.values)
        self.register_buffer("metadata", weight.metadata)
        bias = linear.bias if linear.bias is not None else torch.zeros(linear.out_features)
        self.register_buffer("bias", bias.detach().to(device=weight.values.device, dtype=torch.bfloat16))
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.gelu = gelu
        self.configs = dict(configs or {0: 0})

    def config_for(self, rows: int) -> int:
        return self.configs.get(rows, self.configs[max(self.configs)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, self.in_features).to(torch.bfloat16)
        linear = sparse24_linear if torch.compiler.is_compiling() else _sparse24_linear
        y = linear(x2d, self.values, self.metadata, self.bias, self.out_features, self.gelu,
                   self.config_for(x2d.shape[0]))
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, gelu={self.gelu}"


def _graph_ms(fn: Callable[[], object], calls: int = 10, replays: int = 3) -> float:
    """GPU ms per call of ``fn``: ``calls`` calls captured in one CUDA graph, the fastest of ``replays`` replays."""
    fn()  # any lazy set-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return min(times)


_fastest: dict[tuple[int, int, bool, int], int] = {}


@torch.inference_mode()
def fastest_config(layer: Sparse24Linear, rows: int) -> int:
    """The tile configuration that runs ``layer``'s shape fastest at ``rows`` rows on this card, timed once per
    shape (CUDA graphs on random input; the values do not change the time)."""
    key = (layer.out_features, layer.in_features, layer.gelu, rows)
    if key not in _fastest:
        x = torch.randn(rows, layer.in_features, device=layer.values.device, dtype=torch.bfloat16)
        kept, times = layer.configs, []
        for config in range(len(Library.get().configs)):
            layer.configs = {rows: config}
            times.append(_graph_ms(lambda: layer(x)))  # noqa: B023 (called before the loop moves on)
        layer.configs = kept
        _fastest[key] = min(range(len(times)), key=times.__getitem__)
    return _fastest[key]


def _exact_gelu(activation: nn.Module) -> bool:
    """Whether ``activation`` computes the exact (erf) GELU, checked on values, so any module class will do."""
    probe = torch.linspace(-6, 6, 97)
    try:
        return torch.allclose(activation(probe), F.gelu(probe), atol=1e-6)
    except Exception:  # not an elementwise module of a tensor
        return False


def to_sparse24_kernel(model: nn.Module, rows: Iterable[int] = DEFAULT_ROWS,
                       names: Iterable[str] | None = None) -> list[str]:
    """Replace, in place, each 2:4 ``nn.Linear`` of ``model`` (or of ``names``) whose dimensions are multiples of
    128 with a ``Sparse24Linear``; returns the replaced names. A Linear whose parent applies an exact GELU to it
    as ``intermediate_act_fn`` (BERT, RoBERTa, ELECTRA, MiniLM's feed-forward) gets the GELU fused and the parent's
    activation becomes ``nn.Identity``. ``rows``: the row counts (batch x sequence) to choose tiles for."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise Sparse24Error("to_sparse24_kernel: needs an sm90 GPU (H100/H200)")
    rows = sorted(set(rows))
    wanted = set(names) if names is not None else None
    linears = {n: m for n, m in model.named_modules() if type(m) is nn.Linear and (wanted is None or n in wanted)}
    if wanted is not None and wanted - set(linears):
        raise ValueError(f"to_sparse24_kernel: not nn.Linear layers of the model: {sorted(wanted - set(linears))}")
    converted = []
    for name, linear in linears.items():
        weight = linear.weight.detach()
        if linear.in_features % ALIGNMENT or linear.out_features % ALIGNMENT or not is_two_four(weight):
            log.info("to_sparse24_kernel: %s stays as it is (not 2:4, or not multiples of %d)", name, ALIGNMENT)
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        activation = getattr(parent, "intermediate_act_fn", None)
        gelu = isinstance(activation, nn.Module) and _exact_gelu(activation)
        layer = Sparse24Linear(linear, gelu=gelu)
        layer.configs = {r: fastest_config(layer, r) for r in rows}
        setattr(parent, child, layer)
        if gelu:
            parent.intermediate_act_fn = nn.Identity()
        converted.append(name)
    return converted
