"""The experiment registry: plain dicts in ``experiments/*.py``, derived by deep update, built into configs.

Each module in the experiments directory defines ``EXPERIMENTS: dict[str, dict]``. An entry may name a
``parent``; it then states only what differs from it, and is resolved as a deep copy of the parent with the
entry's keys merged in recursively. ``build`` resolves a name, applies ``--set`` overrides and validates the
result into an :class:`ExperimentConfig`.

A module may also define ``SEARCH_SPACES: dict[str, dict]`` (hyperparameter search spaces for ``--search``);
they are collected here by name, and checked by :mod:`sparsebert.search` when one is used.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.util
import typing
from pathlib import Path
from typing import Any

from sparsebert.config.experiment import ExperimentConfig
from sparsebert.config.schema import ConfigError, field_type, from_dict, is_optional, parse_value

Experiment = dict[str, Any]


def deep_update(base: dict[str, Any], update: dict[str, Any], schema: type | None = None) -> dict[str, Any]:
    """A copy of ``base`` with ``update`` merged in: nested dicts merge, everything else replaces.

    With ``schema`` (a dataclass), only its sections (dataclass-typed fields) merge key by key; a free-form
    mapping such as ``finetune.runs_per_task`` is a value like any other and replaces the parent's whole, so a
    derived experiment can also shrink or empty it.
    """
    out = copy.deepcopy(base)
    for key, value in update.items():
        section = section_type(schema, key) if schema is not None else None
        if isinstance(value, dict) and isinstance(out.get(key), dict) and (schema is None or section is not None):
            out[key] = deep_update(out[key], value, section)
        else:
            out[key] = copy.deepcopy(value)
    return out


def section_type(schema: type, key: str) -> type | None:
    """The dataclass type of field ``key`` of ``schema`` (``X | None`` unwrapped), or None if it is not one."""
    if not dataclasses.is_dataclass(schema):
        return None
    hint = typing.get_type_hints(schema).get(key)
    _, inner = is_optional(hint)
    return inner if dataclasses.is_dataclass(inner) else None


class Registry:
    def __init__(self, experiments: dict[str, Experiment] | None = None):
        self._raw: dict[str, Experiment] = {}
        self._origin: dict[str, str] = {}
        self._spaces: dict[str, dict[str, Any]] = {}
        self._space_origin: dict[str, str] = {}
        for name, exp in (experiments or {}).items():
            self.add(name, exp, origin="<code>")

    @classmethod
    def from_directory(cls, directory: str | Path) -> Registry:
        """Load every ``*.py`` in ``directory`` (not starting with ``_``); collect its ``EXPERIMENTS`` and
        ``SEARCH_SPACES``."""
        directory = Path(directory)
        if not directory.is_dir():
            raise ConfigError(f"experiments directory not found: {directory}")
        reg = cls()
        for path in sorted(directory.glob("*.py")):
            if path.name.startswith("_"):
                continue
            spec = importlib.util.spec_from_file_location(f"sparsebert_experiments.{path.stem}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            for name, exp in getattr(module, "EXPERIMENTS", {}).items():
                reg.add(name, exp, origin=str(path))
            for name, space in getattr(module, "SEARCH_SPACES", {}).items():
                reg.add_space(name, space, origin=str(path))
        return reg

    def add(self, name: str, experiment: Experiment, origin: str = "<code>") -> None:
        _add_dict("experiment", self._raw, self._origin, name, experiment, origin)

    def add_space(self, name: str, space: dict[str, Any], origin: str = "<code>") -> None:
        _add_dict("search space", self._spaces, self._space_origin, name, space, origin)

    def names(self) -> list[str]:
        return sorted(self._raw)

    def space_names(self) -> list[str]:
        return sorted(self._spaces)

    def space(self, name: str) -> dict[str, Any]:
        """The search space ``name`` as defined (a deep copy: the caller may not change the registry's)."""
        if name not in self._spaces:
            close = difflib.get_close_matches(name, self._spaces, n=3, cutoff=0.5)
            # there are few spaces and --list shows only experiments: name them all when none is close
            hint = (f"; closest: {', '.join(close)}" if close
                    else f"; defined: {', '.join(self.space_names()) or 'none'}")
            raise ConfigError(f"unknown search space '{name}'{hint}")
        return copy.deepcopy(self._spaces[name])

    def description(self, name: str) -> str:
        return str(self.resolve(name).get("description", ""))

    def check_name(self, name: str) -> None:
        name = name.partition("=")[0]
        if name not in self._raw:
            close = difflib.get_close_matches(name, self._raw, n=3, cutoff=0.5)
            hint = f"; closest: {', '.join(close)}" if close else "; see python run.py --list"
            raise ConfigError(f"unknown experiment '{name}'{hint}")

    def resolve(self, name: str, _seen: tuple[str, ...] = ()) -> Experiment:
        """The experiment as one plain dict, its parents merged in (without the ``parent`` key)."""
        self.check_name(name)
        if name in _seen:
            raise ConfigError(f"experiment parents form a cycle: {' -> '.join((*_seen, name))}")
        raw = dict(self._raw[name])
        parent = raw.pop("parent", None)
        if parent is None:
            return copy.deepcopy(raw)
        if parent not in self._raw:
            raise ConfigError(f"experiment '{name}' names an unknown parent '{parent}'")
        return deep_update(self.resolve(parent, (*_seen, name)), raw, ExperimentConfig)

    def build(self, name: str, overrides: list[str] | None = None) -> ExperimentConfig:
        """Resolve ``name``, apply ``--set`` overrides (``key.sub=value``) and validate.

        ``NAME=<run>`` is experiment NAME starting from ``<run>`` (``model.init_from``), e.g.
        ``glue_from=sparse_80_rigl``: one finetuning entry serves every pretraining run.
        """
        base, _, start = name.partition("=")
        data = self.resolve(base)
        if start:
            data.setdefault("model", {})["init_from"] = start
            name = f"{base}={Path(start).name}"
        data["name"] = name
        for item in overrides or []:
            apply_override(data, item)
        return from_dict(ExperimentConfig, data)


def _add_dict(kind: str, table: dict[str, dict], origins: dict[str, str], name: str, value: Any, origin: str) -> None:
    """Register ``value`` under ``name`` once: a name defined twice, or a value that is no dict, is refused."""
    if name in table:
        raise ConfigError(f"{kind} '{name}' is defined twice: {origins[name]} and {origin}")
    if not isinstance(value, dict):
        raise ConfigError(f"{kind} '{name}' in {origin} must be a dict")
    table[name] = value
    origins[name] = origin


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one ``--set key.sub=value`` to a resolved experiment dict, parsing value by the key's type."""
    if "=" not in item:
        raise ConfigError(f"--set {item}: expected key.sub=value")
    key, text = item.split("=", 1)
    key = key.strip()
    if key == "name":
        raise ConfigError("--set name: the run name is the experiment name; use --output-dir to separate runs")
    value = parse_value(text, field_type(ExperimentConfig, key), key)
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value
