"""Load a script or bench file that is not a package module (``bench/``, ``scripts/``, ``tests/assets``) by path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
