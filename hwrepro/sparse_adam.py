"""Row-sparse ("lazy") Adam: updates only the rows of a table that a step touched.

A SLIDE step touches a few thousand of the 670,091 output rows and a few thousand of the 135,909 input rows.
A dense Adam update would read and write every row of the table and of both moments each step (three 343 MB
arrays for the output layer), which costs more than the whole sparse forward and backward pass. This update
gathers the touched rows of the table and of its moments, updates them, and scatters them back with
`.at[].set`; under `jax.jit` with the table and state donated, XLA performs the scatters in place, so the
cost is proportional to the number of touched rows, not to the table size.

A bfloat16 table is kept as its bit patterns in a uint16 array (`to_storage` / `from_storage`): XLA:CPU
scatters rows into a uint16 table in place, but converts a whole bfloat16 table around a scatter (a copy of
the table per update, which made bf16 storage 4x slower than float32 at Amazon-670K's size).

Semantics are those of TF's LazyAdam and PyTorch's SparseAdam: the moments of an untouched row do not decay,
and bias correction uses the global step count (one count per table, incremented once per update).
With the same rows touched every step the result equals `optax.adam` on those rows.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class RowAdamState(NamedTuple):
    """Adam moments for a table [num_rows, ...] and the global update count (int32 scalar)."""

    mu: jax.Array
    nu: jax.Array
    count: jax.Array


def to_storage(x: jax.Array) -> jax.Array:
    """How a table is kept between updates: bfloat16 as uint16 bit patterns, anything else as it is."""
    return jax.lax.bitcast_convert_type(x, jnp.uint16) if x.dtype == jnp.bfloat16 else x


def from_storage(x: jax.Array) -> jax.Array:
    """The values of a stored table (or of rows gathered from it): uint16 bit patterns read as bfloat16."""
    return jax.lax.bitcast_convert_type(x, jnp.bfloat16) if x.dtype == jnp.uint16 else x


def _stored_as(x: jax.Array, dtype: jnp.dtype) -> jax.Array:
    if dtype == jnp.uint16:
        return jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)
    return x.astype(dtype)


def init(table: jax.Array, dtype: jnp.dtype | None = None) -> RowAdamState:
    """Zero moments shaped like `table` ([num_rows, ...]); `dtype` defaults to float32.

    The moments default to float32 even for a bfloat16 table: the second moment of a small gradient is far
    below bfloat16's 8-bit mantissa resolution relative to its running value.
    """
    dtype = jnp.float32 if dtype is None else dtype
    # Two distinct buffers: a state whose mu and nu alias one array could not be donated.
    return RowAdamState(mu=jnp.zeros(table.shape, dtype), nu=jnp.zeros(table.shape, dtype),
                        count=jnp.zeros((), jnp.int32))


def update(
    table: jax.Array,
    state: RowAdamState,
    row_ids: jax.Array,
    grad_rows: jax.Array,
    lr: float | jax.Array,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    current_rows: jax.Array | None = None,
) -> tuple[jax.Array, RowAdamState]:
    """One Adam step on the rows `row_ids` of `table`; every other row is left bit-identical.

    Args:
      table: [num_rows, ...] parameters (any float dtype, or uint16 holding bfloat16 bits, see `to_storage`;
        arithmetic is done in float32).
      state: its RowAdamState.
      row_ids: int32 [M] unique row ids; ids >= num_rows are padding and are ignored (their gathers read
        zeros and their scatters are dropped). Ids must be unique: a repeated id would be written twice from
        the same old value, losing one gradient; sum gradient rows per unique id first.
      grad_rows: [M, ...] the gradient of each listed row.
      lr, b1, b2, eps: Adam hyperparameters, as in `optax.adam`.
      current_rows: the table's rows at row_ids (anything finite at padding ids) when the caller has
        gathered them already, as a training step has for its forward pass; saves gathering them again.

    Returns:
      (new_table, new_state). Donate `table` and `state` to the enclosing jit so the scatters run in place.
    """
    count = state.count + 1
    g = grad_rows.astype(jnp.float32)
    # Padding ids read a clamped real row: their results are dropped by the scatters, and a clamped gather
    # needs no select over the gathered values.
    mu = state.mu.at[row_ids].get(mode="clip").astype(jnp.float32)
    nu = state.nu.at[row_ids].get(mode="clip").astype(jnp.float32)
    if current_rows is None:
        current_rows = table.at[row_ids].get(mode="clip")
    w = from_storage(current_rows).astype(jnp.float32)
    mu = b1 * mu + (1.0 - b1) * g
    nu = b2 * nu + (1.0 - b2) * g * g
    # Same operations in the same order as optax.adam, so the touched rows match it bit for bit.
    mu_hat = mu / (1.0 - b1**count).astype(jnp.float32)
    nu_hat = nu / (1.0 - b2**count).astype(jnp.float32)
    w = w + (-lr) * (mu_hat / (jnp.sqrt(nu_hat) + eps))
    new_table = table.at[row_ids].set(_stored_as(w, table.dtype), mode="drop")
    new_mu = state.mu.at[row_ids].set(mu.astype(state.mu.dtype), mode="drop")
    new_nu = state.nu.at[row_ids].set(nu.astype(state.nu.dtype), mode="drop")
    return new_table, RowAdamState(mu=new_mu, nu=new_nu, count=count)
