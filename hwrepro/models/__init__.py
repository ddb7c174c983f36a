"""Flax models, importable by other JAX code (they work under jit, grad and vmap like any Flax module).

Importing this package imports JAX: in a training process, apply numerics (hwrepro.numerics) first.
"""

from hwrepro.models.autoencoder import Autoencoder
from hwrepro.models.convlstm import ConvLSTMCell
from hwrepro.models.prednet import PredNet
from hwrepro.models.slide import SparseInput, SparseOutput

__all__ = ["Autoencoder", "ConvLSTMCell", "PredNet", "SparseInput", "SparseOutput"]
