"""hwrepro.sparse.lsh: hash families against known collision probabilities and a NumPy reference, bucket tables
against their definition, queries, and the rebuild schedule against hand-worked steps."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hwrepro.sparse import lsh
from hwrepro.sparse.hashes import dwta, simhash

# Compiling is most of these tests' time and none checks bits or numerics of the optimized code.
pytestmark = pytest.mark.usefixtures("unoptimized_module")

N, DIM = 500, 16  # neurons and their dimension in the table tests


def simhash_bits(fn: simhash.SimHash, x: np.ndarray) -> np.ndarray:
    """bool [n, L * K]: every SimHash bit of every row of x."""
    num_bits = fn.planes.shape[2]
    c = np.asarray(lsh.codes(fn, x))
    return ((c[:, :, None] >> np.arange(num_bits)) & 1).reshape(len(x), -1).astype(bool)


def pairs_at_angle(rng: np.random.Generator, num_pairs: int, dim: int, angle: float) -> tuple[np.ndarray, ...]:
    """num_pairs random pairs (x, y) of dim-vectors at `angle`, in random orientations, y 3x longer."""
    u = rng.standard_normal((num_pairs, dim))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    v = rng.standard_normal((num_pairs, dim))
    v -= np.sum(u * v, axis=1, keepdims=True) * u
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return u.astype(np.float32), (3.0 * (math.cos(angle) * u + math.sin(angle) * v)).astype(np.float32)


@pytest.mark.parametrize("angle", [math.pi / 8, math.pi / 3, math.pi / 2, 3 * math.pi / 4])
def test_simhash_bit_collision_rate_is_one_minus_angle_over_pi(angle):
    fn = lsh.init_hash("simhash", jax.random.key(1), 24, 16, 32)  # 512 Gaussian hyperplanes
    x, y = pairs_at_angle(np.random.default_rng(2), 16, 24, angle)
    # Given the pairs' random orientations, the 16 x 512 bit collisions are independent Bernoulli(p).
    collisions = simhash_bits(fn, x) == simhash_bits(fn, y)
    p = 1 - angle / math.pi
    standard_error = math.sqrt(p * (1 - p) / collisions.size)
    assert abs(collisions.mean() - p) < 5 * standard_error


@pytest.mark.parametrize("flags, expected", [(["avx2", "avx512f", "avx512_bf16"], jnp.bfloat16),
                                             (["avx2", "amx_bf16"], jnp.bfloat16), (["avx2", "avx512f"], jnp.float32)])
def test_auto_simhash_dtype_is_bf16_only_where_the_cpu_multiplies_bf16(monkeypatch, flags, expected):
    from hwrepro.harness import records

    monkeypatch.setattr(records, "cpu_info", lambda: {"model": "x", "isa_flags": flags, "logical_cores": 2})
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")  # a GPU run of the suite: still the CPU rule
    for family in ("simhash", "simhash_pairs"):
        assert lsh.init_hash(family, jax.random.key(0), 24, 6, 5, dtype="auto").planes.dtype == expected


def test_bf16_simhash_is_the_sign_of_the_bf16_rounded_projection():
    fn = lsh.init_hash("simhash", jax.random.key(44), 24, 6, 5, dtype="bf16")
    assert fn.planes.dtype == jnp.bfloat16
    x = np.random.default_rng(45).standard_normal((300, 24)).astype(np.float32)
    rounded = np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32), np.float64)
    proj = np.einsum("nd,dlk->nlk", rounded, np.asarray(fn.planes.astype(jnp.float32), np.float64))
    reference = np.sum((proj > 0) << np.arange(6), axis=-1)
    sure = np.all(np.abs(proj) > 1e-4, axis=-1)  # f32 sums of exact products: only near-zero ones may differ
    assert sure.mean() > 0.99
    np.testing.assert_array_equal(np.asarray(lsh.codes(fn, x))[sure], reference[sure])
    # The same hyperplanes as the fp32 family drawn with the same key, rounded: most codes agree.
    exact = lsh.init_hash("simhash", jax.random.key(44), 24, 6, 5)
    np.testing.assert_array_equal(fn.planes, exact.planes.astype(jnp.bfloat16))
    assert np.mean(np.asarray(lsh.codes(fn, x)) == np.asarray(lsh.codes(exact, x))) > 0.9


def test_sparse_simhash_has_fixed_pm1_support_and_is_a_sign_matmul():
    fn = lsh.init_hash("simhash", jax.random.key(3), 30, 5, 7, density=1 / 3)
    planes = np.asarray(fn.planes)
    assert planes.shape == (30, 7, 5)
    assert set(np.unique(planes)) == {-1.0, 0.0, 1.0}
    assert np.all(np.count_nonzero(planes, axis=0) == 10)  # round(30 / 3) dims per hyperplane
    x = np.random.default_rng(4).standard_normal((40, 30)).astype(np.float32)
    bits = np.einsum("nd,dlk->nlk", x.astype(np.float64), planes) > 0
    reference = np.sum(bits << np.arange(5), axis=-1)
    np.testing.assert_array_equal(lsh.codes(fn, x), reference)
    # bf16 inputs are hashed as their (exact) f32 values, so mixed-dtype weights and activations agree.
    x16 = jnp.asarray(x, jnp.bfloat16)
    np.testing.assert_array_equal(lsh.codes(fn, x16), lsh.codes(fn, x16.astype(jnp.float32)))


def dwta_reference(fn: dwta.DWTA, x: np.ndarray) -> np.ndarray:
    """int [n, L] by the definition: argmax over each bin's non-zero values (first on ties); an empty bin
    takes the value of the first non-empty bin in its probe order, or 0 if there is none."""
    bins, probes = np.asarray(fn.bins), np.asarray(fn.probes)
    num_tables, num_hashes, bin_size = bins.shape
    values = x[:, bins.reshape(-1, bin_size)]  # [n, M, bin]
    empty = np.all(values == 0, axis=-1)
    slots = np.argmax(np.where(values != 0, values, -np.inf), axis=-1)
    dense = np.zeros_like(slots)
    for i, m in np.ndindex(slots.shape):
        order = [m, *probes[m]]
        filled = [b for b in order if not empty[i, b]]
        dense[i, m] = slots[i, filled[0]] if filled else 0
    return np.sum(dense.reshape(len(x), num_tables, num_hashes) * bin_size ** np.arange(num_hashes), axis=-1)


def sparse_signed_rows(rng: np.random.Generator, n: int, dim: int, zero_fraction: float) -> np.ndarray:
    """Rows with distinct magnitudes (no near-ties), random signs and a given fraction of exact zeros."""
    x = np.stack([rng.permutation(dim) + 1.0 for _ in range(n)]) * rng.choice([-1.0, 1.0], (n, dim))
    return np.where(rng.random((n, dim)) < zero_fraction, 0.0, x).astype(np.float32)


@pytest.fixture(scope="module")
def dwta32():
    return lsh.init_hash("dwta", jax.random.key(5), 32, 2, 12, bin_size=8)


def test_dwta_matches_reference_including_densified_bins(dwta32):
    rng = np.random.default_rng(6)
    x = np.concatenate([sparse_signed_rows(rng, 20, 32, f) for f in (0.0, 0.5, 0.85, 0.95)])
    x[-1] = 0.0
    x[-2] = 0.0
    x[-2, 7] = -4.0  # one non-zero (negative) dim: bins holding it win, all others borrow from them
    codes = np.asarray(lsh.codes(dwta32, x))
    np.testing.assert_array_equal(codes, dwta_reference(dwta32, x))
    assert np.all(codes[-1] == 0)  # all-zero vector: every bin empty, code 0 everywhere
    np.testing.assert_array_equal(lsh.codes(dwta32, jnp.asarray(x, jnp.bfloat16)), codes)  # exact in bf16
    assert np.all((codes >= 0) & (codes < lsh.num_buckets(dwta32)))


def test_dwta_ties_go_to_the_first_slot():
    fn = lsh.init_hash("dwta", jax.random.key(7), 8, 1, 1, bin_size=8)  # one bin holding every dim
    order = np.asarray(fn.bins)[0, 0]
    x = np.zeros((2, 8), np.float32)
    x[0, order[[2, 5]]] = 3.0  # equal maxima at slots 2 and 5
    x[1, order[[4, 6]]] = [1.0, 1.0 + 2**-23]  # differ in the last mantissa bit
    np.testing.assert_array_equal(lsh.codes(fn, x)[:, 0], [2, 4])


def test_dwta_densification_leaves_no_empty_bin_artefact(dwta32):
    rng = np.random.default_rng(8)
    x = sparse_signed_rows(rng, 200, 32, 0.9)  # most bins of 8 dims are empty
    x = x[np.any(x != 0, axis=1)]  # (all-zero rows hash to 0 everywhere, by definition)
    codes = np.asarray(lsh.codes(dwta32, x))
    # Deterministic and independent of the batch it is hashed in.
    np.testing.assert_array_equal(codes[:3], lsh.codes(dwta32, x[:3]))
    # Without densification empty bins would read as slot 0, piling such vectors into bucket 0 (about 1 in
    # 5 table codes here); with it a table code is 0 only by chance (1 in 64 for K = 2, bin 8).
    assert np.mean(codes == 0) < 0.04
    assert len(np.unique(codes[:, 0])) > 30


def test_dwta_identical_vectors_collide_and_collisions_fall_with_distance():
    fn = lsh.init_hash("dwta", jax.random.key(9), 32, 1, 256, bin_size=8)  # 256 single-hash tables
    rng = np.random.default_rng(10)
    x = np.maximum(rng.standard_normal((64, 32)), 0).astype(np.float32)  # ReLU-like: half zeros
    base = np.asarray(lsh.codes(fn, x))
    np.testing.assert_array_equal(base, lsh.codes(fn, 2.5 * x))  # same direction, same winners
    rates = []
    for scale in (0.05, 0.2, 0.5, 1.0, 3.0):
        y = np.maximum(x + scale * rng.standard_normal(x.shape), 0).astype(np.float32)
        rates.append(np.mean(np.asarray(lsh.codes(fn, y)) == base))
    assert rates[0] > 0.8 and rates[-1] < 0.35  # 1/8 + densification correlation for unrelated vectors
    assert all(a > b + 0.03 for a, b in zip(rates, rates[1:])), rates


# ------------------------------------------------------------------------------------------------------ tables


def integer_weights(seed: int) -> np.ndarray:
    """Small integers: sparse-SimHash projections are exact, so codes cannot depend on the batch shape."""
    return np.random.default_rng(seed).integers(-4, 5, (N, DIM)).astype(np.float32)


HASH_KINDS = ("dwta", "simhash", "simhash_pairs")


@functools.cache
def hash_fn(kind: str):
    """The table tests' hash functions, 16 buckets each; drawn when first used (at import, each pytest-xdist
    worker would draw them while collecting, with XLA's optimizations on: ~2.4 s)."""
    if kind == "dwta":
        return lsh.init_hash("dwta", jax.random.key(11), DIM, 2, 6, bin_size=4)
    seed = {"simhash": 12, "simhash_pairs": 15}[kind]
    return lsh.init_hash(kind, jax.random.key(seed), DIM, 4, 5, density=0.5)


