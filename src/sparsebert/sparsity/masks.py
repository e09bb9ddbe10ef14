"""Building and applying boolean masks (True = active weight).

Every random choice goes through a ``torch.Generator`` seeded from (seed, step): under DDP every rank holds the
same weights and all-reduced gradients, so every rank computes the identical mask without communicating.
"""

from __future__ import annotations

import torch

from sparsebert.upstream.torch_ops import foreach_mul_

_STEP_STRIDE = 1_000_003  # a prime, so (seed, step) pairs map to distinct generator seeds in practice


def make_generator(seed: int, step: int, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * _STEP_STRIDE + step) % 2**63)
    return generator


def top_k_indices(
    scores: torch.Tensor, eligible: torch.Tensor, k: int, generator: torch.Generator,
    n_eligible: int | None = None,
) -> torch.Tensor:
    """Flat indices of the ``k`` eligible entries with the largest scores; ties broken at random.

    Ties are common (a gradient is exactly 0 for every embedding row not in the batch), and a deterministic
    tie-break would always favour low indices. Each entry gets one 64-bit key: its score, mapped to an integer
    of the same order, in the high 32 bits and 32 random bits from ``generator`` in the low ones. Unequal
    scores keep their order (additive noise would perturb it); exactly tied scores are ordered by the random
    bits, i.e. uniformly at random (two tied entries draw the same 32 bits with probability 2^-32; such a pair is
    ordered by index). One selection over the keys replaces a permutation plus a full stable sort (a RigL update
    ranks every weight of the model twice). Scores are compared in float32 (weights and gradients here are fp32 or
    bf16); NaN ranks as +inf, ahead of every finite score.
    ``n_eligible`` (the number of True entries of ``eligible``), when the caller already knows it, saves a
    device-to-host read.
    """
    available = int(eligible.sum()) if n_eligible is None else n_eligible
    if k > available:
        raise ValueError(f"cannot pick {k} of {available} eligible entries")
    flat = scores.detach().reshape(-1).float()
    flat = torch.where(torch.isnan(flat), torch.inf, flat) + 0.0  # NaN as +inf; + 0.0 turns -0.0 into 0.0
    bits = flat.view(torch.int32)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # integer order == float order (negatives' magnitude bits flipped)
    noise = torch.randint(0, 2**32, flat.shape, generator=generator, dtype=torch.int64, device=flat.device)
    keys = (ordered.to(torch.int64) << 32) | noise
    # -inf maps above int32's minimum, so an ineligible key sorts below every eligible one
    keys = keys.masked_fill(~eligible.reshape(-1), torch.iinfo(torch.int64).min)
    return _largest(keys, k)


def _largest(keys: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest int64 ``keys`` (in no particular order).

    On CUDA a full radix sort is faster than ``topk``: CUB's sort takes 8 bits per pass over the 64-bit keys,
    torch's top-k radix select 2 (``bench/sparse_overhead.py --upkeep``; docs/performance.md). On CPU ``topk``
    is the faster one. Both return the same set unless equal keys straddle the k-th
    place (ineligible keys never do, as k never exceeds the eligible count; tied scores with equal random bits
    almost never).
    """
    if keys.is_cuda:
        return torch.sort(keys, descending=True).indices[:k]
    return torch.topk(keys, k, sorted=False).indices


def mask_from_indices(indices: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    mask = torch.zeros(like.numel(), dtype=torch.bool, device=like.device)
    mask[indices] = True
    return mask.view(like.shape)


def random_mask(weight: torch.Tensor, n_active: int, generator: torch.Generator) -> torch.Tensor:
    """``n_active`` positions chosen uniformly at random."""
    chosen = torch.randperm(weight.numel(), generator=generator, device=weight.device)[:n_active]
    return mask_from_indices(chosen, weight)


def magnitude_mask(weight: torch.Tensor, n_active: int, generator: torch.Generator) -> torch.Tensor:
    """Keep the ``n_active`` weights of largest magnitude (for starting from a pretrained dense model)."""
    everything = torch.ones_like(weight, dtype=torch.bool)
    return mask_from_indices(top_k_indices(weight.detach().abs(), everything, n_active, generator), weight)


def _groups(tensor: torch.Tensor, m: int) -> torch.Tensor:
    """``tensor`` [out, in] viewed as [out * in / m, m]: groups of ``m`` consecutive entries of a row."""
    if tensor.dim() != 2 or tensor.shape[1] % m:
        raise ValueError(
            f"N:M sparsity groups {m} consecutive weights of a row: need a 2-D weight whose input dimension "
            f"is a multiple of {m}, got shape {tuple(tensor.shape)}"
        )
    return tensor.reshape(-1, m)


def nm_mask(weight: torch.Tensor, n: int = 2, m: int = 4) -> torch.Tensor:
    """Keep the ``n`` entries of largest |w| in every group of ``m`` consecutive entries of each row.

    Rows are a Linear's output units and columns its inputs, so groups run along the input dimension, the
    layout sparse tensor cores expect (columns ``m*j .. m*j+m-1`` of each row). Ties are broken
    deterministically towards the lower column: a stable descending sort keeps equal values in index order. No
    generator is needed: unlike the top-k over a whole layer in ``top_k_indices``, there is no large class of
    tied scores to spread out, only occasional equal |w| inside one group of 4 (mostly exact zeros, e.g. a model
    that already has fewer than 2 non-zeros in a group), where either choice is as good.
    """
    groups = _groups(weight.detach().abs(), m)
    keep = torch.sort(groups, dim=1, descending=True, stable=True).indices[:, :n]
    mask = torch.zeros_like(groups, dtype=torch.bool)
    mask.scatter_(1, keep, True)
    return mask.view(weight.shape)


def nm_violations(tensor: torch.Tensor, n: int = 2, m: int = 4) -> int:
    """Number of groups of ``m`` (as in ``nm_mask``) with more than ``n`` non-zero (or True) entries."""
    return int((_groups(tensor.detach(), m) != 0).sum(dim=1).gt(n).sum())


@torch.no_grad()
def apply_masks_(weights: list[torch.Tensor], masks: list[torch.Tensor]) -> None:
    """Zero every inactive weight in place.

    Runs after every optimizer step on all sparse weights (~85M for BERT-base), so it is one multi-tensor call
    rather than a Python loop. Masks stay bool (1 byte per weight, not 4 for a float copy): mixed dtypes keep
    foreach off its fused CUDA path (one kernel per tensor instead), but the op is memory-bound either way, about
    0.8 GB of traffic per call for BERT-base.
    """
    foreach_mul_(weights, masks)
