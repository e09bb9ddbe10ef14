"""Every private torch name sparsebert touches (torch only: the sparsity core, plain PyTorch, imports this).

The multi-tensor kernels are module-level aliases of torch's own functions, so calling them costs nothing extra:
- ``torch._foreach_norm``: one norm per gradient in one launch (clip_grad_norm_'s total norm on torch < 2.6).
- ``torch._foreach_mul_``: the masks applied to every sparse weight after each optimizer step.
- ``torch._foreach_addcmul_``: movement scores, ``S -= grad * w`` for every layer at once.
- ``torch._foreach_copy_``: the batched (and casting) gradient copies of the flat all-reduce.
- ``torch._cslt_sparse_mm``: cuSPARSELt's 2:4 matmul, called directly so sparsebert chooses the layouts
  (export/semi_structured.py). The op exists in every build (CPU wheels too); only CUDA ones can run it.
Attributes and settings:
- ``SparseSemiStructuredTensor{CUSPARSELT,CUTLASS}._DTYPE_SHAPE_CONSTRAINTS``: each backend's per-dtype shape
  limits (torch has no public table of them).
- ``torch._dynamo.config.optimize_ddp``: Dynamo's DDPOptimizer (``train.ddp.split_compiled_graphs``).
- ``torch._inductor.config.coordinate_descent_tuning``: Inductor's kernel tuning
  (``train.torch_compile_tune_kernels``).
- ``torch._dynamo.utils.counters["stats"]["unique_graphs"]``: graphs compiled so far (CompileWatch).
- ``OptimizedModule._orig_mod``: the module torch.compile wraps (to find DDP under it).
- ``DataLoader._iterator``, ``_MultiProcessingDataLoaderIter._shutdown_workers``: the iterator a loader with
  persistent workers keeps, and how it stops them (torch stops them only when the iterator is collected).

``PRIVATE_NAMES`` lists them for tests/upstream/test_torch_ops.py.
"""

from __future__ import annotations

import os

import torch

PRIVATE_NAMES = [
    "torch._foreach_norm", "torch._foreach_mul_", "torch._foreach_addcmul_", "torch._foreach_copy_",
    "torch._cslt_sparse_mm",
    "torch.sparse.SparseSemiStructuredTensorCUSPARSELT._DTYPE_SHAPE_CONSTRAINTS",
    "torch.sparse.SparseSemiStructuredTensorCUTLASS._DTYPE_SHAPE_CONSTRAINTS",
    "torch._dynamo.config.optimize_ddp", "torch._inductor.config.coordinate_descent_tuning",
    "torch._dynamo.utils.counters", "torch._dynamo.eval_frame.OptimizedModule._orig_mod",
    "torch.utils.data.DataLoader._iterator",
    "torch.utils.data.dataloader._MultiProcessingDataLoaderIter._shutdown_workers",
]

foreach_norm = torch._foreach_norm
foreach_mul_ = torch._foreach_mul_
foreach_addcmul_ = torch._foreach_addcmul_
foreach_copy_ = torch._foreach_copy_


def cslt_sparse_mm(*args, **kwargs) -> torch.Tensor:
    """cuSPARSELt's 2:4 matmul, looked up when called: only the 2:4 export needs it, and a torch without it must
    not break every import of the sparsity core (the foreach aliases above are looked up at import)."""
    return torch._cslt_sparse_mm(*args, **kwargs)


def semi_structured_limits(sparse_cls_or_tensor) -> dict:
    """A semi-structured backend's shape limits per dtype (``sparse_min_rows``, ``sparse_min_cols``,
    ``dense_min_rows``, ...), from its class or one of its tensors."""
    return sparse_cls_or_tensor._DTYPE_SHAPE_CONSTRAINTS


def set_dynamo_ddp_optimizer(on: bool) -> None:
    """Process-wide: whether Dynamo splits graphs compiled inside DDP at the buckets."""
    import torch._dynamo

    torch._dynamo.config.optimize_ddp = on


def set_kernel_tuning(on: bool) -> None:
    """Process-wide Inductor setting; off means the process's default (its environment variable still counts)."""
    import torch._inductor.config

    from_env = os.environ.get("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING") == "1"
    torch._inductor.config.coordinate_descent_tuning = on or from_env


def compiled_graphs() -> int:
    """Graphs Dynamo has compiled in this process (a process-wide count)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def find_ddp(model) -> torch.nn.parallel.DistributedDataParallel | None:
    """The DDP module under Accelerate's wrapping (torch.compile puts an OptimizedModule around it)."""
    while model is not None and not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = getattr(model, "_orig_mod", None)
    return model


def stop_loader_workers(loader) -> None:
    """Stop the worker processes a DataLoader keeps between epochs (persistent workers), now. Left to the garbage
    collector, torch's shutdown waited out its 5 s join timeout per worker before killing it (SparseBertTrainer
    calls this as train() returns); called directly it takes milliseconds. A loader without them is left alone."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
        loader._iterator = None