@pytest.fixture(scope="module", params=HASH_KINDS)
def built(request):
    fn = hash_fn(request.param)
    weights = integer_weights(13)
    return fn, weights, lsh.build_tables(fn, weights, jax.random.key(14))


def test_starts_and_ids_are_the_buckets_of_the_codes(built):
    fn, weights, tables = built
    codes = np.asarray(lsh.codes(fn, weights))  # [N, L]
    ids, starts = np.asarray(tables.ids), np.asarray(tables.starts)
    num_tables = codes.shape[1]
    assert ids.shape == (num_tables, N) and ids.dtype == np.int32
    assert starts.shape == (num_tables, lsh.num_buckets(fn) + 1) and starts.dtype == np.int32
    for table in range(num_tables):
        np.testing.assert_array_equal(np.sort(ids[table]), np.arange(N))
        np.testing.assert_array_equal(np.diff(starts[table]), np.bincount(codes[:, table], minlength=16))
        np.testing.assert_array_equal(codes[ids[table], table], np.repeat(np.arange(16), np.diff(starts[table])))


def test_every_neuron_is_found_in_its_own_bucket(built):
    fn, weights, tables = built
    largest = int(np.max(np.diff(np.asarray(tables.starts), axis=1)))
    found = np.asarray(lsh.query(fn, tables, weights, largest))  # [N, L, largest]
    assert np.all(np.any(found == np.arange(N)[:, None, None], axis=2))
    # With a smaller capacity a neuron is found exactly when it is among its bucket's first `capacity`.
    capacity = 3
    ids, starts = np.asarray(tables.ids), np.asarray(tables.starts)
    codes = np.asarray(lsh.codes(fn, weights))
    rank = np.empty_like(codes)
    for table in range(ids.shape[0]):
        rank[ids[table], table] = np.arange(N) - starts[table, codes[ids[table], table]]
    some = weights[:37]  # another batch shape: same codes (DWTA is exact, and so is this SimHash here)
    found = np.asarray(lsh.query(fn, tables, some, capacity))
    np.testing.assert_array_equal(np.any(found == np.arange(37)[:, None, None], axis=2), rank[:37] < capacity)


