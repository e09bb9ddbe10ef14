"""SparsityController: masks from the start, skipped steps, checkpoints, recovery from zeros."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors import safe_open
from sparsity_helpers import assert_masked_weights_zero, bert_loss, make_mlp, make_tiny_bert, mlp_loss, train

from sparsebert.sparsity import RigLConfig, SparsityConfig, SparsityController


def _rigl_bert(seed: int = 42):
    model = make_tiny_bert()
    controller = SparsityController(
        model, SparsityConfig(sparsity=0.8), rigl=RigLConfig(update_freq=3, end_step=100), seed=seed
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    controller.attach_optimizer(optimizer)
    return model, controller, optimizer


def _same_masks(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n].cpu(), b[n].cpu()) for n in a)


def test_masks_are_built_and_applied_at_construction(mlp):
    controller = SparsityController(mlp, SparsityConfig(sparsity=0.75, include=["weight$"]))
    assert {n: (m.dtype, int(m.sum())) for n, m in controller.masks.items()} == {
        "0.weight": (torch.bool, 128),
        "2.weight": (torch.bool, 256),
        "4.weight": (torch.bool, 32),
    }
    assert_masked_weights_zero(controller)
    assert all(
        int(torch.count_nonzero(p)) == int(controller.masks[n].sum()) for n, p in controller.params.items()
    )


def test_gradients_the_all_reduce_masked_are_not_masked_again_for_one_step(mlp):
    controller = SparsityController(mlp, SparsityConfig(sparsity=0.75, include=["weight$"]))
    for p in mlp.parameters():
        p.grad = torch.ones_like(p)
    controller.before_optimizer_step(grads_masked=True)  # what the sparse all-reduce reports after averaging
    assert all(bool((p.grad == 1).all()) for p in controller.params.values())  # the masking was skipped
    controller.before_optimizer_step()  # the report holds for one step only
    assert all(torch.equal(p.grad, controller.masks[n].float()) for n, p in controller.params.items())


def test_static_masks_survive_adamw_with_weight_decay(mlp):
    controller = SparsityController(mlp, SparsityConfig(sparsity=0.9, include=["weight$"]))
    optimizer = torch.optim.AdamW(mlp.parameters(), lr=0.05, weight_decay=0.1)
    controller.attach_optimizer(optimizer)
    initial = {n: m.clone() for n, m in controller.masks.items()}
    stats = []
    train(
        mlp,
        controller,
        optimizer,
        20,
        mlp_loss,
        lambda s: (stats.append(s), assert_masked_weights_zero(controller)),
    )
    assert stats == [None] * 20 and controller.step == 20
    assert _same_masks(initial, controller.masks)


def test_magnitude_init_keeps_the_largest_weights(mlp):
    magnitudes = mlp[2].weight.detach().abs().clone()
    controller = SparsityController(
        mlp, SparsityConfig(sparsity=0.5, include=[r"^2\.weight$"], init="magnitude")
    )
    mask = controller.masks["2.weight"]
    assert magnitudes[mask].min() >= magnitudes[~mask].max()


def test_skipped_steps_do_not_count_but_still_mask():
    model, controller, optimizer = _rigl_bert()
    name = next(iter(controller.masks))
    bert_loss(model, torch.Generator().manual_seed(0)).backward()
    for _ in range(2):
        assert controller.on_optimizer_step() is None
    masks_before = {n: m.clone() for n, m in controller.masks.items()}
    with torch.no_grad():
        controller.params[name].fill_(1.0)  # as if a skipped step still wrote into the weights
    for _ in range(5):
        assert controller.on_optimizer_step(skipped=True) is None
    assert controller.step == 2
    assert _same_masks(masks_before, controller.masks)
    assert_masked_weights_zero(controller)
    assert controller.on_optimizer_step() is not None  # step 3 is the first update


def test_state_dict_round_trip():
    model, controller, optimizer = _rigl_bert()
    train(model, controller, optimizer, 10, bert_loss)
    state = controller.state_dict()
    _, other, _ = _rigl_bert(seed=1)
    assert not _same_masks(other.masks, controller.masks)
    other.load_state_dict(state)
    assert other.step == 10
    assert _same_masks(other.masks, controller.masks)
    assert _same_masks(other.initial_masks, controller.initial_masks)
    assert_masked_weights_zero(other)
    state["masks"][next(iter(state["masks"]))][0, 0] ^= True  # the state is a copy, not a view
    assert _same_masks(other.masks, controller.masks)


def test_save_load_round_trip(tmp_path):
    model, controller, optimizer = _rigl_bert()
    train(model, controller, optimizer, 7, bert_loss)
    controller.save(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "masks.safetensors",
        "sparsity_state.json",
    ]
    meta = json.loads((tmp_path / "ckpt" / "sparsity_state.json").read_text())
    assert meta["step"] == 7 and meta["layers"]["bert.encoder.layer.0.intermediate.dense.weight"] == [64, 32]
    with safe_open(tmp_path / "ckpt" / "masks.safetensors", framework="pt") as f:
        assert f.get_tensor("mask/bert.encoder.layer.0.intermediate.dense.weight").dtype == torch.uint8

    _, restored, _ = _rigl_bert(seed=3)
    restored.load(tmp_path / "ckpt")
    assert restored.step == 7
    assert _same_masks(restored.masks, controller.masks)
    assert _same_masks(restored.initial_masks, controller.initial_masks)


def test_load_detects_a_torn_or_foreign_checkpoint(tmp_path):
    model, controller, optimizer = _rigl_bert()
    controller.save(tmp_path)
    meta = json.loads((tmp_path / "sparsity_state.json").read_text())
    (tmp_path / "sparsity_state.json").write_text(json.dumps({**meta, "step": 5}))
    with pytest.raises(ValueError, match="is from step 0 but sparsity_state.json from step 5"):
        controller.load(tmp_path)
    mlp_controller = SparsityController(make_mlp(), SparsityConfig(include=["weight$"]))
    with pytest.raises(ValueError, match="do not match the selected layers"):
        mlp_controller.load_state_dict(controller.state_dict())
    with pytest.raises(FileNotFoundError, match="no masks.safetensors"):
        controller.load(tmp_path / "missing")


def test_from_zeros_recovers_the_masks():
    model, controller, optimizer = _rigl_bert()
    # one update at step 3, then two steps so the regrown weights are no longer exactly 0
    train(model, controller, optimizer, 5, bert_loss)
    exported = copy.deepcopy(model)
    recovered = SparsityController.from_zeros(exported, SparsityConfig(sparsity=0.8))
    assert _same_masks(recovered.masks, controller.masks)
    assert recovered.step == 0


def test_given_masks_must_match_the_selection(mlp):
    config = SparsityConfig(include=["weight$"])
    with pytest.raises(ValueError, match="no mask given for selected layer '0.weight'"):
        SparsityController(mlp, config, masks={})
    bad = {n: torch.ones(3, 3, dtype=torch.bool) for n in ("0.weight", "2.weight", "4.weight")}
    with pytest.raises(ValueError, match="mask for '0.weight' has shape"):
        SparsityController(mlp, config, masks=bad)


def test_explicit_distribution_sets_each_layer(mlp):
    config = SparsityConfig(include=["weight$"], distribution="explicit", per_layer={r"^0\.": 0.5, ".": 0.9})
    controller = SparsityController(mlp, config)
    assert {n: int(m.sum()) for n, m in controller.masks.items()} == {
        "0.weight": 256,
        "2.weight": 102,
        "4.weight": 13,
    }


def test_zeros_init_keeps_the_zero_pattern_of_the_weights():
    """init="zeros" (finetuning an exported sparse model): active exactly where the weight is non-zero."""
    import torch
    from torch import nn

    from sparsebert.sparsity import SparsityConfig, SparsityController

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8))
    with torch.no_grad():
        model[0].weight[torch.rand(8, 8) < 0.7] = 0.0
    expected = model[0].weight != 0
    controller = SparsityController(model, SparsityConfig(sparsity=0.5, init="zeros", include=[r"0\.weight$"]))
    assert torch.equal(controller.masks["0.weight"], expected)


def test_a_schedule_is_checked_against_a_run_length_known_only_now(mlp):
    """Epoch-counted finetuning learns its step count when the Trainer is built: a GMP end past it would prune
    everything in one shot at the end, a RigL start past it would never update, and both are refused here."""
    from sparsebert.sparsity import GMPConfig

    with pytest.raises(ValueError, match=r"gmp.end_step \(500\) must be <= the run's optimizer steps \(100\)"):
        SparsityController(mlp, SparsityConfig(sparsity=0.9, include=["weight$"], init="magnitude"),
                           gmp=GMPConfig(end_step=500, frequency=10), total_steps=100)
    with pytest.raises(ValueError, match=r"rigl.begin_step \(150\) must be < the run's optimizer steps \(100\)"):
        SparsityController(mlp, SparsityConfig(sparsity=0.9, include=["weight$"]),
                           rigl=RigLConfig(begin_step=150, end_step=300), total_steps=100)
    with pytest.raises(ValueError, match="rigl would never update the masks"):
        SparsityController(mlp, SparsityConfig(sparsity=0.9, include=["weight$"]), rigl=RigLConfig(),
                           total_steps=120)  # updates every 100 steps, ending at 0.75 x 120 = 90


def test_a_frozen_layer_leaves_the_other_gradients_masked(mlp):
    """One selected layer without a gradient must not switch masking off for the rest; RigL, which scores
    growth by gradient, names the layer instead."""
    mlp[0].weight.requires_grad_(False)
    controller = SparsityController(mlp, SparsityConfig(sparsity=0.75, include=["weight$"]))
    mlp_loss(mlp, torch.Generator().manual_seed(0)).backward()
    controller.before_optimizer_step()
    assert mlp[0].weight.grad is None
    for name in ("2.weight", "4.weight"):
        grad = controller.params[name].grad
        assert grad.abs().sum() > 0 and not grad[~controller.masks[name]].any()

    rigl = SparsityController(mlp, SparsityConfig(sparsity=0.75, include=["weight$"]),
                              rigl=RigLConfig(update_freq=1, end_step=10))
    mlp_loss(mlp, torch.Generator().manual_seed(0)).backward()
    with pytest.raises(ValueError, match=r"0.weight received no gradient \(frozen, or unused"):
        rigl.before_optimizer_step()


def _trainer_order(model, controller, optimizer, steps, spy) -> list:
    """The Trainer's order: backward, mask the gradients, step, controller; counts mask re-applications."""
    calls, stats = [], []
    reapply = controller.apply_masks

    def counted():
        calls.append(controller.step)
        reapply()

    controller.apply_masks = counted
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        bert_loss(model, generator).backward()
        controller.before_optimizer_step()
        optimizer.step()
        stats.append(controller.on_optimizer_step())
        spy(controller)
        optimizer.zero_grad(set_to_none=True)
    return calls, stats


