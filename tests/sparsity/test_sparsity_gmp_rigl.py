"""GMP and RigL together (GraNet's gradual pruning with regrowth): GMP sets how many weights stay, RigL moves some
of them between prunes, on a toy MLP."""

from __future__ import annotations

import pytest
import torch
from sparsity_helpers import assert_masked_weights_zero, make_mlp, mlp_loss, train

from sparsebert.sparsity import GMPConfig, RigLConfig, SparsityConfig, SparsityController, gmp_sparsity


def _mlp_gmp_rigl(gmp_score: str = "magnitude"):
    model = make_mlp()
    gmp = GMPConfig(begin_step=10, end_step=40, frequency=10, score=gmp_score)
    rigl = RigLConfig(update_freq=5, end_step=60, drop_fraction=0.3)
    config = SparsityConfig(sparsity=0.8, include=["weight$"], init="magnitude")
    controller = SparsityController(model, config, rigl=rigl, gmp=gmp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    controller.attach_optimizer(optimizer)
    return model, controller, optimizer


def test_gmp_sets_the_counts_and_rigl_moves_weights_back_in():
    model, controller, optimizer = _mlp_gmp_rigl()
    previous = {n: m.clone() for n, m in controller.masks.items()}
    seen: dict[int, set[str]] = {}
    regrown_after_pruning = 0

    def check(stats):
        nonlocal regrown_after_pruning
        assert_masked_weights_zero(controller)
        step = controller.step
        # every layer holds the count of GMP's last prune (its cubic schedule) whatever RigL moved since
        last_prune = max([s for s in (10, 20, 30, 40) if s <= step], default=0)
        target = gmp_sparsity(last_prune, 0.0, 0.8, 10, 40)
        for name, mask in controller.masks.items():
            assert int(mask.sum()) == round((1 - target) * mask.numel()), (step, name)
        if stats is None:
            return
        seen[step] = {key.split("/")[0] for key in stats}
        for name, mask in controller.masks.items():
            grown = mask & ~previous[name]
            assert torch.all(controller.params[name].detach()[grown] == 0)  # regrown weights start at 0
            if step > 10:
                regrown_after_pruning += int(grown.sum())
            previous[name] = mask.clone()

    train(model, controller, optimizer, 70, mlp_loss, check)
    # both schedules ran: prunes every 10 steps from 10 to 40, moves every 5 steps until 60
    assert seen == {step: ({"gmp"} if step in (10, 20, 30, 40) else set()) | ({"rigl"} if step < 60 else set())
                    for step in range(5, 60, 5)}
    # weights came back after being pruned: unlike GMP alone, pruning is not permanent
    assert regrown_after_pruning > 0
    assert controller.report()["selected"]["sparsity"] == pytest.approx(0.8, abs=1e-3)


def test_rigl_does_nothing_while_the_layers_are_dense():
    model, controller, optimizer = _mlp_gmp_rigl()
    logged = []
    train(model, controller, optimizer, 5, mlp_loss, logged.append)
    assert logged[-1]["rigl/moved_total"] == 0.0  # step 5: nothing inactive to grow into
    assert all(m.all() for m in controller.masks.values())


def test_rigl_with_movement_pruning_is_refused():
    with pytest.raises(ValueError, match=r'^rigl with gmp\.score "movement" is not supported'):
        _mlp_gmp_rigl(gmp_score="movement")
