"""Inference export of 2:4 Linear layers to our own sm90 kernel (``sparsebert/kernels/sparse24.cu``).

``to_sparse24_kernel(model)`` replaces, in place, every eligible 2:4 ``nn.Linear`` with a ``Sparse24Linear``: the
weight compressed (half its values plus 2-bit positions), the product computed by a CUTLASS SM90 sparse GEMM that
reads and writes activations row-major and fuses the bias, and, for a BERT-family feed-forward up-projection,
the exact GELU that follows it. At large batches this runs BERT-style encoders faster than the same masked
weights dense (``bench/semi_structured.py``, docs/performance.md), where torch's cuSPARSELt export
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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from sparsebert.cuda_timing import graph_ms
from sparsebert.export.semi_structured import is_two_four
from sparsebert.kernels import sparse24_library

log = logging.getLogger(__name__)

# The kernel's tiles are 128 wide along both weight dimensions; the compressed layout assumes whole tiles.
ALIGNMENT = 128
DEFAULT_ROWS = (256 * 128,)  # batch 256 x sequence 128
ABI_VERSION = 2  # sb24_abi_version() of the sparse24.cu this module calls


class Sparse24Error(RuntimeError):
    pass


class Library:
    """The built kernel library (``libsparse24.so``), loaded once through ctypes."""

    _instance: Library | None = None

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise Sparse24Error(f"2:4 kernel library {path} not found: build it with "
                                "`python -m sparsebert.kernels.build`")
        rebuild = "rebuild it with `python -m sparsebert.kernels.build`"
        try:
            lib = ctypes.CDLL(str(path))
            version = lib.sb24_abi_version()
        except (OSError, AttributeError) as e:
            raise Sparse24Error(f"2:4 kernel library {path} does not load ({e}): {rebuild}") from e
        if version != ABI_VERSION:
            raise Sparse24Error(f"2:4 kernel library {path} was built from another sparse24.cu (ABI {version}, "
                                f"expected {ABI_VERSION}): {rebuild}")
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
            cls._instance = cls(sparse24_library())
        return cls._instance

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise Sparse24Error(f"2:4 kernel {what}: {self.lib.sb24_last_error().decode()}")

    def workspace(self, config: int, gelu: bool, m: int, n: int, k: int, device: torch.device) -> int:
        """Pointer to a workspace for this call (0 when it needs none, as for all configurations built today),
        kept for later calls of the same shape."""
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
        device = weight.device
        values = torch.zeros(n_values.value, dtype=torch.bfloat16, device=device)
        metadata = torch.zeros(n_metadata.value, dtype=torch.uint8, device=device)
        with torch.cuda.device(device):  # the library launches on the current device
            workspace = torch.zeros(lib.lib.sb24_compress_workspace_size(out_features, in_features),
                                    dtype=torch.uint8, device=device)
            lib.check(lib.lib.sb24_compress(weight.data_ptr(), values.data_ptr(), metadata.data_ptr(),
                                            out_features, in_features, workspace.data_ptr(),
                                            torch.cuda.current_stream(device).cuda_stream), "compress")
        return cls(values, metadata)


def _sparse24_linear(x: torch.Tensor, values: torch.Tensor, metadata: torch.Tensor, bias: torch.Tensor,
                     out_features: int, gelu: bool, config: int) -> torch.Tensor:
    """``act(x W^T + bias)`` for a 2-D bf16 ``x`` [rows, in], W given compressed; the result is row-major."""
    # The kernel reads raw pointers: a wrong dtype, device or width would be read silently or crash the context.
    in_features = values.numel() * 2 // out_features
    if not (x.is_cuda and x.dtype == values.dtype == bias.dtype == torch.bfloat16
            and x.device == values.device == metadata.device == bias.device):
        raise ValueError(f"sparse24_linear: x, the compressed weight and the bias must be bf16 on one GPU; got x "
                         f"{x.dtype} on {x.device}, weight {values.dtype} on {values.device}, bias {bias.dtype}")
    if x.dim() != 2 or x.shape[1] != in_features or x.shape[0] >= 2**31:
        raise ValueError(f"sparse24_linear: x must be [rows < 2^31, {in_features}]; got {tuple(x.shape)}")
    lib = Library.get()
    x = x.contiguous()
    if x.data_ptr() % 16:  # TMA needs 16-byte aligned operands; a view at an odd offset is copied
        x = x.clone()
    rows = x.shape[0]
    y = torch.empty(rows, out_features, dtype=x.dtype, device=x.device)
    if rows == 0:
        return y
    with torch.cuda.device(x.device):  # the library launches on the current device
        workspace = lib.workspace(config, gelu, out_features, rows, in_features, x.device)
        lib.check(lib.lib.sb24_linear(config, int(gelu), values.data_ptr(), metadata.data_ptr(), x.data_ptr(),
                                      bias.data_ptr(), y.data_ptr(), out_features, rows, in_features, workspace,
                                      torch.cuda.current_stream(x.device).cuda_stream), "linear")
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


_fastest: dict[tuple[str, int, int, bool, int], int] = {}


@torch.inference_mode()
def fastest_config(layer: Sparse24Linear, rows: int) -> int:
    """The tile configuration that runs ``layer``'s shape fastest at ``rows`` rows on its card: each one timed
    as CUDA graphs of 10 calls, the best of three, once per card and shape (on random input: the values do not
    change the time). A configuration the kernel refuses for the shape is passed over."""
    device = layer.values.device
    key = (torch.cuda.get_device_name(device), layer.out_features, layer.in_features, layer.gelu, rows)
    if key not in _fastest:
        x = torch.randn(rows, layer.in_features, device=device, dtype=torch.bfloat16)
        kept, times = layer.configs, {}
        try:
            for config in range(len(Library.get().configs)):
                layer.configs = {rows: config}
                try:
                    times[config] = min(graph_ms(lambda: layer(x), calls=10, replays=1) for _ in range(3))
                except Sparse24Error as e:
                    log.info("fastest_config: configuration %d refused for %s: %s", config, key, e)
        finally:
            layer.configs = kept
        if not times:
            raise Sparse24Error(f"2:4 kernel: no configuration runs {layer.out_features}x{layer.in_features}")
        _fastest[key] = min(times, key=times.__getitem__)
    return _fastest[key]


def _exact_gelu(activation: nn.Module) -> bool:
    """Whether ``activation`` computes the exact (erf) GELU, checked on values, so any module class will do."""
    probe = torch.linspace(-6, 6, 97)
    try:
        return torch.allclose(activation(probe), F.gelu(probe), atol=1e-6)
    except (TypeError, RuntimeError):  # not an elementwise module of one tensor
        return False


def to_sparse24_kernel(model: nn.Module, rows: Iterable[int] = DEFAULT_ROWS,
                       names: Iterable[str] | None = None) -> list[str]:
    """Replace, in place, each 2:4 ``nn.Linear`` of ``model`` (or of ``names``) whose dimensions are multiples of
    128 with a ``Sparse24Linear``; returns the replaced names. A Linear whose parent applies an exact GELU to it
    as ``intermediate_act_fn`` (BERT, RoBERTa, ELECTRA, MiniLM's feed-forward) gets the GELU fused and the parent's
    activation becomes ``nn.Identity``. ``rows``: the row counts (batch x sequence) to choose tiles for."""
    if not torch.cuda.is_available():
        raise Sparse24Error("to_sparse24_kernel: needs an sm90 GPU (H100/H200)")
    rows = sorted(set(rows))
    wanted = set(names) if names is not None else None
    linears = {n: m for n, m in model.named_modules() if type(m) is nn.Linear and (wanted is None or n in wanted)}
    if wanted is not None and wanted - set(linears):
        raise ValueError(f"to_sparse24_kernel: not nn.Linear layers of the model: {sorted(wanted - set(linears))}")
    # every replacement is built (and timed) before any is swapped in: a failure leaves the model as it was
    replacements: list[tuple[str, Sparse24Linear, nn.Module | None]] = []
    for name, linear in linears.items():
        weight = linear.weight.detach()
        if linear.in_features % ALIGNMENT or linear.out_features % ALIGNMENT or not is_two_four(weight):
            (log.warning if wanted is not None else log.info)(
                "to_sparse24_kernel: %s stays as it is (not 2:4, or not multiples of %d)", name, ALIGNMENT)
            continue
        if not weight.is_cuda or torch.cuda.get_device_capability(weight.device) != (9, 0):
            raise Sparse24Error(f"to_sparse24_kernel: needs the model on an sm90 GPU (H100/H200); {name} is on "
                                f"{weight.device}")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        # BERT-family feed-forward: intermediate.dense, then the parent's intermediate_act_fn
        activation = getattr(parent, "intermediate_act_fn", None) if child == "dense" else None
        gelu = isinstance(activation, nn.Module) and _exact_gelu(activation)
        layer = Sparse24Linear(linear, gelu=gelu)
        layer.configs = {r: fastest_config(layer, r) for r in rows}
        replacements.append((name, layer, parent if gelu else None))
    for name, layer, fused_parent in replacements:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, layer)
        if fused_parent is not None:
            fused_parent.intermediate_act_fn = nn.Identity()
    return [name for name, _, _ in replacements]
