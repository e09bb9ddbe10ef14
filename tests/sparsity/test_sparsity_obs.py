"""gmp.score "obs" (the Optimal BERT Surgeon): the Woodbury-built block inverse, scores and update against a
brute-force float64 OBS, the gradient window, its memory check and settings, and pruning through the controller."""

from __future__ import annotations

import logging

import pytest
import torch
from sparsity_helpers import assert_masked_weights_zero, bert_loss, make_mlp, make_tiny_bert, mlp_loss
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from sparsebert.sparsity import (
    GMPConfig,
    OBSScore,
    RigLConfig,
    SparsityConfig,
    SparsityController,
    gmp_next_update,
    gmp_update_due,
    make_score,
    obs_memory_bytes,
)
from sparsebert.sparsity.persistence import load_sparsity_state, save_sparsity_state
from sparsebert.sparsity.scores import woodbury_update_

DAMPING = 1e-2


def _obs(**settings) -> GMPConfig:
    settings = {"score": "obs", "obs_damping": DAMPING, **settings}
    return GMPConfig(**settings)


def _block_fishers(grads: list[torch.Tensor], block_size: int, num_grads: int, damping: float) -> torch.Tensor:
    """The exact block Fishers in float64, ``[n_blocks, B, B]``, of flat gradients (zero-padded to whole blocks)."""
    numel = grads[0].numel()
    n_blocks = -(-numel // block_size)
    padded = torch.zeros(len(grads), n_blocks * block_size, dtype=torch.float64)
    padded[:, :numel] = torch.stack([g.reshape(-1).double() for g in grads])
    blocks = padded.view(len(grads), n_blocks, block_size)
    outer = torch.einsum("kni,knj->nij", blocks, blocks) / num_grads
    return outer + damping * torch.eye(block_size, dtype=torch.float64)


def _normalised(grads: list, first: list[torch.Tensor]) -> list:
    """``grads`` divided as OBSScore divides a window's gradients: by the root mean square of every entry of the
    window's first gradient (``first``: that gradient's tensors, all layers)."""
    rms = (sum(float(g.double().square().sum()) for g in first) / sum(g.numel() for g in first)) ** 0.5
    return [g / rms for g in grads]


def _exact_obs(fisher: torch.Tensor, weights: torch.Tensor, pruned: torch.Tensor):
    """Brute-force OBS per block in float64: the saliencies and the optimal update for zeroing ``pruned``."""
    inverse = torch.linalg.inv(fisher)
    saliency = weights**2 / (2 * inverse.diagonal(dim1=1, dim2=2))
    delta = torch.zeros_like(weights)
    for b in range(len(weights)):
        q = pruned[b].nonzero().flatten()
        if len(q):
            delta[b] = -inverse[b][:, q] @ torch.linalg.solve(inverse[b][q][:, q], weights[b, q])
    return saliency, delta


def _padded_blocks(tensor: torch.Tensor, block_size: int) -> torch.Tensor:
    flat = tensor.reshape(-1).double()
    n_blocks = -(-flat.numel() // block_size)
    return torch.cat([flat, flat.new_zeros(n_blocks * block_size - flat.numel())]).view(n_blocks, block_size)


def _linear(rows: int, cols: int, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(cols, rows, bias=False))


@pytest.mark.parametrize("seen", [8, 3])  # a full window, and fewer gradients than obs_num_grads (denominator m)
def test_woodbury_steps_build_the_inverse_of_the_block_fisher(seen):
    generator = torch.Generator().manual_seed(0)
    n_blocks, block_size, num_grads = 6, 5, 8
    grads = [torch.randn(n_blocks * block_size, generator=generator) * 0.3 for _ in range(seen)]
    inverse = torch.eye(block_size).repeat(n_blocks, 1, 1) / DAMPING
    for grad in grads:
        woodbury_update_(inverse, grad.view(n_blocks, block_size), num_grads)
    expected = torch.linalg.inv(_block_fishers(grads, block_size, num_grads, DAMPING))
    torch.testing.assert_close(inverse.double(), expected, rtol=1e-4, atol=1e-5 / DAMPING)
    assert torch.equal(inverse, inverse.transpose(1, 2))  # symmetric to the bit


def _observed_score(model: nn.Module, grads: list[torch.Tensor], block_size: int, num_grads: int) -> OBSScore:
    """An OBSScore of ``model``'s weight that has seen ``grads``, the window of a prune at step len(grads)."""
    params = dict(model.named_parameters())
    steps = len(grads)
    score = OBSScore(params, _obs(end_step=steps, frequency=steps, obs_block_size=block_size,
                                  obs_num_grads=num_grads), end_step=steps)
    for step, grad in enumerate(grads, start=1):
        assert score.observes(step)
        score.observe(step, params, {"0.weight": grad})
    return score


def test_scores_and_update_match_brute_force_obs():
    # 3 x 7 = 21 weights in blocks of 5: the last block holds one weight and 4 padded entries
    model = _linear(3, 7)
    weight = model[0].weight
    generator = torch.Generator().manual_seed(1)
    grads = [torch.randn(3, 7, generator=generator) for _ in range(6)]
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask.view(-1)[[1, 7, 8, 12]] = False  # 1 and 12 were pruned before (weight 0), 7 and 8 are pruned now
    with torch.no_grad():
        weight.view(-1)[[1, 12]] = 0.0
    earlier = torch.ones(3, 7, dtype=torch.bool)
    earlier.view(-1)[[1, 12]] = False
    grads = [g * earlier for g in grads]  # the controller masks the gradients of weights pruned before
    score = _observed_score(model, grads, block_size=5, num_grads=6)

    fisher = _block_fishers(_normalised(grads, [grads[0]]), 5, 6, DAMPING)
    before = _padded_blocks(weight.detach(), 5)
    saliency, delta = _exact_obs(fisher, before, _padded_blocks(~mask, 5).bool())
    scores = score.scores({"0.weight": weight}, {"0.weight": mask})["0.weight"]
    assert scores.shape == weight.shape
    torch.testing.assert_close(scores.double(), saliency.view(-1)[:21].view(3, 7), rtol=1e-4, atol=1e-9)
    assert torch.equal(scores.flatten().argsort(), saliency.view(-1)[:21].argsort())

    score.after_prune({"0.weight": weight}, {"0.weight": mask})
    expected = (before + delta).view(-1)[:21].view(3, 7).masked_fill(~mask, 0.0)
    torch.testing.assert_close(weight.detach().double(), expected, rtol=1e-4, atol=1e-5)
    assert torch.all(weight.detach()[~mask] == 0)
    changed = (weight.detach() != before.view(-1)[:21].view(3, 7).float()) & mask
    # the kept weights of the one block with new prunes move; those of blocks where only zeros go stay as they were
    assert changed.view(-1).nonzero().flatten().tolist() == [5, 6, 9]


def test_the_update_solves_only_the_blocks_where_a_non_zero_weight_goes(monkeypatch):
    """A block whose masked entries are all zero already has w_Q = 0 and an update of 0: the prune leaves it out
    of the batched solve (late in a cubic ramp most blocks are such), with the same result as solving it."""
    import sparsebert.sparsity.scores as scores

    model = _linear(4, 10, seed=3)  # 40 weights in 8 blocks of 5
    weight = model[0].weight
    mask = torch.ones(4, 10, dtype=torch.bool)
    mask.view(-1)[[0, 1, 7, 20, 33]] = False
    with torch.no_grad():
        weight.view(-1)[[1, 7, 20]] = 0.0  # pruned before: blocks 1 and 4 hold only zeros among their masked
    generator = torch.Generator().manual_seed(4)
    score = _observed_score(model, [torch.randn(4, 10, generator=generator) * mask for _ in range(3)],
                            block_size=5, num_grads=3)
    solved = []

    def counting(inverse, weights, pruned):
        solved.append(len(weights))
        return correction(inverse, weights, pruned)

    correction = scores.obs_correction
    monkeypatch.setattr(scores, "obs_correction", counting)
    score.after_prune({"0.weight": weight}, {"0.weight": mask})
    assert solved == [2]  # blocks 0 (weight 0) and 6 (weight 33)
    assert torch.all(weight.detach()[~mask] == 0)


def test_the_update_is_the_constrained_minimiser_of_the_quadratic_model():
    generator = torch.Generator().manual_seed(2)
    block_size = 6
    grads = [torch.randn(block_size, generator=generator) for _ in range(4)]  # rank 4 of 6: coupled entries
    fisher = _block_fishers(grads, block_size, 4, DAMPING)[0]
    weights = torch.randn(1, block_size, generator=generator, dtype=torch.float64)
    pruned = torch.tensor([[True, False, True, False, False, False]])
    saliency, delta = _exact_obs(fisher[None], weights, pruned)

    def loss(dw: torch.Tensor) -> float:
        return float(0.5 * dw @ fisher @ dw)

    zeroing = -weights[0] * pruned[0]
    assert torch.allclose(weights[0, pruned[0]] + delta[0, pruned[0]], torch.zeros(2, dtype=torch.float64))
    assert loss(delta[0]) < loss(zeroing)
    w_q = weights[0, pruned[0]]
    inverse_qq = torch.linalg.inv(fisher)[pruned[0]][:, pruned[0]]
    assert loss(delta[0]) == pytest.approx(float(0.5 * w_q @ torch.linalg.solve(inverse_qq, w_q)))
    for q in range(block_size):  # one weight alone: its saliency is the loss of removing it
        single = torch.zeros(1, block_size, dtype=torch.bool)
        single[0, q] = True
        assert loss(_exact_obs(fisher[None], weights, single)[1][0]) == pytest.approx(float(saliency[0, q]))
    generator = torch.Generator().manual_seed(3)
    for _ in range(20):  # no other update with w_Q = 0 does better
        other = delta[0] + torch.randn(block_size, generator=generator, dtype=torch.float64) * 0.1 * ~pruned[0]
        assert loss(other) >= loss(delta[0])


def test_without_gradients_the_score_is_the_formula_with_the_damping_alone():
    model = _linear(4, 5)
    weight = model[0].weight
    params = dict(model.named_parameters())
    score = OBSScore(params, _obs(end_step=4, frequency=2, obs_block_size=3), end_step=4)
    masks = {"0.weight": torch.ones_like(weight, dtype=torch.bool)}
    expected = weight.detach() ** 2 * DAMPING / 2
    torch.testing.assert_close(score.scores(params, masks)["0.weight"], expected)
    # after a prune its gradients are spent: a second prune with nothing seen since scores like the first
    for step in (1, 2):
        score.observe(step, params, {"0.weight": torch.randn(4, 5)})
    score.after_prune(params, masks)
    torch.testing.assert_close(score.scores(params, masks)["0.weight"], expected)


@pytest.mark.parametrize("begin", [0, 3])
@pytest.mark.parametrize("frequency", [1, 4, 7])
def test_the_next_prune_step(begin, frequency):
    config = GMPConfig(begin_step=begin, frequency=frequency)
    due = [t for t in range(40) if gmp_update_due(t, config, end_step=30)]
    for step in range(1, 40):
        assert gmp_next_update(step, config, 30) == min((t for t in due if t >= step), default=None), step


def _obs_mlp(**settings) -> tuple[nn.Module, SparsityController, torch.optim.Optimizer]:
    model = make_mlp()
    config = SparsityConfig(sparsity=0.8, include=["weight$"], init="magnitude")
    controller = SparsityController(model, config, gmp=_obs(**{"end_step": 20, "frequency": 5,
                                                                "obs_block_size": 16, **settings}))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    controller.attach_optimizer(optimizer)
    return model, controller, optimizer


def _step(model, controller, optimizer, generator, micro_batches: int = 1):
    """One optimizer step the way the Trainer takes it; returns the gradients the controller saw and its stats."""
    for _ in range(micro_batches):
        mlp_loss(model, generator).backward()
    controller.before_optimizer_step()
    grads = {n: p.grad.clone() for n, p in controller.params.items()}
    optimizer.step()
    stats = controller.on_optimizer_step()
    optimizer.zero_grad(set_to_none=True)
    return grads, stats


@pytest.mark.parametrize(("num_grads", "observed", "windows"), [
    # prunes every 5 steps: the last 3 steps before each
    (3, [3, 4, 5, 8, 9, 10, 13, 14, 15, 18, 19, 20],
     {5: [3, 4, 5], 10: [8, 9, 10], 15: [13, 14, 15], 20: [18, 19, 20]}),
    # a window of 7 is cut at the previous prune: every step, each in one window
    (7, list(range(1, 21)),
     {5: [1, 2, 3, 4, 5], 10: [6, 7, 8, 9, 10], 15: [11, 12, 13, 14, 15], 20: [16, 17, 18, 19, 20]}),
])
def test_each_prune_uses_the_gradients_of_its_own_window(num_grads, observed, windows):
    model, controller, optimizer = _obs_mlp(obs_num_grads=num_grads)
    score = controller.score
    assert [t for t in range(1, 30) if score.observes(t)] == observed
    generator = torch.Generator().manual_seed(0)
    seen = {}
    for step in range(1, 21):
        seen[step], stats = _step(model, controller, optimizer, generator)
        if step in windows:  # right after the prune the inverse still holds exactly its window's gradients
            assert stats is not None and score._seen == len(windows[step])
            first = list(seen[windows[step][0]].values())
            for name in controller.params:
                window = _normalised([seen[t][name] for t in windows[step]], first)
                expected = torch.linalg.inv(_block_fishers(window, 16, num_grads, DAMPING))
                torch.testing.assert_close(score._inverse[name].double(), expected, rtol=1e-3, atol=1e-3 / DAMPING)


def test_the_fisher_sees_one_accumulated_gradient_per_optimizer_step():
    damping = 1e-4  # small beside these gradients' outer products, so one gradient differs visibly from two
    model, controller, optimizer = _obs_mlp(obs_num_grads=3, obs_damping=damping)
    generator = torch.Generator().manual_seed(0)
    for _ in range(2):
        _step(model, controller, optimizer, generator)
    # step 3, the first of the window, the way the Trainer takes it with two micro-batches
    mlp_loss(model, generator).backward()
    first = {n: p.grad.clone() for n, p in controller.params.items()}
    mlp_loss(model, generator).backward()
    controller.before_optimizer_step()
    total = {n: p.grad.clone() for n, p in controller.params.items()}
    optimizer.step()
    controller.on_optimizer_step()
    assert controller.score._seen == 1
    firsts = [first[n] * controller.masks[n] for n in controller.params]
    for name in controller.params:
        inverse = controller.score._inverse[name].double()
        expected = _block_fishers(_normalised([total[name]], list(total.values())), 16, 3, damping)
        torch.testing.assert_close(inverse, torch.linalg.inv(expected), rtol=1e-4, atol=1e-4 / damping)
        per_micro_batch = _normalised([first[name] * controller.masks[name], (total[name] - first[name])], firsts)
        assert not torch.allclose(inverse, torch.linalg.inv(_block_fishers(per_micro_batch, 16, 3, damping)),
                                  rtol=1e-2, atol=1e-2 / damping)


@pytest.mark.parametrize("update_weights", [True, False])
def test_obs_prunes_to_the_target_with_exact_zeros(update_weights):
    model, controller, optimizer = _obs_mlp(obs_num_grads=4, obs_update_weights=update_weights)
    generator = torch.Generator().manual_seed(0)
    for _ in range(25):
        for _ in range(1):
            mlp_loss(model, generator).backward()
        controller.before_optimizer_step()
        optimizer.step()
        stepped = {n: p.detach().clone() for n, p in controller.params.items()}
        masks = {n: m.clone() for n, m in controller.masks.items()}
        stats = controller.on_optimizer_step()
        optimizer.zero_grad(set_to_none=True)
        assert_masked_weights_zero(controller)
        kept_moved = any(not torch.equal(p.detach()[controller.masks[n]], stepped[n][controller.masks[n]])
                         for n, p in controller.params.items())
        assert kept_moved == (stats is not None and update_weights), controller.step
        if stats is None:
            assert all(torch.equal(masks[n], m) for n, m in controller.masks.items())
    assert controller.report()["selected"]["sparsity"] == pytest.approx(0.8, abs=1e-3)


def test_obs_removes_a_large_weight_without_curvature_where_magnitude_removes_a_small_one():
    def prune(score: str) -> list[bool]:
        model = nn.Sequential(nn.Linear(4, 1, bias=False))
        with torch.no_grad():
            model[0].weight.copy_(torch.tensor([[1.0, 0.1, 0.5, 0.6]]))
        gmp = _obs(score=score, end_step=8, frequency=8, obs_block_size=4, obs_num_grads=8, obs_damping=1e-4)
        controller = SparsityController(model, SparsityConfig(sparsity=0.25, include=["weight$"], init="magnitude"),
                                        gmp=gmp)
        controller.attach_optimizer(torch.optim.SGD(model.parameters(), lr=0.0))  # weights stay as set
        generator = torch.Generator().manual_seed(0)
        for _ in range(8):  # the loss never moves with the large weight: no curvature there
            model[0].weight.grad = torch.randn(1, 4, generator=generator) * torch.tensor([0.0, 1.0, 1.0, 1.0])
            controller.on_optimizer_step()
        return controller.masks["0.weight"].flatten().tolist()

    assert prune("magnitude") == [True, False, True, True]
    assert prune("obs") == [False, True, True, True]


def test_finish_schedule_prunes_to_the_target_with_obs():
    model, controller, optimizer = _obs_mlp(obs_num_grads=4)
    for _ in range(3):  # fp16 skipped steps: the prune at step 20 never comes
        controller.on_optimizer_step(skipped=True)
    generator = torch.Generator().manual_seed(0)
    for _ in range(17):
        _step(model, controller, optimizer, generator)
    assert controller.report()["selected"]["sparsity"] < 0.8 - 1e-3
    stats = controller.finish_schedule()
    assert stats is not None and stats["gmp/sparsity"] == pytest.approx(0.8, abs=1e-3)
    assert_masked_weights_zero(controller)


def test_the_fisher_is_not_checkpointed_and_restarts_after_a_resume(tmp_path):
    model, controller, optimizer = _obs_mlp(obs_num_grads=4)
    generator = torch.Generator().manual_seed(0)
    for _ in range(8):  # window of the prune at 10: steps 7-10
        _step(model, controller, optimizer, generator)
    assert controller.score._seen == 2
    save_sparsity_state(tmp_path, controller.state_dict())
    state = load_sparsity_state(tmp_path)
    assert set(state) == {"step", "masks", "initial_masks"}

    controller.load_state_dict(state)  # into a controller that had gathered gradients: they are dropped
    _step(model, controller, optimizer, generator)
    assert controller.score._seen == 1

    restored_model = make_mlp()
    restored_model.load_state_dict(model.state_dict())
    restored = SparsityController(restored_model, SparsityConfig(sparsity=0.8, include=["weight$"], init="magnitude"),
                                  gmp=controller.gmp)
    restored.load_state_dict(state)
    optimizer = torch.optim.SGD(restored_model.parameters(), lr=0.05)
    restored.attach_optimizer(optimizer)
    _step(restored_model, restored, optimizer, generator)
    assert restored.step == 9 and restored.score._seen == 1  # only the gradient seen since the resume
    _, stats = _step(restored_model, restored, optimizer, generator)
    assert stats is not None and restored.score._seen == 2
    assert_masked_weights_zero(restored)


def test_tiny_bert_pruned_with_obs_keeps_its_masks_exact():
    model = make_tiny_bert()
    # block size 50: 32 x 32 = 1024 and 64 x 32 = 2048 weights end in padded blocks
    controller = SparsityController(model, SparsityConfig(sparsity=0.8, init="magnitude"),
                                    gmp=_obs(end_step=6, frequency=2, obs_num_grads=2, obs_block_size=50,
                                             global_ranking=True))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    controller.attach_optimizer(optimizer)
    generator = torch.Generator().manual_seed(0)
    prunes = 0
    for _ in range(8):
        bert_loss(model, generator).backward()
        controller.before_optimizer_step()
        optimizer.step()
        prunes += controller.on_optimizer_step() is not None
        optimizer.zero_grad(set_to_none=True)
        assert_masked_weights_zero(controller)
    assert prunes == 3
    assert controller.report()["selected"]["sparsity"] == pytest.approx(0.8, abs=1e-3)


@pytest.mark.parametrize("score", ["movement", "obs"])
def test_the_score_follows_the_weights_to_their_device(score):
    model = make_mlp()
    controller = SparsityController(model, SparsityConfig(sparsity=0.8, include=["weight$"]),
                                    gmp=_obs(score=score, end_step=10))
    moves = []
    to = controller.score.to
    controller.score.to = moves.append
    controller.follow_model_device()  # what the Trainer calls once it has moved the model
    assert moves == [torch.device("cpu")]
    to(torch.device("meta"))  # CUDA's stand-in on a CPU machine: the score's tensors go there
    held = controller.score.accumulated if score == "movement" else controller.score._inverse
    assert {t.device.type for t in held.values()} == {"meta"}


class _HostReads(TorchDispatchMode):
    """Counts the operators that, on a GPU, would wait for it to read a value back to the host."""

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in ("_local_scalar_dense", "nonzero", "masked_select", "item"):
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_observing_a_step_reads_nothing_back_to_the_host():
    model, controller, _ = _obs_mlp(obs_num_grads=4)
    params = {n: p.detach() for n, p in controller.params.items()}
    grads = {n: torch.randn_like(p) for n, p in params.items()}
    controller.score.observe(17, params, grads)  # allocates the inverse (once, outside the per-step path)
    with _HostReads() as mode:
        assert controller.score.observes(18)
        controller.score.observe(18, params, grads)
    assert mode.reads == []


def test_the_memory_is_logged_and_refused_when_it_does_not_fit(caplog, monkeypatch):
    model = _linear(10, 12)
    params = dict(model.named_parameters())
    gmp = _obs(end_step=4, obs_block_size=8)
    with caplog.at_level(logging.INFO, logger="sparsebert.sparsity.scores"):
        score = make_score(gmp, params, 4, free_memory=lambda device: 10**9)
    assert score.memory_bytes == 15 * 8 * 8 * 4  # 120 weights in 15 blocks of 8
    assert f"take {score.memory_bytes} bytes" in caplog.text and "live on" not in caplog.text  # not yet allocated
    with caplog.at_level(logging.INFO, logger="sparsebert.sparsity.scores"):
        score.to(torch.device("cpu"))
    assert "the block Fisher inverses live on cpu" in caplog.text

    with pytest.raises(ValueError) as err:
        make_score(gmp, params, 4, free_memory=lambda device: 1000)
    message = str(err.value)
    assert "\n" not in message and "1000 bytes" in message and "lower gmp.obs_block_size" in message
    needed = int(message.split(" needs ")[1].split(" bytes")[0])
    assert needed >= score.memory_bytes

    def cpu_only(device: torch.device) -> int:
        return 10**9 if device.type == "cpu" else 10
    moving = make_score(gmp, params, 4, free_memory=cpu_only)
    with pytest.raises(ValueError, match="on meta .* but 10 bytes"):  # checked again where the weights go
        moving.to(torch.device("meta"))

    monkeypatch.setattr("sparsebert.sparsity.scores.available_memory", lambda device: 1000)
    with pytest.raises(ValueError, match="gmp.obs_block_size"):  # the controller's default probe
        SparsityController(model, SparsityConfig(include=["weight$"]), gmp=gmp)


def test_the_inverse_of_minilm_l6_takes_about_2_gb():
    layer = [384 * 384] * 4 + [384 * 1536] * 2
    assert obs_memory_bytes(layer * 6, 50) == pytest.approx(2.12e9, rel=0.01)


@pytest.mark.parametrize(("settings", "message"), [
    ({"obs_block_size": 0}, "gmp.obs_block_size must be a positive integer"),
    ({"obs_num_grads": 2.5}, "gmp.obs_num_grads must be a positive integer"),
    ({"obs_damping": 0.0}, "gmp.obs_damping must be a positive number"),
    ({"obs_damping": float("nan")}, "gmp.obs_damping must be a positive number"),
    ({"obs_update_weights": "yes"}, "gmp.obs_update_weights must be true or false"),
])
def test_obs_settings_are_validated(settings, message):
    with pytest.raises(ValueError) as err:
        _obs(**settings).validate()
    assert str(err.value).startswith(message)


def test_obs_is_refused_with_rigl_and_with_two_four(mlp):
    config = SparsityConfig(sparsity=0.8, include=["weight$"], init="magnitude")
    with pytest.raises(ValueError, match=r'^rigl with gmp\.score "obs" is not supported'):
        SparsityController(mlp, config, rigl=RigLConfig(end_step=10), gmp=_obs(end_step=10))
    two_four = SparsityConfig(sparsity=0.5, include=[r"^2\.weight$"], init="magnitude", pattern="2:4")
    with pytest.raises(ValueError, match="2:4"):
        SparsityController(mlp, two_four, gmp=_obs(end_step=10))


def test_the_damping_is_relative_so_a_small_loss_does_not_turn_obs_into_magnitude_pruning():
    # the same gradients at the scale of a distillation loss (1e-6) and at the scale of a task loss: the same
    # ranking, where an absolute damping would rank the small ones by |w| alone
    model = _linear(4, 10)
    weight = model[0].weight
    generator = torch.Generator().manual_seed(5)
    grads = [torch.randn(4, 10, generator=generator) * torch.linspace(0.1, 3, 10) for _ in range(8)]
    masks = {"0.weight": torch.ones_like(weight, dtype=torch.bool)}
    ranks = []
    for scale in (1.0, 1e-6):
        score = _observed_score(model, [g * scale for g in grads], block_size=5, num_grads=8)
        ranks.append(score.scores({"0.weight": weight}, masks)["0.weight"].flatten().argsort())
    assert torch.equal(ranks[0], ranks[1])
    assert not torch.equal(ranks[0], weight.detach().abs().flatten().argsort())