def test_query_returns_bucket_prefix_padded_with_n(built):
    fn, weights, tables = built
    ids, starts = np.asarray(tables.ids), np.asarray(tables.starts)
    x = np.random.default_rng(15).standard_normal((9, DIM)).astype(np.float32)
    capacity = 40  # more than most buckets hold here (N / 16 ~ 31 on average)
    found = np.asarray(lsh.query(fn, tables, x, capacity))
    assert found.shape == (9, ids.shape[0], capacity) and found.dtype == np.int32
    codes = np.asarray(lsh.codes(fn, x))
    padded = 0
    for i, table in np.ndindex(codes.shape):
        bucket = ids[table, starts[table, codes[i, table]]:starts[table, codes[i, table] + 1]][:capacity]
        expected = np.full(capacity, N)
        expected[:len(bucket)] = bucket
        np.testing.assert_array_equal(found[i, table], expected)
        padded += len(bucket) < capacity
    assert padded > 0


def test_in_bucket_order_is_random_and_unbiased():
    fn = lsh.init_hash("simhash", jax.random.key(16), DIM, 1, 40)  # 2 buckets per table: ~250 neurons each
    weights = integer_weights(17)
    first = lsh.build_tables(fn, weights, jax.random.key(18))
    second = lsh.build_tables(fn, weights, jax.random.key(19))
    np.testing.assert_array_equal(first.starts, second.starts)  # same buckets...
    assert np.mean(np.asarray(first.ids) != np.asarray(second.ids)) > 0.9  # ...in another order
    # The first 10 ids of each bucket are a uniform sample of it: their mean id is the bucket's mean id.
    ids, starts = np.asarray(first.ids), np.asarray(first.starts)
    head, whole = [], []
    for table, bucket in np.ndindex(40, 2):
        members = ids[table, starts[table, bucket]:starts[table, bucket + 1]]
        head.append(members[:10].mean())
        whole.append(members.mean())
    spread = N / math.sqrt(12 * 10 * len(head))  # standard error of the mean of 80 x 10 uniform ids
    assert abs(np.mean(head) - np.mean(whole)) < 5 * spread