def test_adamw_after_masked_gradients_needs_no_reapplied_masks():
    # the step itself keeps masked weights at 0 (zero gradient, zero moments, decay of 0): only steps that change
    # masks re-apply them, and the weights still hold the invariant after every step, RigL moves included
    model, controller, optimizer = _rigl_bert()
    calls, stats = _trainer_order(model, controller, optimizer, 10, assert_masked_weights_zero)
    updates = [i + 1 for i, s in enumerate(stats) if s is not None]
    assert updates == [3, 6, 9]
    assert calls == [1, *updates]  # once to clear the state at masked positions, then only after updates
    active = {n: p.detach()[controller.masks[n]] for n, p in controller.params.items()}
    assert all(bool((a != 0).any()) for a in active.values())  # the active weights did train


@pytest.mark.parametrize("build", [
    lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=0.1),
    lambda params: torch.optim.Adagrad(params, lr=0.05),
])
def test_other_optimizers_get_the_masks_reapplied_after_every_step(build):
    model = make_tiny_bert()
    controller = SparsityController(model, SparsityConfig(sparsity=0.8))
    optimizer = build(model.parameters())
    controller.attach_optimizer(optimizer)
    calls, _ = _trainer_order(model, controller, optimizer, 4, assert_masked_weights_zero)
    assert calls == [1, 2, 3, 4]


