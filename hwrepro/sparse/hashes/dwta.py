"""DWTA, densified winner-take-all hashing (Chen & Shrivastava 2018; SLIDE's choice for Amazon-670K).

Hash k of table l is the position of the largest of `bin_size` randomly chosen input dims (for bin size 8,
values within a relative 2**-20 of each other count as equal, the lower position winning); zeros do not take
part, and a bin whose dims are all zero (common after ReLU) takes the value of the first non-empty bin in its
own fixed random probe order (densification, Shrivastava 2017), so identical vectors always collide and
sparse vectors still get a full code. A table's bucket id is the K positions read as a base-`bin_size` number.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from hwrepro.sparse.hashes import FAMILIES, MAX_BUCKET_BITS, OptionError, by_row_blocks, check_positive

Array = jax.Array

# Values are compared as order-preserving int32 keys (see _dwta_keys); a zero input maps to this key, which is
# below every key of a non-zero value even after the slot bits are or-ed into its low bits.
_EMPTY_KEY = -(2**31)


@functools.partial(jax.jit, static_argnames=("dim", "num_hashes", "num_tables", "bin_size", "num_probes"))
def _init(
    key: Array, dim: int, num_hashes: int, num_tables: int, bin_size: int = 8, num_probes: int | None = None
) -> "DWTA":
    DWTA.check(dim, num_hashes, num_tables, bin_size, num_probes)
    num_bins = num_tables * num_hashes
    num_probes = num_bins - 1 if num_probes is None else num_probes
    k_bins, k_probes = jax.random.split(key)
    # The first bin_size entries of an independent random permutation of the dims, for every bin.
    order = jnp.argsort(jax.random.uniform(k_bins, (num_bins, dim)), axis=1)
    bins = order[:, :bin_size].reshape(num_tables, num_hashes, bin_size).astype(jnp.int32)
    # Each bin's probe order: a random permutation of the other bins (its own bin is sorted last, dropped).
    noise = jax.random.uniform(k_probes, (num_bins, num_bins)) + 2.0 * jnp.eye(num_bins)
    probes = jnp.argsort(noise, axis=1)[:, :num_probes].astype(jnp.int32)
    return DWTA(bins, probes)


@FAMILIES.register("dwta")
class DWTA(NamedTuple):
    """`num_hashes` hashes per table of log2(bin_size) bits each.

    bins: int32 [num_tables, num_hashes, bin_size]: the input dims each hash compares (distinct within a bin).
    probes: int32 [num_tables * num_hashes, num_probes]: for each bin (flat index l * num_hashes + k), the other
        bins, in a fixed random order, whose value an empty bin takes (the first non-empty one).
    The input dim is in no shape here, so `table_codes` cannot check it (an index past it would be clamped).
    """

    bins: Array
    probes: Array

    @staticmethod
    def check(dim: int, num_hashes: int, num_tables: int, bin_size: int = 8, num_probes: int | None = None) -> None:
        """OptionError for sizes or options DWTA cannot take (see `init`; at most 2**30 buckets a table)."""
        check_positive(dim=dim, num_hashes=num_hashes, num_tables=num_tables)
        if not 2 <= bin_size <= min(dim, 128):
            raise OptionError("bin_size", bin_size, f"must be between 2 and min(dim={dim}, 128)")
        if bin_size**num_hashes > 2**MAX_BUCKET_BITS:
            raise OptionError("num_hashes", num_hashes, f"gives bin_size**num_hashes = {bin_size}**{num_hashes} "
                              f"buckets, more than 2**{MAX_BUCKET_BITS}")
        if num_probes is not None and not 0 <= num_probes <= num_tables * num_hashes - 1:
            raise OptionError("num_probes", num_probes,
                              f"must be between 0 and {num_tables * num_hashes - 1} (the other bins)")

    @staticmethod
    def init(key: Array, dim: int, num_hashes: int, num_tables: int, bin_size: int = 8,
             num_probes: int | None = None) -> DWTA:
        """Draws `num_tables` x `num_hashes` winner-take-all bins of `bin_size` distinct dims each.

        num_probes: how many other bins an empty bin may borrow from, in its random probe order; default all of
        them (num_tables * num_hashes - 1), so only a vector that is zero in every bin keeps empty bins (code 0).
        Probing stops as soon as every bin is filled, so a long probe list costs nothing for dense vectors.
        """
        return _init(key, dim, num_hashes, num_tables, bin_size, num_probes)

    @property
    def num_tables(self) -> int:
        return self.bins.shape[0]

    @property
    def num_buckets(self) -> int:
        _, num_hashes, bin_size = self.bins.shape
        return bin_size**num_hashes

    def hash_changes(self, x: Array) -> tuple[Array, Array]:
        """For multi-probe queries: hash k taking its bin's runner-up slot changes the bucket id by
        (runner-up - winner) * bin_size**k (deltas int32 [L, n, K]); its margin is the winner's value minus
        the runner-up's (margins float32 [L, n, K]; inf for a bin with fewer than two non-zero values or whose
        slot was borrowed by densification). For query batches: it gathers [n, L, K, bin_size] values."""
        return _hash_changes(self, x)

    def table_codes(self, x: Array) -> Array:
        """int32 [L, n]: the bucket ids of x float [n, dim] in every table."""
        # Rows per block: their int32 keys [dim, rows] (1 MB) stay in L2 while every table's bins read them.
        return by_row_blocks(functools.partial(_dwta_codes, self), x, self.num_tables, (1 << 20) // (4 * x.shape[1]))


def _hash_changes(fn: "DWTA", x: Array) -> tuple[Array, Array]:
    """DWTA.hash_changes: the runner-up of each bin and how far behind the winner it is."""
    num_tables_, num_hashes, bin_size = fn.bins.shape
    codes = _dwta_codes(fn, x)  # [L, n]: the exact bucket ids (the winners, densified)
    radix = bin_size ** jnp.arange(num_hashes, dtype=jnp.int32)  # [K]
    digit = (codes[:, :, None] // radix) % bin_size  # [L, n, K]: each hash's slot in the bucket id
    values = jnp.moveaxis(x.astype(jnp.float32)[:, fn.bins], 0, 2)  # [L, K, n, bin]
    values = jnp.moveaxis(jnp.where(values != 0, values, -jnp.inf), 1, 2)  # [L, n, K, bin]; zeros take no part
    top2, slots = lax.top_k(values, 2)
    margin = jnp.where(jnp.isfinite(top2[..., 1]), top2[..., 0] - top2[..., 1], jnp.inf)
    # Only a bin that decided its own slot (not densified) and has a finite winner margin can be probed.
    own = slots[..., 0] == digit
    return (slots[..., 1] - digit) * radix, jnp.where(own, margin, jnp.inf)


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


def _dwta_codes(fn: "DWTA", x: Array) -> Array:
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
