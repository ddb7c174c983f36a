"""Evaluation of a SLIDE network: top-k labels by dense scoring (chunked, exact) or among LSH-retrieved
neurons (scored exactly), and precision@k.

LSH-scored prediction can use the training tables as they are (hashes of w: they find rows pointing like the
activation, whatever their norm and bias) or `inference_tables`, built once after training over (w, b) for
inner products (lsh.mips_rows), with multi-probe queries (lsh.probe_codes) reading a few neighbouring
buckets per table. Precision, share of labels scored and time of each: docs/slide_costs.md, "LSH-scored
prediction".
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from hwrepro.models import sparse_layers as model
from hwrepro.sparse import lsh
from hwrepro.sparse.training import Batch, Params, model_params

def blocked_top_k(x: jax.Array, k: int, block: int = 128) -> tuple[jax.Array, jax.Array]:
    """`jax.lax.top_k` over the last axis of x [B, n], exact, for n a multiple of `block`.

    XLA's CPU top_k over a long row costs nearly as much as the matmul that made it; here only the
    [B, n / block] block maxima go through top_k, then the k best blocks' elements: the k largest elements
    always lie in the k blocks with the largest maxima (each of them is beaten by its own block's maximum).
    """
    b, n = x.shape
    if n % block or n // block < k:
        return jax.lax.top_k(x, k)
    blocks = x.reshape(b, n // block, block)
    _, best = jax.lax.top_k(blocks.max(axis=2), k)                           # [B, k] block ids
    inside = jnp.take_along_axis(blocks, best[:, :, None], axis=1).reshape(b, k * block)
    v, j = jax.lax.top_k(inside, k)
    return v, jnp.take_along_axis(best, j // block, axis=1) * block + j % block


def topk(params: Params, batch: Batch, k: int, chunk: int = 131072, dtype: Any = jnp.float32) -> jax.Array:
    """The k highest-scoring labels per example by dense scoring: int32 [B, k], best first (`topk_scored`'s ids)."""
    return topk_scored(params, batch, k, chunk, dtype)[1]


@functools.partial(jax.jit, static_argnames=("k", "chunk", "dtype"))
def topk_scored(params: Params, batch: Batch, k: int, chunk: int = 131072,
                dtype: Any = jnp.float32) -> tuple[jax.Array, jax.Array]:
    """(logits float32 [B, k], label ids int32 [B, k]) of the k highest-scoring labels per example, best first,
    by dense scoring.

    Scores all num_labels neurons in chunks of `chunk` rows (a running top-k over chunks), so the [B, N]
    logits never exist at once for large N; slices of W are read in place. params: a state's or the modules'.
    """
    params = model_params(params)
    p_in, p_out = params["input"], params["output"]
    h = model.sparse_hidden(p_in["embedding"], p_in["bias"], batch["feat_ids"], batch["feat_vals"], dtype)
    return scored_topk(p_out["weight"], p_out["bias"], h, k, chunk, dtype)


def scored_topk(weight: jax.Array, bias: jax.Array, h: jax.Array, k: int, chunk: int = 131072,
                dtype: Any = jnp.float32, num_valid: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(logits float32 [B, k], row ids int32 [B, k]) of the k best rows of weight [n, H], bias [n] for h [B, H].

    `topk`'s scoring, also what each shard of hwrepro.sparse.sharded runs on its own rows; num_valid (a scalar,
    may be traced): rows at and after it score -inf (a shard's padding rows). Chunked as `topk` says.
    """
    n = weight.shape[0]
    if chunk >= n:
        z = model.candidate_logits(weight, bias, h, dtype)
        if num_valid is not None:
            z = jnp.where(jnp.arange(n) < num_valid, z, -jnp.inf)
        if k > n:  # a model shard of fewer rows than k: the rest score -inf (ids n and up, never merged in)
            z = jnp.pad(z, ((0, 0), (0, k - n)), constant_values=-jnp.inf)
        return jax.lax.top_k(z, k)

    def body(best, i):
        # The last chunk is shifted back to end at n; ids already scored by the previous chunk are masked.
        start = jnp.minimum(i * chunk, n - chunk)
        z = model.candidate_logits(jax.lax.dynamic_slice_in_dim(weight, start, chunk),
                                   jax.lax.dynamic_slice_in_dim(bias, start, chunk), h, dtype)
        ids = start + jnp.arange(chunk, dtype=jnp.int32)
        keep = ids >= i * chunk
        if num_valid is not None:
            keep = keep & (ids < num_valid)
        v, j = blocked_top_k(jnp.where(keep, z, -jnp.inf), min(k, chunk))  # k may exceed one chunk
        all_v = jnp.concatenate([best[0], v], axis=1)
        all_i = jnp.concatenate([best[1], ids[j]], axis=1)
        v, j = jax.lax.top_k(all_v, k)
        return (v, jnp.take_along_axis(all_i, j, axis=1)), None

    b = h.shape[0]
    init = (jnp.full((b, k), -jnp.inf, jnp.float32), jnp.zeros((b, k), jnp.int32))
    best, _ = jax.lax.scan(body, init, jnp.arange(-(-n // chunk), dtype=jnp.int32))
    return best


def inference_tables(weight: jax.Array, bias: jax.Array, spec: Any, key: jax.Array) -> tuple[Any, lsh.Tables]:
    """(hash_fn, tables) for LSH-scored prediction, built once from the trained output layer: hash functions
    of `spec` (a training.LshSpec: family, K, L, options) over lsh.mips_rows(weight, bias), so that a query's
    nearest rows are its largest logits. Query them with inner_product=True."""
    rows = lsh.mips_rows(weight, bias)
    hash_fn = spec.init(jax.random.fold_in(key, 0), rows.shape[1])
    return hash_fn, lsh.build_tables(hash_fn, rows, jax.random.fold_in(key, 1))


def lsh_logits(
    weight: jax.Array,
    bias: jax.Array,
    h: jax.Array,
    hash_fn: Any,
    tables: Any,
    bucket_capacity: int,
    dtype: Any = jnp.float32,
    probe_bits: int = 0,
    inner_product: bool = False,
    max_scored: int | None = None,
    num_valid: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Scores only the neurons retrieved from the LSH tables for each example (fast inference), exactly.

    probe_bits: multi-probe, 2**probe_bits buckets per table (lsh.query). inner_product: the tables hash
    lsh.mips_rows (`inference_tables`), so the query is lsh.mips_queries(h). max_scored: score at most this
    many distinct ids per example, those retrieved from the most buckets (SLIDE's frequency ranking; ties to
    the lower id). Retrieved ids repeat across tables and probes, so the distinct ones are few: scoring
    them alone, not every retrieved slot, is what makes the scoring fast (docs/slide_costs.md). num_valid (a
    scalar, may be traced): rows at and after it are dropped like padding before the ranking, so they take none
    of max_scored (a model shard's padding rows, which its tables hold).

    Returns:
      ids int32 [B, R] (each retrieved id once; repeats and padding are num_labels), R = max_scored or
      L * 2**probe_bits * bucket_capacity, and float32 logits of the same shape, -inf where the id is num_labels.
    """
    num_labels = weight.shape[0]
    x = lsh.mips_queries(h) if inner_product else h
    ids = lsh.query(hash_fn, tables, x, bucket_capacity, probe_bits).reshape(h.shape[0], -1)
    ids = jnp.sort(ids, axis=1)
    first = jnp.concatenate([jnp.ones_like(ids[:, :1], bool), ids[:, 1:] != ids[:, :-1]], axis=1)
    keep = first & (ids < (num_labels if num_valid is None else num_valid))  # each real id once
    if max_scored is not None and max_scored < ids.shape[1]:
        slots = ids.shape[1]
        position = jax.lax.broadcasted_iota(jnp.int32, ids.shape, 1)
        # A run of equal ids ends where the next one starts: its length is how often the id was retrieved.
        start = jax.lax.cummin(jnp.where(first, position, slots), axis=1, reverse=True)
        count = jnp.concatenate([start[:, 1:], jnp.full_like(start[:, :1], slots)], axis=1) - position
        # One sort of packed keys (most often retrieved first, then by id; the rest last), XLA:CPU's fast
        # single-array path: a two-key sort calls a comparator per comparison, several times slower.
        id_bits = max(1, num_labels.bit_length())
        with jax.enable_x64(True):
            u64 = jnp.uint64
            rank = jnp.where(keep, slots - count, slots + 1).astype(u64)
            packed = jnp.sort((rank << u64(id_bits)) | jnp.where(keep, ids, num_labels).astype(u64), axis=1)
            ids = (packed[:, :max_scored] & u64((1 << id_bits) - 1)).astype(jnp.int32)
        keep = ids < num_labels  # distinct now; the slots left over hold the padding id
    ids = jnp.where(keep, ids, num_labels)
    return ids, model.output_logits(weight, bias, h, ids, dtype)


def topk_lsh(
    params: Params, hash_fn: Any, tables: Any, batch: Batch, k: int, bucket_capacity: int = 16,
    dtype: Any = jnp.float32, probe_bits: int = 0, inner_product: bool = False, max_scored: int | None = None,
) -> jax.Array:
    """The k best labels per example among those its hidden activation retrieves from the LSH tables, scored
    exactly (probe_bits, inner_product, max_scored: see lsh_logits).

    int32 [B, k], best first; -1 where fewer than k neurons were retrieved (never counts as a hit).
    """
    return topk_lsh_scored(params, hash_fn, tables, batch, k, bucket_capacity, dtype, probe_bits,
                           inner_product, max_scored)[1]


@functools.partial(jax.jit, static_argnames=("k", "bucket_capacity", "dtype", "probe_bits", "inner_product",
                                             "max_scored"))
def topk_lsh_scored(
    params: Params, hash_fn: Any, tables: Any, batch: Batch, k: int, bucket_capacity: int = 16,
    dtype: Any = jnp.float32, probe_bits: int = 0, inner_product: bool = False, max_scored: int | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(logits float32 [B, k], `topk_lsh`'s ids int32 [B, k], how many distinct labels each example scored
    int32 [B]); -inf logits where the ids are -1."""
    params = model_params(params)
    p_in, p_out = params["input"], params["output"]
    h = model.sparse_hidden(p_in["embedding"], p_in["bias"], batch["feat_ids"], batch["feat_vals"], dtype)
    ids, z = lsh_logits(p_out["weight"], p_out["bias"], h, hash_fn, tables, bucket_capacity, dtype, probe_bits,
                        inner_product, max_scored)
    v, best = top_k_of(z, ids, k, pad_id=p_out["weight"].shape[0])
    scored = jnp.sum(ids < p_out["weight"].shape[0], axis=1, dtype=jnp.int32)
    return v, jnp.where(v > -jnp.inf, best, -1), scored


def top_k_of(z: jax.Array, ids: jax.Array, k: int, pad_id: int) -> tuple[jax.Array, jax.Array]:
    """(the k best scores per row of z [B, W], best first, and their ids from ids [B, W]). Where W < k (more
    asked for than were scored) the rest are -inf with id `pad_id`."""
    if k > z.shape[1]:
        pad = ((0, 0), (0, k - z.shape[1]))
        z, ids = jnp.pad(z, pad, constant_values=-jnp.inf), jnp.pad(ids, pad, constant_values=pad_id)
    v, j = jax.lax.top_k(z, k)
    return v, jnp.take_along_axis(ids, j, axis=1)


def precision_at_k(
    topk_ids: jax.Array, labels: jax.Array, ks: tuple[int, ...] = (1, 3, 5), num_labels: int | None = None
) -> dict[str, jax.Array]:
    """{"P@k": mean over examples of |top-k ∩ labels| / k} for each k in ks.

    topk_ids: int32 [B, K >= max(ks)], best first (negative = no prediction); labels: int32 [B, Lmax].
    With num_labels given, labels equal to it are padding and examples without labels are left out.
    """
    if max(ks) > topk_ids.shape[1]:
        raise ValueError(f"precision_at_k: k={max(ks)} exceeds the {topk_ids.shape[1]} predictions per example")
    valid_label = labels >= 0 if num_labels is None else labels < num_labels
    hit = jnp.any((topk_ids[:, :, None] == labels[:, None, :]) & valid_label[:, None, :], axis=2)
    hit = hit & (topk_ids >= 0)
    weight = jnp.any(valid_label, axis=1).astype(jnp.float32) if num_labels is not None else jnp.ones(
        labels.shape[0], jnp.float32)
    denom = jnp.maximum(jnp.sum(weight), 1.0)
    return {f"P@{k}": jnp.sum(weight * jnp.sum(hit[:, :k], axis=1) / k) / denom for k in ks}
