"""RigL: exact schedule, exact per-layer mask arithmetic, and the invariants during a real training loop."""

from __future__ import annotations

import math

import pytest
import torch
from sparsity_helpers import assert_masked_weights_zero, bert_loss, make_mlp, make_tiny_bert, mlp_loss, train

from sparsebert.sparsity import (
    RigLConfig,
    SparsityConfig,
    SparsityController,
    rigl_drop_fraction,
    rigl_global_change,
    rigl_layer_change,
    rigl_update_due,
)
from sparsebert.sparsity.masks import make_generator, top_k_indices


def test_cosine_drop_fraction_schedule():
    config = RigLConfig(drop_fraction=0.3, begin_step=10, drop_schedule="cosine")
    assert rigl_drop_fraction(10, config, 110) == pytest.approx(0.3)
    assert rigl_drop_fraction(35, config, 110) == pytest.approx(0.15 * (1 + math.cos(math.pi / 4)))
    assert rigl_drop_fraction(60, config, 110) == pytest.approx(0.15)
    assert rigl_drop_fraction(110, config, 110) == pytest.approx(0.0)


def test_constant_drop_fraction_schedule():
    config = RigLConfig(drop_fraction=0.3, begin_step=10, drop_schedule="constant")
    assert [rigl_drop_fraction(t, config, 110) for t in (10, 60, 109)] == [0.3, 0.3, 0.3]


def test_update_steps_are_multiples_of_update_freq_in_begin_end():
    config = RigLConfig(update_freq=10, begin_step=10)
    assert [t for t in range(0, 80) if rigl_update_due(t, config, end_step=50)] == [10, 20, 30, 40]
    every_7 = RigLConfig(update_freq=7)
    assert [t for t in range(1, 30) if rigl_update_due(t, every_7, end_step=100)] == [7, 14, 21, 28]


def test_layer_change_drops_smallest_weights_and_grows_largest_gradients():
    weight = torch.tensor([0.5, -0.1, 0.0, 0.9, 0.2, 0.0, 0.0, -0.3])
    mask = torch.tensor([True, True, False, True, True, False, False, True])
    # position 1 (dropped) has the largest gradient of all: it must not be regrown in the same update
    grad = torch.tensor([0.0, 9.0, 0.1, 0.0, 0.0, 5.0, 3.0, 0.0])
    generator = make_generator(0, 1, weight.device)
    change = rigl_layer_change(weight, grad, mask, 0.4, generator)  # moves round(0.4·5) = 2
    assert change.dropped.nonzero().flatten().tolist() == [1, 4]
    assert change.grown.nonzero().flatten().tolist() == [5, 6]
    assert not (change.dropped & change.grown).any()


def test_layer_change_cannot_grow_more_than_was_inactive():
    weight = torch.arange(1.0, 11.0)
    mask = torch.ones(10, dtype=torch.bool)
    mask[0] = False
    change = rigl_layer_change(weight, torch.ones(10), mask, 0.5, make_generator(0, 1, weight.device))
    assert int(change.dropped.sum()) == int(change.grown.sum()) == 1


def test_ties_are_broken_by_the_seeded_generator():
    weight = torch.ones(1000)
    mask = torch.rand(1000, generator=torch.Generator().manual_seed(0)) < 0.5
    grad = torch.zeros(1000)  # every inactive position ties

    def grown(seed: int, step: int) -> torch.Tensor:
        return rigl_layer_change(weight, grad, mask, 0.2, make_generator(seed, step, weight.device)).grown

    assert torch.equal(grown(1, 5), grown(1, 5))
    assert not torch.equal(grown(1, 5), grown(1, 6))
    assert not torch.equal(grown(2, 5), grown(1, 5))


def test_global_change_ranks_across_layers():
    weights = {"a": torch.full((10,), 0.01), "b": torch.full((10,), 1.0)}
    masks = {"a": torch.arange(10) < 5, "b": torch.arange(10) < 5}
    grads = {"a": torch.zeros(10), "b": torch.ones(10)}
    changes = rigl_global_change(weights, grads, masks, 0.4, make_generator(0, 1, torch.device("cpu")))
    # 4 moves in total: the smallest weights are all in "a", the largest gradients all in "b"
    assert int(changes["a"].dropped.sum()) == 4 and int(changes["a"].grown.sum()) == 0
    assert int(changes["b"].dropped.sum()) == 0 and int(changes["b"].grown.sum()) == 4
    assert not (changes["b"].grown & masks["b"]).any()


