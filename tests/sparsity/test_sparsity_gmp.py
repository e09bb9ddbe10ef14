"""Gradual magnitude pruning: exact cubic schedule and reaching the per-layer target."""

from __future__ import annotations

import pytest
import torch
from sparsity_helpers import assert_masked_weights_zero, make_mlp, mlp_loss, train

from sparsebert.sparsity import GMPConfig, SparsityConfig, SparsityController, gmp_sparsity, gmp_update_due


def test_cubic_schedule_values():
    assert gmp_sparsity(0, 0.0, 0.8, 0, 100) == 0.0
    assert gmp_sparsity(50, 0.0, 0.8, 0, 100) == pytest.approx(0.8 - 0.8 * 0.5**3)
    assert gmp_sparsity(75, 0.2, 0.8, 50, 150) == pytest.approx(0.8 - 0.6 * 0.75**3)
    assert gmp_sparsity(100, 0.0, 0.8, 0, 100) == pytest.approx(0.8)
    assert gmp_sparsity(10, 0.3, 0.9, 20, 40) == 0.3  # before begin
    assert gmp_sparsity(99, 0.3, 0.9, 20, 40) == pytest.approx(0.9)  # after end


def test_prune_steps_include_the_end_step():
    config = GMPConfig(begin_step=5, frequency=10)
    assert [t for t in range(60) if gmp_update_due(t, config, end_step=47)] == [5, 15, 25, 35, 45, 47]


def _mlp_gmp(initial_sparsity: float = 0.0, distribution: str = "uniform"):
    model = make_mlp()
    gmp = GMPConfig(initial_sparsity=initial_sparsity, begin_step=0, end_step=40, frequency=10)
    config = SparsityConfig(sparsity=0.8, include=["weight$"], distribution=distribution, init="magnitude")
    controller = SparsityController(model, config, gmp=gmp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    controller.attach_optimizer(optimizer)
    return model, controller, optimizer


def test_gmp_starts_at_initial_sparsity():
    _, controller, _ = _mlp_gmp(initial_sparsity=0.5)
    assert {n: int(m.sum()) for n, m in controller.masks.items()} == {
        "0.weight": 256,
        "2.weight": 512,
        "4.weight": 64,
    }


def test_gmp_follows_the_schedule_and_reaches_the_target():
    model, controller, optimizer = _mlp_gmp()
    assert all(m.all() for m in controller.masks.values())  # initial sparsity 0: dense
    history = {}

    def check(stats):
        assert_masked_weights_zero(controller)
        if stats is not None:
            history[controller.step] = (
                stats["gmp/sparsity"],
                {n: m.clone() for n, m in controller.masks.items()},
            )

    train(model, controller, optimizer, 50, mlp_loss, check)
    assert sorted(history) == [10, 20, 30, 40]
    for step, (logged, masks) in history.items():
        target = gmp_sparsity(step, 0.0, 0.8, 0, 40)
        for name, mask in masks.items():
            assert int(mask.sum()) == round((1 - target) * mask.numel()), (step, name)
        assert logged == pytest.approx(target, abs=1e-2)
    # pruning is permanent: every mask is a subset of the previous one
    steps = sorted(history)
    for before, after in zip(steps, steps[1:]):
        for name in history[after][1]:
            assert not (history[after][1][name] & ~history[before][1][name]).any()
    assert history[40][0] == pytest.approx(0.8, abs=1e-3)
    assert controller.report()["selected"]["sparsity"] == pytest.approx(0.8, abs=1e-3)


def test_gmp_prunes_the_smallest_weights():
    model = make_mlp()
    weight = model[2].weight
    with torch.no_grad():
        weight.copy_(torch.arange(1, weight.numel() + 1, dtype=torch.float32).view_as(weight))
    gmp = GMPConfig(end_step=1, frequency=1)
    controller = SparsityController(model, SparsityConfig(sparsity=0.75, include=[r"^2\.weight$"]), gmp=gmp)
    controller.attach_optimizer(torch.optim.SGD(model.parameters(), lr=0.0))
    controller.on_optimizer_step()
    assert controller.masks["2.weight"].flatten().nonzero().flatten().tolist() == list(range(768, 1024))


def test_gmp_uses_per_layer_targets_of_the_distribution():
    model, controller, optimizer = _mlp_gmp(distribution="erk")
    train(model, controller, optimizer, 40, mlp_loss)
    for name, density in controller.target_densities.items():
        assert int(controller.masks[name].sum()) == round(density * controller.masks[name].numel())
    assert len(set(controller.target_densities.values())) > 1


def test_a_schedule_cut_short_by_skipped_steps_still_ends_at_the_target():
    # skipped fp16 steps are not controller steps, but the Trainer counts them towards max_steps: here 3 of the
    # 40 steps of a schedule ending at step 40 were skipped, so the last prune (at step 40) never came
    model, controller, optimizer = _mlp_gmp()
    for _ in range(3):
        controller.on_optimizer_step(skipped=True)
    train(model, controller, optimizer, 37, mlp_loss)
    assert controller.step == 37
    before = controller.report()["selected"]["sparsity"]
    assert before < 0.8 - 1e-3
    stats = controller.finish_schedule()
    assert stats is not None and stats["gmp/sparsity"] == pytest.approx(0.8, abs=1e-3)
    assert_masked_weights_zero(controller)
    controller.finish_schedule()  # again: the same target, nothing more pruned
    assert controller.report()["selected"]["sparsity"] == pytest.approx(0.8, abs=1e-3)


def test_finish_schedule_is_a_no_op_once_the_schedule_ran_to_its_end():
    model, controller, optimizer = _mlp_gmp()
    train(model, controller, optimizer, 40, mlp_loss)
    masks = {n: m.clone() for n, m in controller.masks.items()}
    assert controller.finish_schedule() is None
    assert all(torch.equal(masks[n], m) for n, m in controller.masks.items())
