"""The plain fully connected autoencoder of the CPU-versus-GPU study (arXiv 2109.01451).

The study trained "a plain autoencoder" on MNIST; its sizes are config fields. The defaults follow the
classic Keras tutorial autoencoder such studies start from (784 -> 32 -> 784, ReLU code, sigmoid output,
binary cross-entropy), deepened optionally by `encoder_sizes`.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from hwrepro.models.model_registry import MODELS


@MODELS.register("mlp_autoencoder")
class Autoencoder(nn.Module):
    """x [batch, input_dim] in [0, 1] -> reconstruction logits [batch, input_dim] (sigmoid gives pixels).

    Logits rather than pixels so the loss can use the numerically stable sigmoid cross-entropy.
    `dtype` is the compute dtype (bf16 for the reduced-precision set-ups), `param_dtype` the storage dtype.
    """
    encoder_sizes: Sequence[int] = (32,)
    input_dim: int = 784
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def setup(self):
        dense = lambda n, name: nn.Dense(n, dtype=self.dtype, param_dtype=self.param_dtype, name=name)
        self.encoder = [dense(n, f"enc{i}") for i, n in enumerate(self.encoder_sizes)]
        decoder_sizes = list(self.encoder_sizes[-2::-1]) + [self.input_dim]
        self.decoder = [dense(n, f"dec{i}") for i, n in enumerate(decoder_sizes)]

    def encode(self, x: jax.Array) -> jax.Array:
        for layer in self.encoder:
            x = nn.relu(layer(x))
        return x

    def decode(self, code: jax.Array) -> jax.Array:
        for layer in self.decoder[:-1]:
            code = nn.relu(layer(code))
        return self.decoder[-1](code)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.decode(self.encode(x))


def reconstruction_loss(logits: jax.Array, x: jax.Array) -> jax.Array:
    """Mean per-pixel binary cross-entropy (the Keras autoencoder's loss), computed in float32."""
    logits = logits.astype(jnp.float32)
    return jnp.mean(jnp.maximum(logits, 0) - logits * x + jnp.log1p(jnp.exp(-jnp.abs(logits))))