def test_masks_are_reapplied_when_the_gradients_were_not_masked():
    # a loop that skips before_optimizer_step lets AdamW move masked weights: the masks must put them back
    model, controller, optimizer = _rigl_bert()
    calls = []
    reapply = controller.apply_masks
    controller.apply_masks = lambda: (calls.append(controller.step), reapply())
    train(model, controller, optimizer, 2, bert_loss, lambda _: assert_masked_weights_zero(controller))
    assert calls == [1, 2]


def test_moments_from_unmasked_gradients_cannot_move_masked_weights_later():
    # a step without masked gradients leaves AdamW moments at masked positions; skipping the re-application on
    # the next masked-gradient steps would let them move masked weights, so the state is cleared first
    model, controller, optimizer = _rigl_bert()
    train(model, controller, optimizer, 1, bert_loss)  # no before_optimizer_step: moments everywhere
    moments = optimizer.state[next(iter(controller.params.values()))]["exp_avg"]
    assert bool((moments[~next(iter(controller.masks.values()))] != 0).any())
    _trainer_order(model, controller, optimizer, 2, assert_masked_weights_zero)
    for name, param in controller.params.items():
        for value in optimizer.state[param].values():
            if value.shape == param.shape:
                assert not bool((value[~controller.masks[name]] != 0).any()), name


