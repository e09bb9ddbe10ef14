"""Cheaper arithmetic for two of BERT's elementwise kernels under ``torch.compile`` (``model.fast_gelu``,
``model.fast_dropout``).

Both kernels are bound by arithmetic, not by memory, in a compiled bf16 BERT-base step on an H200 (measured in
docs/benchmarks.md): exact GELU evaluates ``erf`` in its forward and ``erf`` + ``exp`` in its backward, and
Inductor's dropout draws every element's number with its own 10-round Philox call. Under torch.compile these
modules compute

- ``FastGELU``: the same exact (erf) GELU to within 8e-7 absolute (the gradient to within 2e-6), as
  ``x * sigmoid(z(x))`` with ``z`` an odd polynomial fitted to ``logit(Phi(x))``; it is not the tanh
  approximation (which is 4.7e-4 away). After rounding to bf16 the outputs are the same except at rounding ties.
- ``HashDropout``: dropout with the same keep probability (to 2^-24) whose per-element random bits come from two
  rounds of MurmurHash3's 32-bit finalizer over the element's index, keyed by two random 32-bit keys drawn from
  torch's generator per call (so runs are reproducible from the seed and CUDA-graph safe). The backward
  recomputes the mask from the keys instead of storing it. It is a different random stream from
  ``nn.Dropout``'s, so a run does not reproduce one made without it.

Outside torch.compile (eager, CPU tests of the Trainer) both modules run torch's own ``gelu`` / ``dropout``,
whose single kernels are faster there. The swaps keep every parameter and state_dict key.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import GELUActivation

# logit(Phi(x)) ~ x * sum_i C[i] * x^(2i) on [-5.5, 5.5] (Lawson-weighted least squares; C[0] = 2 sqrt(2 / pi)
# and C[1] are the tanh approximation's constants doubled). Beyond 5.5, Phi is within 2e-8 of 0 or 1 and
# taken as exactly that.
GELU_FIT = (1.595769184, 0.07266755117, -6.583180547e-05, -0.0001105501687, 7.941933713e-06, -2.668234815e-07,
            3.603704265e-09)
GELU_FIT_RANGE = 5.5


def _poly(s: torch.Tensor, coefficients: tuple[float, ...]) -> torch.Tensor:
    """sum_i coefficients[i] * s^i by Horner's rule."""
    out = torch.full_like(s, coefficients[-1])
    for c in coefficients[-2::-1]:
        out = out * s + c
    return out


def _fitted_cdf(x: torch.Tensor) -> torch.Tensor:
    """Phi(x) from the fit, exactly 0 / 1 beyond the fitted range (fp32)."""
    clamped = x.clamp(-GELU_FIT_RANGE, GELU_FIT_RANGE)
    cdf = torch.sigmoid(clamped * _poly(clamped * clamped, GELU_FIT))
    return torch.where(x < -GELU_FIT_RANGE, 0.0, torch.where(x > GELU_FIT_RANGE, 1.0, cdf))


def fitted_gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact GELU to within 8e-7, computed in fp32 and returned in ``x``'s dtype. Plain differentiable ops (the
    gradient is the fit's own, within 2e-6 of GELU's), so the compiler fuses the forward and the backward and
    keeps only ``x`` for the backward."""
    xf = x.float()
    return (xf * _fitted_cdf(xf)).to(x.dtype)


class FastGELU(nn.Module):
    """Exact GELU; under torch.compile through :func:`fitted_gelu`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fitted_gelu(x) if torch.compiler.is_compiling() else F.gelu(x)


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finalizer on int32 (products wrap; ``& mask`` makes the right shifts logical)."""
    h = h ^ ((h >> 16) & 0xFFFF)
    h = h * -2048144789  # 0x85EBCA6B
    h = h ^ ((h >> 13) & 0x7FFFF)
    h = h * -1028477387  # 0xC2B2AE35
    return h ^ ((h >> 16) & 0xFFFF)


def _keep_mask(shape: torch.Size, p: float, keys: torch.Tensor, device: torch.device) -> torch.Tensor:
    index = torch.arange(shape.numel(), dtype=torch.int32, device=device).view(shape)
    bits = _fmix32(_fmix32(index ^ keys[0]) ^ keys[1])
    return ((bits >> 8) & 0xFFFFFF) >= round(p * (1 << 24))  # the top 24 bits, uniform in [0, 2^24)


def hash_dropout(x: torch.Tensor, p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Dropout of ``x`` in training mode with counter-hash random bits (new keys from torch's generator)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if p == 0.0:
        return x
    keys = torch.randint(-(1 << 31), (1 << 31) - 1, (2,), dtype=torch.int32, device=x.device, generator=generator)
    # plain differentiable ops: the backward multiplies by the same mask, which the compiler recomputes from the
    # two keys or keeps as one bool per value (as torch's own dropout keeps its mask)
    return torch.where(_keep_mask(x.shape, p, keys, x.device), x * (1.0 / (1.0 - p)), 0.0).to(x.dtype)


class HashDropout(nn.Dropout):
    """nn.Dropout; in training under torch.compile through :func:`hash_dropout` (tensors of up to 2^31 values,
    the int32 counter's range)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.compiler.is_compiling() and x.numel() < (1 << 31):
            return hash_dropout(x, self.p)
        return super().forward(x)


def use_fast_gelu(model: nn.Module) -> int:
    """Replace every exact GELU activation module of ``model`` (transformers' ``GELUActivation`` running
    ``F.gelu``, ``nn.GELU()``) by :class:`FastGELU`; returns how many."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _is_exact_gelu(child):
                setattr(parent, name, FastGELU())
                swapped += 1
    return swapped


def _is_exact_gelu(module: nn.Module) -> bool:
    if type(module) is nn.GELU:
        return module.approximate == "none"
    return type(module) is GELUActivation and module.act is F.gelu


def use_hash_dropout(model: nn.Module) -> int:
    """Make every ``nn.Dropout`` of ``model`` a :class:`HashDropout` in place; returns how many. A dropout module
    that is only read for its ``p`` (transformers' attention hands it to sdpa) is unaffected."""
    swapped = 0
    for module in model.modules():
        if type(module) is nn.Dropout:
            module.__class__ = HashDropout
            swapped += 1
    return swapped
