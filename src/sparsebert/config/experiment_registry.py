"""The experiment registry: plain dicts, derived by deep update, built into configs.

The built-in experiments live in ``sparsebert/experiments/*.py`` (shipped in the package); a user adds their own
with ``--experiments PATH``: a ``.py`` module like the built-in ones, a ``.yaml``/``.yml`` file (a mapping of
name to experiment) or a folder of such files. Each module defines ``EXPERIMENTS: dict[str, dict]``. An entry may name a
``parent``; it then states only what differs from it, and is resolved as a deep copy of the parent with the
entry's keys merged in recursively. ``build`` resolves a name, applies ``--set`` overrides and validates the
result into an :class:`ExperimentConfig`. A name is its run's directory under the output root, so it is checked when
loaded (:func:`check_experiment_name`), and so is every parent once a command's files are all in.

A module may also define ``SEARCH_SPACES: dict[str, dict]`` (hyperparameter search spaces for ``--search``);
they are collected here by name, and checked by :mod:`sparsebert.search` when one is used.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.resources
import importlib.util
import re
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sparsebert.config.experiment import ExperimentConfig
from sparsebert.config.schema import ConfigError, field_type, from_dict, is_optional, parse_value

Experiment = dict[str, Any]
EXPERIMENT_SUFFIXES = (".py", ".yaml", ".yml")
DEFAULT_ORIGIN = "default"
SET_ORIGIN = "--set"
# what the tool keeps in the output root beside the run directories: the search studies (SearchPlan.study_dir) and
# the run registry (results.REGISTRY_FILENAME, with SQLite's side files). A run of such a name would write into
# them and --overwrite would delete them. Spelled out here: results and search import config, not the reverse.
RESERVED_RUN_NAMES = {"search": "its search studies",
                      **{f"registry.sqlite{side}": "its run registry" for side in ("", "-wal", "-shm", "-journal")}}
# one path component: a letter, digit or _ first (so no ".", "..", hidden name or option-like "-x"), then those
# and . ~ + - (no / or \, which would reach into another folder), or = as a NAME=RUN run's glue_from=bert_100k has
RUN_NAME = re.compile(r"\w[\w.=~+-]*")
STUDY_NAME = r"[\w.=+-]+"  # --study: one directory under the output root's search/ (search/plan.py)
# a search trial's run name (SearchPlan.run_name): the one run name that reaches into search/
TRIAL_RUN_NAME = re.compile(rf"search/(?!\.\.?/){STUDY_NAME}/trial\d+")


def check_run_name(name: object, what: str) -> None:
    """Refuse a name that cannot be a run directory of its own under the output root (an experiment's name, or
    ``--run-name``): the run is written to ``<output root>/<name>`` and ``--overwrite`` deletes that, so ``.``,
    ``..``, a path or a name the tool keeps there (``search``) would delete the output root, its parent, another
    folder or every search study. ``what`` names the name and where it comes from, for the one-line error."""
    if not isinstance(name, str) or not RUN_NAME.fullmatch(name):
        raise ConfigError(f"{what} cannot name a run directory: use letters, digits and _ . ~ + -, starting "
                          "with a letter, digit or _")
    if name.lower() in RESERVED_RUN_NAMES:  # lower: a case-insensitive file system finds Search as search
        raise ConfigError(f"{what} cannot name a run directory: the output root keeps "
                          f"{RESERVED_RUN_NAMES[name.lower()]} there under that name; choose another")


def check_experiment_name(name: object, origin: str) -> None:
    """An experiment's name is its run directory's (see :func:`check_run_name`), and has no ``=``: on the command
    line ``NAME=RUN`` is experiment NAME starting from run RUN."""
    what = f"experiment {name!r} in {origin}"
    if isinstance(name, str) and "=" in name:
        raise ConfigError(f"{what}: a name cannot hold '=', since the command line reads NAME=RUN as experiment "
                          "NAME starting from run RUN; choose another name")
    check_run_name(name, what)


def builtin_experiments_dir() -> Path:
    """The folder of the built-in experiment modules, inside the installed package."""
    found = importlib.resources.files("sparsebert.experiments")
    if not isinstance(found, Path):  # a zipped install: the modules have no file to load from
        raise ConfigError(f"the built-in experiments are not files on disk ({found}); install sparsebert unzipped")
    return found


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


class ExperimentRegistry:
    def __init__(self, experiments: dict[str, Experiment] | None = None):
        self._raw: dict[str, Experiment] = {}
        self._origin: dict[str, str] = {}
        self._spaces: dict[str, dict[str, Any]] = {}
        self._space_origin: dict[str, str] = {}
        for name, exp in (experiments or {}).items():
            self.add(name, exp, origin="<code>")

    @classmethod
    def from_directory(cls, directory: str | Path) -> ExperimentRegistry:
        """Load every experiment file in ``directory`` (see :meth:`load_directory`)."""
        reg = cls()
        reg.load_directory(Path(directory))
        reg.check_parents()
        return reg

    @classmethod
    def builtin(cls, extra: Iterable[str | Path] = ()) -> ExperimentRegistry:
        """The built-in experiments, plus a user's own from ``extra`` (files or folders, see :meth:`load_path`).

        A user's experiment may name a built-in parent; a name both define is an error (one line), so that a name
        always means one experiment, whichever files a command loads."""
        reg = cls()
        reg.load_directory(builtin_experiments_dir())
        for path in extra:
            reg.load_path(Path(path))
        reg.check_parents()  # once every file is in: a parent may come from a file loaded after its child's
        return reg

    def load_path(self, path: Path) -> None:
        """Add the experiments of ``path``: one ``.py``/``.yaml``/``.yml`` file, or a folder of them."""
        if path.is_dir():
            self.load_directory(path)
        elif not path.exists():
            raise ConfigError(f"--experiments {path}: no such file or folder")
        elif path.suffix.lower() not in EXPERIMENT_SUFFIXES:
            raise ConfigError(f"--experiments {path}: expected a .py, .yaml or .yml file, or a folder of them")
        else:
            self.load_file(path)

    def load_directory(self, directory: Path) -> None:
        """Add every ``*.py``, ``*.yaml`` and ``*.yml`` in ``directory`` (not recursive; names starting with ``_``
        are helpers, skipped)."""
        if not directory.is_dir():
            raise ConfigError(f"experiments directory not found: {directory}")
        for path in sorted(directory.iterdir()):
            if path.suffix.lower() in EXPERIMENT_SUFFIXES and path.is_file() and not path.name.startswith("_"):
                self.load_file(path)

    def load_file(self, path: Path) -> None:
        """Add the experiments (and a module's ``SEARCH_SPACES``) of one ``.py``, ``.yaml`` or ``.yml`` file."""
        if path.suffix.lower() == ".py":
            experiments, spaces = _load_module(path)
        else:
            experiments, spaces = _load_yaml(path), {}
        for name, exp in experiments.items():
            self.add(name, exp, origin=str(path))
        for name, space in spaces.items():
            self.add_space(name, space, origin=str(path))

    def add(self, name: str, experiment: Experiment, origin: str = "<code>") -> None:
        """Register ``experiment`` under ``name``, refusing a name that cannot be a run directory and a parent that
        is no name (``origin``, its file, goes into the error)."""
        check_experiment_name(name, origin)
        _add_dict("experiment", self._raw, self._origin, name, experiment, origin)
        parent = experiment.get("parent")
        if parent is not None and not isinstance(parent, str):
            raise ConfigError(f"experiment '{name}' in {origin}: parent must be the name of one experiment, got "
                              f"{parent!r}")

    def check_parents(self) -> None:
        """Every experiment's parent chain ends without a cycle or an unknown parent; checked when a command has
        loaded its files, so a mistake fails before any output (not halfway through ``--list``)."""
        for name in self._raw:
            self.parents(name)

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
            hint = f"; closest: {', '.join(close)}" if close else "; see sparsebert --list"
            raise ConfigError(f"unknown experiment '{name}'{hint}")

    def origin(self, name: str) -> str:
        """Where experiment ``name`` is defined (its file)."""
        self.check_name(name)
        return self._origin[name]

    def parents(self, name: str) -> list[str]:
        """``name`` and its parents, nearest first (``[name, parent, grandparent, ...]``)."""
        chain = [name]
        while (parent := self._raw[chain[-1]].get("parent")) is not None:
            if parent in chain or parent not in self._raw:
                self.resolve(name)  # raises the cycle's or the unknown parent's error
            chain.append(parent)
        return chain

    def resolve(self, name: str, _seen: tuple[str, ...] = ()) -> Experiment:
        """The experiment as one plain dict, its parents merged in (without the ``parent`` key)."""
        self.check_name(name)
        if name in _seen:
            files = sorted({self._origin[n] for n in _seen})
            raise ConfigError(f"experiment parents form a cycle: {' -> '.join((*_seen, name))} (in "
                              f"{', '.join(files)})")
        raw = dict(self._raw[name])
        parent = raw.pop("parent", None)
        if parent is None:
            return copy.deepcopy(raw)
        if parent not in self._raw:
            close = difflib.get_close_matches(parent, self._raw, n=3, cutoff=0.5)
            raise ConfigError(f"experiment '{name}' in {self._origin[name]} names an unknown parent '{parent}'"
                              + (f"; closest: {', '.join(close)}" if close else ""))
        return deep_update(self.resolve(parent, (*_seen, name)), raw, ExperimentConfig)

    def build(self, name: str, overrides: list[str] | None = None) -> ExperimentConfig:
        """Resolve ``name``, apply ``--set`` overrides (``key.sub=value``) and validate.

        ``NAME=<run>`` is experiment NAME starting from ``<run>`` (``model.init_from``), e.g.
        ``glue_from=sparse_80_rigl``: one finetuning entry serves every pretraining run.
        """
        base, equals, start = name.partition("=")
        if equals and not start:  # glue_from= alone would finetune the experiment's default model unnoticed
            raise ConfigError(f"{name}: name the run to start from after '=', e.g. {base}=bert_100k")
        data = self.resolve(base)
        if start:
            data.setdefault("model", {})["init_from"] = start
            name = f"{base}={Path(start).name}"
        data["name"] = name
        for item in overrides or []:
            apply_override(data, item)
        cfg = from_dict(ExperimentConfig, data)  # its own checks first (epochs are for finetuning, and finite)
        self._check_one_schedule(name, overrides or [], data)
        return cfg

    def _check_one_schedule(self, name: str, overrides: list[str], data: dict[str, Any]) -> None:
        """A ``train.max_steps`` set nearer than ``train.epochs`` (by ``--set``, or by a child of the experiment that
        set epochs) would be ignored, since epochs win: say so instead of training the whole epoch schedule. Epochs
        set nearer are a switch to epochs and pass. (No built-in experiment sets both.)"""
        train = data.get("train") or {}
        if "max_steps" not in train or train.get("epochs") is None:
            return
        found = self.origins(name, overrides)
        nearest_first = [SET_ORIGIN, *self.parents(name.partition("=")[0])]  # both keys are set, so both are here
        if nearest_first.index(origin_of(found, "train.max_steps")) <= nearest_first.index(
                origin_of(found, "train.epochs")):
            raise ConfigError(f"{name}: train.max_steps={train['max_steps']} would be ignored, since it trains by "
                              f"train.epochs={train['epochs']}; set train.epochs=null (--set train.epochs=null) to "
                              "train by steps")

    def origins(self, name: str, overrides: list[str] | None = None) -> dict[str, str]:
        """Who set each key of ``build(name, overrides)``: dotted key -> the experiment of the parent chain that
        set it last, ``NAME=<run>`` for the ``model.init_from`` such a name sets, or ``--set``. A key missing here
        (and under no key here: a section or mapping set whole) has its schema default.
        """
        base, _, start = name.partition("=")
        found: dict[str, str] = {}
        for exp in reversed(self.parents(base)):  # the root first: a child's keys replace its parent's
            raw = {k: v for k, v in self._raw[exp].items() if k != "parent"}
            _record_origins(found, raw, ExperimentConfig, "", exp)
        if start:
            _record_origins(found, {"model": {"init_from": start}}, ExperimentConfig, "", name)
        for item in overrides or []:
            key = item.partition("=")[0].strip()
            schema: type | None = ExperimentConfig
            parts = key.split(".")
            for end, part in enumerate(parts[:-1], 1):  # a section set whole before (to None) is now a fresh one
                schema = section_type(schema, part) if schema is not None else None
                if schema is not None:
                    found.pop(".".join(parts[:end]), None)
            _record_origins(found, {key: None}, None, "", SET_ORIGIN)  # replaces the key whole, as --set does
        return found


def origin_of(origins: dict[str, str], key: str) -> str:
    """The origin of dotted ``key``: its own, else that of the nearest enclosing key set whole, else default."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        found = origins.get(".".join(parts[:end]))
        if found is not None:
            return found
    return DEFAULT_ORIGIN


def _record_origins(origins: dict[str, str], update: dict[str, Any], schema: type | None, prefix: str,
                    origin: str) -> None:
    """Mark every key ``update`` sets as set by ``origin``, the way :func:`deep_update` merges it: a section's
    keys one by one, anything else (a free-form mapping, a section set to None) whole."""
    for key, value in update.items():
        dotted = prefix + key
        section = section_type(schema, key) if schema is not None else None
        if section is not None and isinstance(value, dict):
            origins.pop(dotted, None)  # a section that was None (or set whole) before: now merged key by key
            _record_origins(origins, value, section, f"{dotted}.", origin)
        else:
            for stale in [k for k in origins if k.startswith(f"{dotted}.")]:
                del origins[stale]
            origins[dotted] = origin


def _load_module(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``EXPERIMENTS`` and ``SEARCH_SPACES`` of the Python module at ``path``."""
    spec = importlib.util.spec_from_file_location(f"sparsebert_experiments.{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # a user's file: one line naming it, not a traceback or a silent exit
        raise ConfigError(f"{path}: cannot load it: {type(e).__name__}: {e}") from None
    tables = [getattr(module, "EXPERIMENTS", {}), getattr(module, "SEARCH_SPACES", {})]
    for table, what in zip(tables, ("EXPERIMENTS", "SEARCH_SPACES")):
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {what} must be a dict of name -> dict, got {type(table).__name__}")
    return tables[0], tables[1]


def _load_yaml(path: Path) -> dict[str, Any]:
    """The experiments of the YAML file at ``path``: a mapping of name -> experiment (an empty file has none)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of experiment name -> settings, got {type(data).__name__}")
    return {str(name): exp for name, exp in data.items()}


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
