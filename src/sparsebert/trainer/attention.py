"""AttentionKernelMixin: which kernel torch's scaled_dot_product_attention runs (``model.attention_kernel``).

With ``model.attn_implementation=sdpa`` torch picks a kernel for every attention call from what the inputs
allow. ``model.attention_kernel`` names one instead (``cudnn``, ``flash``, ``efficient``, ``math``); every
training and evaluation step then runs inside ``torch.nn.attention.sdpa_kernel(that one)``, and a call the
kernel cannot serve fails instead of quietly taking a slower one. A compiled model chooses its kernel when it is
compiled, inside the first step, so the choice holds for its whole graph. ``auto`` leaves torch's choice.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from sparsebert.errors import SparseBertError

ATTENTION_KERNELS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                     "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
GPU_ONLY = ("cudnn", "flash", "efficient")


class AttentionKernelMixin:
    def __init__(self, *args, attention_kernel: str = "auto", **kwargs):
        super().__init__(*args, **kwargs)
        if attention_kernel in GPU_ONLY and not torch.cuda.is_available():
            raise SparseBertError(f"model.attention_kernel={attention_kernel} needs a CUDA GPU; use auto or math here")
        self.attention_backend = ATTENTION_KERNELS.get(attention_kernel)

    def _attention_kernel(self):
        return sdpa_kernel(self.attention_backend) if self.attention_backend is not None else contextlib.nullcontext()

    def training_step(self, *args, **kwargs):
        with self._attention_kernel():
            return super().training_step(*args, **kwargs)

    def prediction_step(self, *args, **kwargs):
        with self._attention_kernel():
            return super().prediction_step(*args, **kwargs)
