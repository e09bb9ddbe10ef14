"""Targets for ``run_in_processes`` in the tests: module-level, so a spawned process can import them."""

from __future__ import annotations

from pathlib import Path

from sparsebert.errors import SparseBertError


def touch(path: str) -> None:
    Path(path).write_text("ran\n")


def refuse(message: str) -> None:
    raise SparseBertError(message)


def call(target, argument) -> None:
    """``target(argument)``: one target per call of a list."""
    target(argument)
