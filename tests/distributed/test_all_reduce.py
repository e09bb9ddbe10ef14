"""The flat all-reduce on a toy MLP under real DDP: 2 gloo processes on CPU, a few seconds (and 2 NCCL
processes on 2 GPUs where there are two).

Each rank trains two copies of the same masked MLP side by side on rank-dependent batches: one under plain DDP,
one whose backward runs under ``no_sync`` followed by the sync, as the Trainer runs it. After every backward the
sync's gradients must equal plain DDP's averaged gradients: everywhere for ``flat`` (rounded to bf16 for
``flat_bf16``); for ``sparse`` at active positions, and exactly 0 at masked ones except on a RigL step, where they
must equal the dense average.
"""

from __future__ import annotations

import gc
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from sparsity_helpers import make_mlp, mlp_loss
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from sparsebert.distributed import all_reduce
from sparsebert.sparsity import RigLConfig, SparsityConfig, SparsityController

pytestmark = pytest.mark.usefixtures("one_thread")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Net(nn.Module):
    """The toy MLP with three more parameters: a masked weight that is a transposed (non-contiguous) view, an
    unmasked float64 scale, whose gradient the sync averages in a buffer of its own (in float64 also with
    ``flat_bf16``, which rounds fp32 gradients only), and an unmasked weight in a module after the MLP (so last
    in the fp32 buffer), which with 3 pieces holds the whole last piece (values 2 048 to 2 304 of 2 304): sent
    without a gather on sparse steps."""

    def __init__(self):
        super().__init__()
        self.mlp = make_mlp(seed=0)
        self.side = nn.Parameter(torch.randn(16, 4, generator=torch.Generator().manual_seed(1)).t())
        self.scale = nn.Parameter(torch.ones((), dtype=torch.float64))
        self.tail = nn.Linear(16, 32, bias=False)
        with torch.no_grad():  # the same on every copy and rank
            self.tail.weight.copy_(torch.randn(32, 16, generator=torch.Generator().manual_seed(2)) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        extra = self.tail(x).view(-1, 4, 8).sum(-1)
        return (self.mlp(x) + x @ self.side.t() + extra) * self.scale.float()


def spawn_ranks(mode: str, set_to_none: bool = True, backend: str = "gloo", world: int = 2, pieces: int = 1) -> None:
    mp.spawn(_worker, args=(_free_port(), [(mode, set_to_none, pieces)], backend, world, None), nprocs=world,
             join=True)


def spawn_cases(cases: list[tuple[str, bool, int]], world: int, done_file: Path) -> Exception | None:
    """Several (mode, set_to_none, pieces) cases on ``world`` gloo processes, one after the other in one spawn
    (starting the processes, each importing torch, costs more than a case); each case builds its models, sync and
    batches anew. The cases every rank finished are appended to ``done_file``; the error that ended the spawn early
    (the first failing case's traceback) is returned."""
    try:
        mp.spawn(_worker, args=(_free_port(), cases, "gloo", world, str(done_file)), nprocs=world, join=True)
    except Exception as error:  # mp.ProcessRaisedException / ProcessExitedException: reported by the cases' tests
        return error
    return None


def _worker(rank: int, port: int, cases: list[tuple[str, bool, int]], backend: str, world: int,
            done_file: str | None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        for mode, set_to_none, pieces in cases:
            _check_case(device, rank, world, mode, set_to_none, pieces)
            if done_file is not None and rank == 0:  # after the case's closing barrier: every rank passed it
                with open(done_file, "a") as f:
                    f.write(f"{mode} {set_to_none} {pieces}\n")
    finally:
        dist.destroy_process_group()


def _check_case(device: torch.device, rank: int, world: int, mode: str, set_to_none: bool, pieces: int) -> None:
    sparsity = SparsityConfig(sparsity=0.75, include=[r"^mlp\.[02]\.weight$", "^side$"])
    rigl = RigLConfig(update_freq=3, end_step=100)
    models, controllers = [], []
    for _ in range(2):
        net = Net().to(device)
        net.mlp[4].bias.requires_grad_(False)  # frozen: left out of the sync, as of plain DDP
        controllers.append(SparsityController(net, sparsity, rigl=rigl, seed=1))
        models.append(DDP(net))
    plain, sparse = models
    controller = controllers[1]
    with pytest.raises(ValueError, match="are not parameters of this model"):
        all_reduce.FlatGradientSync(plain.module, controller)  # another model's controller
    sync = all_reduce.FlatGradientSync(sparse.module, controller if mode == "sparse" else None,
                                          wire_dtype=torch.bfloat16 if mode == "flat_bf16" else None,
                                          pieces=pieces)
    reducer_calls = []  # DDP's reducer must stay out: averaging twice would not show at 2 ranks
    sparse.register_comm_hook(None, lambda state, bucket: reducer_calls.append(1) or keep(bucket))
    total = sum(p.numel() for p in plain.parameters() if p.requires_grad)
    masked_numel = sum(m.numel() for m in controller.masks.values())
    expected_sent = 0
    generator = torch.Generator().manual_seed(100 + rank)  # every rank its own batches

    results = []

    def backward(model: DDP, state: torch.Tensor, then_sync=None) -> dict[str, torch.Tensor]:
        generator.set_state(state)
        if then_sync is None:
            mlp_loss(lambda x: model(x.to(device)), generator).backward()
        else:
            with model.no_sync():  # as the Trainer runs it: no reducer
                mlp_loss(lambda x: model(x.to(device)), generator).backward()
            # track_norm: as the Trainer asks when clipping inside the fused AdamW step
            results.append(then_sync(track_norm=True))
        return {name: p.grad.clone() for name, p in model.module.named_parameters() if p.grad is not None}

    for step in range(1, 5):
        state = generator.get_state()
        expected, got = backward(plain, state), backward(sparse, state, sync)
        dense_step = step % rigl.update_freq == 0
        assert controller.dense_gradients_due() == dense_step
        sent_dense = dense_step or mode != "sparse"
        assert got.keys() == expected.keys() and "mlp.4.bias" not in got
        for name, grad in got.items():
            mask = controller.masks.get(name)
            want = expected[name] if mask is None or sent_dense else expected[name] * mask
            assert_same(grad, want, world, (step, name), mode)
            assert mask is None or sent_dense or torch.equal(grad == 0, want == 0), (step, name)
        side = sparse.module.side
        assert side.grad.stride() == side.stride()  # a fused optimizer's layout, not the flat buffer's
        result = results[-1]
        assert result.masked is not sent_dense  # else the controller masks them itself
        # the norm summed piece by piece is that of the averaged gradients; on a masked call it is also that of
        # the gradients the optimizer sees (below, after the controller's zeroing)
        grads_norm = torch.linalg.vector_norm(torch.cat([g.double().flatten() for g in got.values()]))
        torch.testing.assert_close(result.norm.double(), grads_norm, rtol=1e-6, atol=0, msg=str(step))
        active = sum(int(m.sum()) for m in controller.masks.values())
        expected_sent += total if sent_dense else total - masked_numel + active
        for c in controllers:
            c.before_optimizer_step(grads_masked=c is controller and result.masked)
        if result.masked:
            after = [p.grad.double().flatten() for p in sparse.module.parameters() if p.grad is not None]
            torch.testing.assert_close(result.norm.double(), torch.linalg.vector_norm(torch.cat(after)),
                                       rtol=1e-6, atol=0, msg=str(step))
        for (name, a), b in zip(plain.module.named_parameters(), sparse.module.parameters()):
            if a.grad is None or b.grad is None:  # the frozen bias
                assert a.grad is None and b.grad is None, (step, name)
            else:  # what clipping and the optimizer see: the same
                assert_same(b.grad, a.grad, world, (step, name), mode)
        if step == 2:  # a mask change (RigL, GMP, a loaded state) must reach the sync's positions
            masks = dict(controller.masks)
            masks["mlp.2.weight"] = masks["mlp.2.weight"].clone()
            masks["mlp.2.weight"][:4] = ~masks["mlp.2.weight"][:4]
            for c in controllers:
                c.load_state_dict({**c.state_dict(), "masks": masks, "step": c.step})
        for c in controllers:
            c.step += 1
        for m in models:
            m.zero_grad(set_to_none=set_to_none)  # False: the next backward adds into the last flat buffer
    assert not reducer_calls
    # 3 compact averages (unmasked values and active weights) and a dense one (step 3)
    assert sync.sent_fraction() == pytest.approx(expected_sent / (4 * total))
    if mode == "sparse":
        assert sync.sent_fraction() < 0.65  # 3 steps at 48 % of the values, one at 100 %
        kinds = {plan.masked for plan in sync._plans.values()}
        assert kinds == {True, False}  # the float64 buffer has no mask, the float32 one has
    else:
        assert sync.sent_fraction() == 1.0 and not any(plan.masked for plan in sync._plans.values())
    fp32_plan = sync._plans[(torch.float32, device)]
    assert len(fp32_plan.pieces) == pieces  # the toy's parameters are small enough to cut where asked
    if mode == "sparse" and pieces == 3:  # cut inside mlp.0.weight and tail.weight; the last piece unmasked
        assert [(piece.start, piece.end) for piece in fp32_plan.pieces] == [(0, 256), (256, 2048), (2048, 2304)]
        assert [piece.index is None for piece in fp32_plan.pieces] == [False, False, True]
    for p in sparse.module.parameters():
        p.grad = torch.zeros_like(p) if p.requires_grad and p is not sparse.module.mlp[0].bias else None
    with pytest.raises(RuntimeError, match="mlp.0.bias has no gradient"):
        sync()
    # the DDP reducers (held in reference cycles) must go before their process group, or gloo's threads
    # may abort the process at exit
    del models, plain, sparse, sync
    gc.collect()
    dist.barrier()


def assert_same(got: torch.Tensor, want: torch.Tensor, world: int, where: tuple, mode: str) -> None:
    if mode == "flat_bf16" and got.dtype == torch.float32:  # bf16 on the wire: ~3 significant digits, back in fp32
        assert torch.equal(got, got.bfloat16().to(got.dtype)), where
        # each rank's value and their sum rounded: where they cancel, the error is relative to the values summed
        scale = float(want.abs().max())
        torch.testing.assert_close(got, want, rtol=2 ** -7, atol=2 ** -7 * scale, msg=str(where))
    elif world == 2:  # a + b = b + a: bit for bit
        assert torch.equal(got, want), where
    else:  # gloo sums 3 ranks' values in an order that depends on the tensor's size
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8, msg=str(where))


def keep(bucket: dist.GradBucket) -> torch.futures.Future:
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


# The gloo cases (mode, set_to_none, pieces) by world size: each world's cases run in one spawn (a module
# fixture), and each case's test passes only if every rank finished that case.
GLOO_CASES = {
    2: [("sparse", True, 1), ("sparse", False, 1), ("flat", True, 1), ("flat_bf16", True, 1),
        ("sparse", True, 3), ("flat", True, 3), ("flat_bf16", True, 3)],
    3: [("sparse", True, 1), ("flat", True, 1)],
}


@pytest.fixture(scope="module")
def gloo_spawns(tmp_path_factory) -> dict[int, tuple[set[str], Exception | None]]:
    results = {}
    for world, cases in GLOO_CASES.items():
        done_file = tmp_path_factory.mktemp(f"gloo{world}") / "done"
        done_file.touch()
        error = spawn_cases(cases, world, done_file)
        results[world] = (set(done_file.read_text().splitlines()), error)
    return results


def passed(gloo_spawns, mode: str, set_to_none: bool = True, world: int = 2, pieces: int = 1) -> None:
    done, error = gloo_spawns[world]
    if f"{mode} {set_to_none} {pieces}" not in done:
        pytest.fail(f"case {(mode, set_to_none, pieces)} at {world} ranks did not finish on every rank (it failed, "
                    f"or a case before it in the same spawn did); the spawn ended with:\n{error}", pytrace=False)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_sparse_all_reduce_matches_plain_ddp_at_active_positions(gloo_spawns, set_to_none):
    passed(gloo_spawns, "sparse", set_to_none)


@pytest.mark.parametrize("mode", ["flat", "flat_bf16"])
def test_flat_all_reduce_matches_plain_ddp(gloo_spawns, mode):
    passed(gloo_spawns, mode)


@pytest.mark.parametrize("mode", ["sparse", "flat", "flat_bf16"])
def test_flat_all_reduce_in_pieces_matches_plain_ddp(gloo_spawns, mode):
    """Three pieces, each all-reduced while the next is copied: the same averages (bit for bit at 2 ranks); in
    the sparse mode the last piece has no mask (sent whole), the others gather their active values."""
    passed(gloo_spawns, mode, pieces=3)


def test_pieces_are_small_at_the_ends_aligned_and_cover_every_value_once():
    params = [nn.Parameter(torch.zeros(n)) for n in (5000, 700, 2300, 1, 1999)]  # 10 000 values
    position = {id(p): i for i, p in enumerate(params)}
    cut = all_reduce._cut(params, 4, align=100)
    # 1/8 at each end, the middle 3/4 cut equally; boundaries rounded to 100 values
    assert [(piece.start, piece.end) for piece in cut] == [(0, 1200), (1200, 5000), (5000, 8800), (8800, 10000)]
    assert [(position[id(p)], first, end) for p, first, end in cut[2].segments] == [(1, 0, 700), (2, 0, 2300),
                                                                                  (3, 0, 1), (4, 0, 799)]
    for pieces in (1, 2, 3, 5):
        covered = {i: [] for i in range(len(params))}
        for piece in all_reduce._cut(params, pieces, align=64):
            assert piece.start % 64 == 0 and sum(end - first for _, first, end in piece.segments) == piece.end - piece.start
            for p, first, end in piece.segments:
                covered[position[id(p)]].append((first, end))
        for i, ranges in covered.items():  # consecutive ranges from 0 to the parameter's size
            assert ranges[0][0] == 0 and ranges[-1][1] == params[i].numel(), (pieces, i)
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), (pieces, i)
    assert len(all_reduce._cut(params[3:4], 4)) == 1  # fewer values than pieces: one
    # a strided gradient across a boundary: the transposed 16 x 16 one holds values 300..556, pieces end at 64,
    # 512 and 556
    grads = [torch.arange(300.0), torch.arange(256.0).view(16, 16).t()]
    strided = [nn.Parameter(torch.zeros(300)), nn.Parameter(torch.zeros(16, 16).t())]
    for param, grad in zip(strided, grads):
        param.grad = grad
    pieces = all_reduce._cut(strided, 3, align=64)
    assert [(piece.start, piece.end) for piece in pieces] == [(0, 64), (64, 512), (512, 556)]
    buffer = torch.empty(556)
    for piece in pieces:
        all_reduce.FlatGradientSync._copy_in(piece, buffer)
    assert torch.equal(buffer, torch.cat([grad.reshape(-1) for grad in grads]))
    with pytest.raises(ValueError, match="pieces must be >= 1"):
        all_reduce.FlatGradientSync(nn.Linear(2, 2), pieces=0)


