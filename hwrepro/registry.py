"""Extension by name: one `Registry` per seam (hash families, data sets, models), so a new one is one new file.

A registry belongs to a package; every module of that package is a place to add an entry:

    # hwrepro/sparse/hashes/myhash.py
    from hwrepro.sparse.hashes import FAMILIES

    @FAMILIES.register("myhash")
    class MyHash(NamedTuple): ...

The registry imports every module of its package the first time it is asked for an entry or for its names, so
a new file registers itself with no other edit. Code outside the package (a notebook, a test, another project)
calls `register` the same way before it uses the name. Experiments are found by module name instead
(`hwrepro.experiments`), as big_vision finds its models. Importing this module does not import JAX.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import Callable, Generic, TypeVar

from hwrepro.errors import ConfigError

T = TypeVar("T")


def unknown_name(field: str, value: object, known: list[str], kind: str) -> ConfigError:
    """The one-line error for a config field naming something that does not exist, with a close match."""
    close = difflib.get_close_matches(str(value), known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"{field}={value!r} is not a known {kind}{hint}; known: {', '.join(known)}")


class Registry(Generic[T]):
    """Named entries of one kind ("hash family", "data set", ...), built-ins being the modules of `package`."""

    def __init__(self, kind: str, package: str):
        self.kind, self.package = kind, package
        self._entries: dict[str, T] = {}
        self._loaded = False

    def register(self, name: str, entry: T | None = None) -> T | Callable[[T], T]:
        """Adds `entry` under `name`; without `entry`, a decorator that adds what it decorates.

        Registering the same object twice is harmless (a module imported twice); another object under a taken
        name is a ValueError, so two extensions cannot silently replace each other.
        """
        if entry is None:
            return lambda obj: self.register(name, obj)
        if self._entries.get(name, entry) is not entry:
            raise ValueError(f"{self.kind} {name!r} is registered already ({self._entries[name]!r})")
        self._entries[name] = entry
        return entry

    def _load_builtins(self) -> None:
        if self._loaded:
            return
        self._loaded = True  # before the imports: a module that asks the registry while loading must not loop
        package = importlib.import_module(self.package)
        for module in pkgutil.iter_modules(package.__path__):
            if not module.name.startswith("_"):
                importlib.import_module(f"{self.package}.{module.name}")

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        self._load_builtins()
        return sorted(self._entries)

    def get(self, name: str, field: str | None = None) -> T:
        """The entry called `name`; ConfigError naming `field` (the config field that chose it) if none is."""
        self._load_builtins()
        try:
            return self._entries[name]
        except KeyError:
            raise unknown_name(field or self.kind, name, self.names(), self.kind) from None

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._entries
