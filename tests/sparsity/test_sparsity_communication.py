"""The sparse all-reduce hook on a toy MLP under real DDP: 2 gloo processes on CPU, a few seconds (and 2 NCCL
processes on 2 GPUs where there are two).

Each rank trains two copies of the same masked MLP side by side, one under plain DDP and one with the hook, on
rank-dependent batches; after every backward the hook's gradients must equal plain DDP's averaged gradients at
active positions and be exactly 0 at masked ones, except on a RigL step, where they must equal the dense average.
"""

from __future__ import annotations

import gc
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from sparsity_helpers import make_mlp, mlp_loss
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from sparsebert.sparsity import RigLConfig, SparsityConfig, SparsityController, communication


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Net(nn.Module):
    """The toy MLP, and with ``odd_layout`` also a masked weight that is a transposed (non-contiguous) view, whose
    gradient DDP lays out by its strides: the hook must send that one's bucket whole."""

    def __init__(self, odd_layout: bool):
        super().__init__()
        self.mlp = make_mlp(seed=0)
        self.side = nn.Parameter(torch.randn(16, 4, generator=torch.Generator().manual_seed(1)).t()) \
            if odd_layout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.mlp(x)
        return out if self.side is None else out + x @ self.side.t()


def spawn_two_ranks(bucket_view: bool, odd_layout: bool = False, backend: str = "gloo") -> None:
    mp.spawn(_worker, args=(_free_port(), bucket_view, odd_layout, backend), nprocs=2, join=True)


def _worker(rank: int, port: int, bucket_view: bool, odd_layout: bool, backend: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        # mlp.4 stays dense; bucket_cap_mb=0.0005 (~500 B) puts it and the biases next to it in a bucket without a
        # masked weight, once DDP has rebuilt its buckets after the first step
        sparsity = SparsityConfig(sparsity=0.75, include=[r"^mlp\.[02]\.weight$", "^side$"])
        rigl = RigLConfig(update_freq=3, end_step=100)
        models, controllers = [], []
        for _ in range(2):
            net = Net(odd_layout).to(device)
            controllers.append(SparsityController(net, sparsity, rigl=rigl, seed=1))
            models.append(DDP(net, bucket_cap_mb=0.0005, gradient_as_bucket_view=bucket_view))
        plain, sparse = models
        controller = controllers[1]
        hook = communication.register(sparse, controller)
        total = sum(p.numel() for p in plain.parameters())
        masked_numel = sum(m.numel() for m in controller.masks.values())
        expected_sent = 0
        generator = torch.Generator().manual_seed(100 + rank)  # every rank its own batches

        def backward(model: nn.Module, state: torch.Tensor) -> dict[str, torch.Tensor]:
            generator.set_state(state)
            mlp_loss(lambda x: model(x.to(device)), generator).backward()
            return {name: p.grad.clone() for name, p in model.module.named_parameters()}

        for step in range(1, 5):
            state = generator.get_state()
            expected, got = backward(plain, state), backward(sparse, state)
            dense_step = step % rigl.update_freq == 0
            assert controller.dense_gradients_due() == dense_step
            for name, grad in got.items():
                mask = controller.masks.get(name)
                whole, masked = expected[name], None if mask is None else expected[name] * mask
                if mask is None or dense_step or name == "side":
                    assert torch.equal(grad, whole), (step, name)
                elif odd_layout:  # a layer that shares the bucket of "side" travels whole as well
                    assert torch.equal(grad, masked) or torch.equal(grad, whole), (step, name)
                else:
                    assert torch.equal(grad, masked), (step, name)
            assert controller._grads_arrive_masked is not (dense_step or odd_layout)
            active = sum(int(m.sum()) for m in controller.masks.values())
            expected_sent += total if dense_step else total - masked_numel + active
            for c in controllers:
                c.before_optimizer_step()
            for (name, a), b in zip(plain.module.named_parameters(), sparse.module.parameters()):
                assert torch.equal(a.grad, b.grad), (step, name)  # what the optimizer sees: always the same
            if step == 2:  # a mask change (RigL, GMP, a loaded state) must reach the hook's positions
                masks = dict(controller.masks)
                masks["mlp.2.weight"] = masks["mlp.2.weight"].clone()
                masks["mlp.2.weight"][:4] = ~masks["mlp.2.weight"][:4]
                for c in controllers:
                    c.load_state_dict({**c.state_dict(), "masks": masks, "step": c.step})
            for c in controllers:
                c.step += 1
            for m in models:
                m.zero_grad(set_to_none=False)
        if not odd_layout:  # 3 compact backwards (dense layers and active weights) and a dense one (step 3)
            assert hook.sent_fraction() == pytest.approx(expected_sent / (4 * total))
            assert hook.sent_fraction() < 0.6
            kinds = {plan.index is None for plan in hook._plans.values()}
            assert kinds == {True, False}  # buckets with and without a masked weight
        # the DDP reducers (held in reference cycles) must go before their process group, or gloo's threads
        # may abort the process at exit, with or without the hook
        del models, plain, sparse, hook
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("bucket_view", [True, False])
def test_sparse_all_reduce_matches_plain_ddp_at_active_positions(bucket_view):
    spawn_two_ranks(bucket_view)


def test_a_weight_laid_out_by_its_strides_is_sent_whole_and_masked_by_the_controller():
    spawn_two_ranks(True, odd_layout=True)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (NCCL)")
def test_sparse_all_reduce_matches_plain_ddp_over_nccl():
    spawn_two_ranks(True, backend="nccl")
