"""The models registry (`config.model.name`), apart from the package's __init__ so model modules can import it."""

from hwrepro.registry import Registry

MODELS: Registry = Registry("model", "hwrepro.models")
