"""train.precision=fp8 under DDP with the sparse all-reduce: 2 gloo processes on CPU train tiny BERT whose encoder
Linears are torchao's ``Float8Linear`` (emulated: the FP8 casts, products in fp32), 80 % sparse with RigL.

Each rank trains two copies side by side on rank-dependent batches, one under plain DDP and one whose backward runs
under ``no_sync`` followed by the flat sparse sync, as the Trainer runs it. The sync must average the FP8 layers'
gradients as DDP does (bit for bit at 2 ranks: at active positions, and everywhere on the RigL step), the masked
weights must stay exactly zero in the fp32 master weights, and both copies on both ranks must end as one model.
"""

from __future__ import annotations

import gc
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from sparsity_helpers import assert_masked_weights_zero, bert_loss, make_tiny_bert
from torch.nn.parallel import DistributedDataParallel as DDP

from sparsebert.distributed import all_reduce
from sparsebert.models.fp8 import use_fp8_matmuls
from sparsebert.sparsity import RigLConfig, SparsityConfig, SparsityController

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = 4
RIGL = RigLConfig(update_freq=2, end_step=100)  # RigL updates after steps 2 and 4: dense gradients on the wire


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        _train_and_compare(rank)
    finally:
        dist.destroy_process_group()


def _train_and_compare(rank: int) -> None:
    models, controllers, optimizers = [], [], []
    for _ in range(2):
        bert = make_tiny_bert(seed=0)
        swapped = use_fp8_matmuls(bert, emulate=True)
        assert len(swapped) == 12, swapped  # Q, K, V, attention output, FFN up and down of both layers
        controller = SparsityController(bert, SparsityConfig(sparsity=0.8), rigl=RIGL, seed=1)
        optimizer = torch.optim.AdamW(bert.parameters(), lr=1e-2)
        controller.attach_optimizer(optimizer)
        models.append(DDP(bert))
        controllers.append(controller)
        optimizers.append(optimizer)
    plain, synced = models
    controller = controllers[1]
    assert set(controller.masks) == {f"{name}.weight" for name in swapped}  # the FP8 layers are the sparse ones
    sync = all_reduce.FlatGradientSync(synced.module, controller)
    reducer_calls = []  # DDP's reducer must stay out: averaging twice would not show at 2 ranks
    synced.register_comm_hook(None, lambda state, bucket: reducer_calls.append(1) or _keep(bucket))
    total = sum(p.numel() for p in synced.parameters() if p.requires_grad)
    masked_numel = sum(m.numel() for m in controller.masks.values())
    active = sum(int(m.sum()) for m in controller.masks.values())  # RigL moves weights, keeps their count
    expected_sent = 0
    generator = torch.Generator().manual_seed(100 + rank)  # every rank its own batches
    for step in range(1, STEPS + 1):
        state = generator.get_state()
        torch.manual_seed(10 * step + rank)  # the same dropout in both copies
        bert_loss(plain, generator).backward()
        generator.set_state(state)
        torch.manual_seed(10 * step + rank)
        with synced.no_sync():  # as the Trainer runs it: the sync instead of DDP's reducer
            bert_loss(synced, generator).backward()
        dense_step = controller.dense_gradients_due()
        assert dense_step == (step % RIGL.update_freq == 0)
        result = sync()
        assert result.masked is not dense_step
        expected_sent += total if dense_step else total - masked_numel + active
        expected = dict(plain.module.named_parameters())
        for name, param in synced.module.named_parameters():
            want = expected[name].grad
            mask = controller.masks.get(name)
            if mask is not None and not dense_step:
                want = want * mask
            assert torch.equal(param.grad, want), (step, name)
        for c, optimizer in zip(controllers, optimizers):
            c.before_optimizer_step(grads_masked=c is controller and result.masked)
            optimizer.step()
            c.on_optimizer_step()
            optimizer.zero_grad(set_to_none=True)
    for c in controllers:
        assert_masked_weights_zero(c)
    for name, mask in controller.masks.items():  # both copies made the same RigL moves
        assert torch.equal(mask, controllers[0].masks[name]), name
    weights = torch.cat([p.detach().flatten() for p in synced.module.parameters()])
    assert torch.equal(weights, torch.cat([p.detach().flatten() for p in plain.module.parameters()]))
    gathered = [torch.empty_like(weights) for _ in range(2)]
    dist.all_gather(gathered, weights)
    assert torch.equal(gathered[0], gathered[1])  # both ranks hold the same model
    assert not reducer_calls
    assert sync.sent_fraction() == pytest.approx(expected_sent / (STEPS * total))
    assert expected_sent < STEPS * total  # 2 steps of 4 sent the active weights' values only
    # the DDP reducers (held in reference cycles) must go before their process group
    del models, plain, synced, sync
    gc.collect()
    dist.barrier()


def _keep(bucket: dist.GradBucket) -> torch.futures.Future:
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def test_fp8_layers_train_under_ddp_with_the_sparse_all_reduce():
    mp.spawn(_worker, args=(_free_port(),), nprocs=2, join=True)