class _AllMasked:
    """Just what the sync reads of a SparsityController: one weight whose every value is masked."""

    def __init__(self, weight: nn.Parameter):
        self.params = {"weight": weight}
        self.masks = {"weight": torch.zeros_like(weight, dtype=torch.bool)}
        self.mask_version = 0

    def dense_gradients_due(self) -> bool:
        return False


def _one_rank_worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = nn.Module()
        model.weight = nn.Parameter(torch.ones(896))  # values 0..896 of 1 024: the first two of 3 pieces
        model.bias = nn.Parameter(torch.ones(128))  # the last piece (896..1 024), unmasked
        model.empty = nn.Parameter(torch.ones(0, dtype=torch.float64))  # a group with no values at all
        controller = _AllMasked(model.weight)
        sync = all_reduce.FlatGradientSync(model, controller, pieces=3)
        for param in model.parameters():
            param.grad = torch.full_like(param, 2.0)
        result = sync()
        plan = sync._plans[(torch.float32, torch.device("cpu"))]
        assert [(piece.start, piece.end) for piece in plan.pieces] == [(0, 128), (128, 896), (896, 1024)]
        assert [None if piece.index is None else piece.index.numel() for piece in plan.pieces] == [0, 0, None]
        assert torch.equal(model.weight.grad, torch.zeros(896))  # nothing sent, nothing kept
        assert torch.equal(model.bias.grad, torch.full((128,), 2.0))  # the average over one rank
        assert model.empty.grad.numel() == 0 and (torch.float64, torch.device("cpu")) not in sync._plans
        assert sync.sent_fraction() == 128 / 1024 and result.masked is True
    finally:
        dist.destroy_process_group()