@pytest.mark.parametrize("host_sort", [True, False])
def test_tables_vmapped_over_keys_are_each_keys_tables(built, host_sort):
    fn, weights, _ = built
    keys = jax.random.split(jax.random.key(46), 3)
    batched = jax.vmap(lambda k: lsh.build_tables(fn, weights, k, host_sort=host_sort))(keys)
    for i in range(3):
        one = lsh.build_tables(fn, weights, keys[i], host_sort=host_sort)
        np.testing.assert_array_equal(batched.ids[i], one.ids)
        np.testing.assert_array_equal(batched.starts[i], one.starts)


def test_host_and_xla_grouping_are_identical(built):
    fn, weights, _ = built
    key = jax.random.key(20)
    host = lsh.build_tables(fn, weights, key, host_sort=True)
    device = lsh.build_tables(fn, weights, key, host_sort=False)
    np.testing.assert_array_equal(host.ids, device.ids)
    np.testing.assert_array_equal(host.starts, device.starts)


@pytest.mark.parametrize("bits", [1, 7, 20, 31])
def test_in_bucket_rank_is_a_bijection_that_unrank_inverts_alike_in_numpy_and_jax(bits):
    seeds = np.random.default_rng(bits).integers(0, 2**32, (3, 1), dtype=np.uint32)
    ids = np.random.default_rng(40).integers(0, 2**bits, (3, 4096), dtype=np.uint32)
    ranks = lsh._rank(ids, seeds, bits)
    assert ranks.max() < 2**bits
    np.testing.assert_array_equal(lsh._unrank(ranks, seeds, bits), ids)
    np.testing.assert_array_equal(jax.jit(lsh._rank, static_argnums=2)(ids, seeds, bits), ranks)
    if bits <= 12:  # every id: a permutation of [0, 2**bits) per table
        every = np.broadcast_to(np.arange(2**bits, dtype=np.uint32), (3, 2**bits))
        assert all(len(np.unique(row)) == 2**bits for row in lsh._rank(every, seeds, bits))


def test_host_and_xla_grouping_agree_with_codes_over_16_bits_and_64_bit_keys():
    # 2**21 buckets and 4,000 ids (12 bits): 33-bit keys, so the XLA path sorts uint64 ones; the NumPy path
    # sorts int32 codes (no radix sort over 16 bits).
    fn = lsh.init_hash("simhash", jax.random.key(41), DIM, 21, 3)
    weights = np.random.default_rng(42).standard_normal((4000, DIM)).astype(np.float32)
    key = jax.random.key(43)
    host = lsh.build_tables(fn, weights, key, host_sort=True)
    device = lsh.build_tables(fn, weights, key, host_sort=False)
    np.testing.assert_array_equal(host.ids, device.ids)
    np.testing.assert_array_equal(host.starts, device.starts)
    codes = np.asarray(lsh.table_codes(fn, jnp.asarray(weights)))
    for t in range(3):
        np.testing.assert_array_equal(np.sort(host.ids[t]), np.arange(4000))
        assert np.all(np.diff(codes[t][np.asarray(host.ids[t])]) >= 0)