def _bert_rigl(seed: int = 42, **rigl_kwargs):
    model = make_tiny_bert()
    rigl = RigLConfig(update_freq=5, end_step=60, drop_fraction=0.3, **rigl_kwargs)
    controller = SparsityController(model, SparsityConfig(sparsity=0.8), rigl=rigl, seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    controller.attach_optimizer(optimizer)
    return model, controller, optimizer


def test_training_loop_keeps_density_zeros_and_clean_optimizer_state():
    model, controller, optimizer = _bert_rigl()
    expected_active = {n: int(m.sum()) for n, m in controller.masks.items()}
    assert expected_active["bert.encoder.layer.0.intermediate.dense.weight"] == round(0.2 * 64 * 32)
    updates = []
    previous = {n: m.clone() for n, m in controller.masks.items()}

    def check(stats):
        assert_masked_weights_zero(controller)
        assert {n: int(m.sum()) for n, m in controller.masks.items()} == expected_active
        if stats is None:
            assert all(torch.equal(previous[n], controller.masks[n]) for n in previous)
            return
        updates.append(controller.step)
        moved_total = 0
        for name, mask in controller.masks.items():
            param = controller.params[name]
            grown = mask & ~previous[name]
            dropped = previous[name] & ~mask
            assert int(grown.sum()) == int(dropped.sum()) == stats[f"rigl/moved/{name}"]
            moved_total += int(grown.sum())
            state = optimizer.state[param]
            assert torch.all(state["exp_avg"][grown | dropped] == 0)
            assert torch.all(state["exp_avg_sq"][grown | dropped] == 0)
            assert torch.all(param.detach()[grown] == 0)  # grown weights start at 0
            previous[name] = mask.clone()
        assert stats["rigl/moved_total"] == moved_total > 0
        assert 0 < stats["rigl/mask_changed_since_start"] < 1

    train(model, controller, optimizer, 70, bert_loss, check)
    assert updates == list(range(5, 60, 5))
    # stale optimizer state never revives a masked weight, even many steps after it was dropped
    assert_masked_weights_zero(controller)
    assert any(not torch.equal(controller.initial_masks[n], controller.masks[n]) for n in controller.masks)


def test_regrown_weights_become_nonzero_after_the_next_step():
    model, controller, optimizer = _bert_rigl()
    name = "bert.encoder.layer.1.intermediate.dense.weight"
    grown = []

    def remember(stats):
        if stats is not None and not grown:
            grown.append(controller.masks[name] & ~controller.initial_masks[name])

    train(model, controller, optimizer, 6, bert_loss, remember)
    assert grown and grown[0].any()
    assert (controller.params[name].detach()[grown[0]] != 0).float().mean() > 0.9


def test_drop_fraction_is_logged_per_the_schedule():
    model, controller, optimizer = _bert_rigl(drop_schedule="constant")
    logged = []
    train(model, controller, optimizer, 12, bert_loss, lambda s: logged.append(s and s["rigl/drop_fraction"]))
    assert logged[4] == logged[9] == 0.3 and logged[0] is None


def test_global_ranking_keeps_the_total_and_zeros():
    model, controller, optimizer = _bert_rigl(global_ranking=True)
    total = sum(int(m.sum()) for m in controller.masks.values())
    train(
        model,
        controller,
        optimizer,
        30,
        bert_loss,
        lambda _: (assert_masked_weights_zero(controller), None)[1],
    )
    assert sum(int(m.sum()) for m in controller.masks.values()) == total


def test_same_seed_gives_same_masks_after_training():
    runs = []
    for seed in (7, 7, 8):
        model, controller, optimizer = _bert_rigl(seed=seed)
        initial = {n: m.clone() for n, m in controller.masks.items()}
        train(model, controller, optimizer, 20, bert_loss)
        runs.append((initial, controller.masks))
    for first, second in zip(runs[0], runs[1]):
        assert all(torch.equal(first[n], second[n]) for n in first)
    assert not all(torch.equal(runs[0][0][n], runs[2][0][n]) for n in runs[0][0])


def test_equal_shaped_layers_get_different_random_masks():
    _, controller, _ = _bert_rigl()
    q = controller.masks["bert.encoder.layer.0.attention.self.query.weight"]
    k = controller.masks["bert.encoder.layer.0.attention.self.key.weight"]
    assert not torch.equal(q, k)


def test_rigl_needs_gradients_and_the_optimizer():
    model = make_mlp()
    controller = SparsityController(
        model, SparsityConfig(include=["weight$"]), rigl=RigLConfig(update_freq=1, end_step=10)
    )
    with pytest.raises(RuntimeError, match="attach_optimizer"):
        controller.on_optimizer_step()
    controller.attach_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match="found no gradient"):
        controller.on_optimizer_step()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    controller.attach_optimizer(optimizer)
    mlp_loss(model, torch.Generator().manual_seed(0)).backward()
    assert controller.on_optimizer_step()["rigl/moved_total"] > 0


