"""Search spaces: the specs of ``SEARCH_SPACES`` as optuna distributions, each key checked on the experiment."""

from __future__ import annotations

from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from sparsebert.config import ConfigError, ExperimentRegistry

SPEC_KEYS = {
    "float": {"type", "low", "high", "log"},
    "int": {"type", "low", "high", "step"},
    "categorical": {"type", "choices"},
}


def parse_space(name: str, space: dict[str, Any]) -> dict[str, BaseDistribution]:
    """The optuna distribution of every parameter of search space ``name``.

    Args:
        name: the space's name (for messages).
        space: ``{"description": str, "params": {dotted_key: spec}}`` as an experiments module defines it.

    Returns:
        ``{dotted_key: distribution}`` in the space's order.

    Raises:
        ConfigError: naming the space and the key of a malformed spec.
    """
    unknown = sorted(set(space) - {"description", "params"})
    if unknown:
        raise ConfigError(f"search space '{name}': unknown key(s) {', '.join(unknown)} (use description, params)")
    if not isinstance(space.get("description", ""), str):
        raise ConfigError(f"search space '{name}': description must be a string")
    params = space.get("params")
    if not isinstance(params, dict) or not params:
        raise ConfigError(f"search space '{name}': 'params' must map experiment keys to specs")
    return {key: parse_spec(f"search space '{name}', {key}", spec) for key, spec in params.items()}


def parse_spec(where: str, spec: Any) -> BaseDistribution:
    """One spec (``{"type": "float" | "int" | "categorical", ...}``) as an optuna distribution.

    Args:
        where: the space and key, the start of every message.
        spec: the spec as written.

    Returns:
        A FloatDistribution, IntDistribution or CategoricalDistribution.
    """
    if not isinstance(spec, dict) or spec.get("type") not in SPEC_KEYS:
        raise ConfigError(f"{where}: a spec is a dict with type float, int or categorical, got {spec!r}")
    kind = spec["type"]
    unknown = sorted(set(spec) - SPEC_KEYS[kind])
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} for type {kind} "
                          f"(use {', '.join(sorted(SPEC_KEYS[kind]))})")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list | tuple) or not choices:
            raise ConfigError(f"{where}: choices must be a non-empty list")
        if not all(c is None or isinstance(c, bool | int | float | str) for c in choices):
            raise ConfigError(f"{where}: choices must be numbers, strings, booleans or None (what --set takes)")
        return CategoricalDistribution(list(choices))
    low, high = spec.get("low"), spec.get("high")
    for bound, value in (("low", low), ("high", high)):
        wrong = isinstance(value, bool) or not isinstance(value, int if kind == "int" else int | float)
        if wrong:
            raise ConfigError(f"{where}: {bound} must be {'an integer' if kind == 'int' else 'a number'}, "
                              f"got {value!r}")
    if low >= high:
        raise ConfigError(f"{where}: low ({low}) must be below high ({high})")
    if kind == "int":
        step = spec.get("step", 1)
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ConfigError(f"{where}: step must be a positive integer, got {step!r}")
        return IntDistribution(low, high, step=step)
    use_log = spec.get("log", False)
    if not isinstance(use_log, bool):
        raise ConfigError(f"{where}: log must be true or false, got {use_log!r}")
    if use_log and low <= 0:
        raise ConfigError(f"{where}: a log range needs low > 0, got {low}")
    return FloatDistribution(float(low), float(high), log=use_log)


def set_item(key: str, value: Any) -> str:
    """``key=value`` as ``--set`` parses it back (floats keep every digit)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "none"
    else:
        text = repr(value) if isinstance(value, float) else str(value)
    return f"{key}={text}"


def check_space_keys(registry: ExperimentRegistry, experiment: str, space: str, overrides: list[str],
                     distributions: dict[str, BaseDistribution]) -> None:
    """Build the experiment with each parameter at its ends (and every choice) so that a misspelled or
    misplaced key, or a range the experiment refuses, fails now in the registry's words, not in every trial.

    Args:
        registry: the experiment registry.
        experiment: the experiment searched.
        space: the space's name (for messages).
        overrides: the command's own ``--set`` items, applied before each parameter.
        distributions: the space, from :func:`parse_space`.
    """
    for key, dist in distributions.items():
        if any(item.partition("=")[0].strip() == key for item in overrides):
            raise ConfigError(f"--set {key}: search space '{space}' sets {key} in every trial; drop the --set")
        samples = dist.choices if isinstance(dist, CategoricalDistribution) else (dist.low, dist.high)
        for value in samples:
            try:
                registry.build(experiment, [*overrides, set_item(key, value)])
            except ConfigError as e:
                raise ConfigError(f"search space '{space}' on {experiment}, {set_item(key, value)}: {e}") from None
