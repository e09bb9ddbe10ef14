"""Gradual pruning by movement scores, global ranking, recovery at fixed masks, and the rewound LR schedule:
exact expected masks on toy models."""

from __future__ import annotations

import pytest
import torch
from sparsity_helpers import assert_masked_weights_zero, make_mlp, mlp_loss, train
from torch import nn

from sparsebert.sparsity import (
    GMPConfig,
    MagnitudeScore,
    SparsityConfig,
    SparsityController,
    rewound_linear_factor,
)
from sparsebert.sparsity.persistence import load_sparsity_state, save_sparsity_state


def _linear(weights: list[list[float]]) -> nn.Sequential:
    model = nn.Sequential(nn.Linear(len(weights[0]), len(weights), bias=False))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor(weights))
    return model


def _one_step_gmp(model: nn.Module, sparsity: float, **gmp) -> SparsityController:
    config = SparsityConfig(sparsity=sparsity, include=["weight$"], init="magnitude")
    end_step = gmp.pop("end_step", 1)  # the one prune comes at end_step
    controller = SparsityController(model, config, gmp=GMPConfig(end_step=end_step, frequency=end_step, **gmp))
    controller.attach_optimizer(torch.optim.SGD(model.parameters(), lr=0.0))  # weights stay as set
    return controller


def test_movement_keeps_the_weights_moving_away_from_zero_not_the_largest():
    model = _linear([[4.0, 3.0, 2.0, 1.0], [-4.0, -3.0, -2.0, -1.0]])
    controller = _one_step_gmp(model, sparsity=0.5, score="movement", end_step=2)
    # S = -(g1 + g2) * w over two steps: the gradient pulls the two largest weights of each row towards zero
    # and pushes the two smallest away from it
    grads = [torch.tensor([[1.0, 1.0, -1.0, -1.0], [-1.0, -1.0, 1.0, 1.0]]),
             torch.tensor([[0.5, 0.5, -0.5, -3.0], [-0.5, -0.5, 0.5, 3.0]])]
    expected_scores = -(grads[0] + grads[1]) * model[0].weight.detach()
    for grad in grads:
        model[0].weight.grad = grad.clone()
        controller.on_optimizer_step()
    assert torch.equal(controller.score.accumulated["0.weight"], expected_scores)
    assert controller.masks["0.weight"].tolist() == [[False, False, True, True], [False, False, True, True]]
    assert_masked_weights_zero(controller)


def test_magnitude_keeps_the_largest_for_the_same_gradients():
    model = _linear([[4.0, 3.0, 2.0, 1.0], [-4.0, -3.0, -2.0, -1.0]])
    controller = _one_step_gmp(model, sparsity=0.5)
    model[0].weight.grad = torch.tensor([[1.0, 1.0, -1.0, -1.0], [-1.0, -1.0, 1.0, 1.0]])
    controller.on_optimizer_step()
    assert isinstance(controller.score, MagnitudeScore)
    assert controller.masks["0.weight"].tolist() == [[True, True, False, False], [True, True, False, False]]


def _two_layers() -> nn.Sequential:
    model = nn.Sequential(nn.Linear(4, 2, bias=False), nn.Linear(2, 2, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 5.0, 6.0]]))
        model[1].weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    return model


def test_global_ranking_prunes_the_layer_of_small_weights_harder():
    per_layer = _one_step_gmp(_two_layers(), sparsity=0.5)
    per_layer.on_optimizer_step()
    assert per_layer.masks["0.weight"].tolist() == [[False, False, False, False], [True, True, True, True]]
    assert per_layer.masks["1.weight"].tolist() == [[False, False], [True, True]]

    controller = _one_step_gmp(_two_layers(), sparsity=0.5, global_ranking=True)
    controller.on_optimizer_step()
    # the 6 largest of 12: 5, 6 of the first layer and all four of the second
    assert controller.masks["0.weight"].tolist() == [[False, False, False, False], [False, False, True, True]]
    assert controller.masks["1.weight"].tolist() == [[True, True], [True, True]]
    assert controller.report()["selected"]["sparsity"] == pytest.approx(0.5)


def _three_layers() -> nn.Sequential:
    """_two_layers with a third layer of tiny weights, which the global ranking would empty at 50 %."""
    model = nn.Sequential(*_two_layers(), nn.Linear(2, 2, bias=False))
    with torch.no_grad():
        model[2].weight.copy_(torch.tensor([[0.01, 0.04], [0.03, 0.02]]))
    return model


def test_a_tensor_sparsity_cap_keeps_each_tensors_best_and_ranks_the_rest_globally():
    free = _one_step_gmp(_three_layers(), sparsity=0.5, global_ranking=True)
    free.on_optimizer_step()
    assert not free.masks["2.weight"].any()  # the tiny layer is emptied without the cap

    capped = _one_step_gmp(_three_layers(), sparsity=0.5, global_ranking=True, max_tensor_sparsity=0.75)
    capped.on_optimizer_step()
    # each tensor keeps ceil(0.25 * numel) of its largest (first layer 2: 5, 6; the others 1: 4.0 and 0.04),
    # and the other 4 of the 8 kept go to the largest of what is left: 3.0, 2.0, 1.0 and 0.6
    assert capped.masks["0.weight"].tolist() == [[False, False, False, False], [False, True, True, True]]
    assert capped.masks["1.weight"].tolist() == [[True, True], [True, True]]
    assert capped.masks["2.weight"].tolist() == [[False, True], [False, False]]
    assert capped.report()["selected"]["sparsity"] == pytest.approx(0.5)
    assert_masked_weights_zero(capped)


