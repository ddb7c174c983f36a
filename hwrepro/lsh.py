"""Locality-sensitive hashing for SLIDE's output layer: hash families, bucket tables, queries, rebuild schedule.

SLIDE (MLSys 2020/2021) computes, each step, only the output neurons whose weight rows share an LSH bucket with
the hidden activation in at least one of L tables. This module holds the hashing half of that and nothing of
training: pure functions with explicit PRNG keys, jit-able with hash functions and tables passed as pytrees
(every static size comes from an array shape).

Hash families (L tables of K hashes each):
- SimHash: bit k of table l is sign(<x, r_lk>) (signed random projections, Charikar 2002). Dense: Gaussian r,
  so P(bit collides) = 1 - angle(x, y) / pi exactly. Sparse (density < 1, SLIDE's "ratio 3"): r has exactly
  round(density * dim) non-zero entries, each +-1. Either way the codes are one f32 matmul.
- DWTA, densified winner-take-all (Chen & Shrivastava 2018; SLIDE's choice for Amazon-670K): hash k of table
  l is the position of the largest of `bin_size` randomly chosen input dims (for bin size 8, values within a
  relative 2**-20 of each other count as equal, the lower position winning); zeros do not take part, and a
  bin whose dims are all zero (common after ReLU) takes the value of the first non-empty bin in its own fixed
  random probe order (densification, Shrivastava 2017), so identical vectors always collide and sparse
  vectors still get a full code. A table's bucket id is the K positions read as a base-`bin_size` number.

Tables store, per table, all N neuron ids sorted by bucket plus bucket start offsets (the CSR layout): SLIDE's
Amazon setting (L = 50, 2^18 buckets, bucket size 128) as a dense [L, 2^18, 128] array would be 6.7 GB, while
ids + starts are L * (N + 2^18 + 1) int32 (186 MB for N = 670,091). Inside a bucket the order is random, so
taking the first `bucket_capacity` ids of a bucket is a uniform sample of it; this stands in for SLIDE's
FIFO / reservoir bucket replacement with a fixed bucket size.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
import os
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Array = jax.Array

# DWTA compares values as order-preserving int32 keys (see _dwta_keys); a zero input maps to this key, which
# is below every key of a non-zero value even after the slot bits are or-ed into its low bits.
_EMPTY_KEY = -(2**31)
# Largest bucket count per table we accept: `starts` holds L * (num_buckets + 1) int32.
_MAX_BUCKET_BITS = 30


class SimHash(NamedTuple):
    """Signed random projections: `num_bits` sign bits per table, `num_tables` tables.

    planes: float32 [dim, num_tables, num_bits]; Gaussian entries (density 1) or exactly
        round(density * dim) entries of +-1 per (table, bit) column and zeros elsewhere (density < 1).
    """

    planes: Array


class DWTA(NamedTuple):
    """Densified winner-take-all hashes: `num_hashes` hashes per table of log2(bin_size) bits each.

    bins: int32 [num_tables, num_hashes, bin_size]: the input dims each hash compares (distinct within a bin).
    probes: int32 [num_tables * num_hashes, num_probes]: for each bin (flat index l * num_hashes + k), the other
        bins, in a fixed random order, whose value an empty bin takes (the first non-empty one).
    The input dim is in no shape here, so `codes` cannot check it (an index past it would be clamped).
    """

    bins: Array
    probes: Array


HashFn = SimHash | DWTA


class Tables(NamedTuple):
    """All N neuron ids of every table, grouped by bucket.

    ids: int32 [L, N]: neuron ids of table l sorted by bucket; random order inside a bucket.
    starts: int32 [L, num_buckets + 1]: bucket b of table l is ids[l, starts[l, b]:starts[l, b + 1]].
    """

    ids: Array
    starts: Array


# ------------------------------------------------------------------------------------------------ hash functions


@functools.partial(jax.jit, static_argnames=("dim", "num_bits", "num_tables", "density"))
def init_simhash(key: Array, dim: int, num_bits: int, num_tables: int, density: float = 1.0) -> SimHash:
    """Draws `num_tables` x `num_bits` random hyperplanes for `dim`-dimensional inputs.

    density 1 gives Gaussian hyperplanes (exact 1 - angle/pi collision probability per bit); density < 1 gives
    SLIDE's sparse projections: round(density * dim) (at least 1) dims per hyperplane, each with a random sign.
    """
    _check_positive(dim=dim, num_bits=num_bits, num_tables=num_tables)
    if num_bits > _MAX_BUCKET_BITS:
        raise ValueError(f"num_bits={num_bits} gives more than 2**{_MAX_BUCKET_BITS} buckets per table")
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density={density} must be in (0, 1]")
    shape = (dim, num_tables, num_bits)
    k_values, k_dims = jax.random.split(key)
    if density == 1.0:
        return SimHash(jax.random.normal(k_values, shape, jnp.float32))
    nonzero = max(1, round(density * dim))
    # A dim is kept when its uniform rank within its column is below `nonzero`: exactly `nonzero` per column.
    rank = jnp.argsort(jnp.argsort(jax.random.uniform(k_dims, shape), axis=0), axis=0)
    signs = jax.random.rademacher(k_values, shape, jnp.float32)
    return SimHash(jnp.where(rank < nonzero, signs, 0.0))


@functools.partial(jax.jit, static_argnames=("dim", "num_hashes", "num_tables", "bin_size", "num_probes"))
def init_dwta(
    key: Array, dim: int, num_hashes: int, num_tables: int, bin_size: int = 8, num_probes: int | None = None
) -> DWTA:
    """Draws `num_tables` x `num_hashes` winner-take-all bins of `bin_size` distinct dims each.

    num_probes: how many other bins an empty bin may borrow from, in its random probe order; default all of
    them (num_tables * num_hashes - 1), so only a vector that is zero in every bin keeps empty bins (code 0).
    Probing stops as soon as every bin is filled, so a long probe list costs nothing for dense vectors.
    """
    _check_positive(dim=dim, num_hashes=num_hashes, num_tables=num_tables)
    if not 2 <= bin_size <= min(dim, 128):
        raise ValueError(f"bin_size={bin_size} must be between 2 and min(dim={dim}, 128)")
    if bin_size**num_hashes > 2**_MAX_BUCKET_BITS:
        raise ValueError(f"bin_size**num_hashes = {bin_size}**{num_hashes} exceeds 2**{_MAX_BUCKET_BITS} buckets")
    num_bins = num_tables * num_hashes
    num_probes = num_bins - 1 if num_probes is None else num_probes
    if not 0 <= num_probes <= num_bins - 1:
        raise ValueError(f"num_probes={num_probes} must be between 0 and {num_bins - 1} (the other bins)")
    k_bins, k_probes = jax.random.split(key)
    # The first bin_size entries of an independent random permutation of the dims, for every bin.
    order = jnp.argsort(jax.random.uniform(k_bins, (num_bins, dim)), axis=1)
    bins = order[:, :bin_size].reshape(num_tables, num_hashes, bin_size).astype(jnp.int32)
    # Each bin's probe order: a random permutation of the other bins (its own bin is sorted last, dropped).
    noise = jax.random.uniform(k_probes, (num_bins, num_bins)) + 2.0 * jnp.eye(num_bins)
    probes = jnp.argsort(noise, axis=1)[:, :num_probes].astype(jnp.int32)
    return DWTA(bins, probes)


def num_buckets(fn: HashFn) -> int:
    """Buckets per table: 2**num_bits (SimHash) or bin_size**num_hashes (DWTA)."""
    if isinstance(fn, SimHash):
        return 2 ** fn.planes.shape[2]
    _, num_hashes, bin_size = fn.bins.shape
    return bin_size**num_hashes


def num_tables(fn: HashFn) -> int:
    """L, the number of tables (one bucket id per table per input)."""
    return fn.planes.shape[1] if isinstance(fn, SimHash) else fn.bins.shape[0]


def _check_positive(**sizes: int) -> None:
    for name, value in sizes.items():
        if int(value) != value or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")


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
    if isinstance(fn, SimHash):
        if x.shape[1] != fn.planes.shape[0]:
            raise ValueError(f"inputs have dim {x.shape[1]} but the SimHash was drawn for dim {fn.planes.shape[0]}")
        _, tables, bits = fn.planes.shape
        # Rows per block: their f32 projections [rows, L * K] (2 MB) stay in a core's L2 cache.
        return _by_row_blocks(functools.partial(_simhash_codes, fn), x, tables, (1 << 21) // (4 * tables * bits))
    if isinstance(fn, DWTA):
        # Rows per block: their int32 keys [dim, rows] (1 MB) stay in L2 while every table's bins read them,
        # 3x faster at Amazon-670K's size than passes over all rows.
        return _by_row_blocks(functools.partial(_dwta_codes, fn), x, fn.bins.shape[0], (1 << 20) // (4 * x.shape[1]))
    raise TypeError(f"expected a SimHash or DWTA hash function, got {type(fn).__name__}")


def _by_row_blocks(hash_rows: Callable[[Array], Array], x: Array, num_tables_: int, block: int) -> Array:
    """int32 [L, n]: hash_rows (rows [b, dim] -> codes [L, b]) over blocks of `block` rows (at least 64).

    The last block is shifted back to end at row n, re-hashing a few rows to the same codes, so every block
    has one static shape and no padded copy of x is made.
    """
    n = x.shape[0]
    if n == 0:
        return jnp.zeros((num_tables_, 0), jnp.int32)
    block = min(n, max(64, block))

    def hash_block(i: Array, out: Array) -> Array:
        start = jnp.minimum(i * block, n - block)
        return lax.dynamic_update_slice_in_dim(out, hash_rows(lax.dynamic_slice_in_dim(x, start, block)), start, 1)

    return lax.fori_loop(0, -(-n // block), hash_block, jnp.zeros((num_tables_, n), jnp.int32))


def _simhash_codes(fn: SimHash, x: Array) -> Array:
    """int32 [L, n]: bit k of table l is <x, planes[:, l, k]> > 0.

    Inputs are upcast to f32 (exact for bf16) so that vectors of different dtypes, e.g. f32 weights and bf16
    activations, are hashed by the same hyperplanes; HIGHEST precision keeps TF32 / bf16 passes out of it.
    (A projection within float rounding of 0 could still flip its bit between two matmul shapes.)
    """
    bit_values = jnp.left_shift(1, jnp.arange(fn.planes.shape[2], dtype=jnp.int32))
    proj = jnp.einsum("nd,dlk->nlk", x.astype(jnp.float32), fn.planes, precision=lax.Precision.HIGHEST)
    return jnp.sum(jnp.where(proj > 0, bit_values, 0), axis=-1, dtype=jnp.int32).T


def _dwta_keys(x: Array, bin_size: int) -> Array:
    """int32 keys with the order of x's values, the low bits cleared for a slot id, zeros mapped to _EMPTY_KEY.

    Comparing one int32 max per value (with the slot in the low bits) is what makes DWTA cheap here: a float
    argmax needs a compare and two selects per value. The cleared low bits mean values agreeing in their top
    32 - ceil(log2(bin_size)) bits (relative difference < 2**-20 for bin 8) count as a tie, won by the lower
    slot: a fixed, deterministic part of the hash function, shared by queries and tables.
    """
    slot_mask = (1 << (bin_size - 1).bit_length()) - 1
    v = x.astype(jnp.float32)
    bits = lax.bitcast_convert_type(v, jnp.int32)
    ordered = jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)  # negative floats: reverse magnitude order
    return jnp.where(v != 0, ordered & jnp.int32(~slot_mask), jnp.int32(_EMPTY_KEY))


def _dwta_codes(fn: DWTA, x: Array) -> Array:
    """int32 [L, n]: sum over k of slot(l, k) * bin_size**k, slots densified."""
    num_tables_, num_hashes, bin_size = fn.bins.shape
    keys = _dwta_keys(x, bin_size).T  # [dim, n]: a bin's dims are then whole contiguous rows
    flat = _dwta_slots(keys, fn.bins).reshape(num_tables_ * num_hashes, -1)
    # Weight rows are dense, so a table build rarely has an empty bin: skip the probing then.
    flat = lax.cond(jnp.any(flat < 0), _densify, lambda s, _: s, flat, fn.probes)
    slots = jnp.maximum(flat, 0).astype(jnp.int32).reshape(num_tables_, num_hashes, -1)
    radix = bin_size ** jnp.arange(num_hashes, dtype=jnp.int32)
    return jnp.sum(slots * radix[:, None], axis=1)


def _dwta_slots(keys: Array, bins: Array) -> Array:
    """int8 [L, K, n]: the position (0..bin_size-1) of the largest non-zero value in each bin, -1 if none.

    A scan over tables whose body reads each bin's dims as whole rows of `keys` [dim, n] (dynamic slices):
    one pass of int32 maxes per table, contiguous and vectorised. Gathering [n, L, K, bin_size] values
    instead is a 19x larger intermediate than the input and XLA:CPU's slow element-wise gather path.
    """
    _, num_hashes, bin_size = bins.shape
    slot_mask = (1 << (bin_size - 1).bit_length()) - 1

    def table(carry: None, table_bins: Array) -> tuple[None, Array]:
        slots = []
        for k in range(num_hashes):
            # Slot j is or-ed in as bin_size - 1 - j so that on equal keys the lower slot wins.
            best = functools.reduce(jnp.maximum, [
                lax.dynamic_index_in_dim(keys, table_bins[k, j], keepdims=False) | (bin_size - 1 - j)
                for j in range(bin_size)])
            empty = (best & ~slot_mask) == _EMPTY_KEY
            slots.append(jnp.where(empty, -1, bin_size - 1 - (best & slot_mask)).astype(jnp.int8))
        return carry, jnp.stack(slots)

    return lax.scan(table, None, bins)[1]


def _densify(slots: Array, probes: Array) -> Array:
    """int8 [M, n]: every empty bin (-1) takes the slot of the first non-empty bin in its probe order.

    One round per probe position, each a row gather from the original slots, until no vector that has a
    non-empty bin has an empty one left (typically a few rounds for ReLU activations). Vectors with no
    non-empty bin at all keep -1 everywhere (the caller reads that as slot 0).
    """
    if probes.shape[1] == 0:
        return slots
    fillable = jnp.any(slots >= 0, axis=0)

    def unfinished(state: tuple[Array, Array]) -> Array:
        t, current = state
        return (t < probes.shape[1]) & jnp.any((current < 0) & fillable)

    def probe(state: tuple[Array, Array]) -> tuple[Array, Array]:
        t, current = state
        borrowed = jnp.take(slots, probes[:, t], axis=0)
        return t + 1, jnp.where(current < 0, borrowed, current)

    return lax.while_loop(unfinished, probe, (jnp.int32(0), slots))[1]


# -------------------------------------------------------------------------------------------------------- tables


@functools.partial(jax.jit, static_argnames="host_sort")
def build_tables(fn: HashFn, weights: Array, key: Array, *, host_sort: bool | None = None) -> Tables:
    """Hashes every weight row (one per output neuron) and groups the ids by bucket in each table.

    weights: float [N, dim]; key: a PRNG key for the random order inside buckets.
    host_sort: group with NumPy through a callback instead of XLA (same result, bit for bit: the sort keys
        are unique). Default: on the CPU backend, where XLA's sort is most of the build's time (Amazon-670K's
        DWTA tables on this project's 2-core CPU: 3.8 s with XLA's sort, 1.2 s with NumPy's AVX-512 sort).
    Returns Tables(ids int32 [L, N], starts int32 [L, num_buckets + 1]).
    """
    if host_sort is None:
        host_sort = jax.default_backend() == "cpu"
    bucket_codes = table_codes(fn, weights)  # [L, N]
    buckets = num_buckets(fn)
    noise, id_bits, rand_bits = _sort_key_parts(bucket_codes, buckets, key)
    if host_sort:
        group = functools.partial(_host_group_by_bucket, buckets=buckets, id_bits=id_bits, rand_bits=rand_bits)
        shapes = Tables(ids=jax.ShapeDtypeStruct(bucket_codes.shape, jnp.int32),
                        starts=jax.ShapeDtypeStruct((bucket_codes.shape[0], buckets + 1), jnp.int32))
        return Tables(*jax.pure_callback(group, shapes, bucket_codes, noise, vmap_method="expand_dims"))
    with jax.enable_x64(True):  # JAX has uint64 only with x64 on; only these few ops need it
        u64 = jnp.uint64
        packed = ((bucket_codes.astype(u64) << u64(rand_bits + id_bits))
                  | (noise.astype(u64) << u64(id_bits))
                  | lax.broadcasted_iota(u64, bucket_codes.shape, 1))
        ids = (jnp.sort(packed, axis=1) & u64((1 << id_bits) - 1)).astype(jnp.int32)
    table = jnp.arange(bucket_codes.shape[0])[:, None]
    sizes = jnp.zeros((bucket_codes.shape[0], buckets), jnp.int32).at[table, bucket_codes].add(1)
    return Tables(ids=ids, starts=jnp.pad(jnp.cumsum(sizes, axis=1), ((0, 0), (1, 0))))


def _sort_key_parts(bucket_codes: Array, buckets: int, key: Array) -> tuple[Array, int, int]:
    """How ids are grouped: one sort per table of unique uint64 keys (bucket | noise | id).

    Returns the noise (uint32 [L, N], `rand_bits` random bits each, the in-bucket order), id_bits, rand_bits.
    Sorting one primitive array takes XLA:CPU's std::sort path; an argsort (a payload operand) or a second
    sort key instead calls a compiled comparator per comparison, 4-5x slower; the id is read back from the
    key's low bits. Bucket starts come from a histogram (or bincount), not from a searchsorted of 2**18 + 1
    boundaries, which costs more than the histogram's scatter-add on CPU.
    """
    n = bucket_codes.shape[1]
    if n >= 2**31:
        raise ValueError(f"{n} neurons do not fit int32 ids")
    id_bits = max(1, (n - 1).bit_length())
    code_bits = max(1, (buckets - 1).bit_length())
    rand_bits = min(32, 64 - id_bits - code_bits)  # >= 3, as code_bits <= 30 and id_bits <= 31
    return _keyed_mix(key, bucket_codes.shape) >> (32 - rand_bits), id_bits, rand_bits


def _keyed_mix(key: Array, shape: tuple[int, int]) -> Array:
    """uint32 [rows, n]: per row, a random bijection of the column indices.

    murmur3's 32-bit finalizer of (index xor a random seed per row): fully avalanching, and 10x cheaper on
    CPU than L * N threefry bits (1.1 s at Amazon-670K's size, twice NumPy's whole sort).
    """
    h = lax.broadcasted_iota(jnp.uint32, shape, 1) ^ jax.random.bits(key, (shape[0], 1), jnp.uint32)
    h ^= h >> 16
    h *= jnp.uint32(0x85EBCA6B)
    h ^= h >> 13
    h *= jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _host_group_by_bucket(
    bucket_codes: Array, noise: Array, *, buckets: int, id_bits: int, rand_bits: int
) -> tuple[np.ndarray, np.ndarray]:
    """build_tables' grouping in NumPy (ids, starts), the same keys as its XLA path, so the same result.

    One table at a time and in place: a table's keys (5 MB at Amazon-670K's size) stay in cache and no
    [L, N] uint64 temporaries are allocated (fresh pages cost more here than the sort's memory traffic).
    Tables are spread over one thread per core (NumPy's sort and element-wise passes release the GIL): the
    callback otherwise runs on one core while XLA's threads wait for it.
    """
    bucket_codes, noise = np.asarray(bucket_codes), np.asarray(noise)  # callbacks get jax.Arrays
    u64 = np.uint64
    column = np.arange(bucket_codes.shape[-1], dtype=u64)
    ids = np.empty(bucket_codes.shape, np.int32)
    starts = np.zeros((*bucket_codes.shape[:-1], buckets + 1), np.int32)

    def group(row: tuple[int, ...]) -> None:
        packed = bucket_codes[row].astype(u64)
        packed <<= u64(rand_bits)
        packed |= noise[row]
        packed <<= u64(id_bits)
        packed |= column
        packed.sort()
        packed &= u64((1 << id_bits) - 1)
        ids[row] = packed
        # An int64 cumsum then a copy: 4x faster than a cumsum that casts as it writes into int32.
        starts[row][1:] = np.cumsum(np.bincount(bucket_codes[row], minlength=buckets))

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1  # numerics.threads holds
    with concurrent.futures.ThreadPoolExecutor(cores) as pool:
        list(pool.map(group, np.ndindex(bucket_codes.shape[:-1])))  # tables (and any vmapped axes)
    return ids, starts


@functools.partial(jax.jit, static_argnames="bucket_capacity")
def query(tables: Tables, fn: HashFn, x: Array, bucket_capacity: int) -> Array:
    """Neurons in the buckets x falls in: x float [B, dim] -> int32 [B, L, bucket_capacity].

    Per table, the first `bucket_capacity` ids of x's bucket (a uniform sample of it, the in-bucket order
    being random), padded with N (one past the last neuron id) when the bucket is smaller.
    """
    return lookup(tables, codes(fn, x), bucket_capacity)


def lookup(tables: Tables, bucket_codes: Array, bucket_capacity: int) -> Array:
    """`query` for precomputed codes: int32 [B, L] bucket ids -> int32 [B, L, bucket_capacity] neuron ids."""
    _check_positive(bucket_capacity=bucket_capacity)
    num_tables_, n = tables.ids.shape
    if bucket_codes.ndim != 2 or bucket_codes.shape[1] != num_tables_:
        raise ValueError(f"expected bucket codes of shape [B, {num_tables_}], got shape {bucket_codes.shape}")
    table = jnp.arange(num_tables_)
    first = tables.starts[table, bucket_codes]  # [B, L]
    end = tables.starts[table, bucket_codes + 1]
    position = first[..., None] + jnp.arange(bucket_capacity, dtype=jnp.int32)  # [B, L, C]
    found = tables.ids[table[:, None], jnp.minimum(position, n - 1)]
    return jnp.where(position < end[..., None], found, n)


# ------------------------------------------------------------------------------------------------------ schedule


@dataclasses.dataclass(frozen=True)
class RebuildSchedule:
    """When to rebuild the tables and when to redraw the hash functions (host side, a pure function of step).

    SLIDE re-inserts the neurons into its tables periodically, the period growing exponentially as training
    settles, and draws new hash functions on a separate, longer period. Here the i-th period (i = 0, 1, ...)
    is `period * exp(decay * i)` steps, and event n (n >= 1) falls on the nearest integer step to the sum of
    the first n periods, so rounding never accumulates. `step` counts completed training steps: with
    rebuild_period 50 and no decay, tables are rebuilt after steps 50, 100, 150, ...

    rebuild_period, rebuild_decay: table rebuilds (SLIDE's Amazon-670K config: every 50 batches).
    redraw_period, redraw_decay: new hash functions, which need new tables too (SLIDE: every 1,000 batches);
        redraw_period None never redraws.
    """

    rebuild_period: float
    rebuild_decay: float = 0.0
    redraw_period: float | None = None
    redraw_decay: float = 0.0

    def __post_init__(self) -> None:
        _check_period("rebuild", self.rebuild_period, self.rebuild_decay)
        if self.redraw_period is not None:
            _check_period("redraw", self.redraw_period, self.redraw_decay)

    def due(self, step: int) -> bool:
        """True when the tables must be rebuilt after `step` (a rebuild or a redraw step)."""
        return _is_event(self.rebuild_period, self.rebuild_decay, step) or self.redraw_due(step)

    def redraw_due(self, step: int) -> bool:
        """True when new hash functions must be drawn (and tables built for them) after `step`."""
        return self.redraw_period is not None and _is_event(self.redraw_period, self.redraw_decay, step)

    def due_steps(self, stop: int) -> list[int]:
        """The steps in [1, stop) at which `due` is True, in order."""
        steps = set(_events_before(self.rebuild_period, self.rebuild_decay, stop))
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