def test_rebuild_rehashes_the_noted_rows_into_the_tables_a_full_build_gives(built):
    fn, weights, _ = built
    rng = np.random.default_rng(21)
    tables = lsh.build_tables(fn, weights, jax.random.key(22), keep_codes=True)
    assert not np.any(tables.changed)
    changed = rng.choice(N, 150, replace=False)
    moved = weights.copy()
    moved[changed] = integer_weights(23)[changed]
    key = jax.random.key(24)
    full = lsh.build_tables(fn, moved, key, keep_codes=True)
    # Noted changes (padding id N and repeats allowed), over blocks of 64 rows: the full build, bit for bit.
    noted = lsh.note_changed(tables, jnp.asarray(np.concatenate([changed, changed[:10], [N, N]])))
    assert np.flatnonzero(noted.changed).tolist() == sorted(changed.tolist())
    again = lsh.rebuild(fn, noted, moved, key, block=64)
    for got, want in zip(again, full):
        np.testing.assert_array_equal(got, want)
    # Unnoted rows keep their old codes: the same changes unnoted leave the old buckets.
    stale = lsh.rebuild(fn, tables, moved, key)
    np.testing.assert_array_equal(stale.codes, tables.codes)
    # Tables without kept codes are built in full.
    plain = lsh.rebuild(fn, lsh.build_tables(fn, weights, key), moved, key)
    np.testing.assert_array_equal(plain.ids, full.ids)
    assert plain.codes is None


def test_everything_runs_under_jit_with_functions_and_tables_as_arguments():
    traces = []

    @jax.jit
    def draw_build_query(key, weights, x):
        traces.append(1)
        k_fn, k_tables = jax.random.split(key)
        fn = lsh.init_hash("dwta", k_fn, DIM, 2, 6, bin_size=4)
        tables = lsh.build_tables(fn, weights, k_tables)
        return fn, tables, lsh.query(fn, tables, x, 5)

    weights = integer_weights(21)
    x = weights[:4] + 0.5
    key = jax.random.PRNGKey(22)  # raw uint32 keys work as well as typed ones
    fn, tables, found = draw_build_query(key, weights, x)
    k_fn, k_tables = jax.random.split(key)
    eager_fn = lsh.init_hash("dwta", k_fn, DIM, 2, 6, bin_size=4)
    np.testing.assert_array_equal(fn.bins, eager_fn.bins)
    np.testing.assert_array_equal(fn.probes, eager_fn.probes)
    np.testing.assert_array_equal(found, lsh.query(eager_fn, lsh.build_tables(eager_fn, weights, k_tables), x, 5))
    draw_build_query(jax.random.PRNGKey(23), weights + 1, x)  # new arrays, same shapes: no retrace
    assert len(traces) == 1


def test_bad_inputs_raise_one_line_errors():
    with pytest.raises(ValueError, match="dim 8 but the SimHash was drawn for dim 16"):
        lsh.codes(hash_fn("simhash"), np.zeros((2, 8), np.float32))
    with pytest.raises(ValueError, match="shape"):
        lsh.codes(hash_fn("dwta"), np.zeros(16, np.float32))
    with pytest.raises(ValueError, match="bin_size=32"):
        lsh.init_hash("dwta", jax.random.key(0), 16, 2, 3, bin_size=32)
    with pytest.raises(ValueError, match="density"):
        lsh.init_hash("simhash", jax.random.key(0), 16, 2, 3, density=0.0)
    with pytest.raises(ValueError, match="dtype='fp16' must be one of fp32, bf16, auto"):
        lsh.init_hash("simhash", jax.random.key(0), 16, 2, 3, dtype="fp16")
    with pytest.raises(ValueError, match="bucket_capacity"):
        lsh.lookup(lsh.Tables(jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 5), jnp.int32)),
                   jnp.zeros((1, 2), jnp.int32), 0)


# ------------------------------------------------------------------------------------------------ multi-probe


def test_multi_probe_returns_a_superset_of_the_plain_query(built):
    fn, weights, tables = built
    x = np.random.default_rng(45).standard_normal((9, DIM)).astype(np.float32)
    plain = np.asarray(lsh.query(fn, tables, x, 8))
    probed = np.asarray(lsh.query(fn, tables, x, 8, probe_bits=2))  # [9, L, 4 * 8]
    assert probed.shape == (9, fn.num_tables, 32)
    np.testing.assert_array_equal(probed[:, :, :8], plain)  # x's own bucket first
    codes = np.asarray(lsh.probe_codes(fn, x, 2))
    assert np.mean(codes[:, :, 1:] != codes[:, :, :1]) > 0.9  # other buckets (DWTA: unless a bin was tied)
    assert np.sum(probed < N) > 2 * np.sum(plain < N)


def table_planes(fn) -> np.ndarray:
    """float64 [dim, L, K]: the hyperplane of each bit of each table (simhash_pairs: low half, then high)."""
    planes = np.asarray(fn.planes, np.float64)
    if isinstance(fn, simhash.PairedSimHash):
        pairs = np.asarray(fn.pairs)
        return np.concatenate([planes[:, pairs[:, 1]], planes[:, pairs[:, 0]]], axis=2)
    return planes


