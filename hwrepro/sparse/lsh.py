"""Locality-sensitive hashing for SLIDE's output layer: hash families by name, bucket tables, queries, and
the rebuild schedule.

SLIDE (MLSys 2020/2021) computes, each step, only the output neurons whose weight rows share an LSH bucket with
the hidden activation in at least one of L tables. This module holds the hashing half of that and nothing of
training: pure functions with explicit PRNG keys, jit-able with hash functions and tables passed as pytrees
(every static size comes from an array shape). The hash families themselves (SimHash, DWTA, or one of yours)
live in `hwrepro.sparse.hashes`, one module each, and are made by name with `init_hash`.

Tables store, per table, all N neuron ids sorted by bucket plus bucket start offsets (the CSR layout): SLIDE's
Amazon setting (L = 50, 2^18 buckets, bucket size 128) as a dense [L, 2^18, 128] array would be 6.7 GB, while
ids + starts are L * (N + 2^18 + 1) int32 (186 MB for N = 670,091). Inside a bucket the order is random, so
taking the first `bucket_capacity` ids of a bucket is a uniform sample of it; this stands in for SLIDE's
FIFO / reservoir bucket replacement with a fixed bucket size.

    fn = lsh.init_hash("simhash", key, dim=128, num_hashes=16, num_tables=25)
    tables = lsh.build_tables(fn, weights, key)             # weights [N, 128]
    ids = lsh.query(fn, tables, x, bucket_capacity=16)      # x [B, 128] -> [B, 25, 16], padded with N

Built with `keep_codes=True`, Tables also keep every row's codes, and a rebuild hashes only the rows noted
as changed since (training touches about half of W's rows between two of SLIDE's rebuilds):

    tables = lsh.build_tables(fn, weights, key, keep_codes=True)
    tables = lsh.note_changed(tables, row_ids)               # rows whose weights changed (each step)
    tables = lsh.rebuild(fn, tables, weights, key)           # = build_tables(fn, weights, key, keep_codes=True)

Tables kept up to date between full builds use the other layout, `BucketTables`: fixed-capacity buckets
(SLIDE's own: a bucket holds at most C ids) plus, per row, the bucket and slot it is filed in, so one changed
row is moved in O(L * C) work instead of a rebuild's O(L * N):

    tables = lsh.build_tables(fn, weights, key, capacity=16, pending_rows=8192)
    tables = lsh.note_changed(tables, row_ids)               # rows whose weights changed (each step)
    tables = lsh.refile(fn, tables, weights, key)            # re-hash those rows only, move them

A fresh BucketTables holds exactly what a query of the sorted tables built with the same key reads (the first
C ids of each bucket), so both layouts answer queries alike until rows move.

For prediction: multi-probe queries read 2^m buckets per table (`query(..., probe_bits=m)`, `probe_codes`),
and `mips_rows` / `mips_queries` turn "largest logit <w, h> + b" into "nearest row" for tables built over
the trained layer (hwrepro.sparse.evaluation.inference_tables).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import math
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hwrepro.sparse.hashes import FAMILIES, check_positive

Array = jax.Array
HashFn = Any  # an instance of a registered hash family (see hwrepro.sparse.hashes for the protocol)


class Tables(NamedTuple):
    """All N neuron ids of every table, grouped by bucket.

    ids: int32 [L, N]: neuron ids of table l sorted by bucket; random order inside a bucket.
    starts: int32 [L, num_buckets + 1]: bucket b of table l is ids[l, starts[l, b]:starts[l, b + 1]].
    codes: int32 [L, N], every row's bucket in every table, or None: kept (`build_tables(..., keep_codes=True)`)
        so that `rebuild` re-hashes only the rows noted in `changed` since.
    changed: bool [N] or None (with codes): rows whose weights changed since the tables were built
        (`note_changed`, each training step).
    """

    ids: Array
    starts: Array
    codes: Array | None = None
    changed: Array | None = None


class BucketTables(NamedTuple):
    """Fixed-capacity buckets that single rows can be moved between (`refile`), for incremental maintenance.

    slots: int32 [L, num_buckets, C]: the ids filed in each bucket; N (one past the last id) at free slots,
        which may lie anywhere in the bucket (a moved row leaves a hole that the next arrival fills).
    row_bucket: int32 [L, N]: the bucket each row hashed to when it was last filed.
    row_slot: int32 [L, N]: the row's slot in that bucket, -1 when it is not filed (its bucket was full).
    sizes: int32 [L, num_buckets]: rows hashed to each bucket, filed or not.
    pending: int32 [P]: ids of rows changed since the last refile, in the first `num_pending` entries.
    num_pending: int32 []: ids noted since the last refile; those past P were dropped (size P for the rows
        that change between two refiles).

    At Amazon-670K's size (L = 25, 2^16 buckets, C = 16) the arrays take 245 MB, against 74 MB for Tables (141 MB
    with kept codes).
    """

    slots: Array
    row_bucket: Array
    row_slot: Array
    sizes: Array
    pending: Array
    num_pending: Array


def layout(tables: Tables | BucketTables) -> dict[str, int | bool]:
    """The `build_tables` arguments that give tables of the same layout and sizes (for rebuilds and redraws):
    {"keep_codes": kept or not} for Tables, {"capacity": C, "pending_rows": P} for BucketTables."""
    if isinstance(tables, BucketTables):
        return {"capacity": tables.slots.shape[2], "pending_rows": tables.pending.shape[0]}
    return {"keep_codes": tables.codes is not None}


def init_hash(kind: str, key: Array, dim: int, num_hashes: int, num_tables: int, **options: Any) -> HashFn:
    """Draws the hash functions of family `kind` ("simhash", "simhash_pairs", "dwta", or any registered one)
    for `dim`-dimensional vectors: `num_tables` tables (L) of `num_hashes` hashes (K) each; `options` are the
    family's own (SimHash, simhash_pairs: density, dtype; DWTA: bin_size, num_probes)."""
    return FAMILIES.get(kind, "lsh.kind").init(key, dim, num_hashes, num_tables, **options)


