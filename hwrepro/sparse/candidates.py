"""Which output neurons a sparse step computes: candidate sets (batch-shared or per example), their targets,
and the unique-rows helper the step uses for the input layer too.

Ids are label ids in [0, num_labels); num_labels is the padding id everywhere. Pure functions of arrays and
explicit PRNG keys; nothing here knows of parameters or optimizers.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from hwrepro.models import sparse_layers as model

SAMPLERS = ("uniform", "log_uniform")
CANDIDATE_MODES = ("shared", "per_example")

def sample_labels(key: jax.Array, shape: tuple[int, ...], num_labels: int | jax.Array, sampler: str = "uniform",
                  offset: int | jax.Array = 0) -> jax.Array:
    """Random label ids int32 [shape] in [0, num_labels).

    "uniform", or "log_uniform" (Zipfian by id: P(id) = log((id + 2) / (id + 1)) / log(num_labels + 1), the
    sampler of TF's sampled softmax), which assumes ids are ranks, most frequent label first.

    offset: the global id of id 0, for a model shard holding labels [offset, offset + num_labels): the draws
    follow the global Zipf law restricted to those labels (P(id) proportional to
    log((offset + id + 2) / (offset + id + 1))), so the shards' fills together rank labels as one device's.
    num_labels and offset may be traced (a shard's own values).
    """
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler={sampler!r} is not one of {', '.join(map(repr, SAMPLERS))}")
    if sampler == "uniform":
        return jax.random.randint(key, shape, 0, num_labels, jnp.int32)
    # Inverse CDF: global id g in [a, a + n) with P(g) ~ log((g + 2) / (g + 1)) is floor((a + 1) r^u) - 1,
    # r = (a + n + 1) / (a + 1); with a = 0, floor((n + 1)^u) - 1.
    u = jax.random.uniform(key, shape)
    low, high = jnp.log(offset + 1.0), jnp.log(offset + num_labels + 1.0)
    ids = jnp.floor(jnp.exp(low + u * (high - low))) - 1.0 - offset
    return jnp.clip(ids, 0, num_labels - 1).astype(jnp.int32)


def uniform_by_id(key: jax.Array, ids: jax.Array) -> jax.Array:
    """float32 in [0, 1), shaped like ids: an integer hash (lowbias32) of each id mixed with one random word.

    The same id gets the same number wherever it appears in one step (one word from `key`). Random enough to
    break ties, and far cheaper than threefry draws on a CPU.
    """
    x = ids.astype(jnp.uint32) ^ jax.random.bits(key, (), jnp.uint32)
    for shift, multiplier in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        x = (x ^ (x >> shift)) * jnp.uint32(multiplier)
    x = x ^ (x >> 16)
    return (x >> 8).astype(jnp.float32) * (1.0 / (1 << 24))


def batch_shared_candidates(
    labels: jax.Array,
    retrieved: jax.Array | None,
    key: jax.Array,
    num_candidates: int,
    num_labels: int,
    min_count: int = 2,
    sampler: str = "uniform",
    *,
    num_valid: int | jax.Array | None = None,
    offset: int | jax.Array = 0,
) -> tuple[jax.Array, jax.Array]:
    """One candidate set for the whole batch, of fixed size M.

    Priority: the batch's true labels first, then retrieved ids seen at least `min_count` times across the
    batch and tables (SLIDE's "sampling" mode, threshold 2), most often retrieved first (ties at the cut
    broken at random), then M random ids (uniform or log-uniform) to fill up, in the order they were drawn.
    The draws are independent, so the first ones that fit are as random a subset as the draws themselves.

    The labels and retrieved ids that qualify (each at its first listing) usually fit: ~2,200 of M = 8,192 in
    the main job. Then no ranking is needed: they and the first draws that fit are compacted into M slots and
    sorted (cheaper than a top_k, which XLA:CPU runs on one thread). When more qualify than fit, one top_k over
    the listed ids (labels, retrieved, drawn) ranks them; both ways select the same ids (tested against a top_k
    over every label id).

    Args:
      labels: int32 [B, Lmax], padded with num_labels.
      retrieved: int32 [...] ids from the LSH tables, padded with num_labels; None for sampled softmax.
      key: PRNG key for the random fill and the random order of ties.
      num_candidates: M. If the batch has more than M distinct labels, the first M listed (row by row) are
        kept.
      min_count: >= 1.
      num_valid, offset: for a model shard whose ids [num_valid, num_labels) are padding rows (the last
        shard's) and whose id 0 is label `offset`: ids at or above num_valid are never chosen (neither
        retrieved nor drawn), and the fill draws (`sample_labels`) rank ids globally. Default: every id is a
        label, offset 0.

    Returns:
      ids int32 [M] (distinct, ascending, num_labels at the unfilled slots, which come last) and mask bool
      [M] (False at those slots; a slot stays unfilled only when too few draws are new: repeats, or ids
      already chosen). Ascending ids make the step's row gathers and scatters walk W and its moments in
      memory order.
    """
    if min_count < 1:
        raise ValueError(f"min_count={min_count} must be >= 1")
    if num_candidates > num_labels:
        raise ValueError(f"num_candidates={num_candidates} exceeds num_labels={num_labels}")
    k_fill, k_tie = jax.random.split(key)
    num_valid = num_labels if num_valid is None else num_valid
    fill = sample_labels(k_fill, (num_candidates,), num_valid, sampler, offset)
    listed = labels.ravel() if retrieved is None else jnp.concatenate([labels.ravel(), retrieved.ravel()])
    listed = listed.astype(jnp.int32)
    if retrieved is None:
        score, qualifies = None, listed < num_valid
    else:  # labels inf, retrieved ids their count
        score = jnp.zeros(num_labels + 1, jnp.float32).at[retrieved.ravel()].add(1.0)
        score = score.at[labels.ravel()].set(jnp.inf)
        qualifies = (listed < num_valid) & (score[listed] >= min_count)
    # Each id is claimed by its first qualifying listing, else by its first draw (one [N + 1] array).
    position = jnp.arange(listed.size + num_candidates, dtype=jnp.int32)
    everything = jnp.concatenate([listed, fill])
    claims = jnp.concatenate([jnp.where(qualifies, position[:listed.size], position.size), position[listed.size:]])
    first = jnp.full(num_labels + 1, position.size, jnp.int32).at[everything].min(claims)
    owns = first[everything] == claims
    chosen, drawn = owns[:listed.size] & qualifies, owns[listed.size:]  # each id once; the fill in draw order
    num_chosen = jnp.sum(chosen, dtype=jnp.int32)

    def compact(_) -> jax.Array:  # the chosen all fit: they, then the first draws that fit
        take = drawn & (jnp.cumsum(drawn, dtype=jnp.int32) <= num_candidates - num_chosen)
        keep = jnp.concatenate([chosen, take])
        at = jnp.where(keep, jnp.cumsum(keep, dtype=jnp.int32) - 1, num_candidates)
        return jnp.full(num_candidates, num_labels, jnp.int32).at[at].set(everything, mode="drop")

    def rank(_) -> jax.Array:  # more chosen than fit: the M highest priorities
        # A random fraction per retrieved id (count >= 1): the ones kept at the cut are a random subset of
        # those with the same count (top_k alone would keep the first listed). Draws: (0.25, 0.75], the earlier
        # the higher, below any retrieved id.
        ranked = jnp.inf if score is None else score[listed] + 0.5 * uniform_by_id(k_tie, listed)
        slot = jnp.arange(num_candidates, dtype=jnp.int32)
        priority = jnp.concatenate([jnp.where(chosen, ranked, 0.0),
                                    jnp.where(drawn, 0.75 - 0.5 * slot / num_candidates, 0.0)])
        top, at = jax.lax.top_k(priority, num_candidates)
        return jnp.where(top > 0, everything[at], num_labels)

    ids = jnp.sort(jax.lax.cond(num_chosen <= num_candidates, compact, rank, None))
    return ids, ids < num_labels


class PerExample(NamedTuple):
    """Candidate sets per example (SLIDE's own mode), in two parts: each example's own ids, and a random fill
    drawn once for the batch of which each example takes what it needs.

    own: int32 [B, W] (W = Lmax + R): the example's labels, then the ids it retrieved, each distinct id at
        its first listing and num_labels elsewhere (at most m real ids per row).
    fill: int32 [m]: the batch's random draw; num_labels at repeats and at ids no example takes.
    fill_mask: bool [B, m]: the fill ids example b takes, the first m - (its own ids) not already its own.

    Example b's set is own[b] (real ids) with fill[fill_mask[b]]: m distinct ids when enough are drawn.
    `as_rows()` lays it out as one [B, W + m] row per example.
    """

    own: jax.Array
    fill: jax.Array
    fill_mask: jax.Array

    def as_rows(self, num_labels: int) -> tuple[jax.Array, jax.Array]:
        """ids int32 [B, W + m] (num_labels at unused slots) and mask bool [B, W + m]: each example's set."""
        fill = jnp.where(self.fill_mask, self.fill, num_labels)
        ids = jnp.concatenate([self.own, fill], axis=1)
        return ids, ids < num_labels


def per_example_candidates(
    labels: jax.Array,
    retrieved: jax.Array | None,
    key: jax.Array,
    num_candidates: int,
    num_labels: int,
    sampler: str = "uniform",
) -> PerExample:
    """A candidate set of m ids per example (SLIDE's own mode).

    Each example keeps its true labels, then the ids it retrieved from its L buckets (the union, SLIDE's
    "union" ranking), then random ids to fill up to m; within each of the three, the ids that fit are a random
    subset. The fill is one draw of m ids for the whole batch, in the same order for every example (the
    negatives of TF's sampled softmax are shared the same way), each example taking its first ids that are
    not already its own: a step then scores each example's own ids row by row and the fill as one [B, H] x
    [H, m] product, and the fill adds at most m rows to the Adam, where m independent draws per example made
    B * m (~118,000 of W's rows at Amazon-670K's batch 128, m = 1,024) and every slot a row gather.
    The first distinct draws are a uniformly random subset of the distinct draws; retrieved ids are listed in
    a random order when they may not all fit (Lmax + R > m). Own ids: one sort per row of Lmax + R packed
    (id, listing) keys finds first listings; the fill's overlap with them: a binary search in the sorted
    draws and one scatter into [B, m].

    Args:
      labels: int32 [B, Lmax] padded with num_labels; retrieved: int32 [B, R] or None; m = num_candidates.

    Returns:
      PerExample(own int32 [B, Lmax + R], fill int32 [m], fill_mask bool [B, m]).
    """
    if num_candidates > num_labels:
        raise ValueError(f"num_candidates={num_candidates} exceeds num_labels={num_labels}")
    b = labels.shape[0]
    k_fill, k_order = jax.random.split(key)
    listed = labels
    if retrieved is not None:
        if labels.shape[1] + retrieved.shape[1] > num_candidates:
            order = jnp.argsort(jax.random.uniform(k_order, retrieved.shape), axis=1)
            retrieved = jnp.take_along_axis(retrieved, order, axis=1)
        listed = jnp.concatenate([labels, retrieved], axis=1)
    listed = listed.astype(jnp.int32)
    length = listed.shape[1]
    listing = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), listed.shape)
    listing_bits = max(1, (length - 1).bit_length())
    if (num_labels + 1) << listing_bits <= 2**31:
        # (id, listing) packed into one int32 per slot: XLA:CPU sorts a single array several times faster
        # than a two-key sort (see unique_rows); the order is the same.
        keys = jnp.sort((listed << listing_bits) | listing, axis=1)
        ids, at = keys >> listing_bits, keys & ((1 << listing_bits) - 1)
    else:
        ids, at = jax.lax.sort((listed, listing), dimension=1, num_keys=2)
    first = jnp.concatenate([jnp.ones((b, 1), bool), ids[:, 1:] != ids[:, :-1]], axis=1) & (ids < num_labels)
    example = jnp.arange(b, dtype=jnp.int32)[:, None]
    kept = jnp.zeros(listed.shape, bool).at[example, at].set(first, unique_indices=True)
    kept &= jnp.cumsum(kept, axis=1, dtype=jnp.int32) <= num_candidates
    own = jnp.where(kept, listed, num_labels)
    # The fill: each id at its first draw; an example skips its own ids and takes what it still needs.
    # Found by binary search in the sorted draws: O(m) memory, nothing of size num_labels.
    m = num_candidates
    fill = sample_labels(k_fill, (m,), num_labels, sampler)
    order = jnp.argsort(fill, stable=True)  # equal draws keep their order: the first draw comes first
    drawn = fill[order]
    fresh = jnp.zeros(m, bool).at[order].set(jnp.concatenate([jnp.ones(1, bool), drawn[1:] != drawn[:-1]]))
    at = jnp.minimum(jnp.searchsorted(drawn, own), m - 1)  # an own id's first draw, if it was drawn
    draw = jnp.where(drawn[at] == own, order[at], m)
    taken = jnp.zeros((b, m + 1), bool).at[example, draw].set(True)[:, :m]  # own ids among the draws
    free = fresh & ~taken
    need = m - jnp.sum(kept, axis=1, dtype=jnp.int32)
    fill_mask = free & (jnp.cumsum(free, axis=1, dtype=jnp.int32) <= need[:, None])
    return PerExample(own=own, fill=jnp.where(jnp.any(fill_mask, axis=0), fill, num_labels), fill_mask=fill_mask)


def unique_rows(ids: jax.Array, num_rows: int, size: int | None = None) -> tuple[jax.Array, jax.Array]:
    """The distinct ids of a batch and where each slot's id went: `jnp.unique(ids, size=size,
    fill_value=num_rows, return_inverse=True)`, cheaper.

    ids: int32 [...] in [0, num_rows] (num_rows is padding); size: length of the result, at least the number
    of distinct ids (default ids.size). Returns rows int32 [size], ascending, padded with num_rows, and
    inverse int32 [ids.shape] with rows[inverse] == ids.

    Only single-array sorts: XLA:CPU sorts one primitive array with its fast library sort, while a sort with
    a payload (jnp.unique's lexsort) calls a compiled comparator per comparison, several times slower. When
    id and slot fit one uint32 (Amazon-670K's 135,910 feature ids x 12,288 slots do), one sort of packed
    (id, slot) keys gives both results; otherwise the ids are sorted alone and each slot finds its row by
    binary search.
    """
    size = ids.size if size is None else size
    flat = ids.ravel()
    slot_bits = max(1, (flat.size - 1).bit_length())
    packed = num_rows.bit_length() + slot_bits <= 32
    if packed:
        keys = jnp.sort((flat.astype(jnp.uint32) << slot_bits) | jnp.arange(flat.size, dtype=jnp.uint32))
        sorted_ids = (keys >> slot_bits).astype(jnp.int32)
    else:
        sorted_ids = jnp.sort(flat)
    new = jnp.concatenate([jnp.ones(1, bool), sorted_ids[1:] != sorted_ids[:-1]])
    position = jnp.cumsum(new, dtype=jnp.int32) - 1
    rows = jnp.full(size, num_rows, jnp.int32).at[position].set(sorted_ids, mode="drop")
    if packed:
        slots = (keys & ((1 << slot_bits) - 1)).astype(jnp.int32)
        inverse = jnp.zeros(flat.size, jnp.int32).at[slots].set(position, unique_indices=True)
    else:
        inverse = jnp.searchsorted(rows, flat).astype(jnp.int32)  # rows ascending: an id's first row
    return rows, inverse.reshape(ids.shape)


def compact_rows(ids: jax.Array, num_rows: int, size: int | None = None) -> tuple[jax.Array, jax.Array]:
    """The distinct ids of many slots, in the order of their first slot, and where each slot's id went: for
    the per-example step, whose candidate slots share rows across examples.

    ids: int32 [...] in [0, num_rows] (num_rows is padding); size: length of the result, at least ids.size
    (default). Returns rows int32 [size] (the distinct real ids first, then num_rows) and index int32
    [ids.shape] with rows[index] == ids at real ids and index == size (out of range: dropped by a segment sum)
    at padding.

    One scatter-min of slot numbers into a [num_rows + 1] int32 array, a gather and a cumulative sum: O(num_rows)
    memory (the shared candidates' score array is as large), where `unique_rows` would sort the slots (with
    two keys once id and slot no longer fit one uint32, as 670,091 labels x 131,072 slots do not).
    """
    flat = ids.ravel()
    size = flat.size if size is None else size
    if size < flat.size:
        raise ValueError(f"size={size} is below the {flat.size} slots: distinct ids could be dropped")
    slot = jnp.arange(flat.size, dtype=jnp.int32)
    first = jnp.full(num_rows + 1, flat.size, jnp.int32).at[flat].min(slot)[flat]  # <= slot: in range
    is_first = (first == slot) & (flat < num_rows)
    position = jnp.cumsum(is_first, dtype=jnp.int32) - 1
    rows = jnp.full(size, num_rows, jnp.int32).at[jnp.where(is_first, position, size)].set(flat, mode="drop")
    index = jnp.where(flat < num_rows, position[first], size)
    return rows, index.reshape(ids.shape)


def shared_targets(labels: jax.Array, candidates: jax.Array, num_labels: int) -> jax.Array:
    """float32 [B, M] normalised targets (1/|labels_b| at each true label) over shared candidates [M]."""
    m = candidates.shape[0]
    pos = jnp.full(num_labels, m, jnp.int32).at[candidates].set(jnp.arange(m, dtype=jnp.int32), mode="drop")
    label_pos = pos.at[labels].get(mode="fill", fill_value=m)
    return model.label_targets(labels, num_labels, columns=label_pos, width=m)


def per_example_targets(labels: jax.Array, candidates: jax.Array, num_labels: int) -> jax.Array:
    """float32 [B, m] normalised targets over per-example candidates [B, m]."""
    hit = (candidates[:, None, :] == labels[:, :, None]) & (labels < num_labels)[:, :, None]
    per = 1.0 / jnp.maximum(jnp.sum(labels < num_labels, axis=1), 1)
    return jnp.sum(hit, axis=1).astype(jnp.float32) * per[:, None]
