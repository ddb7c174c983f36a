"""LSH hash families, found by name (`config.lsh.kind`): one module each, registered in `FAMILIES`.

A hash family is a class whose instances are pytrees (a NamedTuple of arrays, so they pass through jit, vmap
and donation) with this protocol:

    @FAMILIES.register("name")
    class MyHash(NamedTuple):
        params: jax.Array                                   # the random draws, any arrays

        @staticmethod
        def init(key, dim, num_hashes, num_tables, **options) -> "MyHash":  # options: config.lsh.<name>
        def table_codes(self, x) -> jax.Array:          # x float [n, dim] -> bucket ids int32 [L, n]
        @property
        def num_tables(self) -> int:                     # L, from a static shape
        @property
        def num_buckets(self) -> int:                    # buckets per table, from static shapes
        # Optional, for multi-probe queries (lsh.probe_codes): per table and hash, how the bucket id would
        # change if that hash alone took its next most likely value, and how close it came to doing so.
        def hash_changes(self, x) -> tuple[jax.Array, jax.Array]:  # deltas int32 [L, n, K], margins f32 [L, n, K]
        # Optional, JAX-free: OptionError(name, value, problem) for sizes or options the family cannot take.
        @staticmethod
        def check(dim, num_hashes, num_tables, **options) -> None:

`check` lets a config's bad sizes or options be refused, naming the config field, before any data is read
(hwrepro.experiments.slide.validate); the built-ins' `init` calls it too. `hwrepro.sparse.lsh` builds tables
and answers queries for any family; `hwrepro.sparse.hashes.simhash` and `.dwta` are the built-ins. The
helpers below are shared by families.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from hwrepro.registry import Registry

__all__ = ["FAMILIES", "MAX_BUCKET_BITS", "OptionError", "by_row_blocks", "check_positive"]

FAMILIES: Registry = Registry("hash family", __name__)

# Largest bucket count per table accepted: tables hold L * (num_buckets + 1) int32 bucket starts.
MAX_BUCKET_BITS = 30


class OptionError(ValueError):
    """A size or option a hash family cannot take: "name=value problem", with `name` (the parameter) and
    `problem` kept for callers that name the config field instead."""

    def __init__(self, name: str, value: object, problem: str):
        super().__init__(f"{name}={value!r} {problem}")
        self.name, self.value, self.problem = name, value, problem


def check_positive(**sizes: int) -> None:
    """OptionError naming the first size that is not a positive integer."""
    for name, value in sizes.items():
        if int(value) != value or value < 1:
            raise OptionError(name, value, "must be a positive integer")


def by_row_blocks(hash_rows: Callable[[jax.Array], jax.Array], x: jax.Array, num_tables: int,
                  block: int) -> jax.Array:
    """int32 [L, n]: hash_rows (rows [b, dim] -> codes [L, b]) over blocks of `block` rows (at least 64).

    Blocks keep a family's temporaries in cache at table-build sizes (670,091 rows). The last block is shifted
    back to end at row n, re-hashing a few rows to the same codes, so every block has one static shape and no
    padded copy of x is made.
    """
    n = x.shape[0]
    if n == 0:
        return jnp.zeros((num_tables, 0), jnp.int32)
    block = min(n, max(64, block))

    def hash_block(i: jax.Array, out: jax.Array) -> jax.Array:
        start = jnp.minimum(i * block, n - block)
        return lax.dynamic_update_slice_in_dim(out, hash_rows(lax.dynamic_slice_in_dim(x, start, block)), start, 1)

    return lax.fori_loop(0, -(-n // block), hash_block, jnp.zeros((num_tables, n), jnp.int32))