def num_buckets(fn: HashFn) -> int:
    """Buckets per table (SimHash: 2**K; DWTA: bin_size**K)."""
    return fn.num_buckets


def num_tables(fn: HashFn) -> int:
    """L, the number of tables (one bucket id per table per input)."""
    return fn.num_tables


# --------------------------------------------------------------------------------------------------------- codes


@jax.jit
def codes(fn: HashFn, x: Array) -> Array:
    """Bucket ids: x float [n, dim] (f32, bf16, ...) -> int32 [n, L], each in [0, num_buckets(fn))."""
    return table_codes(fn, x).T


def table_codes(fn: HashFn, x: Array) -> Array:
    """`codes` in table-major layout, int32 [L, n] (what build_tables sorts); ValueError on a bad x."""
    if x.ndim != 2:
        raise ValueError(f"expected inputs of shape [n, dim], got shape {x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"expected floating-point inputs, got dtype {x.dtype}")
    if not hasattr(fn, "table_codes"):
        raise TypeError(f"expected a hash function of a registered family, got {type(fn).__name__}")
    return fn.table_codes(x)


# ------------------------------------------------------------------------------------- inner-product search


def mips_rows(weight: Array, bias: Array) -> Array:
    """Rows whose angle to `mips_queries(h)` orders them by their logit <w, h> + b: float32 [N, dim + 2].

    Simple-LSH (Neyshabur & Srebro 2015): [w, b, sqrt(M^2 - |w|^2 - b^2)] with M the largest |(w, b)|, all
    of norm M, so the cosine with the query [h, 1, 0] is (<w, h> + b) / (M |(h, 1)|): the largest logits are
    the nearest neighbours, which SimHash (or DWTA) tables find. Hashing w alone finds rows pointing like h,
    whatever their norm and bias. Rows with a small |(w, b)| point along the last axis, which no query has:
    they gather in few buckets that queries rarely probe.
    """
    rows = jnp.concatenate([weight.astype(jnp.float32), bias.astype(jnp.float32)[:, None]], axis=1)
    square = jnp.sum(rows * rows, axis=1)
    return jnp.concatenate([rows, jnp.sqrt(jnp.maximum(jnp.max(square) - square, 0.0))[:, None]], axis=1)


def mips_queries(x: Array) -> Array:
    """The queries of `mips_rows` tables: x float [B, dim] -> [x, 1, 0] float32 [B, dim + 2]."""
    ones = jnp.ones((x.shape[0], 1), jnp.float32)
    return jnp.concatenate([x.astype(jnp.float32), ones, jnp.zeros_like(ones)], axis=1)


# -------------------------------------------------------------------------------------------------------- tables


@functools.partial(jax.jit, static_argnames=("host_sort", "capacity", "pending_rows", "keep_codes"))
def build_tables(fn: HashFn, weights: Array, key: Array, *, host_sort: bool | None = None, capacity: int = 0,
                 pending_rows: int = 0, keep_codes: bool = False) -> Tables | BucketTables:
    """Hashes every weight row (one per output neuron) and groups the ids by bucket in each table.

    weights: float [N, dim]; key: a PRNG key for the random order inside buckets.
    host_sort: group with NumPy through a callback instead of XLA (same result, bit for bit: the sort keys
        are unique). Default: on the CPU backend, where XLA's sort is most of the build's time and NumPy's
        O(N) grouping (a radix sort of the codes) took half as long (25 tables of 670,091 uniform codes,
        2026-12-07, EPYC-512: 0.43 s against XLA's 0.81-0.88 s).
    capacity: 0 for Tables(ids int32 [L, N], starts int32 [L, num_buckets + 1]), every id; C > 0 for
        BucketTables holding the first C ids of each bucket of those (a uniform sample of a larger bucket),
        with room for `pending_rows` changed-row ids between refiles.
    keep_codes: Tables only: keep every row's bucket codes (67 MB at Amazon-670K's size), so that `rebuild`
        re-hashes only the rows that changed since.
    """
    bucket_codes = table_codes(fn, weights)  # [L, N]
    tables = _group(bucket_codes, num_buckets(fn), key, host_sort)
    if keep_codes and not capacity:
        return tables._replace(codes=bucket_codes, changed=jnp.zeros(bucket_codes.shape[1], bool))
    if not capacity:
        return tables
    check_positive(capacity=capacity)
    return _to_buckets(tables, bucket_codes, capacity, pending_rows)


@functools.partial(jax.jit, static_argnames=("host_sort", "block"))
def rebuild(fn: HashFn, tables: Tables | BucketTables, weights: Array, key: Array, *,
            host_sort: bool | None = None, block: int = 8192) -> Tables | BucketTables:
    """New tables of the same layout for the current weights float [N, dim] and the same hash functions.

    Tables with kept codes (`build_tables(..., keep_codes=True)`): only the rows noted in `tables.changed` are
    hashed again (`block` rows at a time, as many blocks as there are such rows), the others keep their codes;
    then every table is grouped anew. Other tables: `build_tables` with their layout.

    The same tables as a full build, bit for bit when the projections are exact (a projection within float
    rounding of zero may flip its bit between matmul shapes, as in any build); `changed` is cleared. Training
    touches ~45% of W's rows between two of SLIDE's rebuilds at Amazon-670K's size (50 steps x 8,192 rows),
    so this hashes about half the rows a full build does (docs/slide_costs.md).
    """
    if isinstance(tables, BucketTables) or tables.codes is None:
        return build_tables(fn, weights.astype(jnp.float32), key, host_sort=host_sort, **layout(tables))
    n = tables.changed.shape[0]
    count = jnp.sum(tables.changed, dtype=jnp.int32)
    block = max(1, min(block, n))
    rows = jnp.nonzero(tables.changed, size=-(-n // block) * block, fill_value=n)[0].astype(jnp.int32)

    def rehash(i: Array, codes: Array) -> Array:
        r = lax.dynamic_slice_in_dim(rows, i * block, block)
        new = table_codes(fn, weights.at[r].get(mode="clip").astype(jnp.float32))  # [L, block]
        r = jnp.where(r < n, r, n + jnp.arange(block, dtype=jnp.int32))  # padding: distinct, out of range
        return codes.at[:, r].set(new, mode="drop", unique_indices=True)  # (dropped)

    codes = lax.fori_loop(0, -(-count // block), rehash, tables.codes)
    grouped = _group(codes, num_buckets(fn), key, host_sort)
    return grouped._replace(codes=codes, changed=jnp.zeros_like(tables.changed))


def _group(bucket_codes: Array, buckets: int, key: Array, host_sort: bool | None) -> Tables:
    """Tables of bucket codes int32 [L, N]: ids sorted by (bucket, a random rank of the id), and bucket starts."""
    if host_sort is None:
        host_sort = jax.default_backend() == "cpu"
    seeds = _row_seeds(key, bucket_codes.shape[0])  # one rank bijection per table (_rank)
    if host_sort:
        group = functools.partial(_host_group_by_bucket, buckets=buckets)
        shapes = Tables(ids=jax.ShapeDtypeStruct(bucket_codes.shape, jnp.int32),
                        starts=jax.ShapeDtypeStruct((bucket_codes.shape[0], buckets + 1), jnp.int32))
        return Tables(*jax.pure_callback(group, shapes, bucket_codes, seeds, vmap_method="expand_dims"))
    _, ids = _sort_in_random_order(bucket_codes, buckets - 1, seeds)
    table = jnp.arange(bucket_codes.shape[0])[:, None]
    sizes = jnp.zeros((bucket_codes.shape[0], buckets), jnp.int32).at[table, bucket_codes].add(1)
    return Tables(ids=ids, starts=jnp.pad(jnp.cumsum(sizes, axis=1), ((0, 0), (1, 0))))


def _to_buckets(tables: Tables, bucket_codes: Array, capacity: int, pending_rows: int) -> BucketTables:
    """BucketTables holding the first `capacity` ids of every bucket of `tables` (bucket_codes: int32 [L, N])."""
    num_tables_, n = tables.ids.shape
    table = jnp.arange(num_tables_)[:, None]
    position = tables.starts[:, :-1, None] + jnp.arange(capacity, dtype=jnp.int32)  # [L, buckets, C]
    found = jnp.take_along_axis(tables.ids, jnp.minimum(position, n - 1).reshape(num_tables_, -1), axis=1)
    slots = jnp.where(position < tables.starts[:, 1:, None], found.reshape(position.shape), n)
    # The id at sorted position p sits at p - (its bucket's start) in its bucket.
    rank = jnp.arange(n, dtype=jnp.int32) - jnp.take_along_axis(
        tables.starts, jnp.take_along_axis(bucket_codes, tables.ids, axis=1), axis=1)
    row_slot = jnp.zeros((num_tables_, n), jnp.int32).at[table, tables.ids].set(
        jnp.where(rank < capacity, rank, -1), unique_indices=True)
    return BucketTables(slots=slots.astype(jnp.int32), row_bucket=bucket_codes, row_slot=row_slot,
                        sizes=jnp.diff(tables.starts, axis=1), pending=jnp.full(pending_rows, n, jnp.int32),
                        num_pending=jnp.zeros((), jnp.int32))


def _id_bits(n: int) -> int:
    """Bits of an id below n: the domain [0, 2**bits) of the rank bijection (_rank)."""
    if n >= 2**31:
        raise ValueError(f"{n} neurons do not fit int32 ids")
    return max(1, (n - 1).bit_length())


def _rank_constants(seeds: Array | np.ndarray, bits: int) -> tuple:
    """Per table, from its uint32 seed [L, 1]: two odd multipliers, their inverses mod 2**32, and an offset.

    The inverse of an odd a mod 2**32 by Newton's iteration x <- x (2 - a x): a is its own inverse mod 8, and
    every step doubles the bits that are right (3, 6, 12, 24, 48). For JAX and NumPy uint32 arrays alike."""
    mask = (1 << bits) - 1
    a1, a2 = (_fmix32(seeds ^ np.uint32(salt)) | np.uint32(1) for salt in (0x9E3779B9, 0x7F4A7C15))
    inverses = []
    for a in (a1, a2):
        x = a
        for _ in range(4):
            x = x * (np.uint32(2) - a * x)
        inverses.append(x)
    return a1, a2, inverses[0], inverses[1], _fmix32(seeds ^ np.uint32(0x2545F491)) & np.uint32(mask)


def _rank(i: Array | np.ndarray, seeds: Array | np.ndarray, bits: int) -> Array | np.ndarray:
    """A random bijection of [0, 2**bits) per table (uint32 [L, n] ids -> ranks; seeds uint32 [L, 1]): the order
    of ids inside a bucket.

    An affine map mod 2**bits, a xor-shift by half the bits (its own inverse) that folds the high bits into the
    low ones, and a second odd multiplier that carries them back up, so the ranks' order (their high bits)
    depends on every bit of the id. Cheap to invert (`_unrank`), so the NumPy grouping lists the ids in rank
    order in O(2**bits) instead of sorting them, and both groupings give the same tables."""
    a1, a2, _, _, offset = _rank_constants(seeds, bits)
    mask, shift = np.uint32((1 << bits) - 1), np.uint32((bits + 1) // 2)
    h = (i * a1 + offset) & mask
    h ^= h >> shift
    return (h * a2) & mask


def _unrank(r: Array | np.ndarray, seeds: Array | np.ndarray, bits: int) -> Array | np.ndarray:
    """`_rank`'s inverse: ranks uint32 [L, n] -> ids."""
    _, _, inv1, inv2, offset = _rank_constants(seeds, bits)
    mask, shift = np.uint32((1 << bits) - 1), np.uint32((bits + 1) // 2)
    h = (r * inv2) & mask
    h ^= h >> shift
    return ((h - offset) * inv1) & mask


def _row_seeds(key: Array, rows: int) -> Array:
    """uint32 [rows, 1]: one random word per row (table), the seed of its `_rank` bijection."""
    return jax.random.bits(key, (rows, 1), jnp.uint32)


def _fmix32(h: Array | np.ndarray) -> Array | np.ndarray:
    """murmur3's 32-bit finalizer, a bijection of uint32 that mixes every input bit into every output bit.

    For JAX and NumPy uint32 arrays alike (NumPy's in place: callers give it a fresh one)."""
    h ^= h >> 16
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> 13
    h *= np.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _host_group_by_bucket(bucket_codes: Array, seeds: Array, *, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """build_tables' grouping in NumPy (ids, starts): the same tables as its XLA path.

    Per table, O(N): the ids in rank order (`_unrank` of every rank, those below N kept), then a stable sort of
    their bucket codes, a radix sort for codes of up to 16 bits (4-6 ms for 670,091 ids, where one sort of
    packed 64-bit keys took 46 ms). Tables are spread over one thread per core (NumPy's sort and element-wise
    passes release the GIL): the callback otherwise runs on one core while XLA's threads wait for it.
    """
    bucket_codes, seeds = np.asarray(bucket_codes), np.asarray(seeds)  # callbacks get jax.Arrays
    # vmapped keys, weights, both or neither: an unbatched operand comes with leading axes of size 1.
    lead = np.broadcast_shapes(bucket_codes.shape[:-1], seeds.shape[:-1])
    bucket_codes = np.broadcast_to(bucket_codes, (*lead, bucket_codes.shape[-1]))
    seeds = np.broadcast_to(seeds, (*lead, 1))
    n = bucket_codes.shape[-1]
    bits = _id_bits(n)
    code_type = np.uint16 if buckets <= 2**16 else np.int32
    every_rank = np.arange(1 << bits, dtype=np.uint32)
    ids = np.empty(bucket_codes.shape, np.int32)
    starts = np.zeros((*bucket_codes.shape[:-1], buckets + 1), np.int32)

    def group(row: tuple[int, ...]) -> None:
        by_rank = _unrank(every_rank, seeds[row], bits)
        by_rank = np.compress(by_rank < n, by_rank)  # a third of boolean indexing's time
        codes = bucket_codes[row].astype(code_type)
        ids[row] = by_rank[np.argsort(codes[by_rank], kind="stable")]
        # An int64 cumsum then a copy: faster than a cumsum that casts as it writes into int32.
        starts[row][1:] = np.cumsum(np.bincount(bucket_codes[row], minlength=buckets))

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1  # numerics.threads holds
    with concurrent.futures.ThreadPoolExecutor(cores) as pool:
        list(pool.map(group, np.ndindex(bucket_codes.shape[:-1])))  # tables (and any vmapped axes)
    return ids, starts


@functools.partial(jax.jit, static_argnames=("bucket_capacity", "probe_bits"))
def query(fn: HashFn, tables: Tables | BucketTables, x: Array, bucket_capacity: int, probe_bits: int = 0) -> Array:
    """Neurons in the buckets x falls in: x float [B, dim] -> int32 [B, L, 2**probe_bits * bucket_capacity].

    Per table, the first `bucket_capacity` ids of x's bucket (a uniform sample of it, the in-bucket order
    being random), padded with N (one past the last neuron id) when the bucket is smaller. probe_bits m > 0:
    multi-probe, the same from 2**m buckets per table (`probe_codes`), x's own bucket first.
    """
    if not probe_bits:
        return lookup(tables, codes(fn, x), bucket_capacity)
    probed = probe_codes(fn, x, probe_bits)  # [B, L, P]
    b, num_tables_, p = probed.shape
    found = lookup(tables, probed.transpose(0, 2, 1).reshape(b * p, num_tables_), bucket_capacity)
    return found.reshape(b, p, num_tables_, bucket_capacity).transpose(0, 2, 1, 3).reshape(b, num_tables_, -1)


def probe_codes(fn: HashFn, x: Array, probe_bits: int) -> Array:
    """Multi-probe bucket ids int32 [B, L, 2**probe_bits]: x's own bucket, then those where any subset of the
    table's `probe_bits` least certain hashes took its next most likely value (Lv et al. 2007), in the order
    of the subsets' binary numbers (hash 0, hash 1, both, hash 2, ...).

    Uses the family's `hash_changes` (SimHash: flip the bits of the hyperplanes x lies closest to; DWTA:
    a bin's runner-up slot where it lost by the least). Hashes with an infinite margin are never changed.
    """
    check_positive(probe_bits=probe_bits)
    if not hasattr(fn, "hash_changes"):
        raise ValueError(f"hash family {type(fn).__name__} has no hash_changes: it cannot answer multi-probe "
                         "queries")
    home = table_codes(fn, x)  # [L, B]
    deltas, margins = fn.hash_changes(x)  # [L, B, K]
    if probe_bits > deltas.shape[2]:
        raise ValueError(f"probe_bits={probe_bits} exceeds the {deltas.shape[2]} hashes per table")
    neg_margin, least = lax.top_k(-margins, probe_bits)  # [L, B, m]: the least certain hashes
    step = jnp.where(jnp.isfinite(neg_margin), jnp.take_along_axis(deltas, least, axis=2), 0)
    subsets = (jnp.arange(2**probe_bits)[:, None] >> jnp.arange(probe_bits)) & 1  # [P, m]
    probed = home[..., None] + jnp.sum(step[:, :, None, :] * subsets, axis=3, dtype=jnp.int32)
    return probed.transpose(1, 0, 2)


def lookup(tables: Tables | BucketTables, bucket_codes: Array, bucket_capacity: int) -> Array:
    """`query` for precomputed codes: int32 [B, L] bucket ids -> int32 [B, L, bucket_capacity] neuron ids.

    BucketTables: the bucket's first `bucket_capacity` slots (padded with N past its capacity C); N marks a
    free slot anywhere in it.
    """
    check_positive(bucket_capacity=bucket_capacity)
    num_tables_, n = (tables.ids if isinstance(tables, Tables) else tables.row_bucket).shape
    if bucket_codes.ndim != 2 or bucket_codes.shape[1] != num_tables_:
        raise ValueError(f"expected bucket codes of shape [B, {num_tables_}], got shape {bucket_codes.shape}")
    table = jnp.arange(num_tables_)
    if isinstance(tables, BucketTables):
        found = tables.slots[table, bucket_codes][..., :bucket_capacity]  # [B, L, min(C, capacity)]
        return jnp.pad(found, ((0, 0), (0, 0), (0, bucket_capacity - found.shape[2])), constant_values=n)
    first = tables.starts[table, bucket_codes]  # [B, L]
    end = tables.starts[table, bucket_codes + 1]
    position = first[..., None] + jnp.arange(bucket_capacity, dtype=jnp.int32)  # [B, L, C]
    found = tables.ids[table[:, None], jnp.minimum(position, n - 1)]
    return jnp.where(position < end[..., None], found, n)


# ------------------------------------------------------------------------------------------ incremental upkeep


def note_changed(tables: Tables | BucketTables, ids: Array) -> Tables | BucketTables:
    """Notes rows whose weights changed, for the next `refile` or `rebuild`: ids int32 [...] in [0, N] (N =
    none; repeats allowed; a negative id would count from the end, as in any JAX index).

    O(ids.size): BucketTables append the ids to `tables.pending` (ids past its size are dropped and counted in
    num_pending); Tables with kept codes set them in `changed`; Tables without keep no record.
    """
    if not isinstance(tables, BucketTables):
        if tables.changed is None:
            return tables
        return tables._replace(changed=tables.changed.at[ids.ravel()].set(True, mode="drop"))
    flat = ids.ravel().astype(jnp.int32)
    at = tables.num_pending + jnp.arange(flat.size, dtype=jnp.int32)
    return tables._replace(pending=tables.pending.at[at].set(flat, mode="drop"),
                           num_pending=tables.num_pending + flat.size)


@functools.partial(jax.jit, static_argnames="block")
def refile(fn: HashFn, tables: BucketTables, weights: Array, key: Array, block: int = 8192) -> BucketTables:
    """Re-hashes the rows noted since the last refile and moves those whose bucket changed; pending emptied.

    weights: float [N, dim] (any float dtype; only the noted rows are read); key: PRNG key for the overflow
    choices. Work is O(noted rows): they are deduplicated (one sort of the pending buffer), then hashed and
    moved `block` rows at a time, as many blocks as there are distinct rows. A moved row leaves its old
    bucket and takes a free slot of its new one; rows not filed (their bucket was full) take free slots too.
    Overflow, when a bucket has no free slot left: a moved row replaces a random filed row with probability
    C / (rows hashed to the bucket), SLIDE's reservoir sampling, so a full bucket stays a near-uniform
    sample of its rows; otherwise it stays unfiled (row_slot -1) until it is noted again (its weights change)
    or the next full build: a slot that frees later is not offered to it, nor to a row of an earlier block
    of the same refile, so between full builds a bucket may hold fewer rows than it could.
    Without overflow the result holds the same ids per bucket as a full build of the same weights.
    """
    n = tables.row_bucket.shape[1]
    pending = jnp.where(jnp.arange(tables.pending.shape[0]) < tables.num_pending, tables.pending, n)
    ids = jnp.sort(pending)
    first = jnp.concatenate([jnp.ones(1, bool), ids[1:] != ids[:-1]]) & (ids < n)
    count = jnp.sum(first, dtype=jnp.int32)
    block = max(1, min(block, pending.shape[0]))
    size = -(-pending.shape[0] // block) * block
    rows = jnp.full(size, n, jnp.int32).at[jnp.where(first, jnp.cumsum(first) - 1, size)].set(ids, mode="drop")

    def move_block(i: Array, t: BucketTables) -> BucketTables:
        r = lax.dynamic_slice_in_dim(rows, i * block, block)
        x = weights.at[r].get(mode="clip").astype(jnp.float32)  # padding rows are masked in _move
        return _move(t, r, table_codes(fn, x), jax.random.fold_in(key, i))

    tables = lax.fori_loop(0, -(-count // block), move_block, tables)
    return tables._replace(num_pending=jnp.zeros((), jnp.int32))


def _move(t: BucketTables, rows: Array, new: Array, key: Array) -> BucketTables:
    """Files distinct rows int32 [U] (N = padding) under their new bucket codes int32 [L, U] (see refile)."""
    num_tables_, buckets, capacity = t.slots.shape
    n = t.row_bucket.shape[1]
    table = jnp.arange(num_tables_)[:, None]
    valid = rows < n
    r = jnp.minimum(rows, n - 1)
    old, old_slot = t.row_bucket[:, r], t.row_slot[:, r]  # [L, U]
    moved = valid & (new != old)
    # Out of the old buckets (index `buckets` is out of range: the scatter drops it).
    slots = t.slots.at[table, jnp.where(moved & (old_slot >= 0), old, buckets), old_slot].set(n, mode="drop")
    sizes = (t.sizes.at[table, jnp.where(moved, old, buckets)].add(-1, mode="drop")
             .at[table, jnp.where(moved, new, buckets)].add(1, mode="drop"))
    # Into the new ones: each arrival's rank among this block's arrivals to its bucket, in random order.
    arrive = valid & (moved | (old_slot < 0))
    k_order, k_admit, k_start = jax.random.split(key, 3)
    iota = lax.broadcasted_iota(jnp.int32, new.shape, 1)
    by_bucket, order = _sort_in_random_order(jnp.where(arrive, new, buckets), buckets,
                                             _row_seeds(k_order, num_tables_))
    head = jnp.concatenate([jnp.ones((num_tables_, 1), bool), by_bucket[:, 1:] != by_bucket[:, :-1]], axis=1)
    rank_sorted = iota - lax.cummax(jnp.where(head, iota, 0), axis=1)
    rank = jnp.zeros_like(iota).at[table, order].set(rank_sorted, unique_indices=True)
    here = slots[table, new]  # [L, U, C]: the new buckets after the removals
    free = here == n
    num_free = jnp.sum(free, axis=2, dtype=jnp.int32)
    # Overflow: the o-th overflowing arrival of a bucket takes its (o + start)-th filed row's slot (distinct
    # for distinct o), if admitted; `start` is random per bucket.
    over, filed = rank - num_free, capacity - num_free
    start = (_fmix32(new.astype(jnp.uint32) ^ _row_seeds(k_start, num_tables_))
             % capacity).astype(jnp.int32)
    admit = (moved & (over >= 0) & (over < filed)
             & (jax.random.uniform(k_admit, new.shape) * sizes[table, new] < capacity))
    evict_slot = _nth(~free, (over + start) % jnp.maximum(filed, 1))
    slot = jnp.where(arrive & (rank < num_free), _nth(free, rank), jnp.where(admit, evict_slot, -1))
    evicted = jnp.where(admit, jnp.take_along_axis(here, evict_slot[..., None], axis=2)[..., 0], n)
    # Evicted rows (filed rows not in this block's arrivals) and arrivals are distinct: no scatter collides.
    row_slot = (t.row_slot.at[table, evicted].set(-1, mode="drop")
                .at[table, jnp.where(arrive, r, n)].set(slot, mode="drop"))
    slots = slots.at[table, jnp.where(slot >= 0, new, buckets), slot].set(rows, mode="drop")
    row_bucket = t.row_bucket.at[table, jnp.where(moved, r, n)].set(new, mode="drop")
    return t._replace(slots=slots, row_bucket=row_bucket, row_slot=row_slot, sizes=sizes)


def _sort_in_random_order(values: Array, top: int, seeds: Array) -> tuple[Array, Array]:
    """Per row of values int32 [L, U] (each in [0, top]): the values sorted, and the positions they came from,
    in a random order within equal values: that of `_rank` of the position, one bijection per row (seeds uint32
    [L, 1]). Both the tables' XLA grouping (values: bucket codes, positions: neuron ids) and a refile (the
    arrivals' new buckets) sort this way.

    One sort of a primitive array per row (XLA:CPU's std::sort path; a payload operand or a second key calls a
    compiled comparator per comparison, several times slower): unique keys value | rank, 32 bits where they
    fit, else 64; the position is the rank's inverse."""
    id_bits = _id_bits(values.shape[1])
    value_bits = max(1, top.bit_length())
    rank = _rank(lax.broadcasted_iota(jnp.uint32, values.shape, 1), seeds, id_bits)
    wide = value_bits + id_bits > 32
    with jax.enable_x64(True) if wide else contextlib.nullcontext():  # JAX has uint64 only with x64 on
        word = jnp.uint64 if wide else jnp.uint32
        packed = jnp.sort((values.astype(word) << word(id_bits)) | rank.astype(word), axis=1)
        positions = _unrank((packed & word((1 << id_bits) - 1)).astype(jnp.uint32), seeds, id_bits)
        return (packed >> word(id_bits)).astype(jnp.int32), positions.astype(jnp.int32)


def _nth(mask: Array, k: Array) -> Array:
    """int32 [...]: the position of the k-th (from 0) True of mask bool [..., C] (0 when there is none)."""
    count = jnp.cumsum(mask, axis=-1, dtype=jnp.int32)
    return jnp.argmax(mask & (count == k[..., None] + 1), axis=-1).astype(jnp.int32)


# ------------------------------------------------------------------------------------------------------ schedule


@dataclasses.dataclass(frozen=True)
class RebuildSchedule:
    """When to rebuild the tables and when to redraw the hash functions (host side, a pure function of step).

    SLIDE re-inserts the neurons into its tables periodically, the period growing exponentially as training
    settles, and draws new hash functions on a separate, longer period. Here the i-th period (i = 0, 1, ...)
    is `period * exp(decay * i)` steps, and event n (n >= 1) falls on the nearest integer step to the sum of
    the first n periods, so rounding never accumulates. `step` counts completed training steps: with
    rebuild_period 50 and no decay, tables are rebuilt after steps 50, 100, 150, ...

    rebuild_period, rebuild_decay: table rebuilds (SLIDE's Amazon-670K config: every 50 batches); rebuild_period
        None rebuilds only with a redraw (incremental tables, lsh.refile, kept up to date in between).
    redraw_period, redraw_decay: new hash functions, which need new tables too (SLIDE: every 1,000 batches);
        redraw_period None never redraws.
    """

    rebuild_period: float | None
    rebuild_decay: float = 0.0
    redraw_period: float | None = None
    redraw_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.rebuild_period is not None:
            _check_period("rebuild", self.rebuild_period, self.rebuild_decay)
        if self.redraw_period is not None:
            _check_period("redraw", self.redraw_period, self.redraw_decay)

    def due(self, step: int) -> bool:
        """True when the tables must be rebuilt after `step` (a rebuild or a redraw step)."""
        return ((self.rebuild_period is not None and _is_event(self.rebuild_period, self.rebuild_decay, step))
                or self.redraw_due(step))

    def redraw_due(self, step: int) -> bool:
        """True when new hash functions must be drawn (and tables built for them) after `step`."""
        return self.redraw_period is not None and _is_event(self.redraw_period, self.redraw_decay, step)

    def due_steps(self, stop: int) -> list[int]:
        """The steps in [1, stop) at which `due` is True, in order."""
        steps = set() if self.rebuild_period is None else set(
            _events_before(self.rebuild_period, self.rebuild_decay, stop))
        if self.redraw_period is not None:
            steps.update(_events_before(self.redraw_period, self.redraw_decay, stop))
        return sorted(steps)

    def redraw_steps(self, stop: int) -> list[int]:
        """The steps in [1, stop) at which `redraw_due` is True, in order."""
        return [] if self.redraw_period is None else _events_before(self.redraw_period, self.redraw_decay, stop)


def _check_period(what: str, period: float, decay: float) -> None:
    if not (math.isfinite(period) and period >= 1):
        raise ValueError(f"{what}_period={period!r} must be a finite number of steps >= 1")
    if not (math.isfinite(decay) and decay >= 0):
        raise ValueError(f"{what}_decay={decay!r} must be finite and >= 0 (periods may only grow)")


def _event_step(period: float, decay: float, n: int) -> int:
    """Step of event n >= 1: period * (1 + e^decay + ... + e^(decay (n-1))), rounded half up."""
    total = n if decay == 0 else math.expm1(decay * n) / math.expm1(decay)
    return math.floor(period * total + 0.5)


def _is_event(period: float, decay: float, step: int) -> bool:
    step = int(step)  # also a NumPy or JAX scalar, e.g. a train state's step counter
    if step < 1:
        return False
    # Invert the (increasing) event-step formula, then check the neighbours of the estimate exactly.
    estimate = step / period if decay == 0 else math.log1p(step * math.expm1(decay) / period) / decay
    around = range(max(1, math.floor(estimate) - 1), math.floor(estimate) + 3)
    return any(_event_step(period, decay, n) == step for n in around)


def _events_before(period: float, decay: float, stop: int) -> list[int]:
    steps, n = [], 1
    while (step := _event_step(period, decay, n)) < stop:
        steps.append(step)
        n += 1
    return steps
