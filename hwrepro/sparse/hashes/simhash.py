"""SimHash: signed random projections (Charikar 2002), `num_hashes` sign bits per table.

Bit k of table l is sign(<x, r_lk>). Dense: Gaussian r, so P(bit collides) = 1 - angle(x, y) / pi exactly.
Sparse (density < 1, SLIDE's "ratio 3"): r has exactly round(density * dim) non-zero entries, each +-1.
Either way the codes are one matmul, accumulated in f32: of f32 inputs (dtype "fp32"), or of inputs and r
rounded to bf16 (dtype "bf16"; 1.3-2.2x faster hashing on an AVX512-BF16 CPU, but 1.3-1.7x slower on an AVX2
CPU, which has no bf16 products: docs/slide_costs.md): a projection within bf16 rounding of zero may then take
the other sign, as if x had moved by ~0.4%. dtype "auto" (the configs') is bf16 where products of bf16 are
native (an accelerator, or a CPU with AVX512-BF16 or AMX), else fp32.

Two families: "simhash", L * K independent hyperplanes; "simhash_pairs", L tables made of pairs of m
half-codes of K / 2 bits (Andoni & Indyk's tensoring, m (m - 1) / 2 >= L): m K / 2 hyperplanes, 64 instead
of 400 for K = 16, L = 25, so hashing 670,091 rows for a table rebuild costs a sixth. Each table still
collides with probability p^K (p = 1 - angle / pi), but tables sharing a half are correlated: both collide
with probability p^(3K/2), not p^(2K); only tables with no half in common are independent.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from hwrepro.sparse.hashes import FAMILIES, MAX_BUCKET_BITS, OptionError, by_row_blocks, check_positive


DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16}  # option dtype: what the projection's inputs are rounded to
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs with bf16 dot products


def resolve_dtype(dtype: str) -> str:
    """dtype, with "auto" made "bf16" where the default backend multiplies bf16 natively (an accelerator, or a
    CPU listing one of NATIVE_BF16_CPU_FLAGS, whatever numerics.cpu_max_isa caps), else "fp32". The planes
    keep the dtype they were drawn in: a run resumed on another CPU keeps its own (checkpoints.restore)."""
    if dtype != "auto":
        return dtype
    if jax.default_backend() != "cpu":
        return "bf16"
    from hwrepro.harness import records

    return "bf16" if set(records.cpu_info()["isa_flags"]) & set(NATIVE_BF16_CPU_FLAGS) else "fp32"


@functools.partial(jax.jit, static_argnames=("dim", "num_hashes", "num_tables", "density", "dtype"))
def _init(key: jax.Array, dim: int, num_hashes: int, num_tables: int, density: float = 1.0,
          dtype: str = "fp32") -> "SimHash":
    SimHash.check(dim, num_hashes, num_tables, density, dtype)
    shape = (dim, num_tables, num_hashes)
    k_values, k_dims = jax.random.split(key)
    if density == 1.0:
        return SimHash(jax.random.normal(k_values, shape, jnp.float32).astype(DTYPES[dtype]))
    nonzero = max(1, round(density * dim))
    # A dim is kept when its uniform rank within its column is below `nonzero`: exactly `nonzero` per column.
    rank = jnp.argsort(jnp.argsort(jax.random.uniform(k_dims, shape), axis=0), axis=0)
    signs = jax.random.rademacher(k_values, shape, jnp.float32)
    return SimHash(jnp.where(rank < nonzero, signs, 0.0).astype(DTYPES[dtype]))


@FAMILIES.register("simhash")
class SimHash(NamedTuple):
    """planes: float32 or bfloat16 (option dtype) [dim, num_tables, num_hashes]; Gaussian entries (density 1)
    or exactly round(density * dim) entries of +-1 per (table, bit) column and zeros elsewhere (density < 1).
    Inputs are rounded to the planes' dtype for the projection."""

    planes: jax.Array

    @staticmethod
    def check(dim: int, num_hashes: int, num_tables: int, density: float = 1.0, dtype: str = "fp32") -> None:
        """OptionError for sizes or options SimHash cannot take (K <= 30 bits: int32 bucket ids)."""
        check_positive(dim=dim, num_hashes=num_hashes, num_tables=num_tables)
        if num_hashes > MAX_BUCKET_BITS:
            raise OptionError("num_hashes", num_hashes, f"gives more than 2**{MAX_BUCKET_BITS} buckets per table")
        if not 0.0 < density <= 1.0:
            raise OptionError("density", density, "must be in (0, 1]")
        if dtype not in (*DTYPES, "auto"):
            raise OptionError("dtype", dtype, f"must be one of {', '.join(DTYPES)}, auto")

    @staticmethod
    def init(key: jax.Array, dim: int, num_hashes: int, num_tables: int, density: float = 1.0,
             dtype: str = "fp32") -> SimHash:
        """Draws `num_tables` x `num_hashes` hyperplanes for `dim`-dimensional inputs (density, dtype: see
        module)."""
        return _init(key, dim, num_hashes, num_tables, density, resolve_dtype(dtype))

    @property
    def num_tables(self) -> int:
        return self.planes.shape[1]

    @property
    def num_buckets(self) -> int:
        return 2 ** self.planes.shape[2]

    def table_codes(self, x: jax.Array) -> jax.Array:
        """int32 [L, n]: bit k of table l is <x, planes[:, l, k]> > 0.

        Inputs are cast to the planes' dtype (from bf16 to f32 exactly) so that vectors of different dtypes,
        e.g. f32 weights and bf16 activations, are hashed by the same hyperplanes; HIGHEST precision keeps
        TF32 / bf16 passes out of f32 planes' products. (A projection within float rounding of 0 could still
        flip its bit between two matmul shapes.)
        """
        _check_dim(self.planes, x)
        _, tables, bits = self.planes.shape
        # Rows per block: their f32 projections [rows, L * K] (2 MB) stay in a core's L2 cache.
        return by_row_blocks(self._codes, x, tables, (1 << 21) // (4 * tables * bits))

    def hash_changes(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """For multi-probe queries: flipping bit k changes the bucket id by +-2**k (deltas int32 [L, n, K]); its
        margin is x's distance to hyperplane k, |<x, r>| / |r| (margins float32 [L, n, K]), the least certain
        bits first (Lv et al. 2007, multi-probe LSH)."""
        proj = self._project("nd,dlk->lnk", x)
        bit = jnp.left_shift(1, jnp.arange(self.planes.shape[2], dtype=jnp.int32))
        planes = self.planes.astype(jnp.float32)
        norms = jnp.sqrt(jnp.sum(planes * planes, axis=0))  # [L, K]
        return jnp.where(proj > 0, -bit, bit), jnp.abs(proj) / jnp.maximum(norms[:, None, :], 1e-30)

    def _codes(self, x: jax.Array) -> jax.Array:
        bit_values = jnp.left_shift(1, jnp.arange(self.planes.shape[2], dtype=jnp.int32))
        proj = self._project("nd,dlk->nlk", x)
        return jnp.sum(jnp.where(proj > 0, bit_values, 0), axis=-1, dtype=jnp.int32).T

    def _project(self, spec: str, x: jax.Array) -> jax.Array:
        """float32 projections of x on the planes, both in the planes' dtype, accumulated in f32."""
        return jnp.einsum(spec, x.astype(self.planes.dtype), self.planes, precision=lax.Precision.HIGHEST,
                          preferred_element_type=jnp.float32)


def _check_dim(planes: jax.Array, x: jax.Array) -> None:
    """ValueError when inputs x [n, dim] do not have the planes' dim (planes [dim, ...])."""
    if x.shape[1] != planes.shape[0]:
        raise ValueError(f"inputs have dim {x.shape[1]} but the SimHash was drawn for dim {planes.shape[0]}")


@functools.partial(jax.jit, static_argnames=("dim", "num_hashes", "num_tables", "density", "dtype"))
def _init_pairs(key: jax.Array, dim: int, num_hashes: int, num_tables: int, density: float = 1.0,
                dtype: str = "fp32") -> "PairedSimHash":
    PairedSimHash.check(dim, num_hashes, num_tables, density, dtype)
    halves = math.ceil((1 + math.sqrt(1 + 8 * num_tables)) / 2)  # the least m with m (m - 1) / 2 >= L
    k_planes, k_pairs = jax.random.split(key)
    first, second = jnp.triu_indices(halves, 1)
    # A random L of the m (m - 1) / 2 pairs: each half then serves about 2 L / m tables.
    pick = jax.random.permutation(k_pairs, first.size)[:num_tables]
    pairs = jnp.stack([first[pick], second[pick]], axis=1).astype(jnp.int32)
    return PairedSimHash(_init(k_planes, dim, num_hashes // 2, halves, density, dtype).planes, pairs)


@FAMILIES.register("simhash_pairs")
class PairedSimHash(NamedTuple):
    """SimHash tables from pairs of half-codes (see the module docstring).

    planes: float32 or bfloat16 [dim, m, K / 2]: m half-codes' hyperplanes, drawn as SimHash's (options:
        density, dtype).
    pairs: int32 [L, 2]: table l's bucket id is half-code pairs[l, 0] in the high K / 2 bits, pairs[l, 1] in
        the low ones (distinct pairs, so no two tables are the same).
    """

    planes: jax.Array
    pairs: jax.Array

    @staticmethod
    def check(dim: int, num_hashes: int, num_tables: int, density: float = 1.0, dtype: str = "fp32") -> None:
        """SimHash's checks, and K even: a table's code is two half-codes of K / 2 bits."""
        SimHash.check(dim, num_hashes, num_tables, density, dtype)
        if num_hashes % 2:
            raise OptionError("num_hashes", num_hashes, "must be even: a table's code is two half-codes of K / 2 bits")

    @staticmethod
    def init(key: jax.Array, dim: int, num_hashes: int, num_tables: int, density: float = 1.0,
             dtype: str = "fp32") -> PairedSimHash:
        """Draws m = the least with m (m - 1) / 2 >= num_tables half-codes of num_hashes / 2 bits (K even)."""
        return _init_pairs(key, dim, num_hashes, num_tables, density, resolve_dtype(dtype))

    @property
    def num_tables(self) -> int:
        return self.pairs.shape[0]

    @property
    def num_buckets(self) -> int:
        return 4 ** self.planes.shape[2]

    def table_codes(self, x: jax.Array) -> jax.Array:
        """int32 [L, n]: (half-code pairs[l, 0] << K / 2) | half-code pairs[l, 1], each as SimHash's codes."""
        _check_dim(self.planes, x)
        halves, shift = SimHash(self.planes), self.planes.shape[2]

        def codes(rows: jax.Array) -> jax.Array:
            half = halves._codes(rows)  # [m, b]
            return (half[self.pairs[:, 0]] << shift) | half[self.pairs[:, 1]]

        _, m, bits = self.planes.shape
        return by_row_blocks(codes, x, self.num_tables, (1 << 21) // (4 * m * bits))

    def hash_changes(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """SimHash's, per table: a bit of the low half as it is, a bit of the high half shifted by K / 2
        (deltas int32 [L, n, K], margins float32 [L, n, K])."""
        deltas, margins = SimHash(self.planes).hash_changes(x)  # [m, n, K / 2]
        high, low = self.pairs[:, 0], self.pairs[:, 1]
        shift = self.planes.shape[2]
        return (jnp.concatenate([deltas[low], deltas[high] << shift], axis=2),
                jnp.concatenate([margins[low], margins[high]], axis=2))
