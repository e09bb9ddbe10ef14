"""Layer density distributions: they spend exactly the overall budget."""

from __future__ import annotations

import math

import pytest

from sparsebert.sparsity import (
    SparsityConfig,
    erk_densities,
    explicit_densities,
    layer_densities,
    uniform_densities,
)
from sparsebert.sparsity.distribution import kept_count

BERT_BASE_LAYER = {
    "q": (768, 768),
    "k": (768, 768),
    "v": (768, 768),
    "ao": (768, 768),
    "inter": (3072, 768),
    "out": (768, 3072),
}


def _kept(shapes, densities):
    return sum(densities[n] * math.prod(s) for n, s in shapes.items())


def test_uniform():
    assert uniform_densities(BERT_BASE_LAYER, 0.2) == dict.fromkeys(BERT_BASE_LAYER, 0.2)


@pytest.mark.parametrize("density", [0.05, 0.2, 0.5, 0.9])
def test_erk_hits_the_target_budget(density):
    shapes = {**BERT_BASE_LAYER, "tiny": (2, 768), "emb": (30522, 768)}
    densities = erk_densities(shapes, density)
    total = sum(math.prod(s) for s in shapes.values())
    assert _kept(shapes, densities) == pytest.approx(density * total, abs=1.0)
    # after rounding to whole weights, still within one weight per layer
    rounded = sum(kept_count(densities[n], math.prod(s)) for n, s in shapes.items())
    assert abs(rounded - density * total) <= len(shapes)
    assert all(0.0 < d <= 1.0 for d in densities.values())


def test_erk_is_proportional_to_fan_sum_over_fan_product():
    densities = erk_densities(BERT_BASE_LAYER, 0.2)
    # (768+768)/768² vs (3072+768)/(3072·768): the square layers are 1.6x denser
    assert densities["q"] / densities["inter"] == pytest.approx((1536 / 768**2) / (3840 / (3072 * 768)))
    assert densities["inter"] == pytest.approx(densities["out"])


def test_erk_makes_a_small_layer_dense_and_resolves_the_rest():
    shapes = {"small": (4, 4), "big": (1000, 1000)}
    densities = erk_densities(shapes, 0.5)
    # unclipped, small would get scale·0.5 with scale ≈ 0.5·1e6/2008 ≫ 2, i.e. far above 1
    assert densities["small"] == 1.0
    assert densities["big"] == pytest.approx((0.5 * (16 + 1_000_000) - 16) / 1_000_000)
    assert _kept(shapes, densities) == pytest.approx(0.5 * (16 + 1_000_000))


def test_erk_clips_iteratively():
    # First round: scale ≈ 2.82 puts "wide" (raw ≈ 1) over 1 but "mid" (raw 0.25) at 0.70. Making "wide" dense
    # frees budget, the scale rises to ≈ 5.77 and "mid" now exceeds 1 too: a second round is needed.
    shapes = {"wide": (1, 1000), "mid": (8, 8), "big": (300, 300)}
    densities = erk_densities(shapes, 0.05)
    total = 1000 + 64 + 90_000
    assert densities["wide"] == 1.0
    assert densities["mid"] == 1.0
    assert densities["big"] == pytest.approx((0.05 * total - 1064) / 90_000)
    assert _kept(shapes, densities) == pytest.approx(0.05 * total)


def test_erk_dense_target_is_all_dense():
    assert erk_densities(BERT_BASE_LAYER, 1.0) == dict.fromkeys(BERT_BASE_LAYER, 1.0)


def test_explicit_first_match_wins_and_every_layer_must_match():
    names = ["l0.query.weight", "l0.key.weight", "l0.intermediate.weight"]
    per_layer = {r"query": 0.9, r"\.(query|key)\.": 0.5, r"intermediate": 0.7}
    assert explicit_densities(names, per_layer) == pytest.approx(
        {"l0.query.weight": 0.1, "l0.key.weight": 0.5, "l0.intermediate.weight": 0.3}
    )
    with pytest.raises(
        ValueError, match=r"^sparsity\.per_layer has no pattern matching the selected layer 'l0\.in"
    ):
        explicit_densities(names, {"query|key": 0.5})


def test_layer_densities_dispatches_on_the_config():
    shapes = {"a.weight": (8, 8), "b.weight": (8, 16)}
    assert layer_densities(SparsityConfig(sparsity=0.75), shapes) == {"a.weight": 0.25, "b.weight": 0.25}
    erk = layer_densities(SparsityConfig(sparsity=0.75, distribution="erk"), shapes)
    assert erk["a.weight"] > erk["b.weight"]
    explicit = layer_densities(
        SparsityConfig(distribution="explicit", per_layer={"^a": 0.5, ".": 0.0}), shapes
    )
    assert explicit == {"a.weight": 0.5, "b.weight": 1.0}