def test_top_k_breaks_exact_ties_uniformly():
    # 5 of 20 tied entries over 2000 seeded draws: each entry is picked ~500 times (binomial sd ~19)
    scores = torch.zeros(20)
    eligible = torch.ones(20, dtype=torch.bool)
    counts = torch.zeros(20)
    for seed in range(2000):
        counts[top_k_indices(scores, eligible, 5, make_generator(seed, 1, scores.device))] += 1
    assert counts.sum() == 5 * 2000
    assert counts.min() > 420 and counts.max() < 580, counts.tolist()


def test_top_k_keeps_the_order_of_unequal_scores():
    negative_nan = -torch.tensor(float("nan")).abs()  # -|w| of a NaN weight: the sign bit set
    scores = torch.tensor([-3.0, -0.0, 0.0, 2.5, -1e-30, float("-inf"), 1e-30, -2.0, negative_nan, 7.0])
    eligible = torch.tensor([True, True, True, True, True, True, True, True, True, False])
    generator = make_generator(0, 1, scores.device)
    picked = top_k_indices(scores, eligible, 6, generator)
    # NaN first (ranked as +inf, whatever its sign bit), then 2.5, 1e-30, the two zeros (a tie), -1e-30; never 9
    assert sorted(picked.tolist()) == [1, 2, 3, 4, 6, 8]
    everything = top_k_indices(scores, eligible, 9, generator)
    assert sorted(everything.tolist()) == [0, 1, 2, 3, 4, 5, 6, 7, 8]  # -inf included, the ineligible 7.0 not
    with pytest.raises(ValueError, match="cannot pick 10 of 9"):
        top_k_indices(scores, eligible, 10, generator)


def test_the_sort_and_the_topk_path_pick_the_same_entries():
    from sparsebert.sparsity.masks import _largest

    keys = torch.randperm(5000, generator=torch.Generator().manual_seed(0)).to(torch.int64) * 7919 - 10**6
    by_topk = _largest(keys, 300)
    by_sort = torch.sort(keys, descending=True).indices[:300]  # what _largest runs on CUDA
    assert sorted(by_topk.tolist()) == sorted(by_sort.tolist())


def test_minus_zero_and_zero_are_one_tie():
    # -|w| of a just-regrown weight is -0.0; it must tie with +0.0 rather than rank below it
    scores = torch.tensor([-0.0, 0.0, -1.0, -2.0])
    eligible = torch.ones(4, dtype=torch.bool)
    picks = [top_k_indices(scores, eligible, 1, make_generator(seed, 1, scores.device)).item() for seed in range(400)]
    assert set(picks) == {0, 1}
    assert 150 < picks.count(0) < 250


