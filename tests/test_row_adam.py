"""The row-sparse Adam in optax's shape: over a pytree of tables, each with its own touched rows."""

import jax
import jax.numpy as jnp
import numpy as np

from hwrepro.sparse import sparse_adam


def test_a_pytree_of_tables_updates_each_table_at_its_own_rows_like_one_table_at_a_time():
    rng = np.random.default_rng(0)
    tables = {"weight": jnp.asarray(rng.normal(size=(10, 4)), jnp.float32),
              "bias": jnp.asarray(rng.normal(size=(10,)), jnp.float32),
              "embedding": jnp.asarray(rng.normal(size=(7, 4)), jnp.bfloat16)}
    tables["embedding"] = sparse_adam.to_storage(tables["embedding"])  # bf16 kept as uint16 bits
    ids = {"weight": jnp.array([1, 4, 10], jnp.int32), "bias": jnp.array([1, 4, 10], jnp.int32),
           "embedding": jnp.array([0, 6], jnp.int32)}
    opt = sparse_adam.row_adam(1e-2, b1=0.8, b2=0.99)
    together, state = tables, opt.init(tables)
    alone = {k: (v, opt.init(v)) for k, v in tables.items()}
    update = jax.jit(opt.update)
    for _ in range(3):
        grads = {k: jnp.asarray(rng.normal(size=(len(ids[k]), *v.shape[1:])), jnp.float32) for k, v in tables.items()}
        together, state = update(grads, ids, state, together)
        alone = {k: update(grads[k], ids[k], s, t) for k, (t, s) in alone.items()}
    assert int(state.count) == 3 and jax.tree_util.tree_structure(state.mu) == jax.tree_util.tree_structure(tables)
    for k in tables:
        np.testing.assert_array_equal(together[k], alone[k][0])  # bit for bit
        untouched = np.setdiff1d(np.arange(tables[k].shape[0]), np.asarray(ids[k]))
        np.testing.assert_array_equal(np.asarray(together[k])[untouched], np.asarray(tables[k])[untouched])
    assert together["embedding"].dtype == jnp.uint16
