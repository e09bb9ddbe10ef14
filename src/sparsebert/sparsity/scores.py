"""Pruning scores: what GMP ranks weights by, as plug-ins of ``SparsityController``.

A pruning method is its score (as in google-research/rigl, whose methods differ only in theirs): GMP keeps the
weights of largest score, and whatever else a method needs — gradients seen along the way, a weight update after
a prune, state for the checkpoint — lives in its score object. The controller drives every score alike:

- after each optimizer step, while ``observes(step)``: ``observe(step, weights, grads)`` with the gradients of
  the whole step still in ``p.grad`` (accumulated over its micro-batches, all-reduced, unscaled, zero at masked
  positions) and the weights just stepped;
- at a prune: ``scores(weights, masks)`` (larger = keep); the masks change; ``after_prune(weights, masks)`` with
  the new masks; then the controller zeroes every masked weight;
- ``state_dict()`` / ``load_state_dict(state)`` with each checkpoint, ``to(device)`` when the weights move.

``make_score`` builds the one a ``GMPConfig`` names.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .config import GMPConfig
from .gmp import accumulate_movement, gmp_next_update

log = logging.getLogger(__name__)

MemoryProbe = Callable[[torch.device], int | None]
"""Bytes free for new tensors on a device, or None where that is unknown."""

# Blocks per batched solve of the OBS update: bounds its working space (13 bytes per Fisher entry, so 0.27 GB at
# 50 x 50 blocks) whatever the layer's size.
_UPDATE_CHUNK = 8192


class PruningScore:
    """The score GMP keeps the largest of. This base observes nothing, updates no weight and has no state."""

    def observes(self, step: int) -> bool:
        """Whether ``observe`` wants the gradients of optimizer step ``step`` (counted from 1)."""
        return False

    def observe(self, step: int, weights: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]) -> None:
        """Take in one optimizer step.

        Args:
            step: the optimizer step just taken, counted from 1.
            weights: the selected weights after the step, by name.
            grads: their gradients of the step (a layer without one, e.g. frozen, is absent).
        """

    def scores(self, weights: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each weight's score, shaped like it; larger = keep. Masked entries are never picked, whatever they hold.

        Args:
            weights: the selected weights by name.
            masks: their masks (True = active).

        Returns:
            name -> score tensor.
        """
        raise NotImplementedError

    def after_prune(self, weights: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> None:
        """Called once the masks of a prune are set (with the new ``masks``), before the masked weights are zeroed;
        may update ``weights`` in place."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to go on scoring alike after a resume (merged into the controller's)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from a controller state (``SparsityController.load_state_dict`` passes the whole of it)."""

    def to(self, device: torch.device) -> None:
        """Move whatever tensors the score holds to ``device``, where the weights now are."""


class MagnitudeScore(PruningScore):
    """|w| (Zhu & Gupta 2017)."""

    def scores(self, weights: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: weight.detach().abs() for name, weight in weights.items()}


class MovementScore(PruningScore):
    """Hard movement pruning (Sanh et al. 2020): ``S = -sum_t grad_t * w_t`` over every optimizer step up to the
    end of pruning (float32, one per weight). A masked weight is 0 and adds nothing, so its score freezes.

    Checkpointed as ``movement_scores`` (``score/<name>`` in ``masks.safetensors``), so a resumed run prunes by
    the same scores.

    Args:
        params: the selected weights by name.
        end_step: the last step of pruning (``SparsityController.gmp_end_step``).
    """

    STATE_KEY = "movement_scores"

    def __init__(self, params: Mapping[str, torch.Tensor], end_step: int) -> None:
        self.end_step = end_step
        self.params = params
        self.accumulated = {name: torch.zeros_like(p, dtype=torch.float32) for name, p in params.items()}

    def observes(self, step: int) -> bool:
        return step <= self.end_step

    def observe(self, step: int, weights: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]) -> None:
        names = list(grads)
        accumulate_movement([self.accumulated[n] for n in names], [weights[n] for n in names],
                            [grads[n] for n in names])

    def scores(self, weights: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.accumulated

    def state_dict(self) -> dict[str, Any]:
        return {self.STATE_KEY: {n: s.detach().cpu().clone() for n, s in self.accumulated.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.STATE_KEY not in state:
            raise ValueError("the sparsity state holds no movement scores but gmp.score is movement: was it "
                             "saved by a run with another gmp.score?")
        saved = state[self.STATE_KEY]
        self.accumulated = {n: saved[n].to(device=p.device, dtype=torch.float32).clone()
                            for n, p in self.params.items()}

    def to(self, device: torch.device) -> None:
        self.accumulated = {n: s.to(device) for n, s in self.accumulated.items()}


class OBSScore(PruningScore):
    """The Optimal BERT Surgeon (Kurtic et al. 2022): ``rho_q = w_q^2 / (2 [F^-1]_qq)``, the rise of the loss's
    quadratic model when weight q goes to zero and the rest of its block moves optimally.

    F is a block-diagonal empirical Fisher, ``F = damping * I + (1/m) sum_i g_i g_i^T`` (each g divided by the
    root mean square of the window's first gradient, so ``damping`` is relative to F's diagonal) over blocks of
    ``gmp.obs_block_size`` (B) consecutive entries of each flattened weight; a layer whose size is not a multiple
    of B has its last block padded, and padded entries (gradient 0) stay decoupled, never score and never go. Its
    inverse is built directly, one Sherman–Morrison step per gradient for all blocks of a layer at once
    (``woodbury_update_``), starting from ``I / damping``.

    Which gradients: the Fisher of a prune at step p holds those of the steps after
    ``max(previous prune, p - m)`` up to p itself (m = ``gmp.obs_num_grads``), so a gradient serves one prune at
    most; steps outside such a window are not observed at all. With fewer than m gradients (the window is cut by
    the previous prune, or by the start or a resume) the recursion keeps its denominator m: F's gradient term is
    then scaled by k/m for k gradients, which is F of the k gradients with damping ``damping * m / k``, times k/m.
    The overall scale changes neither the ranking (global ranking too: all layers share k) nor the OBS update;
    the relatively larger damping pulls a thin estimate towards magnitude pruning, which k = 0 gives exactly
    (``w^2 * damping / 2``). Normalising by k instead would rescale the damping term at every step, which is no
    rank-1 update.

    After the masks change (``gmp.obs_update_weights``), the kept weights of each block move by
    ``-F^-1[:, Q] (F^-1[Q, Q])^-1 w_Q``, Q every masked entry of the block (those pruned before are 0 and stay
    so): the minimiser of the quadratic model with w_Q = 0. The optimizer state of the kept weights is left as it
    is (the masked ones' is cleared as for every prune).

    Not checkpointed: the inverse is as large as stated below and the window rebuilds it; after a resume it holds
    the gradients seen since. It lives in float32 (gradients are cast before they enter), on the weights' device,
    allocated at ``to`` or first use; the bytes are logged when the score is built and checked against what the
    device has free there and at every ``to``, refused with a ``ValueError`` when they do not fit.

    Args:
        params: the selected weights by name.
        gmp: the GMP section (its schedule and ``obs_*`` settings).
        end_step: the resolved last step of pruning (``SparsityController.gmp_end_step``).
        free_memory: the bytes free on a device (default ``available_memory``); for tests.
    """

    def __init__(self, params: Mapping[str, torch.Tensor], gmp: GMPConfig, end_step: int,
                 free_memory: MemoryProbe | None = None) -> None:
        self.gmp = gmp
        self.end_step = end_step
        self.block_size = gmp.obs_block_size
        self.num_grads = gmp.obs_num_grads
        self.damping = gmp.obs_damping
        self.update_weights = gmp.obs_update_weights
        self._free_memory = free_memory or available_memory
        self._n_blocks = {name: -(-p.numel() // self.block_size) for name, p in params.items()}
        self._device = next(iter(params.values())).device
        self._inverse: dict[str, torch.Tensor] | None = None  # name -> [n_blocks, B, B]; allocated when needed
        self._window: int | None = None  # the prune step whose gradients the inverse gathers; None: none since
        self._seen = 0  # gradients in the inverse
        # the root mean square of the window's first gradient over every layer (a device scalar): the window's
        # gradients are divided by it, so gmp.obs_damping is relative to the Fisher's diagonal. One factor for all
        # layers and the whole window scales every score alike: rankings and the OBS update do not change
        self._scale: torch.Tensor | float = 1.0
        self.memory_bytes = obs_memory_bytes(params.values(), self.block_size)
        self._check_fits(self._device)
        # where they will live is said when they are allocated (``to``): the weights may still move to a GPU
        log.info("gmp.score obs: the block Fisher inverses take %d bytes (%.2f GiB; %d blocks of %d x %d float32 "
                 "over %d layers); %s has room for them", self.memory_bytes, self.memory_bytes / 2**30,
                 sum(self._n_blocks.values()), self.block_size, self.block_size, len(self._n_blocks), self._device)

    def observes(self, step: int) -> bool:
        # the last m steps up to the prune to come; a step at or before the previous prune has that one as its
        # next, so no window reaches back past it
        prune = gmp_next_update(step, self.gmp, self.end_step)
        return prune is not None and step > prune - self.num_grads

    @torch.no_grad()
    def observe(self, step: int, weights: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]) -> None:
        prune = gmp_next_update(step, self.gmp, self.end_step)
        if prune != self._window:  # a new window: nothing from before it
            self._restart()
            self._window = prune
            self._scale = gradient_rms(grads.values())
        inverse = self._inverses()
        for name, grad in grads.items():
            woodbury_update_(inverse[name], self._blocks(name, grad.detach().float() / self._scale, 0.0),
                             self.num_grads)
        self._seen += 1

    @torch.no_grad()
    def scores(self, weights: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self._window is None:  # no gradient since the last prune (or resume): those went into that one
            self._restart()
        log.info("gmp.score obs: pruning with the Fisher of %d gradients (gmp.obs_num_grads %d)", self._seen,
                 self.num_grads)
        inverse = self._inverses()
        result = {}
        for name, weight in weights.items():
            diagonal = inverse[name].diagonal(dim1=1, dim2=2).reshape(-1)[: weight.numel()]
            result[name] = (weight.detach().float().reshape(-1).square() / (2 * diagonal)).view(weight.shape)
        return result

    @torch.no_grad()
    def after_prune(self, weights: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> None:
        if self.update_weights:
            started, solved = time.perf_counter(), 0
            inverse = self._inverses()
            for name, weight in weights.items():
                blocks = self._blocks(name, weight.detach().float(), 0.0)
                pruned = self._blocks(name, ~masks[name], False)
                # only the blocks where a non-zero weight goes now: in the others w_Q = 0 and so is the update.
                # Late in the cubic ramp a prune touches few blocks (one host sync per layer and prune)
                moving = (pruned & (blocks != 0)).any(dim=1).nonzero().squeeze(1)
                solved += len(moving)
                # in chunks of blocks, so the solve's working space stays bounded whatever the layer's size
                for start in range(0, len(moving), _UPDATE_CHUNK):
                    chunk = moving[start:start + _UPDATE_CHUNK]
                    moved = blocks[chunk]
                    blocks[chunk] = moved + obs_correction(inverse[name][chunk], moved, pruned[chunk])
                updated = blocks.reshape(-1)[: weight.numel()].view(weight.shape)
                weight.copy_(updated.masked_fill(~masks[name], 0.0))
            if self._device.type == "cuda":  # one sync per prune, so the time below is the update's own
                torch.cuda.synchronize(self._device)
            log.info("gmp.score obs: the OBS update solved %d of %d blocks in %.2f s", solved,
                     sum(self._n_blocks.values()), time.perf_counter() - started)
        self._window = None  # this window's gradients served this prune

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._window = None  # the inverse is not saved: the window starts again with the gradients to come

    def to(self, device: torch.device) -> None:
        device = torch.device(device)
        if self._inverse is not None and device == self._device:
            return
        if device != self._device:
            self._check_fits(device)
            self._device = device
        if self._inverse is None:  # allocated now, so a device without room says so before training starts
            self._inverses()
        else:
            self._inverse = {n: t.to(device) for n, t in self._inverse.items()}
        log.info("gmp.score obs: the block Fisher inverses live on %s", device)

    def _inverses(self) -> dict[str, torch.Tensor]:
        if self._inverse is None:
            self._inverse = {name: torch.empty(n, self.block_size, self.block_size, device=self._device)
                             for name, n in self._n_blocks.items()}
            self._fill_identity()
        return self._inverse

    def _restart(self) -> None:
        """The inverse back to ``I / damping`` (no gradient); left alone when it is that already or unallocated."""
        if self._inverse is not None and self._seen:
            self._fill_identity()
        self._seen = 0

    def _fill_identity(self) -> None:
        for inverse in self._inverse.values():
            inverse.zero_().diagonal(dim1=1, dim2=2).fill_(1.0 / self.damping)

    def _blocks(self, name: str, tensor: torch.Tensor, fill: float | bool) -> torch.Tensor:
        """``tensor`` flattened into ``[n_blocks, B]``, the last block padded with ``fill``."""
        padded = tensor.new_full((self._n_blocks[name] * self.block_size,), fill)
        padded[: tensor.numel()] = tensor.reshape(-1)
        return padded.view(-1, self.block_size)

    def _check_fits(self, device: torch.device) -> None:
        needed = self.memory_bytes + _update_working_bytes(max(self._n_blocks.values()), self.block_size)
        free = self._free_memory(device)
        if free is not None and needed > free:
            raise ValueError(f"gmp.score obs needs {needed} bytes ({needed / 2**30:.2f} GiB) on {device} for its block "
                             f"Fisher inverses and their update, but {free} bytes ({free / 2**30:.2f} GiB) are free: "
                             f"lower gmp.obs_block_size (now {self.block_size}; the bytes grow linearly with it)")


def make_score(gmp: GMPConfig, params: Mapping[str, torch.Tensor], end_step: int,
               free_memory: MemoryProbe | None = None) -> PruningScore:
    """The score ``gmp.score`` names.

    Args:
        gmp: the GMP section.
        params: the selected weights by name.
        end_step: the resolved last step of pruning.
        free_memory: for "obs", the probe of free device memory (default ``available_memory``).

    Returns:
        A ``MagnitudeScore``, ``MovementScore`` or ``OBSScore``.
    """
    if gmp.score == "movement":
        return MovementScore(params, end_step)
    if gmp.score == "obs":
        return OBSScore(params, gmp, end_step, free_memory)
    return MagnitudeScore()


def gradient_rms(grads: Any) -> torch.Tensor:
    """The root mean square of every entry of ``grads`` together, as a float32 device scalar (no host read); a
    gradient of zeros gives the smallest positive float instead of 0, so dividing by it is safe."""
    grads = list(grads)
    total = torch.stack([g.detach().float().square().sum() for g in grads]).sum()
    count = sum(g.numel() for g in grads)
    return (total / count).sqrt().clamp_min(torch.finfo(torch.float32).tiny)


@torch.no_grad()
def woodbury_update_(inverse: torch.Tensor, grads: torch.Tensor, num_grads: int) -> None:
    """One Sherman–Morrison step for every block at once: ``F^-1 <- F^-1 - (F^-1 g)(F^-1 g)^T / (m + g^T F^-1 g)``,
    the inverse of ``F + g g^T / m``. Two batched products, no host sync.

    Args:
        inverse: ``[n_blocks, B, B]`` symmetric, updated in place.
        grads: ``[n_blocks, B]``, the gradient's entries of each block.
        num_grads: m.
    """
    product = torch.bmm(inverse, grads.unsqueeze(2))  # [n, B, 1]: F^-1 g (F^-1 is symmetric)
    denominator = torch.bmm(grads.unsqueeze(1), product).add_(num_grads)  # [n, 1, 1]
    scaled = product / denominator.sqrt()  # v v^T: the subtracted term is symmetric to the bit
    inverse.baddbmm_(scaled, scaled.transpose(1, 2), alpha=-1.0)


def obs_correction(inverse: torch.Tensor, weights: torch.Tensor, pruned: torch.Tensor) -> torch.Tensor:
    """The OBS update of every block at once: ``delta_w = -F^-1[:, Q] (F^-1[Q, Q])^-1 w_Q``, Q = ``pruned``.

    ``F^-1[Q, Q]`` is solved for as ``F^-1`` with the rows and columns outside Q replaced by the identity's, so
    every block is one system of the same shape; a block with an empty Q, or whose Q holds only zeros, gets 0.

    Args:
        inverse: ``[n, B, B]`` the blocks' Fisher inverses.
        weights: ``[n, B]``.
        pruned: ``[n, B]`` bool, Q.

    Returns:
        ``[n, B]`` float32: the change of every entry; ``weights + delta`` is ~0 on Q.
    """
    system = torch.where(pruned.unsqueeze(2) & pruned.unsqueeze(1), inverse, 0.0)
    system.diagonal(dim1=1, dim2=2).add_((~pruned).float())
    solution = torch.linalg.solve(system, (weights * pruned).unsqueeze(2))  # (F^-1[Q, Q])^-1 w_Q, 0 outside Q
    return -torch.bmm(inverse, solution).squeeze(2)


def obs_memory_bytes(weights: Any, block_size: int) -> int:
    """The bytes of the block Fisher inverses: ``sum over layers of ceil(numel / B) * B * B * 4``.

    Args:
        weights: the selected weights (anything with ``numel()``), or their sizes as ints.
        block_size: B.
    """
    sizes = [w if isinstance(w, int) else w.numel() for w in weights]
    return sum(-(-n // block_size) for n in sizes) * block_size * block_size * 4


def _update_working_bytes(n_blocks: int, block_size: int) -> int:
    """The OBS update's working space on top of the inverses: per solved block a copy of its inverse (gathered
    from the blocks that move), a masked copy, its LU factors (float32 each) and the bool mask of Q x Q."""
    return min(n_blocks, _UPDATE_CHUNK) * block_size * block_size * (4 + 4 + 4 + 1)


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on ``device``: on CUDA the driver's free memory plus what torch's caching
    allocator holds unused; on the CPU the kernel's MemAvailable (else free physical pages); None elsewhere."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
