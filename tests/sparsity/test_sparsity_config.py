"""Config validation: every misconfiguration is a one-line ValueError that names its key."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from sparsebert.sparsity import GMPConfig, RigLConfig, SparsityConfig, SparsityController


def test_defaults_are_valid():
    SparsityConfig().validate()
    RigLConfig().validate()
    GMPConfig().validate()


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"sparsity": 1.2}, "sparsity.sparsity must be in [0, 1), got 1.2"),
        ({"sparsity": 1.0}, "sparsity.sparsity must be in [0, 1)"),
        ({"sparsity": -0.1}, "sparsity.sparsity must be in [0, 1)"),
        ({"sparsity": "0.8"}, "sparsity.sparsity must be in [0, 1)"),
        ({"distribution": "ERK"}, "sparsity.distribution must be one of"),
        ({"init": "largest"}, "sparsity.init must be one of"),
        ({"distribution": "explicit"}, "sparsity.per_layer must map"),
        (
            {"distribution": "explicit", "per_layer": {"query": 1.5}},
            "sparsity.per_layer['query'] must be in [0, 1)",
        ),
        ({"distribution": "explicit", "per_layer": {"(": 0.5}}, "sparsity.per_layer has an invalid regex"),
        ({"per_layer": {"query": 0.5}}, "sparsity.per_layer is only used with"),
        ({"include": "query"}, "sparsity.include must be a list"),
        ({"include": ["("]}, "sparsity.include has an invalid regex"),
        ({"exclude": ["["]}, "sparsity.exclude has an invalid regex"),
        ({"include": []}, "sparsity.include is empty"),
    ],
)
def test_sparsity_config_errors_name_the_key(kwargs, key):
    with pytest.raises(ValueError) as err:
        SparsityConfig(**kwargs).validate()
    assert str(err.value).startswith(key)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"update_freq": 0}, "rigl.update_freq must be a positive integer"),
        ({"update_freq": 2.5}, "rigl.update_freq must be a positive integer"),
        ({"begin_step": -1}, "rigl.begin_step must be an integer >= 0"),
        (
            {"begin_step": 10, "end_step": 10},
            "rigl.end_step must be None or an integer > rigl.begin_step (10)",
        ),
        ({"end_fraction": 0.0}, "rigl.end_fraction must be in (0, 1]"),
        ({"drop_fraction": 1.0}, "rigl.drop_fraction must be in (0, 1)"),
        ({"drop_fraction": 0.0}, "rigl.drop_fraction must be in (0, 1)"),
        ({"drop_schedule": "linear"}, "rigl.drop_schedule must be one of cosine, constant"),
    ],
)
def test_rigl_config_errors_name_the_key(kwargs, key):
    with pytest.raises(ValueError) as err:
        RigLConfig(**kwargs).validate()
    assert str(err.value).startswith(key)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"initial_sparsity": 1.0}, "gmp.initial_sparsity must be in [0, 1)"),
        ({"frequency": 0}, "gmp.frequency must be a positive integer"),
        ({"begin_step": 5, "end_step": 3}, "gmp.end_step must be None or an integer > gmp.begin_step (5)"),
        ({"end_fraction": 1.5}, "gmp.end_fraction must be in (0, 1]"),
    ],
)
def test_gmp_config_errors_name_the_key(kwargs, key):
    with pytest.raises(ValueError) as err:
        GMPConfig(**kwargs).validate()
    assert str(err.value).startswith(key)


def test_end_step_resolves_from_total_steps():
    assert RigLConfig(end_fraction=0.75).resolved_end_step(1000) == 750
    assert RigLConfig(end_step=300).resolved_end_step(1000) == 300
    assert GMPConfig(end_fraction=0.5).resolved_end_step(99) == 50  # round(49.5) is banker's 50
    with pytest.raises(ValueError, match=r"^rigl\.end_step is None and total_steps is 0"):
        RigLConfig().resolved_end_step(0)
    with pytest.raises(
        ValueError, match=r"^gmp\.end_step \(resolved to 5\) must be > gmp\.begin_step \(10\)"
    ):
        GMPConfig(begin_step=10).resolved_end_step(7)


def test_controller_validates_its_sections(mlp):
    with pytest.raises(ValueError, match=r"^sparsity\.sparsity"):
        SparsityController(mlp, SparsityConfig(sparsity=2.0, include=["weight$"]))
    with pytest.raises(ValueError, match=r"^rigl\.end_step is None"):
        SparsityController(mlp, SparsityConfig(include=["weight$"]), rigl=RigLConfig())


def test_the_package_names_load_on_first_use_and_the_config_needs_no_torch():
    """``sparsebert.sparsity`` loads each exported name from its submodule when it is first used, so reading the
    sparsity config (every command line does, ``--list`` and bad-input errors included) does not import torch."""
    import subprocess
    import sys

    import sparsebert.sparsity as sparsity

    for name in sparsity.__all__:
        submodule = importlib.import_module(f"sparsebert.sparsity.{sparsity._SUBMODULE[name]}")
        assert getattr(sparsity, name) is getattr(submodule, name)
    assert set(sparsity._SUBMODULE) == set(sparsity.__all__)
    # the imports for type checkers name the same submodule for each name as the table the package loads by
    tree = ast.parse(Path(sparsity.__file__).read_text())
    guarded = next(node for node in tree.body if isinstance(node, ast.If))
    imported = {alias.name: node.module for node in guarded.body for alias in node.names}
    assert imported == sparsity._SUBMODULE
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        sparsity.nothing  # noqa: B018
    probe = "import sys, sparsebert.cli, sparsebert.sparsity.config; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
