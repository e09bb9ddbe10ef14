"""GMP and RigL together (GraNet's gradual pruning with regrowth): GMP sets how many weights stay, RigL moves some
of them between prunes, on a toy MLP."""

from __future__ import annotations

import pytest
import torch
from sparsity_helpers import assert_masked_weights_zero, make_mlp, mlp_loss, train

from sparsebert.sparsity import GMPConfig, RigLConfig, SparsityConfig, SparsityController, gmp_sparsity

PRUNES = (10, 20, 30, 40)  # GMP every 10 steps from 10 (which prunes nothing: the schedule starts at 0 there)
MOVES = tuple(range(3, 60, 3))  # RigL every 3 steps until 60: with GMP at one step only, 30


def _mlp_gmp_rigl(gmp_score: str = "magnitude", rigl_global: bool = False, **gmp_settings):
    model = make_mlp()
    gmp = GMPConfig(begin_step=10, end_step=40, frequency=10, score=gmp_score, **gmp_settings)
    rigl = RigLConfig(update_freq=3, end_step=60, drop_fraction=0.3, global_ranking=rigl_global)
    config = SparsityConfig(sparsity=0.8, include=["weight$"], init="magnitude")
    controller = SparsityController(model, config, rigl=rigl, gmp=gmp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    controller.attach_optimizer(optimizer)
    return model, controller, optimizer


def test_gmp_sets_the_counts_and_rigl_brings_pruned_weights_back():
    model, controller, optimizer = _mlp_gmp_rigl()
    previous = {n: m.clone() for n, m in controller.masks.items()}
    pruned = {n: torch.zeros_like(m) for n, m in controller.masks.items()}  # dropped at a step only GMP ran
    seen: dict[int, set[str]] = {}
    came_back = 0

    def check(stats):
        nonlocal came_back
        assert_masked_weights_zero(controller)
        step = controller.step
        # every layer holds the count of GMP's last prune (its cubic schedule) whatever RigL moved since
        target = gmp_sparsity(max([s for s in PRUNES if s <= step], default=0), 0.0, 0.8, 10, 40)
        for name, mask in controller.masks.items():
            assert int(mask.sum()) == round((1 - target) * mask.numel()), (step, name)
        if stats is None:
            return
        seen[step] = {key.split("/")[0] for key in stats}
        grown_total = 0
        for name, mask in controller.masks.items():
            grown = mask & ~previous[name]
            assert torch.all(controller.params[name].detach()[grown] == 0)  # regrown weights start at 0
            grown_total += int(grown.sum())
            came_back += int((grown & pruned[name]).sum())
            if "rigl" not in seen[step]:
                pruned[name] |= previous[name] & ~mask
            previous[name] = mask.clone()
        if seen[step] == {"gmp", "rigl"}:
            # GMP prunes first, so weights RigL grows at this step stay (pruned after, as zeros they would all go);
            # some of its moves regrow weights GMP pruned at this very step: those restart at zero too
            assert 0 < grown_total <= stats["rigl/moved_total"]
        elif "rigl" in seen[step]:
            assert grown_total == stats["rigl/moved_total"]

    train(model, controller, optimizer, 70, mlp_loss, check)
    assert seen == {step: ({"gmp"} if step in PRUNES else set()) | ({"rigl"} if step in MOVES else set())
                    for step in sorted(set(PRUNES) | set(MOVES))}
    # unlike GMP alone, pruning is not permanent: RigL regrew weights that GMP had pruned
    assert came_back > 0
    assert controller.report()["selected"]["sparsity"] == pytest.approx(0.8, abs=1e-3)
    # the share of weights moved since the start would count GMP's prunes as moves: not reported
    assert "rigl_changed_since_start" not in controller.report()


def test_rigl_does_nothing_while_the_layers_are_dense():
    model, controller, optimizer = _mlp_gmp_rigl()
    logged = []
    train(model, controller, optimizer, 3, mlp_loss, logged.append)
    assert logged[-1]["rigl/moved_total"] == 0.0  # step 3: nothing inactive to grow into
    assert all(m.all() for m in controller.masks.values())


def test_rigl_with_movement_pruning_is_refused():
    with pytest.raises(ValueError, match=r'^rigl with gmp\.score "movement" is not supported'):
        _mlp_gmp_rigl(gmp_score="movement")


def test_global_rigl_with_per_layer_gmp_is_refused():
    # RigL would move weights between layers and the per-layer prunes could not refill a layer left sparser
    with pytest.raises(ValueError, match=r"^rigl\.global_ranking=true with gmp\.global_ranking=false"):
        _mlp_gmp_rigl(rigl_global=True)


def test_global_rigl_with_a_tensor_sparsity_cap_is_refused():
    # the cap holds when GMP prunes; a global RigL move between prunes could still empty a layer, and the next
    # prune could then not keep the cap's weights in it
    with pytest.raises(ValueError, match=r"^rigl\.global_ranking=true moves weights between layers without "
                                         r"gmp\.max_tensor_sparsity's floor"):
        _mlp_gmp_rigl(rigl_global=True, global_ranking=True, max_tensor_sparsity=0.9)
    _mlp_gmp_rigl(rigl_global=True, global_ranking=True)  # without the cap: allowed
    _mlp_gmp_rigl(global_ranking=True, max_tensor_sparsity=0.9)  # per-layer RigL keeps each layer's count


def test_rigl_must_update_after_pruning_begins():
    model = make_mlp()
    with pytest.raises(ValueError, match=r"^rigl\.end_step \(resolved to 10\) must be > gmp\.begin_step \(10\)"):
        SparsityController(model, SparsityConfig(sparsity=0.8, include=["weight$"]),
                           rigl=RigLConfig(update_freq=2, end_step=10), gmp=GMPConfig(begin_step=10, end_step=40),
                           total_steps=50)
