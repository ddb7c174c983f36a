"""SLIDE's sparse training core: sparse paths against dense references, row-sparse Adam against optax, and
the three training methods on a tiny learnable problem."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hwrepro import sparse
from hwrepro.sparse import candidates
from hwrepro.sparse import sparse_adam
from hwrepro.models import sparse_layers as model

# Compiling is most of these tests' time and none checks bits or numerics of the optimized code, except those
# that take `optimized`.
pytestmark = pytest.mark.usefixtures("unoptimized_module")

NF, N, H = 50, 300, 16  # features, labels, hidden
B, F, LMAX = 32, 4, 4  # batch, active features and labels per example
M = 160  # shared candidates: more than the B * LMAX label slots, so every true label fits
TINY_LSH = sparse.LshSpec(kind="dwta", num_hashes=2, num_tables=8, options=(("bin_size", 4),))

# The candidate selections compiled whole, as the training step runs them, once per shape and shared by the
# tests (called eagerly, each of their primitives would be compiled on its own).
batch_shared_candidates = jax.jit(sparse.batch_shared_candidates, static_argnums=(3, 4, 5, 6))
per_example_candidates = jax.jit(sparse.per_example_candidates, static_argnums=(3, 4, 5))


def random_batch(rng: np.random.Generator, b: int = B) -> dict:
    """Random batch in the shared format, with some padding in features and labels."""
    feat_ids = np.stack([rng.choice(NF, F, replace=False) for _ in range(b)]).astype(np.int32)
    feat_ids[::3, -1] = NF
    feat_vals = np.where(feat_ids < NF, rng.uniform(0.5, 1.5, feat_ids.shape), 0.0).astype(np.float32)
    labels = np.stack([rng.choice(N, LMAX, replace=False) for _ in range(b)]).astype(np.int32)
    labels[::2, -2:] = N
    return {"feat_ids": feat_ids, "feat_vals": feat_vals, "labels": labels}


# A learnable problem: each feature "names" one label; an example's labels are those of its features.
FEATURE_LABEL = np.random.default_rng(7).choice(N, NF, replace=False).astype(np.int32)


def learnable_batch(rng: np.random.Generator, b: int = B) -> dict:
    feat_ids = np.stack([rng.choice(NF, F, replace=False) for _ in range(b)]).astype(np.int32)
    labels = FEATURE_LABEL[feat_ids]
    return {"feat_ids": feat_ids, "feat_vals": np.ones(feat_ids.shape, np.float32), "labels": labels}


def scaled_params(key: jax.Array) -> sparse.Params:
    """Parameters with O(1) logits so that comparisons are not dominated by tiny numbers."""
    p = sparse.init_params(key, NF, N, H)
    return jax.tree.map(lambda x: x * 50.0 + 0.1, p)


@pytest.fixture(scope="module")
def params():
    return jax.jit(scaled_params)(jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def batch():
    return random_batch(np.random.default_rng(0))


def assert_logits_match(actual, expected, h, params, ids):
    """|actual - expected| <= 1e-6 x the logit's scale, sum_i |h_i w_i| + |b|: a product summed in another
    order (a gather of rows, another CPU's kernel) differs by a few roundings of its terms, which is far more
    than 1e-6 of a logit that nearly cancels to 0."""
    w, b = np.asarray(params["output"]["weight"]), np.asarray(params["output"]["bias"])
    ids = np.broadcast_to(np.asarray(ids), np.shape(expected))
    scale = np.einsum("bh,bkh->bk", np.abs(np.asarray(h)), np.abs(w[ids])) + np.abs(b[ids])
    assert np.all(np.abs(np.asarray(actual) - np.asarray(expected)) <= 1e-6 * scale)


def test_candidate_logits_equal_dense_logits(params, batch):
    h = jax.jit(model.SparseInput(NF, H).apply)({"params": params["input"]}, batch["feat_ids"], batch["feat_vals"])
    out = model.SparseOutput(N)  # input width from h, as nn.Dense
    apply = jax.jit(out.apply)  # compiled whole per candidate shape (eagerly, primitive by primitive)
    assert jax.tree_util.tree_map(jnp.shape, jax.jit(out.init)(jax.random.key(0), h)["params"]) == {
        "weight": (N, H), "bias": (N,)}
    dense = apply({"params": params["output"]}, h)
    assert dense.shape == (B, N)
    # Padding candidates (id N) score -inf, so a cross-entropy over them adds no phantom class.
    padded = apply({"params": params["output"]}, h, jnp.array([3, N, N], jnp.int32))
    assert np.all(np.isneginf(padded[:, 1:])) and np.all(np.isfinite(padded[:, 0]))
    xent = optax.softmax_cross_entropy_with_integer_labels(padded, jnp.zeros(B, jnp.int32))
    np.testing.assert_allclose(xent, 0.0, atol=1e-6)
    shared = jnp.array([5, 0, 299, 17, 123], jnp.int32)
    assert_logits_match(apply({"params": params["output"]}, h, shared), dense[:, shared], h, params, shared)
    per_example = jnp.asarray(np.random.default_rng(1).integers(0, N, (B, 7)), jnp.int32)
    assert_logits_match(apply({"params": params["output"]}, h, per_example),
                        np.take_along_axis(np.asarray(dense), np.asarray(per_example), axis=1), h, params,
                        per_example)
    # Wrong rows are far outside that tolerance.
    with pytest.raises(AssertionError):
        assert_logits_match(apply({"params": params["output"]}, h, shared + 1), dense[:, shared], h, params, shared)
    # The module is the pure function: hidden layer by hand from the dense definition.
    x = np.zeros((B, NF + 1), np.float32)
    np.add.at(x, (np.arange(B)[:, None], batch["feat_ids"]), batch["feat_vals"])
    h_ref = np.maximum(x[:, :NF] @ np.asarray(params["input"]["embedding"]) + params["input"]["bias"], 0)
    np.testing.assert_allclose(h, h_ref, rtol=1e-5, atol=1e-5)


def test_sparse_gradient_equals_dense_gradient_when_candidates_cover_all(params, batch):
    """Gradient w.r.t. gathered rows (the training path) == matching rows of jax.grad of the dense loss."""
    e, b1 = params["input"]["embedding"], params["input"]["bias"]
    w, b = params["output"]["weight"], params["output"]["bias"]
    perm = jnp.asarray(np.random.default_rng(2).permutation(N), jnp.int32)  # all neurons, shuffled
    mask = jnp.ones(N, bool)
    targets = jax.jit(candidates.shared_targets, static_argnums=2)(jnp.asarray(batch["labels"]), perm, N)
    unique = jax.jit(functools.partial(jnp.unique, size=B * F, fill_value=NF, return_inverse=True))
    feat_rows, inv = unique(batch["feat_ids"].ravel())
    inv = inv.reshape(B, F)

    def sparse_loss(e_rows, b1_, w_rows, b_rows):
        h = model.embedding_sum(e_rows[inv], batch["feat_vals"], b1_)
        return model.softmax_xent(model.candidate_logits(w_rows, b_rows, h), targets, mask)

    def dense_loss(e_, b1_, w_, b_):
        h = model.sparse_hidden(e_, b1_, batch["feat_ids"], batch["feat_vals"])
        return model.softmax_xent(model.output_logits(w_, b_, h), model.label_targets(batch["labels"], N))

    g_sparse = jax.jit(jax.grad(sparse_loss, argnums=(0, 1, 2, 3)))(
        model.gather_rows(e, feat_rows), b1, model.gather_rows(w, perm), model.gather_rows(b, perm))
    g_dense = jax.jit(jax.grad(dense_loss, argnums=(0, 1, 2, 3)))(e, b1, w, b)
    assert float(jnp.abs(g_dense[2]).max()) > 1e-4
    np.testing.assert_allclose(g_sparse[2], g_dense[2][perm], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(g_sparse[3], g_dense[3][perm], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(g_sparse[1], g_dense[1], rtol=1e-4, atol=1e-7)
    real = np.asarray(feat_rows) < NF
    np.testing.assert_allclose(np.asarray(g_sparse[0])[real], np.asarray(g_dense[0])[np.asarray(feat_rows)[real]],
                               rtol=1e-4, atol=1e-7)
    # SLIDE's gradient at the logits: (p - t) / B.
    z = model.output_logits(w, b, model.sparse_hidden(e, b1, batch["feat_ids"], batch["feat_vals"]))
    t = model.label_targets(batch["labels"], N)
    g_z = jax.jit(jax.grad(lambda z_: model.softmax_xent(z_, t)))(z)
    np.testing.assert_allclose(g_z, (jax.nn.softmax(z) - t) / B, rtol=1e-5, atol=1e-8)


def test_row_adam_equals_optax_on_touched_rows_and_leaves_others_bit_identical(optimized):
    rng = np.random.default_rng(3)
    table = jnp.asarray(rng.normal(size=(12, 5)), jnp.float32)
    rows = jnp.array([2, 7, 5, 12, 12], jnp.int32)  # two padding ids (>= 12)
    real = np.array([2, 7, 5])
    tx = optax.adam(1e-2)
    sub = table[real]
    sub_state = tx.init(sub)
    opt = sparse_adam.row_adam(1e-2)
    state = opt.init(table)
    update = jax.jit(opt.update, donate_argnums=(2, 3))
    original = np.asarray(table)
    for _ in range(4):
        g = jnp.asarray(rng.normal(size=(5, 5)), jnp.float32)
        table, state = update(g, rows, state, table)
        u, sub_state = tx.update(g[:3], sub_state, sub)
        sub = optax.apply_updates(sub, u)
    np.testing.assert_allclose(np.asarray(table)[real], sub, rtol=1e-6, atol=1e-7)
    untouched = np.setdiff1d(np.arange(12), real)
    np.testing.assert_array_equal(np.asarray(table)[untouched], original[untouched])
    np.testing.assert_array_equal(np.asarray(state.mu)[untouched], 0)
    assert int(state.count) == 4


def test_batch_shared_candidates_contain_labels_are_unique_and_fixed_size(batch):
    rng = np.random.default_rng(4)
    labels = jnp.asarray(batch["labels"])
    retrieved = rng.integers(0, N + 1, (B, 8, 3)).astype(np.int32)
    retrieved[0, :3, 0] = 250  # retrieved 3 times: must be kept
    for sampler in sparse.SAMPLERS:
        ids, mask = batch_shared_candidates(labels, jnp.asarray(retrieved), jax.random.PRNGKey(1), M, N, 2, sampler)
        ids, mask = np.asarray(ids), np.asarray(mask)
        assert ids.shape == (M,) and mask.shape == (M,)
        real = ids[mask]
        assert len(np.unique(real)) == len(real) and np.all(real < N) and np.all(ids[~mask] == N)
        assert np.all(np.diff(ids) >= 0) and np.all(np.diff(real) > 0)  # ascending, padding (N) last
        assert set(batch["labels"][batch["labels"] < N].tolist()) <= set(real.tolist())
        assert 250 in real
        assert mask.sum() > 0.8 * M  # the random fill filled most of the rest
    per_ids, per_mask = per_example_candidates(labels, jnp.asarray(retrieved.reshape(B, -1)),
                                               jax.random.PRNGKey(2), 16, N).as_rows(N)
    for row, m_row, lab in zip(np.asarray(per_ids), np.asarray(per_mask), batch["labels"]):
        assert len(np.unique(row[m_row])) == m_row.sum() and set(lab[lab < N].tolist()) <= set(row[m_row].tolist())


@pytest.mark.parametrize("num_labels", [10_000, 2**30])  # one packed int32 sort key; a two-key sort
def test_per_example_candidates_rank_labels_then_retrieved_then_fill(num_labels):
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 40, (6, 3)).astype(np.int32)
    labels[0, 1:] = num_labels  # padding
    retrieved = rng.integers(0, 40, (6, 10)).astype(np.int32)
    ids, mask = per_example_candidates(jnp.asarray(labels), jnp.asarray(retrieved), jax.random.PRNGKey(3), 12,
                                       num_labels).as_rows(num_labels)
    for row, m_row, lab, ret in zip(np.asarray(ids), np.asarray(mask), labels, retrieved):
        real = row[m_row]
        assert m_row.sum() == 12 and len(np.unique(real)) == 12 and np.all(row[~m_row] == num_labels)
        assert set(lab[lab < num_labels].tolist()) <= set(real.tolist())
        # Retrieved ids rank above the random fill: as many of them as fit after the labels are kept.
        kept = len(set(ret.tolist()) & set(real.tolist()) - set(lab.tolist()))
        assert kept == min(len(set(ret.tolist()) - set(lab.tolist())), 12 - len(set(lab[lab < num_labels].tolist())))


def test_random_fill_that_fits_is_spread_over_all_ids():
    # More ids drawn than slots left: the ones kept must be a random subset of the draws, not the lowest ids.
    n = 10_000
    rng = np.random.default_rng(6)
    labels = jnp.full((4, 2), n, jnp.int32)
    retrieved = jnp.asarray(np.repeat(np.arange(600), 2), jnp.int32)  # 600 ids twice: kept, 400 slots left
    ids, mask = batch_shared_candidates(labels, retrieved, jax.random.PRNGKey(7), 1000, n)
    fill = np.asarray(ids)[np.asarray(mask) & (np.asarray(ids) >= 600)]
    assert len(fill) > 350 and 3500 < np.median(fill) < 6500 and fill.max() > 9000
    # Per example: 20 retrieved ids, 30 slots left for 50 draws, in each of 64 rows.
    retrieved = jnp.asarray(rng.integers(0, 20, (64, 20)), jnp.int32)
    # The fill is one draw for the batch: each row takes its first draws that are not its own ids.
    sets = per_example_candidates(jnp.full((64, 2), n, jnp.int32), retrieved, jax.random.PRNGKey(8), 50, n)
    ids, mask = (np.asarray(a) for a in sets.as_rows(n))
    fill = ids[mask & (ids >= 20)]
    assert len(fill) > 64 * 25 and len(np.unique(fill)) <= 50 and np.all(np.sum(mask, axis=1) == 50)
    drawn = np.asarray(sets.fill)[np.asarray(sets.fill) < n]
    assert np.all(np.isin(np.unique(fill), drawn)) and fill.max() > 0.8 * n and fill.min() < 0.2 * n


def test_retrieved_ids_tied_at_the_cut_are_a_random_subset():
    # 3,000 ids retrieved twice, 2,000 once, 1,000 slots: all twice-seen ids that fit are kept, and which ones
    # is random over the whole id range (top_k on the counts alone would keep ids 0..999).
    n = 10_000
    twice = np.arange(0, n, 2)[:3000]
    retrieved = jnp.asarray(np.concatenate([twice, twice, np.arange(1, 4001, 2)]), jnp.int32)
    ids, mask = batch_shared_candidates(jnp.full((4, 2), n, jnp.int32), retrieved, jax.random.PRNGKey(9), 1000, n,
                                        min_count=1)
    kept = np.asarray(ids)[np.asarray(mask)]
    assert len(kept) == 1000 and np.all(kept % 2 == 0)
    assert 2000 < np.median(kept) < 4000 and kept.max() > 5600
    again, _ = batch_shared_candidates(jnp.full((4, 2), n, jnp.int32), retrieved, jax.random.PRNGKey(10), 1000, n,
                                       min_count=1)
    assert 100 < len(np.setdiff1d(kept, np.asarray(again))) < 900


@functools.partial(jax.jit, static_argnums=(3, 4, 6, 7, 8))
def full_array_top_k(labels, retrieved, key, num_candidates, num_labels, min_count, sampler, num_valid=None,
                     offset=0):
    """The selection's definition, written over every label id: priorities in one [N + 1] array, one top_k
    over all of it (batch_shared_candidates compacts or ranks only the listed ids; a top_k over 670k labels is
    several times slower). Ids from num_valid on (a shard's padding rows) have no priority. Returns the
    top_k's (priorities, ids)."""
    num_valid = num_labels if num_valid is None else num_valid
    k_fill, k_tie = jax.random.split(key)
    score = jnp.zeros(num_labels + 1).at[retrieved.ravel()].add(1.0)
    score = jnp.where((score >= min_count) & (jnp.arange(num_labels + 1) < num_valid), score, 0.0)
    score = score.at[labels.ravel()].set(jnp.inf)
    score = score + jnp.where(score > 0, 0.5 * candidates.uniform_by_id(k_tie, jnp.arange(num_labels + 1)), 0.0)
    fill = sparse.sample_labels(k_fill, (num_candidates,), num_valid, sampler, offset)
    # A drawn id's priority is its first draw's: the earlier drawn, the higher.
    score = score.at[fill].max(0.75 - 0.5 * jnp.arange(num_candidates, dtype=jnp.int32) / num_candidates)
    return jax.lax.top_k(score[:num_labels], num_candidates)


def full_array_selection(labels, retrieved, key, num_candidates, num_labels, min_count, sampler, num_valid=None,
                         offset=0):
    """The ids full_array_top_k selects, ascending, num_labels at the slots without a priority."""
    priority, ids = full_array_top_k(labels, retrieved, key, num_candidates, num_labels, min_count, sampler,
                                     num_valid, offset)
    return np.sort(np.where(np.asarray(priority) > 0, np.asarray(ids), num_labels))


@pytest.mark.parametrize("min_count, retrieved_ids", [(2, 3_000), (1, 3_000), (1, 40), (2, 0), (2, None)])
def test_batch_shared_candidates_equal_a_top_k_over_every_label(min_count, retrieved_ids):
    # Overfull (min_count=1: ~2,600 distinct retrieved ids for 500 slots: ranked by top_k), underfull (compacted),
    # nothing retrieved but padding, nothing retrieved (None: sampled softmax); padded labels and retrieved ids
    # (id N) throughout.
    n, m = 5_000, 500
    rng = np.random.default_rng(11)
    labels = rng.integers(0, n, (8, 4)).astype(np.int32)
    labels[::2, -1] = n
    retrieved = np.full((8, 5, 100), n, np.int32)
    retrieved.reshape(-1)[:retrieved_ids or 0] = rng.integers(0, n, retrieved_ids or 0)
    labels, retrieved = jnp.asarray(labels), jnp.asarray(retrieved)
    for sampler in sparse.SAMPLERS:
        for seed in range(3):
            key = jax.random.PRNGKey(seed)
            ids, mask = batch_shared_candidates(labels, None if retrieved_ids is None else retrieved, key, m, n,
                                                min_count, sampler)
            expected = full_array_selection(labels, retrieved, key, m, n, min_count, sampler)
            np.testing.assert_array_equal(np.asarray(ids), expected)
            np.testing.assert_array_equal(np.asarray(mask), expected < n)


@pytest.mark.parametrize("min_count, retrieved_ids", [(2, 3_000), (1, 3_000), (2, None)])
def test_a_shards_selection_skips_its_padding_rows_and_draws_by_global_rank(min_count, retrieved_ids):
    # The last of several model shards: local ids [0, n), of which [valid, n) are padding rows that its tables
    # return often; its id 0 is label `offset`. Its selection is the reference's with those rows unranked.
    n, valid, offset, m = 5_000, 4_960, 20_000, 500
    rng = np.random.default_rng(12)
    labels = rng.integers(0, valid, (8, 4)).astype(np.int32)
    labels[::2, -1] = n
    retrieved = np.full((8, 5, 100), n, np.int32)
    retrieved.reshape(-1)[:retrieved_ids or 0] = rng.integers(0, n, retrieved_ids or 0)
    retrieved[:, :, :10] = valid + np.arange(10)  # padding rows retrieved 40 times each
    labels, retrieved = jnp.asarray(labels), jnp.asarray(retrieved)
    select = jax.jit(functools.partial(batch_shared_candidates, num_candidates=m, num_labels=n,
                                       min_count=min_count), static_argnames="sampler")
    for sampler in sparse.SAMPLERS:
        for seed in range(2):
            key = jax.random.PRNGKey(seed)
            # num_valid and offset traced, as a shard computes them from its position
            ids, mask = select(labels, None if retrieved_ids is None else retrieved, key, sampler=sampler,
                               num_valid=jnp.int32(valid), offset=jnp.int32(offset))
            expected = full_array_selection(labels, retrieved, key, m, n, min_count, sampler, valid, offset)
            np.testing.assert_array_equal(np.asarray(ids), expected)
            ids, mask = np.asarray(ids), np.asarray(mask)
            assert np.all(ids[mask] < valid) and np.all(ids[~mask] == n) and mask.sum() > 0.99 * m


def test_more_distinct_labels_than_candidates_keeps_the_first_listed():
    for retrieved in (None, jnp.array([7, 7, 50], jnp.int32)):
        ids, mask = batch_shared_candidates(jnp.array([[5, 3, 1]], jnp.int32), retrieved, jax.random.PRNGKey(0), 2,
                                            50)
        assert np.asarray(ids).tolist() == [3, 5] and np.asarray(mask).all()


def test_topk_chunked_equals_dense_and_precision_at_k(params, batch):
    h = model.sparse_hidden(params["input"]["embedding"], params["input"]["bias"], batch["feat_ids"],
                            batch["feat_vals"])
    dense = np.asarray(model.output_logits(params["output"]["weight"], params["output"]["bias"], h))
    ids = np.asarray(sparse.topk(params, batch, 5, chunk=70))  # 300 = 4 * 70 + 20: last chunk overlaps
    np.testing.assert_array_equal(ids, np.argsort(-dense, axis=1)[:, :5])
    np.testing.assert_array_equal(ids, np.asarray(sparse.topk(params, batch, 5)))
    pred = jnp.array([[1, 2, 3, 4, 5], [9, 8, 7, 6, -1]], jnp.int32)
    labels = jnp.array([[2, 5, 300], [300, 300, 300]], jnp.int32)
    p = sparse.precision_at_k(pred, labels)
    assert float(p["P@1"]) == 0.0 and float(p["P@3"]) == pytest.approx(1 / 6) and float(p["P@5"]) == pytest.approx(0.2)
    assert float(sparse.precision_at_k(pred, labels, num_labels=N)["P@5"]) == pytest.approx(0.4)


STEPS = {
    "dense": sparse.make_train_step("dense", learning_rate=1e-2),
    "sampled": sparse.make_train_step("sampled", learning_rate=1e-2, num_candidates=M, sampler="log_uniform"),
    "lsh": sparse.make_train_step("lsh", learning_rate=1e-2, num_candidates=M, bucket_capacity=8),
    "lsh_per_example": sparse.make_train_step("lsh", learning_rate=3e-2, num_candidates=64,
                                             candidate_mode="per_example", bucket_capacity=4),
}


def test_embedding_and_output_rows_outside_the_batch_are_bit_identical(optimized, batch):
    for name in ("sampled", "lsh"):
        state = sparse.init_state(jax.random.PRNGKey(5), NF, N, H, method=name, lsh_spec=TINY_LSH)
        e0 = np.asarray(state.params["input"]["embedding"])
        w0 = np.asarray(state.params["output"]["weight"])
        state, _ = STEPS[name](state, batch, jax.random.PRNGKey(6))
        e1 = np.asarray(state.params["input"]["embedding"])
        active = np.unique(batch["feat_ids"][batch["feat_ids"] < NF])
        inactive = np.setdiff1d(np.arange(NF), active)
        np.testing.assert_array_equal(e1[inactive], e0[inactive])
        assert np.all(np.any(e1[active] != e0[active], axis=1))
        changed = np.any(np.asarray(state.params["output"]["weight"]) != w0, axis=1)
        assert 0 < changed.sum() <= M
        assert np.all(changed[np.unique(batch["labels"][batch["labels"] < N])])


def test_per_example_step_equals_the_dense_gradient_and_adam_of_each_examples_own_softmax(batch):
    # B * m = 2,048 slots over 300 labels: most rows are candidates of several examples, whose gradients the
    # step folds onto one slot. Reference: each example's softmax over its own candidates, differentiated with
    # respect to all of W and b, then Adam's first step on every row any example scored.
    lr, m, capacity = 3e-2, 64, 4
    step = sparse.make_train_step("lsh", learning_rate=lr, num_candidates=m, candidate_mode="per_example",
                                  bucket_capacity=capacity)
    state = sparse.init_state(jax.random.PRNGKey(5), NF, N, H, method="lsh", lsh_spec=TINY_LSH)
    p0 = jax.tree.map(np.asarray, state.params)
    key = jax.random.PRNGKey(6)

    @jax.jit
    def reference(params, hash_fn, tables):
        hidden = lambda hb: model.sparse_hidden(params["input"]["embedding"], hb, batch["feat_ids"],
                                                batch["feat_vals"])
        h = hidden(params["input"]["bias"])
        retrieved = sparse.lsh.query(hash_fn, tables, h, capacity).reshape(B, -1)
        labels = jnp.asarray(batch["labels"])
        cand, mask = sparse.per_example_candidates(labels, retrieved, key, m, N).as_rows(N)
        # The targets of all N labels (1 / |labels| at each), read at each example's candidate columns.
        targets = jnp.where(cand < N, jnp.take_along_axis(model.label_targets(labels, N), jnp.minimum(cand, N - 1),
                                                          axis=1), 0.0)
        loss_fn = lambda w, b, hb: model.softmax_xent(model.output_logits(w, b, hidden(hb), cand), targets, mask)
        loss, grads = jax.value_and_grad(loss_fn, argnums=(0, 1, 2))(
            params["output"]["weight"], params["output"]["bias"], params["input"]["bias"])
        return loss, grads, cand, mask, targets

    loss, (g_w, g_b, g_hb), cand, mask, targets = jax.tree.map(
        np.asarray, reference(state.params, state.hash_fn, state.tables))
    np.testing.assert_allclose(targets.sum(1), 1.0, rtol=1e-6)  # every example's labels are among its candidates
    state, metrics = step(state, batch, key)
    touched = np.zeros(N, bool)
    touched[cand[mask]] = True
    assert 200 < touched.sum() < mask.sum() // 4  # rows shared by many examples
    np.testing.assert_allclose(float(metrics["loss"]), loss, rtol=1e-6)
    assert float(metrics["candidates"]) == mask.sum() / B
    # The hidden layer's bias, a dense parameter, takes Adam's first step too.
    hb1 = np.asarray(state.params["input"]["bias"])
    np.testing.assert_allclose(p0["input"]["bias"] - hb1, lr * g_hb / (np.abs(g_hb) + 1e-8), rtol=1e-4,
                               atol=1e-4 * lr)
    for name, g, w0 in (("weight", g_w, p0["output"]["weight"]), ("out_bias", g_b, p0["output"]["bias"])):
        mu = np.asarray(state.opt_state.rows.mu[name])
        np.testing.assert_allclose(mu[touched], 0.1 * g[touched], rtol=1e-5, atol=1e-6 * np.abs(g).max())
        np.testing.assert_array_equal(mu[~touched], 0)
        w1 = np.asarray(state.params["output"]["weight" if name == "weight" else "bias"])
        # Adam's first step moves each coordinate by lr * g / (|g| + eps).
        np.testing.assert_allclose((w0 - w1)[touched], lr * g[touched] / (np.abs(g[touched]) + 1e-8), rtol=1e-4,
                                   atol=1e-4 * lr)
        np.testing.assert_array_equal(w1[~touched], w0[~touched])


@pytest.mark.parametrize("name", list(STEPS))
def test_every_method_learns_a_tiny_problem(name):
    method = "lsh" if name.startswith("lsh") else name
    state = sparse.init_state(jax.random.PRNGKey(8), NF, N, H, method=method, lsh_spec=TINY_LSH)
    rng = np.random.default_rng(9)
    key = jax.random.PRNGKey(10)
    losses = []
    for i in range(150):
        key, k_step, k_tables = jax.random.split(key, 3)
        state, metrics = STEPS[name](state, learnable_batch(rng), k_step)
        losses.append(float(metrics["loss"]))
        if method == "lsh" and i % 25 == 24:
            state = sparse.redraw(state, k_tables) if i % 50 == 49 else sparse.rebuild(state, k_tables)
    assert int(state.step) == 150
    floor = np.log(F)  # every example has F equally weighted labels: the loss cannot go below their entropy
    assert np.mean(losses[-10:]) - floor < 0.5 * (np.mean(losses[:10]) - floor)
    test = learnable_batch(np.random.default_rng(11), 256)
    p = sparse.precision_at_k(sparse.topk(state.params, test, 5), test["labels"])
    assert float(p["P@1"]) > 0.5  # chance is F / N = 1.3%
    if method == "lsh":
        ids = np.asarray(sparse.topk_lsh(state.params, state.hash_fn, state.tables, test, 5, bucket_capacity=32))
        assert ids.shape == (256, 5) and np.all((ids >= -1) & (ids < N))


@pytest.mark.parametrize("name", ["lsh", pytest.param("lsh_per_example", marks=pytest.mark.slow)])
def test_incremental_tables_follow_the_rows_each_step_changed(name, batch):
    # Tables of buckets large enough never to overflow: after refile they hold what a full build would.
    per_step = sparse.changed_rows_per_step("per_example" if name == "lsh_per_example" else "shared",
                                            64 if name == "lsh_per_example" else M, B,
                                            LMAX + TINY_LSH.num_tables * 4)  # labels + retrieved per example
    state = sparse.init_state(jax.random.PRNGKey(12), NF, N, H, method="lsh", lsh_spec=TINY_LSH,
                              table_capacity=N, pending_rows=2 * per_step)
    w0 = np.asarray(state.params["output"]["weight"])
    for i in range(2):
        state, _ = STEPS[name](state, random_batch(np.random.default_rng(13 + i)), jax.random.PRNGKey(14 + i))
    assert int(state.tables.num_pending) == 2 * per_step
    changed = np.flatnonzero(np.any(np.asarray(state.params["output"]["weight"]) != w0, axis=1))
    assert len(changed) > 0 and np.all(np.isin(changed, np.asarray(state.tables.pending)))  # every one noted
    state = sparse.refile(state, jax.random.PRNGKey(16))
    full = sparse.rebuild(jax.tree.map(jnp.copy, state), jax.random.PRNGKey(17)).tables
    for table in range(TINY_LSH.num_tables):
        for bucket in range(16):
            got, want = (np.asarray(t.slots)[table, bucket] for t in (state.tables, full))
            np.testing.assert_array_equal(np.sort(got[got < N]), np.sort(want[want < N]))
    assert int(state.tables.num_pending) == 0 and isinstance(full, sparse.lsh.BucketTables)


def test_lsh_scored_top_k_equals_dense_top_k_when_every_label_is_retrieved(params, batch):
    # One-bit SimHash tables probed in both buckets, every bucket read whole: every label is scored.
    dense = np.asarray(sparse.topk(params, batch, 5))
    spec = sparse.LshSpec(kind="simhash", num_hashes=1, num_tables=2)
    w, b = params["output"]["weight"], params["output"]["bias"]
    for inner_product in (False, True):
        if inner_product:
            hash_fn, tables = sparse.inference_tables(w, b, spec, jax.random.PRNGKey(18))
        else:
            hash_fn = spec.init(jax.random.PRNGKey(18), H)
            tables = sparse.lsh.build_tables(hash_fn, w, jax.random.PRNGKey(19))
        for max_scored in (None, N):  # N of the 2 * 2 * N slots: every distinct id
            scores, ids, scored = sparse.topk_lsh_scored(params, hash_fn, tables, batch, 5, bucket_capacity=N,
                                                         probe_bits=1, inner_product=inner_product,
                                                         max_scored=max_scored)
            np.testing.assert_array_equal(ids, dense)
            np.testing.assert_allclose(scores, sparse.topk_scored(params, batch, 5)[0], rtol=1e-6)
            np.testing.assert_array_equal(scored, N)


def test_lsh_scoring_budget_keeps_the_most_often_retrieved(params, batch):
    # Two tables of one bucket each, read whole: every id retrieved twice, except those cut by the capacity.
    w, b = params["output"]["weight"], params["output"]["bias"]
    hash_fn = sparse.LshSpec(kind="simhash", num_hashes=1, num_tables=2).init(jax.random.PRNGKey(20), H)
    hash_fn = hash_fn._replace(planes=jnp.zeros_like(hash_fn.planes))  # every vector in bucket 0
    tables = sparse.lsh.build_tables(hash_fn, w, jax.random.PRNGKey(21))
    h = jnp.ones((2, H))
    ids, logits = sparse.lsh_logits(w, b, h, hash_fn, tables, 200, max_scored=120)
    twice = np.intersect1d(*np.asarray(sparse.lsh.query(hash_fn, tables, h[:1], 200))[0])  # in both tables
    assert ids.shape == (2, 120) and len(twice) > 120 - 1
    assert set(np.asarray(ids)[0].tolist()) <= set(twice.tolist()) and len(set(np.asarray(ids)[0].tolist())) == 120
    assert np.all(np.isfinite(np.asarray(logits)))
    # A model shard's padding rows (ids from num_valid on, which its tables hold) take none of the budget:
    # every retrieved id below num_valid is scored (fewer than 120), none above.
    ids, logits = (np.asarray(x) for x in sparse.lsh_logits(w, b, h, hash_fn, tables, 200, max_scored=120,
                                                              num_valid=100))
    retrieved = np.asarray(sparse.lsh.query(hash_fn, tables, h[:1], 200)).ravel()
    assert set(ids[0][ids[0] < N].tolist()) == set(retrieved[retrieved < 100].tolist())
    assert np.all(np.isneginf(logits[ids == N])) and np.all(np.isfinite(logits[ids < N]))


def test_blocked_top_k_equals_top_k():
    from hwrepro.sparse import blocked_top_k

    x = jax.random.normal(jax.random.key(3), (6, 1024))
    x = x.at[0, :256].set(5.0 + jnp.arange(256) * 1e-3)   # the best values crowded into a few blocks
    v, i = blocked_top_k(x, 5, block=64)
    v_ref, i_ref = jax.lax.top_k(x, 5)
    np.testing.assert_array_equal(np.asarray(i), np.asarray(i_ref))
    np.testing.assert_array_equal(np.asarray(v), np.asarray(v_ref))


def test_dense_scoring_in_chunks_returns_more_labels_than_one_chunk_holds():
    w = jax.random.normal(jax.random.key(4), (1000, 8))
    b = jnp.zeros(1000)
    h = jax.random.normal(jax.random.key(5), (3, 8))
    v, i = sparse.evaluation.scored_topk(w, b, h, 300, chunk=256)  # k above the chunk: 4 chunks, the last shifted
    v_ref, i_ref = jax.lax.top_k(h @ w.T, 300)
    np.testing.assert_array_equal(np.asarray(i), np.asarray(i_ref))
    np.testing.assert_allclose(np.asarray(v), np.asarray(v_ref), rtol=1e-5)


def test_lsh_scoring_pads_a_k_above_what_it_scores():
    params = sparse.init_params(jax.random.PRNGKey(6), 10, 200, 8)
    hash_fn = sparse.LshSpec(kind="simhash", num_hashes=2, num_tables=2).init(jax.random.PRNGKey(7), 8)
    tables = sparse.lsh.build_tables(hash_fn, params["output"]["weight"], jax.random.PRNGKey(8))
    batch = {"feat_ids": jnp.array([[1, 2], [3, 10]], jnp.int32), "feat_vals": jnp.ones((2, 2))}
    v, ids, scored = sparse.topk_lsh_scored(params, hash_fn, tables, batch, 70, bucket_capacity=4, max_scored=32)
    assert ids.shape == (2, 70) and np.all(np.asarray(ids)[:, 32:] == -1) and np.all(np.asarray(v)[:, 32:] == -np.inf)
    assert np.all(np.asarray(scored) <= 32)


# Packed (id, slot) sort; ids sorted alone + binary search (id and slot need more than 32 bits); and a
# result shorter than the batch (at most 52 distinct ids here).
@pytest.mark.parametrize("shape, num_rows, size", [((16, 12), 300, None), ((4, 5), 2**30, None),
                                                   ((8, 10), 2**30, 60)])
def test_unique_rows_equals_jnp_unique(shape, num_rows, size):
    rng = np.random.default_rng(7)
    ids = rng.integers(0, min(num_rows, 50) + 1, shape).astype(np.int32)
    ids[0, :3] = num_rows  # padding
    rows, inverse = jax.jit(sparse.unique_rows, static_argnums=(1, 2))(jnp.asarray(ids), num_rows, size)
    unique = functools.partial(jnp.unique, size=size or ids.size, fill_value=num_rows, return_inverse=True)
    ref_rows, ref_inverse = jax.jit(unique)(ids.ravel())
    np.testing.assert_array_equal(rows, ref_rows)
    np.testing.assert_array_equal(inverse, np.asarray(ref_inverse).reshape(shape))
    np.testing.assert_array_equal(np.asarray(rows)[np.asarray(inverse)], ids)


@pytest.mark.parametrize("size", [None, 64])
def test_compact_rows_lists_distinct_ids_by_first_slot(size):
    from hwrepro.sparse.candidates import compact_rows

    ids = np.array([[7, 3, 40], [3, 40, 9], [40, 2, 40]], np.int32)  # 40 = num_rows: padding
    rows, index = jax.jit(compact_rows, static_argnums=(1, 2))(jnp.asarray(ids), 40, size)
    length = size or ids.size
    np.testing.assert_array_equal(rows, [7, 3, 9, 2] + [40] * (length - 4))
    np.testing.assert_array_equal(index, [[0, 1, length], [1, length, 2], [length, 3, length]])
    sums = jax.ops.segment_sum(jnp.arange(1.0, 10.0), index.ravel(), length)  # padding slots dropped
    np.testing.assert_array_equal(np.asarray(sums)[:4], [1, 2 + 4, 6, 8])


def test_bf16_tables_are_stored_as_bits_and_updated_like_bf16_rows(optimized, batch):
    # Row Adam on a uint16-stored bfloat16 table: the same values as on the bfloat16 table itself.
    rng = np.random.default_rng(12)
    table = jnp.asarray(rng.normal(size=(12, 5)), jnp.bfloat16)
    rows, g = jnp.array([3, 9, 12], jnp.int32), jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
    opt = sparse_adam.row_adam(1e-2)
    direct, _ = opt.update(g, rows, opt.init(table), table)
    stored, _ = opt.update(g, rows, opt.init(table), sparse_adam.to_storage(table))
    assert stored.dtype == jnp.uint16
    np.testing.assert_array_equal(sparse_adam.from_storage(stored), direct)
    # A bf16 training state keeps E and W as bits, trains, and gives the modules bfloat16 parameters.
    state = sparse.init_state(jax.random.PRNGKey(5), NF, N, H, method="lsh", lsh_spec=TINY_LSH,
                             param_dtype=jnp.bfloat16)
    assert state.params["output"]["weight"].dtype == jnp.uint16
    state, metrics = STEPS["lsh"](state, batch, jax.random.PRNGKey(6))
    params = sparse.model_params(state.params)
    assert params["output"]["weight"].dtype == params["input"]["embedding"].dtype == jnp.bfloat16
    assert np.isfinite(float(metrics["loss"]))
    np.testing.assert_array_equal(sparse.topk(state.params, batch, 5), sparse.topk(params, batch, 5))


def test_bf16_adam_moments_store_the_float32_moments_rounded(optimized, batch):
    """train.moments_dtype=bf16: the first step's parameters are those of float32 moments (the update is
    computed in float32 from the stored moments, zero at first) and the stored moments are theirs rounded."""
    states = {}
    for dtype in (jnp.float32, jnp.bfloat16):
        state = sparse.init_state(jax.random.PRNGKey(5), NF, N, H, method="lsh", lsh_spec=TINY_LSH,
                                  moment_dtype=dtype)
        states[dtype], _ = STEPS["lsh"](state, batch, jax.random.PRNGKey(6))
    wide, narrow = (jax.tree_util.tree_leaves(states[d].params) for d in (jnp.float32, jnp.bfloat16))
    assert all(np.array_equal(a, b) for a, b in zip(wide, narrow))
    mu_wide, mu_narrow = (states[d].opt_state.rows.mu["weight"] for d in (jnp.float32, jnp.bfloat16))
    assert mu_narrow.dtype == jnp.uint16 and np.any(np.asarray(mu_wide) != 0)  # bfloat16 bits, as tables
    np.testing.assert_array_equal(np.asarray(sparse_adam.from_storage(mu_narrow)),
                                  np.asarray(mu_wide.astype(jnp.bfloat16)))


@pytest.mark.parametrize("offset", [0, 40])
def test_log_uniform_draws_follow_zipfs_law_by_id(offset):
    """P(id) = log((id + 2) / (id + 1)) / log(N + 1): id 0 the most likely (a rank, most frequent first). A
    model shard whose id 0 is label `offset` draws by the global law restricted to its labels."""
    n, draws = 50, 400_000
    ids = np.asarray(sparse.sample_labels(jax.random.PRNGKey(0), (draws,), n, "log_uniform", offset))
    rank = offset + np.arange(n)
    p = np.log((rank + 2) / (rank + 1)) / np.log((offset + n + 1) / (offset + 1))
    counts = np.bincount(ids, minlength=n)
    assert counts.size == n and np.all(np.abs(counts - draws * p) < 5 * np.sqrt(draws * p))
