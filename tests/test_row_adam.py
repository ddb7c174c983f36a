"""The row-sparse Adam in optax's shape: over a pytree of tables, each with its own touched rows."""

import functools
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
        for moments in (state.mu, state.nu):  # padding ids (10) write nothing: row 9's moments stay zero
            assert not np.asarray(moments[k])[untouched].any(), k
    assert together["embedding"].dtype == jnp.uint16


def test_an_update_over_the_used_blocks_only_equals_the_update_over_every_id():
    # 11 real ids then padding, in blocks of 4: 3 blocks run, the 4th (padding only) is skipped; an id array
    # whose length is not a whole number of blocks is padded.
    rng = np.random.default_rng(1)
    n = 40
    tables = {"weight": jnp.asarray(rng.normal(size=(n, 3)), jnp.float32),
              "bias": jnp.asarray(rng.normal(size=(n,)), jnp.float32)}
    opt = sparse_adam.row_adam(1e-2)
    update = jax.jit(opt.update)
    blocks = jax.jit(functools.partial(sparse_adam.update_blocks, lr=1e-2, b1=0.9, b2=0.999, eps=1e-8, block=4))
    for size in (16, 14):
        ids = jnp.asarray(np.concatenate([rng.choice(n, 11, replace=False), np.full(size - 11, n)]), jnp.int32)
        grads = {"weight": jnp.asarray(rng.normal(size=(size, 3)), jnp.float32),
                 "bias": jnp.asarray(rng.normal(size=(size,)), jnp.float32)}
        every, _ = update(grads, {"weight": ids, "bias": ids}, opt.init(tables), tables)
        blocked = {k: blocks(tables[k], *[jnp.zeros_like(tables[k])] * 2, jnp.int32(1), ids, grads[k],
                             jnp.int32(11))[0] for k in tables}
        used = update(grads, {"weight": ids, "bias": ids}, opt.init(tables), tables,
                      {"weight": jnp.int32(11), "bias": None})[0]
        for k in tables:
            np.testing.assert_array_equal(blocked[k], every[k])  # bit for bit
            np.testing.assert_array_equal(used[k], every[k])
            assert not np.array_equal(every[k], tables[k])
    # A count short of the real ids leaves the later blocks' rows as they were: the blocks really are skipped.
    short = blocks(tables["bias"], *[jnp.zeros(n)] * 2, jnp.int32(1), ids, grads["bias"], jnp.int32(4))[0]
    later = np.asarray(ids[4:11])
    np.testing.assert_array_equal(np.asarray(short)[later], np.asarray(tables["bias"])[later])
    first = np.asarray(ids[:4])
    assert not np.array_equal(np.asarray(short)[first], np.asarray(tables["bias"])[first])


def test_touching_every_row_each_step_is_optax_adam_up_to_rounding():
    import optax

    w = jax.random.normal(jax.random.key(0), (50, 8))
    tx, opt = optax.adam(1e-2), sparse_adam.row_adam(1e-2)
    ref, ref_state, rows, state = w, optax.adam(1e-2).init(w), {"w": w}, opt.init({"w": w})
    every = {"w": jnp.arange(50)}
    for i in range(5):
        g = jax.random.normal(jax.random.key(i + 1), (50, 8)) * 10.0 ** (i % 3 - 1)
        updates, ref_state = tx.update(g, ref_state, ref)
        ref = optax.apply_updates(ref, updates)
        rows, state = opt.update({"w": g}, every, state, rows)
    np.testing.assert_allclose(np.asarray(rows["w"]), np.asarray(ref), rtol=1e-6, atol=1e-7)
    assert not np.allclose(np.asarray(ref), np.asarray(w), rtol=1e-3)  # it moved
