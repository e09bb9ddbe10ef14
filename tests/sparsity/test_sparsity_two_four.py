"""2:4 semi-structured masks: the mask builder, config checks, fixed masks in the controller, report (the export of
2:4 models for inference: tests/export/test_semi_structured.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from sparsity_helpers import assert_masked_weights_zero, make_mlp, mlp_loss, train
from torch import nn

from sparsebert.config.experiment import ExperimentConfig
from sparsebert.config.schema import ConfigError
from sparsebert.export import is_two_four  # the export's 2:4 test, on what training left
from sparsebert.sparsity import (
    GMPConfig,
    RigLConfig,
    SparsityConfig,
    SparsityController,
    nm_mask,
)


def _two_four(**kwargs) -> SparsityConfig:
    return SparsityConfig(
        **{"sparsity": 0.5, "pattern": "2:4", "init": "magnitude", "include": ["weight$"], **kwargs}
    )


def _brute_force_mask(weight: torch.Tensor) -> torch.Tensor:
    """Per row and group of 4 columns: the 2 largest |w|, lower column first among equals."""
    mask = torch.zeros_like(weight, dtype=torch.bool)
    for row in range(weight.shape[0]):
        for start in range(0, weight.shape[1], 4):
            cols = sorted(range(start, start + 4), key=lambda c: (-abs(float(weight[row, c])), c))
            for col in cols[:2]:
                mask[row, col] = True
    return mask


def test_nm_mask_keeps_the_two_largest_of_every_four():
    weight = torch.randn(6, 16, generator=torch.Generator().manual_seed(0))
    weight[0, :4] = torch.tensor([0.5, -0.5, 0.5, -0.5])  # all tied: the first two columns win
    weight[1, 4:8] = torch.tensor([0.0, 0.0, 0.0, 2.0])  # one non-zero: topped up with the first zero
    mask = nm_mask(weight)
    assert mask.dtype == torch.bool and mask.shape == weight.shape
    assert torch.equal(mask.view(-1, 4).sum(dim=1), torch.full((24,), 2))
    assert torch.equal(mask, _brute_force_mask(weight))
    assert mask[0, :4].tolist() == [True, True, False, False]
    assert mask[1, 4:8].tolist() == [True, False, False, True]


def test_nm_mask_needs_input_dim_multiple_of_four():
    with pytest.raises(ValueError, match=r"multiple of 4, got shape \(3, 6\)"):
        nm_mask(torch.randn(3, 6))


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"pattern": "4:8"}, "sparsity.pattern must be one of unstructured, 2:4"),
        ({"sparsity": 0.8}, 'sparsity.sparsity must be 0.5 with sparsity.pattern "2:4" (2:4 keeps exactly half)'),
        ({"distribution": "erk"}, 'sparsity.distribution must be "uniform" with sparsity.pattern "2:4"'),
        ({"init": "random"}, 'sparsity.init must be one of magnitude, zeros with sparsity.pattern "2:4"'),
    ],
)
def test_two_four_config_errors_name_the_key(kwargs, key):
    with pytest.raises(ValueError) as err:
        _two_four(**kwargs).validate()
    assert str(err.value).startswith(key)
    assert "\n" not in str(err.value)


def test_two_four_config_defaults_and_valid_combinations():
    assert SparsityConfig().pattern == "unstructured"
    _two_four().validate()
    _two_four(init="zeros").validate()


@pytest.mark.parametrize("hook", [{"rigl": RigLConfig()}, {"gmp": GMPConfig()}])
def test_rigl_and_gmp_refuse_two_four(hook):
    experiment = ExperimentConfig(name="x", sparsity=_two_four(), **hook)
    with pytest.raises(ConfigError, match="RigL/GMP change the number of weights per group; 2:4 masks stay fixed"):
        experiment.validate()
    with pytest.raises(ValueError, match="2:4 masks stay fixed"):
        SparsityController(make_mlp(), _two_four(), total_steps=100, **hook)


def test_controller_two_four_masks_stay_fixed_under_adamw(mlp):
    magnitudes = {name: nm_mask(param) for name, param in mlp.named_parameters() if name.endswith("weight")}
    controller = SparsityController(mlp, _two_four())
    assert {n: torch.equal(m, magnitudes[n]) for n, m in controller.masks.items()} == dict.fromkeys(magnitudes, True)
    before = {n: p.detach().clone() for n, p in controller.params.items()}
    optimizer = torch.optim.AdamW(mlp.parameters(), lr=0.05, weight_decay=0.1)
    controller.attach_optimizer(optimizer)
    train(mlp, controller, optimizer, 10, mlp_loss, lambda stats: assert_masked_weights_zero(controller))
    for name, param in controller.params.items():
        assert is_two_four(param), name
        assert torch.equal(controller.masks[name], magnitudes[name]), name
        assert not torch.equal(param.detach(), before[name]), name  # it did train
        assert int(controller.masks[name].sum()) * 2 == param.numel()


def test_controller_rejects_input_dim_not_multiple_of_four():
    with pytest.raises(ValueError, match=r'pattern "2:4" needs .* 0\.weight has shape \(8, 6\)'):
        SparsityController(nn.Sequential(nn.Linear(6, 8)), _two_four())


def test_init_zeros_recovers_two_four_masks_and_rejects_dense(mlp):
    masks = SparsityController(mlp, _two_four()).masks
    recovered = SparsityController(copy.deepcopy(mlp), _two_four(init="zeros")).masks
    assert all(torch.equal(masks[n], recovered[n]) for n in masks)
    with pytest.raises(ValueError, match=r'init "zeros" with sparsity.pattern "2:4": 0\.weight is not 2:4'):
        SparsityController(make_mlp(), _two_four(init="zeros"))


def test_given_masks_must_be_two_four(mlp):
    controller = SparsityController(mlp, _two_four())
    state = controller.state_dict()
    state["masks"] = {n: torch.ones_like(m) for n, m in state["masks"].items()}
    with pytest.raises(ValueError, match="is not 2:4"):
        controller.load_state_dict(state)


def test_report_names_the_pattern(tiny_bert):
    controller = SparsityController(tiny_bert, _two_four(include=list(SparsityConfig().include)))
    report = controller.report()
    assert report["pattern"] == "2:4"
    assert report["selected"]["two_four_tensors"] == report["selected"]["tensors"] == 12
    assert report["headline"].startswith(
        "2:4 semi-structured (50.0% sparse) encoder linear layers (12 tensors); embeddings dense; whole model"
    )
    with torch.no_grad():
        next(iter(controller.params.values())).fill_(1.0)  # as if something wrote into masked weights
    assert controller.report()["headline"].startswith(
        "2:4 masks, but 1 of 12 tensors not 2:4 in the weights: 46.9% sparse encoder linear layers"
    )
    assert "pattern" in SparsityController(make_mlp(), SparsityConfig(include=["weight$"])).report()
