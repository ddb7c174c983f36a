"""Row-sparse ("lazy") Adam: updates only the rows of a table that a step touched.

A SLIDE step touches a few thousand of the 670,091 output rows and a few thousand of the 135,909 input rows.
A dense Adam update would read and write every row of the table and of both moments each step (three 343 MB
arrays for the output layer), which costs more than the whole sparse forward and backward pass. This update
gathers the touched rows of the table and of its moments, updates them, and scatters them back with
`.at[].set`; under `jax.jit` with the table and state donated, XLA performs the scatters in place, so the
cost is proportional to the number of touched rows, not to the table size.

A bfloat16 table is kept as its bit patterns in a uint16 array (`to_storage` / `from_storage`): XLA:CPU
scatters rows into a uint16 table in place, but converts a whole bfloat16 table around a scatter (a copy of
the table per update, which made bf16 storage much slower than float32 at Amazon-670K's size; see
docs/benchmarks.md, "bf16, ISA cap, huge pages, freed-memory reuse").

Semantics are those of TF's LazyAdam and PyTorch's SparseAdam: the moments of an untouched row do not decay,
and bias correction uses the global step count (incremented once per update). With the same rows touched every
step the result is `optax.adam`'s on those rows, up to float rounding (the same formulas; XLA may round a
product or a fused multiply-add differently: tests/test_row_adam.py checks 1e-6).

Shaped like an optax transformation, over a pytree of tables (each leaf [num_rows, ...]) with one array of
touched row ids per table:

    opt = row_adam(learning_rate=1e-3)
    state = opt.init(tables)                                        # {"weight": W [N, H], "bias": b [N]}
    tables, state = opt.update(row_grads, row_ids, state, tables)    # row_grads {"weight": [M, H], "bias": [M]}

Unlike optax's `update`, which returns updates for the caller to add, it returns the updated tables: the
scatter into the donated table is the update, and a separate add would touch every row.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp


class RowAdamState(NamedTuple):
    """Adam moments shaped like the tables (a pytree of [num_rows, ...] arrays each) and the global update
    count (int32 scalar)."""

    count: jax.Array
    mu: Any
    nu: Any


class RowGradientTransformation(NamedTuple):
    """A row-sparse optimizer: `init(tables) -> state` and
    `update(row_grads, row_ids, state, tables, used=None) -> (tables, state)`."""

    init: Callable[[Any], RowAdamState]
    update: Callable[..., tuple[Any, RowAdamState]]


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


def row_adam(learning_rate: float | jax.Array, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
             moment_dtype: jnp.dtype | None = None) -> RowGradientTransformation:
    """Row-sparse Adam with its hyperparameters bound (as in `optax.adam`).

    moment_dtype: dtype of both moments of every table; default float32, also for bfloat16 tables: the second
    moment of a small gradient is far below bfloat16's 8-bit mantissa resolution relative to its running value.
    bfloat16 moments (half the optimizer's bytes) are stored as uint16 bits, like bfloat16 tables.

    update(row_grads, row_ids, state, tables, used=None):
      row_grads: pytree like `tables` of [M_t, ...] gradient rows; row_ids: the same pytree of int32 [M_t]
        unique row ids, where ids >= num_rows are padding and are ignored (their gathers read a clamped row and
        their scatters are dropped). Ids must be unique: a repeated id would be written twice from the same old
        value, losing one gradient; sum gradient rows per unique id first.
      tables: the parameters (any float dtype, or uint16 holding bfloat16 bits, see `to_storage`; arithmetic
        is float32).
      used: None, or a pytree like `tables` of int32 [] counts (or None leaves): a table's row_ids hold `used`
        real ids first, then only padding, and it is updated `BLOCK` ids at a time over the blocks that hold
        real ids (`update_blocks`), instead of over every id. Each block gathers its own rows again rather
        than reuse the forward's: 0.88x the time (docs/benchmarks.md).
      Returns (new tables, new state); every untouched row is left bit-identical. Donate the tables and the
      state to the enclosing jit so the scatters run in place.
    """
    def init(tables: Any) -> RowAdamState:
        dtype = jnp.float32 if moment_dtype is None else moment_dtype
        # Two distinct buffers per table: a state whose mu and nu alias one array could not be donated.
        # bfloat16 moments are kept as their uint16 bits (`to_storage`), as bfloat16 tables are: XLA's CPU
        # scatters update those in place, and bfloat16 ones not (a bf16 moment step measured 2.75x slower).
        zeros = lambda t: to_storage(jnp.zeros(t.shape, dtype))
        return RowAdamState(count=jnp.zeros((), jnp.int32), mu=jax.tree_util.tree_map(zeros, tables),
                            nu=jax.tree_util.tree_map(zeros, tables))

    def update(row_grads: Any, row_ids: Any, state: RowAdamState, tables: Any,
               used: Any = None) -> tuple[Any, RowAdamState]:
        count = state.count + 1
        treedef = jax.tree_util.tree_structure(tables)
        none = jax.tree_util.tree_unflatten(treedef, [None] * treedef.num_leaves)
        used = none if used is None else used
        leaves = [treedef.flatten_up_to(x)
                  for x in (tables, state.mu, state.nu, row_ids, row_grads, used)]
        out = [update_rows(t, mu, nu, count, ids, g, None, learning_rate, b1, b2, eps) if n is None else
               update_blocks(t, mu, nu, count, ids, g, n, learning_rate, b1, b2, eps)
               for t, mu, nu, ids, g, n in zip(*leaves)]
        new_tables, mu, nu = (jax.tree_util.tree_unflatten(treedef, part) for part in zip(*out))
        return new_tables, RowAdamState(count=count, mu=mu, nu=nu)

    return RowGradientTransformation(init, update)


# Ids per block of `update_blocks`. Against 4,096, the lsh-shared step (E's Adam in blocks) took 0.95x, the
# per-example step 1.00x; 1,024: 0.94x, 1.10x (2026-12-07, EPYC-512, in-process alternation).
BLOCK = 2048


def padded_size(size: int, block: int = BLOCK) -> int:
    """`size` rounded up to whole blocks: give `update(..., used=...)` ids and gradients this long (padding
    ids >= num_rows, zero gradients) and it needs no copy to pad them."""
    return -(-size // block) * block


def real_ids(row_ids: jax.Array, num_rows: int) -> jax.Array:
    """The `used` count (int32 []) of ids that list their real ids (< num_rows) first, then only padding."""
    return jnp.sum(row_ids < num_rows, dtype=jnp.int32)


def update_blocks(table: jax.Array, mu_table: jax.Array, nu_table: jax.Array, count: jax.Array,
                  row_ids: jax.Array, grad_rows: jax.Array, used: jax.Array, lr: float | jax.Array, b1: float,
                  b2: float, eps: float, block: int = BLOCK) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`update_rows` over the first `used` (int32 []) ids only, when the rest of row_ids is padding: `block`
    ids at a time, as many blocks as hold them (a dynamic trip count; in place in the donated tables).

    For id arrays sized for the worst case and partly padding: the per-example step's 54,272 slots hold about
    two thirds as many distinct rows, the shared step's B * max_features feature slots about half to three
    quarters, and `update_rows` would gather, update and write back every slot."""
    size = padded_size(row_ids.shape[0], block)
    if size != row_ids.shape[0]:
        row_ids = jnp.pad(row_ids, (0, size - row_ids.shape[0]), constant_values=table.shape[0])
        grad_rows = jnp.pad(grad_rows, ((0, size - grad_rows.shape[0]),) + ((0, 0),) * (grad_rows.ndim - 1))

    def update_block(i: jax.Array, tables: tuple[jax.Array, jax.Array, jax.Array]):
        ids = jax.lax.dynamic_slice_in_dim(row_ids, i * block, block)
        g = jax.lax.dynamic_slice_in_dim(grad_rows, i * block, block)
        return update_rows(*tables, count, ids, g, None, lr, b1, b2, eps)

    return jax.lax.fori_loop(0, -(-used // block), update_block, (table, mu_table, nu_table))


def adam_rows(w: jax.Array, mu: jax.Array, nu: jax.Array, g: jax.Array, count: jax.Array, lr: float | jax.Array,
              b1: float, b2: float, eps: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Adam's step on gathered float32 rows (w, its moments mu and nu, its gradient g; count: the step number
    after this update, from 1): (new w, new mu, new nu). optax.adam's formulas, equal to its result up to
    float rounding."""
    mu = b1 * mu + (1.0 - b1) * g
    nu = b2 * nu + (1.0 - b2) * g * g
    mu_hat = mu / (1.0 - b1**count).astype(jnp.float32)
    nu_hat = nu / (1.0 - b2**count).astype(jnp.float32)
    return w + (-lr) * (mu_hat / (jnp.sqrt(nu_hat) + eps)), mu, nu


def update_rows(table: jax.Array, mu_table: jax.Array, nu_table: jax.Array, count: jax.Array, row_ids: jax.Array,
                grad_rows: jax.Array, current_rows: jax.Array | None, lr: float | jax.Array, b1: float, b2: float,
                eps: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One table's Adam step on its rows `row_ids` (count: the step number after this update, from 1):
    (new table, new mu, new nu). current_rows: the table's rows at row_ids when already gathered, else None
    (benchmarks/slide_levers.py compares the two)."""
    g = grad_rows.astype(jnp.float32)
    # Padding ids read a clamped real row: their results are dropped by the scatters, and a clamped gather
    # needs no select over the gathered values.
    mu = from_storage(mu_table.at[row_ids].get(mode="clip")).astype(jnp.float32)
    nu = from_storage(nu_table.at[row_ids].get(mode="clip")).astype(jnp.float32)
    if current_rows is None:
        current_rows = table.at[row_ids].get(mode="clip")
    w, mu, nu = adam_rows(from_storage(current_rows).astype(jnp.float32), mu, nu, g, count, lr, b1, b2, eps)
    return (table.at[row_ids].set(_stored_as(w, table.dtype), mode="drop"),
            mu_table.at[row_ids].set(_stored_as(mu, mu_table.dtype), mode="drop"),
            nu_table.at[row_ids].set(_stored_as(nu, nu_table.dtype), mode="drop"))
