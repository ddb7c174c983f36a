"""Data sets, found by name (`config.data.dataset`): readers of real files with an offline synthetic default.

Each module here registers the data sets it provides; a new data set is one new module (or a `register` call
in your own code):

    from hwrepro import data

    @data.register("my_labels", kind="labels")
    def load(config) -> data.xc.LabelData: ...

`kind` says what an experiment gets from `load(config)`: "labels" (sparse inputs with multi-label targets in
the shared batch format, `xc.LabelData`: the SLIDE experiment), "images" (`mnist.ImageSplits`: the
autoencoder) or "video" (`video.VideoSplits`: PredNet). Data code knows nothing of models. NumPy only: importing it does not import JAX.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from hwrepro.errors import ConfigError
from hwrepro.registry import Registry


__all__ = ["DATASETS", "DataSet", "get", "load", "names", "register", "mnist", "moving_mnist", "text8", "video", "xc"]


class DataSet(NamedTuple):
    """A registered data set: what it provides (`kind`), how to load it from a run's config, and the
    `config.data.source` values it understands (checked before a run starts)."""

    name: str
    kind: str
    load: Callable[[Any], Any]
    sources: tuple[str, ...] = ("auto", "synthetic")


DATASETS: Registry = Registry("data set", __name__)


def register(name: str, kind: str, sources: tuple[str, ...] = ("auto", "synthetic")
             ) -> Callable[[Callable], Callable]:
    """Decorator: registers `load(config)` as data set `name` providing `kind`, reading the data.source values
    `sources` (default: "auto", real files under data.dir or the synthetic stand-in, and "synthetic")."""
    def add(load: Callable) -> Callable:
        DATASETS.register(name, DataSet(name, kind, load, tuple(sources)))
        return load
    return add


def get(name: str, kind: str) -> DataSet:
    """The data set `name` (config.data.dataset); ConfigError if there is none of that kind."""
    entry = DATASETS.get(name, "data.dataset")
    if entry.kind != kind:
        raise ConfigError(f"data.dataset={name!r} provides {entry.kind}, this experiment needs {kind}: "
                          f"one of {', '.join(names(kind))}")
    return entry


def names(kind: str) -> list[str]:
    """Names of the registered data sets that provide `kind`."""
    return [n for n in DATASETS.names() if DATASETS.get(n).kind == kind]


def load(config: Any, kind: str) -> Any:
    """Loads config.data.dataset, which must provide `kind`."""
    return get(config.data.dataset, kind).load(config)
