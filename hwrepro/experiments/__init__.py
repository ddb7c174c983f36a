"""Experiments, found by module name: `config.experiment = "NAME"` runs `hwrepro.experiments.NAME`.

An experiment is one module with `run(config, rec) -> (final_metrics, params)` and, optionally,
`validate(config)` (raises hwrepro.errors.ConfigError naming the field); a new experiment is one new file here
plus its config in configs/. Listing and checking names imports no experiment (so no JAX).
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from hwrepro.registry import unknown_name


__all__ = ["get", "module_name", "names"]


def names() -> list[str]:
    """The experiments: the modules of this package."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def module_name(name: object) -> str:
    """`hwrepro.experiments.NAME`; ConfigError naming the `experiment` field when there is no such module."""
    if name not in names():
        raise unknown_name("experiment", name, names(), "experiment")
    return f"{__name__}.{name}"


def get(name: str) -> ModuleType:
    """The experiment module `name` (imports it, and with it JAX)."""
    return importlib.import_module(module_name(name))
