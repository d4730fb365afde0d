"""benchmarks/*.py scripts as modules, for the tests of their pure-Python parts (the scripts are not a package)."""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def load(name: str) -> ModuleType:
    """benchmarks/<name>.py, executed as module `name`."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCHMARKS, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