def test_a_fully_masked_piece_sends_nothing_and_an_empty_group_is_left_alone():
    mp.spawn(_one_rank_worker, args=(_free_port(),), nprocs=1, join=True)


@pytest.mark.parametrize("mode", ["sparse", "flat"])
def test_flat_all_reduce_matches_plain_ddp_with_three_ranks(gloo_spawns, mode):
    """Up to the order of summation, which with 3 ranks differs between DDP's buckets and the flat tensor."""
    passed(gloo_spawns, mode, world=3)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (NCCL)")
@pytest.mark.parametrize("pieces", [1, 3])
@pytest.mark.parametrize("mode", ["sparse", "flat", "flat_bf16"])
def test_flat_all_reduce_matches_plain_ddp_over_nccl(mode, pieces):
    spawn_ranks(mode, backend="nccl", pieces=pieces)


def test_nccl_average_only_where_it_equals_ddp_s_multiplication():
    """NCCL's average multiplies by 1 / world rounded to the values' dtype: fine in fp32 or at a power of two."""
    assert all_reduce.nccl_average_is_exact(torch.float32, 3)
    assert all_reduce.nccl_average_is_exact(torch.float64, 6)
    assert all_reduce.nccl_average_is_exact(torch.bfloat16, 4)
    assert all_reduce.nccl_average_is_exact(torch.float16, 8)
    assert not all_reduce.nccl_average_is_exact(torch.bfloat16, 3)
    assert not all_reduce.nccl_average_is_exact(torch.float16, 6)
