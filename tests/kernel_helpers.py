"""When our 2:4 kernel can run here: the GPU tests that need it skip, with this reason, where it cannot."""

from __future__ import annotations


def sparse24_kernel_missing() -> str | None:
    """What the 2:4 kernel lacks on this machine (a CUDA GPU, an sm90 one, the built library), or None."""
    import torch

    from sparsebert.export.sparse24_kernel import Library, Sparse24Error

    if not torch.cuda.is_available():
        return "needs a CUDA GPU (an sm90 one: H100/H200)"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"the 2:4 kernel needs an sm90 GPU (H100/H200); this is {torch.cuda.get_device_name()}"
    try:
        Library.get()
    except Sparse24Error as e:
        return f"needs the kernel library: {' '.join(str(e).split())}"
    return None
