"""Turning plain experiment dicts into typed dataclass sections, and back.

Every section of an experiment is a dataclass. ``from_dict`` checks each key and value against the dataclass'
type hints, so an unknown key or a value of the wrong type fails when the experiment is built, with a message
naming the full key (``train.max_steps``), never halfway through a run. ``parse_value`` turns the string of a
``--set key=value`` into the type that key's field declares.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from typing import Any, TypeVar, Union

T = TypeVar("T")


class ConfigError(ValueError):
    """A key or value of an experiment is wrong; the message names the key."""


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def is_optional(tp: Any) -> tuple[bool, Any]:
    """(True, inner) for ``X | None``; (False, tp) otherwise."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def _type_name(tp: Any) -> str:
    optional, inner = is_optional(tp)
    if optional:
        return f"{_type_name(inner)} or None"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, key: str) -> Any:
    optional, inner = is_optional(tp)
    if value is None:
        if optional or tp is Any:
            return None
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got None")
    tp = inner
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of settings, got {type(value).__name__}")
        return from_dict(tp, value, prefix=key)
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        return [_convert(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__} {value!r}")
        k_tp, v_tp = typing.get_args(tp) or (Any, Any)
        return {_convert(k, k_tp, key): _convert(v, v_tp, f"{key}.{k}") for k, v in value.items()}
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{key}: must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise TypeError(f"{key}: unsupported config type {tp!r}")  # a bug in a section definition, not user input


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; every key must be a field, every value of the field's type."""
    hints = _hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else k
        if k not in fields:
            raise ConfigError(f"unknown key '{key}'{_suggest(k, fields, prefix)}")
        kwargs[k] = _convert(v, hints[k], key)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except ConfigError:
            raise
        except ValueError as e:  # section validators raise plain ValueError naming their keys
            raise ConfigError(str(e)) from None
    return obj


def to_dict(obj: Any) -> Any:
    """The plain-data form of a config (what ``config.json`` holds)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def _suggest(name: str, options: typing.Iterable[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    if not close:
        return ""
    return f" (did you mean '{prefix + '.' if prefix else ''}{close[0]}'?)"


def field_type(cls: type, dotted: str) -> Any:
    """The declared type of ``dotted`` (e.g. ``train.max_steps``) inside dataclass ``cls``."""
    tp: Any = cls
    walked: list[str] = []
    for part in dotted.split("."):
        _, tp = is_optional(tp)
        if not dataclasses.is_dataclass(tp):
            if typing.get_origin(tp) is dict:  # a free-form mapping such as sparsity.per_layer
                return typing.get_args(tp)[1] if typing.get_args(tp) else Any
            raise ConfigError(f"unknown key '{dotted}': '{'.'.join(walked)}' has no sub-keys")
        names = {f.name for f in dataclasses.fields(tp) if f.init}
        if part not in names:
            prefix = ".".join(walked)
            raise ConfigError(f"unknown key '{dotted}'{_suggest(part, names, prefix)}")
        tp = _hints(tp)[part]
        walked.append(part)
    return tp


def all_keys(cls: type, prefix: str = "") -> list[tuple[str, str, Any]]:
    """Every settable key of dataclass ``cls`` as (dotted key, type name, default), sections walked into: the
    reference ``python run.py --keys`` prints. A section that is off by default (``X | None``) lists its keys with
    the defaults it gets once present."""
    rows = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}{f.name}"
        _, inner = is_optional(_hints(cls)[f.name])
        if dataclasses.is_dataclass(inner):
            rows += all_keys(inner, f"{key}.")
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "(required)"
        rows.append((key, _type_name(_hints(cls)[f.name]), default))
    return rows


def parse_value(text: str, tp: Any, key: str) -> Any:
    """Parse the string of ``--set key=text`` into a value of type ``tp`` (checked again by from_dict)."""
    optional, inner = is_optional(tp)
    if optional and text.lower() in ("none", "null"):
        return None
    tp = inner
    try:
        if tp is bool:
            low = text.lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if tp is int:
            return int(text.replace("_", ""))
        if tp is float:
            return float(text)
        if tp is str or typing.get_origin(tp) is typing.Literal:
            return text
        if typing.get_origin(tp) in (list, tuple):
            if text.startswith("["):
                return json.loads(text)
            (item_tp, *_) = typing.get_args(tp) or (str,)
            return [parse_value(t.strip(), item_tp, key) for t in text.split(",") if t.strip()]
        if typing.get_origin(tp) is dict or dataclasses.is_dataclass(tp):
            return json.loads(text)
    except (ValueError, json.JSONDecodeError):
        raise ConfigError(f"--set {key}={text}: expected {_type_name(tp)}") from None
    return json.loads(text)
