"""A convolutional LSTM cell with a configurable gate activation (Keras-style, as PredNet's reference uses).

Why not `flax.linen.ConvLSTMCell`: in flax 0.12.8 it hard-codes `sigmoid` for the gates, adds 1 to the
forget-gate pre-activation, and uses two biased convolutions (input-to-hidden and hidden-to-hidden, so two
biases per gate). PredNet's reference Keras code uses `hard_sigmoid` gates, no forget bias offset and one
biased convolution per gate over the concatenation [h_{t-1}, x_t]. This cell computes exactly that:

    z = [h_{t-1}, x_t]                      (channel concatenation)
    i = gate(conv_i(z)),  f = gate(conv_f(z)),  o = gate(conv_o(z)),  g = act(conv_g(z))
    c_t = f * c_{t-1} + i * g
    h_t = o * act(c_t)

The four gate convolutions are fused into one convolution with 4 * features outputs (ordered i, f, g, o);
the parameter count is the same as four separate convolutions, and the kernel initialiser draws each gate's
block with the fans of a single-gate kernel (Keras' glorot_uniform per Conv2D), so the initial weight scale
matches the reference too.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

NUM_GATES = 4


def hard_sigmoid(x: jax.Array) -> jax.Array:
    """Keras 1/2 `hard_sigmoid`: clip(0.2 * x + 0.5, 0, 1) (not jax.nn.hard_sigmoid, which is relu6(x+3)/6)."""
    return jnp.clip(0.2 * x + 0.5, 0.0, 1.0)


def per_gate_glorot_uniform(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
    """Glorot-uniform for a fused [kh, kw, cin, 4 * f] kernel, each gate's [kh, kw, cin, f] block on its own.

    Drawing the fused kernel directly would use fan_out = kh * kw * 4f, i.e. weights sqrt(5/8)-ish smaller
    than Keras' four separate Conv2D layers; the gate axis is therefore a batch axis for the fans.
    """
    kh, kw, cin, fused = shape
    gate_shape = (kh, kw, cin, NUM_GATES, fused // NUM_GATES)
    init = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=-3, out_axis=-1, batch_axis=-2)
    return init(key, gate_shape, dtype).reshape(shape)


class ConvLSTMState(NamedTuple):
    """Carry of the cell: cell state c and hidden state h, both [batch, height, width, features]."""

    c: jax.Array
    h: jax.Array


class ConvLSTMCell(nn.Module):
    """One step of a ConvLSTM (see module docstring for the equations).

    Attributes:
      features: hidden channels f.
      kernel_size: (kh, kw) of the gate convolutions ('SAME' padding, stride 1).
      gate_activation: for i, f, o; default Keras `hard_sigmoid`.
      activation: for the candidate g and the output; default tanh.
      dtype: computation (activation) dtype; parameters are stored in `param_dtype`.
    """

    features: int
    kernel_size: tuple[int, int] = (3, 3)
    gate_activation: Callable[[jax.Array], jax.Array] = hard_sigmoid
    activation: Callable[[jax.Array], jax.Array] = jnp.tanh
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, state: ConvLSTMState, inputs: jax.Array) -> tuple[ConvLSTMState, jax.Array]:
        """state: ConvLSTMState of [B, H, W, f]; inputs: [B, H, W, cin]. Returns (new state, h_t [B, H, W, f])."""
        z = jnp.concatenate([state.h.astype(self.dtype), inputs.astype(self.dtype)], axis=-1)
        gates = nn.Conv(
            NUM_GATES * self.features,
            self.kernel_size,
            padding="SAME",
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=per_gate_glorot_uniform,
            name="gates",
        )(z)
        i, f, g, o = jnp.split(gates, NUM_GATES, axis=-1)
        c = self.gate_activation(f) * state.c + self.gate_activation(i) * self.activation(g)
        h = self.gate_activation(o) * self.activation(c)
        return ConvLSTMState(c=c, h=h), h

    @staticmethod
    def zero_state(batch_shape: Sequence[int], features: int, dtype: Any = jnp.float32) -> ConvLSTMState:
        """All-zero carry of shape [*batch_shape, features] (batch_shape = (B, H, W))."""
        zeros = jnp.zeros((*batch_shape, features), dtype)
        return ConvLSTMState(c=zeros, h=zeros)