@pytest.mark.parametrize("kind", ["simhash", "simhash_pairs"])
def test_simhash_probes_flip_the_bits_nearest_their_hyperplanes(kind):
    fn = lsh.init_hash(kind, jax.random.key(46), DIM, 6, 3)
    x = np.random.default_rng(47).standard_normal((7, DIM)).astype(np.float32)
    planes = table_planes(fn)  # [dim, L, K]
    bits = (np.einsum("nd,dlk->nlk", x, planes) > 0) << np.arange(6)
    np.testing.assert_array_equal(lsh.codes(fn, x), bits.sum(axis=2))  # bit k of table l: its plane's sign
    distance = np.abs(np.einsum("nd,dlk->nlk", x, planes)) / np.linalg.norm(planes, axis=0)
    least = np.argsort(distance, axis=2)[..., :2]  # the two least certain bits of each table
    home = np.asarray(lsh.codes(fn, x))
    flip = 1 << least
    expected = np.stack([home, home ^ flip[..., 0], home ^ flip[..., 1], home ^ flip[..., 0] ^ flip[..., 1]], -1)
    np.testing.assert_array_equal(lsh.probe_codes(fn, x, 2), expected)


def test_simhash_pairs_tables_are_distinct_pairs_of_few_half_codes():
    fn = lsh.init_hash("simhash_pairs", jax.random.key(51), DIM, 16, 25)
    assert fn.planes.shape == (DIM, 8, 8)  # m = 8 half-codes (28 pairs >= 25 tables): 64 planes, not 400
    pairs = np.asarray(fn.pairs)
    assert pairs.shape == (25, 2) and np.all(pairs[:, 0] < pairs[:, 1])
    assert len({tuple(p) for p in pairs}) == 25
    assert lsh.num_buckets(fn) == 2**16
    with pytest.raises(ValueError, match="num_hashes=5 must be even"):
        lsh.init_hash("simhash_pairs", jax.random.key(0), DIM, 5, 3)


def test_dwta_probe_is_the_bucket_where_the_runner_up_wins():
    fn = lsh.init_hash("dwta", jax.random.key(48), DIM, 3, 4, bin_size=4)
    rng = np.random.default_rng(49)
    x = sparse_signed_rows(rng, 6, DIM, 0.0)  # no zeros: no densification
    probes = np.asarray(lsh.probe_codes(fn, x, 1))  # [n, L, 2]: home, then the closest runner-up winning
    bins = np.asarray(fn.bins)
    for i, table in np.ndindex(6, 4):
        values = x[i, bins[table]]  # [K, bin]
        top2 = np.sort(values, axis=1)[:, -2:]
        k = np.argmin(top2[:, 1] - top2[:, 0])  # the hash the runner-up came closest in
        y = x[i].copy()
        y[bins[table, k, np.argsort(values[k])[-2]]] = top2[k, 1] + 0.5  # the runner-up now wins
        assert np.asarray(lsh.codes(fn, y[None]))[0, table] == probes[i, table, 1]


def test_mips_rows_order_rows_by_their_logits():
    rng = np.random.default_rng(50)
    w, b = rng.standard_normal((200, DIM)).astype(np.float32), rng.standard_normal(200).astype(np.float32)
    h = rng.standard_normal((3, DIM)).astype(np.float32)
    rows, queries = np.asarray(lsh.mips_rows(w, b), np.float64), np.asarray(lsh.mips_queries(h), np.float64)
    norms = np.linalg.norm(rows, axis=1)
    np.testing.assert_allclose(norms, norms.max(), rtol=1e-5)  # all of one norm: angle orders by inner product
    cosine = queries @ rows.T / np.linalg.norm(queries, axis=1, keepdims=True) / norms
    np.testing.assert_array_equal(np.argsort(-cosine, axis=1), np.argsort(-(h @ w.T + b), axis=1))


# ------------------------------------------------------------------------------------------ incremental upkeep


def bucket_sets(tables: lsh.BucketTables) -> list[list[list[int]]]:
    """Per table and bucket, the sorted ids filed there (the contents up to their order in the bucket)."""
    return [[sorted(b[b < N].tolist()) for b in table] for table in np.asarray(tables.slots)]


def changed_weights(weights: np.ndarray, seed: int, num_changed: int) -> tuple[np.ndarray, np.ndarray]:
    """A copy of weights with `num_changed` random rows redrawn (most of them change buckets), and their ids."""
    rng = np.random.default_rng(seed)
    changed = rng.choice(N, num_changed, replace=False).astype(np.int32)
    new = weights.copy()
    new[changed] = rng.integers(-4, 5, (num_changed, DIM))
    return new, changed