def test_state_loaded_before_attaching_is_cleared_at_masked_positions():
    # e.g. optimizer state from a dense run: attaching marks it as not built under these masks
    model = make_tiny_bert()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    bert_loss(model, torch.Generator().manual_seed(1)).backward()
    optimizer.step()  # dense moments everywhere
    optimizer.zero_grad(set_to_none=True)
    controller = SparsityController(model, SparsityConfig(sparsity=0.8))
    controller.attach_optimizer(optimizer)
    _trainer_order(model, controller, optimizer, 3, assert_masked_weights_zero)


def test_rescale_init_restores_the_dense_pre_activation_variance():
    torch.manual_seed(0)
    dense = torch.nn.Linear(512, 512)
    x = torch.randn(256, 512)
    dense_var = float((x @ dense.weight.T).var())
    variances = {}
    for rescale in (False, True):
        layer = copy.deepcopy(dense)
        SparsityController(layer, SparsityConfig(sparsity=0.8, include=["weight$"], rescale_init=rescale))
        variances[rescale] = float((x @ layer.weight.T).var())
        assert int(torch.count_nonzero(layer.weight)) == round(0.2 * 512 * 512)
    assert variances[False] == pytest.approx(0.2 * dense_var, rel=0.05)  # without it: a fifth of the dense variance
    assert variances[True] == pytest.approx(dense_var, rel=0.05)


def test_rescale_init_keeps_the_mask_and_scales_kept_weights_exactly():
    plain, scaled = make_mlp(), make_mlp()
    config = dict(sparsity=0.75, include=["weight$"])
    a = SparsityController(plain, SparsityConfig(**config))
    b = SparsityController(scaled, SparsityConfig(**config, rescale_init=True))
    assert _same_masks(a.masks, b.masks)
    for name in a.params:
        torch.testing.assert_close(b.params[name], a.params[name] * 2.0)  # 1 / sqrt(0.25)


def test_rescale_init_needs_a_random_init():
    with pytest.raises(ValueError, match='rescale_init .* needs sparsity.init "random"'):
        SparsityConfig(init="magnitude", rescale_init=True).validate()


def test_the_report_gives_rigls_changes_per_layer():
    model, controller, optimizer = _rigl_bert()
    assert set(controller.report()["rigl_changed_since_start"].values()) == {0.0}
    train(model, controller, optimizer, 6, bert_loss)
    changed = controller.report()["rigl_changed_since_start"]
    assert set(changed) == set(controller.masks) and all(0.0 < v <= 1.0 for v in changed.values())
    name = next(iter(changed))
    initial, now = controller.initial_masks[name], controller.masks[name]
    assert changed[name] == int((initial & ~now).sum()) / int(initial.sum())
