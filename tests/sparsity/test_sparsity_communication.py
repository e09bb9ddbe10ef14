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
from torch.nn.parallel import DistributedDataParallel as DDP

from sparsebert.sparsity import RigLConfig, SparsityConfig, SparsityController, communication


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.module.named_parameters()}


def spawn_two_ranks(bucket_view: bool, backend: str = "gloo") -> None:
    mp.spawn(_worker, args=(_free_port(), bucket_view, backend), nprocs=2, join=True)


def _worker(rank: int, port: int, bucket_view: bool, backend: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        sparsity = SparsityConfig(sparsity=0.75, include=[r"^[02]\.weight$"])  # layer 4 stays dense
        rigl = RigLConfig(update_freq=3, end_step=100)
        models, controllers = [], []
        for _ in range(2):
            mlp = make_mlp(seed=0).to(device)
            controllers.append(SparsityController(mlp, sparsity, rigl=rigl, seed=1))
            # ~1 KB buckets: several buckets, some with a masked weight next to dense biases, some without one
            models.append(DDP(mlp, bucket_cap_mb=0.001, gradient_as_bucket_view=bucket_view))
        plain, sparse = models
        _, controller = controllers
        hook = communication.register(sparse, controller)
        total = sum(p.numel() for p in plain.parameters())
        masked_numel = sum(m.numel() for m in controller.masks.values())
        expected_sent = 0
        generator = torch.Generator().manual_seed(100 + rank)  # every rank its own batches
        def loss(model: torch.nn.Module, generator: torch.Generator) -> torch.Tensor:
            return mlp_loss(lambda x: model(x.to(device)), generator)

        for step in range(1, 5):
            state = generator.get_state()
            loss(plain, generator).backward()
            generator.set_state(state)
            loss(sparse, generator).backward()
            expected, got = _grads(plain), _grads(sparse)
            dense_step = step % rigl.update_freq == 0
            assert controller.dense_gradients_due() == dense_step
            for name, grad in got.items():
                mask = controller.masks.get(name)
                want = expected[name] if mask is None or dense_step else expected[name] * mask
                assert torch.equal(grad, want), (step, name)
            assert controller._grads_arrive_masked is not dense_step
            active = sum(int(m.sum()) for m in controller.masks.values())
            expected_sent += total if dense_step else total - masked_numel + active
            controller.before_optimizer_step()
            if step == 2:  # a mask change (as a RigL update makes) must reach the hook's positions
                flipped = controller.masks["2.weight"].clone()
                flipped[:4] = ~flipped[:4]
                for c in controllers:
                    c.masks["2.weight"] = flipped.clone()
                    c.mask_version += 1
            for c in controllers:
                c.step += 1
            for m in models:
                m.zero_grad(set_to_none=False)
        # 3 compact backwards (dense layers and active weights) and a dense one (step 3)
        assert hook.sent_fraction() == pytest.approx(expected_sent / (4 * total))
        assert hook.sent_fraction() < 0.6
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


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (NCCL)")
def test_sparse_all_reduce_matches_plain_ddp_over_nccl():
    spawn_two_ranks(True, backend="nccl")
