"""The models registry (`config.model.name`), apart from the package's __init__ so model modules can import it."""

import dataclasses
from typing import Iterable

from hwrepro.errors import ConfigError
from hwrepro.registry import Registry

MODELS: Registry = Registry("model", "hwrepro.models")


def model_class(name: str, fields: Iterable[str]) -> type:
    """The model registered as `name` (config.model.name), checked to take every one of `fields` (the keyword
    arguments its experiment builds it with): ConfigError naming the first it lacks, e.g. an autoencoder's
    config asking for "prednet"."""
    cls = MODELS.get(name, "model.name")
    if dataclasses.is_dataclass(cls):  # Flax modules are: their fields are what they take
        taken = {f.name for f in dataclasses.fields(cls)}
        missing = [f for f in fields if f not in taken]
        if missing:
            raise ConfigError(f"model.name={name!r} takes no {missing[0]!r}, which this experiment builds its model "
                              "with: not a model for this experiment")
    return cls