def check_consistent(tables: lsh.BucketTables, weights: np.ndarray, fn) -> None:
    """Every filed id sits where its row says, every row's bucket is its code, sizes count the codes."""
    slots, row_bucket, row_slot = (np.asarray(a) for a in (tables.slots, tables.row_bucket, tables.row_slot))
    codes = np.asarray(lsh.codes(fn, weights)).T  # [L, N]
    np.testing.assert_array_equal(row_bucket, codes)
    for table in range(codes.shape[0]):
        np.testing.assert_array_equal(tables.sizes[table], np.bincount(codes[table], minlength=slots.shape[1]))
        bucket, slot = np.nonzero(slots[table] < N)
        filed = slots[table, bucket, slot]
        assert len(np.unique(filed)) == len(filed)  # an id is filed at most once per table
        np.testing.assert_array_equal(row_bucket[table, filed], bucket)
        np.testing.assert_array_equal(row_slot[table, filed], slot)
        assert np.sum(row_slot[table] >= 0) == len(filed)  # and nothing else claims a slot


@pytest.mark.parametrize("kind", HASH_KINDS)
def test_fresh_bucket_tables_answer_queries_like_sorted_tables(kind):
    fn, weights, key = hash_fn(kind), integer_weights(24), jax.random.key(25)
    buckets = lsh.build_tables(fn, weights, key, capacity=6, pending_rows=8)
    check_consistent(buckets, weights, fn)
    x = np.random.default_rng(26).standard_normal((9, DIM)).astype(np.float32)
    sorted_tables = lsh.build_tables(fn, weights, key)
    np.testing.assert_array_equal(lsh.query(fn, buckets, x, 6), lsh.query(fn, sorted_tables, x, 6))
    past = np.asarray(lsh.query(fn, buckets, x, 9))  # past the capacity: padding
    assert past.shape == (9, fn.num_tables, 9) and np.all(past[..., 6:] == N)


# The refile is one code path for every family (only the codes differ): SimHash in the fast tier, the others
# with the slow tier.
@pytest.mark.parametrize("kind", [k if k == "simhash" else pytest.param(k, marks=pytest.mark.slow)
                                  for k in HASH_KINDS])
def test_refile_leaves_the_tables_a_full_build_of_the_new_weights_would_have(kind):
    fn, weights, key = hash_fn(kind), integer_weights(27), jax.random.key(28)
    capacity = N  # no bucket can overflow: then every row is filed, in both
    tables = lsh.build_tables(fn, weights, key, capacity=capacity, pending_rows=400)
    new, changed = changed_weights(weights, 29, 150)
    # Noted over two "steps", with repeats and padding, as training steps note their candidate rows.
    noted = np.concatenate([changed, changed[:40], np.full(7, N, np.int32)])
    tables = lsh.note_changed(lsh.note_changed(tables, noted[:90]), noted[90:])
    assert int(tables.num_pending) == len(noted)
    moved = np.any(np.asarray(lsh.codes(fn, new)) != np.asarray(lsh.codes(fn, weights)), axis=1).sum()
    assert moved > 100
    refiled = lsh.refile(fn, tables, new, jax.random.key(30), block=64)  # several blocks
    full = lsh.build_tables(fn, new, jax.random.key(31), capacity=capacity, pending_rows=400)
    assert bucket_sets(refiled) == bucket_sets(full)
    np.testing.assert_array_equal(refiled.sizes, full.sizes)
    check_consistent(refiled, new, fn)
    assert int(refiled.num_pending) == 0
    # Rows not noted are not re-hashed: a refile with nothing pending changes nothing.
    again = lsh.refile(fn, refiled, weights, jax.random.key(32))
    assert bucket_sets(again) == bucket_sets(refiled)


def test_refile_into_full_buckets_keeps_the_tables_consistent():
    fn, weights = hash_fn("simhash"), integer_weights(33)
    capacity = 4  # ~31 rows per bucket: nearly every bucket overflows
    tables = lsh.build_tables(fn, weights, jax.random.key(34), capacity=capacity, pending_rows=300)
    new, changed = changed_weights(weights, 35, 300)
    refiled = lsh.refile(fn, lsh.note_changed(tables, changed), new, jax.random.key(36))
    check_consistent(refiled, new, fn)
    slots, row_bucket, row_slot = (np.asarray(a) for a in (refiled.slots, refiled.row_bucket, refiled.row_slot))
    table = np.arange(slots.shape[0])[:, None]
    free_after = np.sum(slots == N, axis=2)[table, row_bucket[:, changed]]  # [L, changed]
    assert not np.any((row_slot[:, changed] < 0) & (free_after > 0))  # a row waits only when its bucket is full