def test_grow_init_normal_draws_regrown_weights_at_the_kept_weights_scale():
    """rigl.grow_init "normal": regrown weights start non-zero, at the std of the layer's kept weights, with
    empty optimizer state, and the same seed draws the same values (every DDP rank must)."""

    def one_update(grow_init: str):
        model = make_mlp()
        controller = SparsityController(
            model, SparsityConfig(include=[r"^[02]\.weight$"], sparsity=0.5),
            rigl=RigLConfig(update_freq=1, end_step=10, drop_fraction=0.3, grow_init=grow_init), seed=3,
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        controller.attach_optimizer(optimizer)
        mlp_loss(model, torch.Generator().manual_seed(0)).backward()
        optimizer.step()
        before = {n: m.clone() for n, m in controller.masks.items()}
        controller.on_optimizer_step()
        return controller, optimizer, before

    zeros, _, _ = one_update("zeros")
    controller, optimizer, before = one_update("normal")
    again, _, _ = one_update("normal")
    for name, param in controller.params.items():
        grown = controller.masks[name] & ~before[name]
        kept = controller.masks[name] & before[name]
        assert grown.sum() > 20
        assert torch.equal(controller.masks[name], zeros.masks[name])  # the init does not change the selection
        values = param.detach()[grown]
        assert torch.all(values != 0) and torch.all(zeros.params[name].detach()[grown] == 0)
        ratio = float(values.std() / param.detach()[kept].std())
        assert 0.7 < ratio < 1.4, ratio
        assert torch.all(optimizer.state[param]["exp_avg"][grown] == 0)
        assert torch.equal(param, again.params[name])
    assert_masked_weights_zero(controller)


def _regrown_and_kept_steps(grow_second_moment: str, lr: float = 1e-3) -> tuple[float, float]:
    """Train a 50 %-sparse MLP 200 steps, move 30 % of its weights once (step 200), then take 20 more steps.

    Returns:
        the largest step of a regrown weight, and the largest step of a weight active throughout, in units of lr.
    """
    model = make_mlp()
    rigl = RigLConfig(update_freq=200, end_step=201, drop_fraction=0.3, drop_schedule="constant",
                      grow_second_moment=grow_second_moment)
    controller = SparsityController(model, SparsityConfig(include=[r"^[02]\.weight$"], sparsity=0.5), rigl=rigl)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    controller.attach_optimizer(optimizer)
    masks = []
    train(model, controller, optimizer, 200, mlp_loss, lambda stats: stats and masks.append(dict(controller.masks)))
    assert len(masks) == 1
    before = {name: param.detach().clone() for name, param in controller.params.items()}
    grown_steps, kept_steps = [], []
    for data_seed in range(20):
        train(model, controller, optimizer, 1, mlp_loss, data_seed=data_seed)
        for name, param in controller.params.items():
            grown = masks[0][name] & ~controller.initial_masks[name]
            kept = masks[0][name] & controller.initial_masks[name]
            step = (param.detach() - before[name]).abs() / lr
            grown_steps.append(float(step[grown].max()))
            kept_steps.append(float(step[kept].max()))
            before[name] = param.detach().clone()
    return max(grown_steps), max(kept_steps)


def test_grow_second_moment_sets_the_size_of_a_regrown_weights_first_steps():
    """Adam's step count is one per tensor, so a regrown weight with an empty second moment (the default) is not
    bias-corrected for its own age: its first steps are several lr where a weight active throughout takes at most
    ~lr. "layer_mean" starts its second moment at the layer's mean over the kept weights: ordinary steps."""
    grown_empty, kept_empty = _regrown_and_kept_steps("zeros")
    assert grown_empty > 2 * kept_empty
    grown, kept = _regrown_and_kept_steps("layer_mean")
    assert grown <= kept < 1.5, (grown, kept)


def test_layer_mean_seeds_the_second_moment_of_grown_weights_only():
    model, controller, optimizer = _bert_rigl(grow_second_moment="layer_mean")
    previous = {n: m.clone() for n, m in controller.masks.items()}
    checked = []

    def check(stats):
        if stats is None:
            return
        for name, mask in controller.masks.items():
            grown, dropped = mask & ~previous[name], previous[name] & ~mask
            state = optimizer.state[controller.params[name]]
            first, second = state["exp_avg"], state["exp_avg_sq"]
            assert torch.all(first[grown | dropped] == 0) and torch.all(second[dropped] == 0)
            assert torch.allclose(second[grown], second[mask & ~grown].mean().expand(int(grown.sum())))
            previous[name] = mask.clone()
        checked.append(controller.step)

    train(model, controller, optimizer, 12, bert_loss, check)
    assert checked == [5, 10]


def test_grow_init_must_be_known():
    with pytest.raises(ValueError, match="rigl.grow_init"):
        RigLConfig(grow_init="uniform").validate()
    with pytest.raises(ValueError, match="rigl.grow_second_moment"):
        RigLConfig(grow_second_moment="ones").validate()