def test_a_tensor_already_sparser_than_the_cap_keeps_every_weight_it_has():
    # masks read from a pruned model (sparsity.init zeros): the third layer has 1 weight left, fewer than the 2 the
    # cap keeps per tensor, so it keeps that one and the prune goes on (it used to fail: "cannot pick 2 of 1")
    model = _three_layers()
    with torch.no_grad():
        model[2].weight.copy_(torch.tensor([[0.0, 0.04], [0.0, 0.0]]))
    config = SparsityConfig(sparsity=0.5, include=["weight$"], init="zeros")
    controller = SparsityController(model, config, gmp=GMPConfig(end_step=1, frequency=1, global_ranking=True,
                                                                  max_tensor_sparsity=0.6))
    controller.attach_optimizer(torch.optim.SGD(model.parameters(), lr=0.0))
    controller.on_optimizer_step()
    # kept per tensor: 4 of the first (6, 5, 0.6, 0.5), 2 of the second (4, 3), the third's one; the 8th kept
    # weight is the largest of the rest, 2.0
    assert controller.masks["0.weight"].tolist() == [[False, False, False, False], [True, True, True, True]]
    assert controller.masks["1.weight"].tolist() == [[False, True], [True, True]]
    assert controller.masks["2.weight"].tolist() == [[False, True], [False, False]]
    assert controller.report()["selected"]["sparsity"] == pytest.approx(0.5)


@pytest.mark.parametrize("gmp, message", [
    ({"global_ranking": True, "max_tensor_sparsity": 0.5}, "must exceed the target sparsity"),
    ({"max_tensor_sparsity": 0.9}, "set gmp.global_ranking=true"),
    ({"global_ranking": True, "max_tensor_sparsity": 1.0}, r"must be None or in \(0, 1\)"),
])
def test_a_tensor_sparsity_cap_is_refused_where_it_cannot_hold(gmp, message):
    config = SparsityConfig(sparsity=0.5, include=["weight$"], init="magnitude")
    with pytest.raises(ValueError, match=message):
        SparsityController(make_mlp(), config, gmp=GMPConfig(end_step=10, **gmp))


def test_global_ranking_refuses_a_non_uniform_distribution():
    config = SparsityConfig(sparsity=0.5, include=["weight$"], distribution="erk", init="magnitude")
    with pytest.raises(ValueError, match="gmp.global_ranking"):
        SparsityController(make_mlp(), config, gmp=GMPConfig(end_step=10, global_ranking=True))


def test_global_initial_sparsity_is_ranked_globally():
    model = make_mlp()
    config = SparsityConfig(sparsity=0.8, include=["weight$"], init="magnitude")
    controller = SparsityController(model, config, gmp=GMPConfig(initial_sparsity=0.5, end_step=10,
                                                                 global_ranking=True))
    weights = torch.cat([p.detach().abs().flatten() for p in controller.params.values()])
    kept = torch.cat([controller.masks[n].flatten() for n in controller.params])
    assert int(kept.sum()) == weights.numel() // 2
    assert weights[kept].min() >= weights[~kept].max()  # exactly the largest half of all layers together


def test_masks_stay_fixed_during_recovery_after_pruning_ends():
    model = make_mlp()
    config = SparsityConfig(sparsity=0.8, include=["weight$"], init="magnitude")
    controller = SparsityController(model, config, gmp=GMPConfig(end_step=20, frequency=5, score="movement"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    controller.attach_optimizer(optimizer)
    train(model, controller, optimizer, 20, mlp_loss)
    at_end = {n: m.clone() for n, m in controller.masks.items()}
    scores_at_end = {n: s.clone() for n, s in controller.score.accumulated.items()}
    assert controller.report()["selected"]["sparsity"] == pytest.approx(0.8, abs=1e-3)
    train(model, controller, optimizer, 15, mlp_loss, data_seed=1)  # recovery: 15 more steps
    assert all(torch.equal(at_end[n], m) for n, m in controller.masks.items())
    assert all(torch.equal(scores_at_end[n], s) for n, s in controller.score.accumulated.items())  # not accumulated
    assert_masked_weights_zero(controller)


def test_movement_scores_survive_a_save_and_load(tmp_path):
    model = make_mlp()
    config = SparsityConfig(sparsity=0.8, include=["weight$"], init="magnitude")
    gmp = GMPConfig(end_step=20, frequency=5, score="movement")
    controller = SparsityController(model, config, gmp=gmp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    controller.attach_optimizer(optimizer)
    train(model, controller, optimizer, 7, mlp_loss)
    save_sparsity_state(tmp_path, controller.state_dict())

    restored = SparsityController(make_mlp(), config, gmp=gmp)
    restored.load_state_dict(load_sparsity_state(tmp_path))
    assert restored.step == 7
    assert all(torch.equal(controller.score.accumulated[n], s) for n, s in restored.score.accumulated.items())
    assert all(torch.equal(controller.masks[n], m) for n, m in restored.masks.items())


def test_the_learning_rate_is_rewound_when_pruning_ends():
    factors = [rewound_linear_factor(t, warmup_steps=2, rewind_step=6, total_steps=10) for t in range(11)]
    assert factors == pytest.approx([0.0, 0.5, 1.0, 0.875, 0.75, 0.625, 1.0, 0.75, 0.5, 0.25, 0.0])