def test_refile_into_full_buckets_is_reservoir_sampling():
    fn, weights = hash_fn("simhash"), integer_weights(41)
    capacity = 4
    tables = lsh.build_tables(fn, weights, jax.random.key(42), capacity=capacity, pending_rows=64)
    # Rows filed in no table: moving them frees no slot, so every arrival meets a full bucket (or a small one).
    unfiled = np.flatnonzero(np.all(np.asarray(tables.row_slot) < 0, axis=0))
    rng = np.random.default_rng(43)
    changed = rng.choice(unfiled, 40, replace=False).astype(np.int32)
    new = weights.copy()
    new[changed] = rng.integers(-4, 5, (40, DIM))
    refiled = lsh.refile(fn, lsh.note_changed(tables, changed), new, jax.random.key(44))
    check_consistent(refiled, new, fn)
    bucket = np.asarray(refiled.row_bucket)[:, changed]
    moved = bucket != np.asarray(tables.row_bucket)[:, changed]
    # A moved row is filed with probability about C / (rows now hashed to its bucket), capped at 1.
    p = np.minimum(1.0, capacity / np.asarray(refiled.sizes)[np.arange(bucket.shape[0])[:, None], bucket][moved])
    filed = np.sum(np.asarray(refiled.row_slot)[:, changed][moved] >= 0)
    assert 0 < filed < moved.sum()
    assert abs(filed - p.sum()) < 4 * math.sqrt(np.sum(p * (1 - p))) + 3, (filed, p.sum())


def test_refile_runs_under_jit_and_drops_ids_noted_past_the_buffer():
    fn, weights = hash_fn("dwta"), integer_weights(37)
    tables = lsh.build_tables(fn, weights, jax.random.key(38), capacity=100, pending_rows=50)
    new, changed = changed_weights(weights, 39, 80)
    step = jax.jit(lambda t, ids: lsh.note_changed(t, ids))
    tables = step(step(tables, changed[:40]), changed[40:])  # the second note fills the buffer's last 10 slots
    assert int(tables.num_pending) == 80
    refiled = jax.jit(lsh.refile)(fn, tables, new, jax.random.key(40))
    codes = np.asarray(lsh.codes(fn, new)).T
    np.testing.assert_array_equal(np.asarray(refiled.row_bucket)[:, changed[:50]], codes[:, changed[:50]])
    stale = np.asarray(refiled.row_bucket)[:, changed[50:]]
    np.testing.assert_array_equal(stale, np.asarray(tables.row_bucket)[:, changed[50:]])


# ---------------------------------------------------------------------------------------------------- schedule


def test_rebuild_schedule_with_decay_matches_hand_worked_steps():
    # Periods 10, 10e^0.5, 10e^1, 10e^1.5, 10e^2 = 10, 16.49, 27.18, 44.82, 73.89; cumulative sums 10,
    # 26.49, 53.67, 98.49, 172.38, rounded: 10, 26, 54, 98, 172.
    schedule = lsh.RebuildSchedule(rebuild_period=10, rebuild_decay=0.5)
    assert schedule.due_steps(200) == [10, 26, 54, 98, 172]
    assert [s for s in range(200) if schedule.due(s)] == [10, 26, 54, 98, 172]
    assert not any(schedule.redraw_due(s) for s in range(200))


def test_rebuild_schedule_redraws_on_its_own_period():
    schedule = lsh.RebuildSchedule(rebuild_period=50, redraw_period=120)  # SLIDE-like, shrunk
    assert schedule.due_steps(400) == [50, 100, 120, 150, 200, 240, 250, 300, 350, 360]
    assert schedule.redraw_steps(400) == [120, 240, 360]
    assert [s for s in range(400) if schedule.redraw_due(s)] == [120, 240, 360]
    assert schedule.due(120) and not schedule.due(0) and not schedule.due(49)
    assert schedule.redraw_due(jnp.int32(240))  # a train state's step counter works as is
    assert schedule.due(50 * 1_000_000)  # no iteration over the past: large steps are cheap


def test_rebuild_schedule_without_rebuilds_keeps_its_redraws():
    schedule = lsh.RebuildSchedule(rebuild_period=None, redraw_period=120)  # incremental tables in between
    assert schedule.due_steps(400) == schedule.redraw_steps(400) == [120, 240, 360]
    assert not schedule.due(50) and schedule.due(240)


@pytest.mark.parametrize("fields", [dict(rebuild_period=0), dict(rebuild_period=10, rebuild_decay=-0.1),
                                    dict(rebuild_period=10, redraw_period=math.inf)])
def test_rebuild_schedule_rejects_bad_periods(fields):
    with pytest.raises(ValueError):
        lsh.RebuildSchedule(**fields)
