"""Flax models, importable by other JAX code (they work under jit, grad and vmap like any Flax module), and
found by name (`config.model.name`) through `MODELS`: a new model is one module here that registers itself.

    from hwrepro.models import MODELS
    @MODELS.register("my_autoencoder")
    class MyAutoencoder(nn.Module): ...

Importing this package imports JAX: in a training process, apply numerics (hwrepro.harness.numerics) first.
"""

from hwrepro.models.model_registry import MODELS
from hwrepro.models.convlstm import ConvLSTMCell
from hwrepro.models.mlp_autoencoder import Autoencoder, reconstruction_loss
from hwrepro.models.predictive_coding import PredNet
from hwrepro.models.sparse_layers import (SparseInput, SparseOutput, candidate_logits, embedding_sum,
                                          gather_rows, label_targets, output_logits, softmax_xent,
                                          sparse_hidden)

__all__ = [
    "MODELS", "Autoencoder", "ConvLSTMCell", "PredNet", "SparseInput", "SparseOutput", "candidate_logits",
    "embedding_sum", "gather_rows", "label_targets", "output_logits", "reconstruction_loss",
    "softmax_xent", "sparse_hidden",
]
