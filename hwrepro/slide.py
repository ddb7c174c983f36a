"""SLIDE's sparse training core: state, jitted training steps (LSH, sampled, dense), table rebuilds, evaluation.

No file I/O and no logging here; the training loop (hwrepro.experiments) owns those and calls:
  state = init_state(key, num_features, num_labels, method=...)
  step = make_train_step(method, ...);  state, metrics = step(state, batch, key)
  state = rebuild(state, key) / redraw(state, key)   when RebuildSchedule says so (method "lsh" only)
  ids = topk(state.params, batch, k);  precision_at_k(ids, batch["labels"])

Batches are the shared format (dicts of arrays): feat_ids int32 [B, F] padded with num_features, feat_vals
[B, F], labels int32 [B, Lmax] padded with num_labels.

What makes a sparse step cheap, and is kept that way on purpose:
- the input embedding E is touched only at the batch's unique active features (`unique_rows`: one sort of
  packed keys, padded with num_features), its rows gathered once, differentiated as gathered rows and handed
  to the row-sparse Adam as they are (no second gather);
- the output layer is differentiated with respect to the gathered candidate rows only (one gather of W and
  b per step), never with respect to the whole W;
- E, W and b are updated with the row-sparse Adam (hwrepro.sparse_adam), whose scatters run in place because
  the step donates the state (bfloat16 tables are kept as uint16 bits for that); candidate ids are ascending,
  so gathers and scatters walk the tables in memory order; only the hidden bias uses a dense optax Adam;
- candidate selection costs O(num_labels) in float32 counters (one zeroed score array and one top_k), which
  is ~128x less traffic than one pass over W, and nothing in a step is O(num_labels * hidden).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax

from hwrepro import lsh
from hwrepro import sparse_adam
from hwrepro.models import slide as model

METHODS = ("lsh", "sampled", "dense")
CANDIDATE_MODES = ("shared", "per_example")
SAMPLERS = ("uniform", "log_uniform")
LSH_KINDS = ("dwta", "simhash")

Batch = Mapping[str, jax.Array]
Params = dict[str, dict[str, jax.Array]]
StepFn = Callable[["SlideState", Batch, jax.Array], tuple["SlideState", dict[str, jax.Array]]]


class LshSpec(NamedTuple):
    """The output layer's hash family. Default: the main job's SimHash, K = 16 bits, L = 25 tables.

    SLIDE's Amazon-670K setting is LshSpec("dwta", 6, 50, 8); in this project's measurements its retrieved
    negatives were hardly harder than uniform ones, SimHash's were (docs/benchmarks.md, "Which hash").
    kind: "dwta" (num_hashes = K hashes of log2(bin_size) bits per table) or "simhash" (num_hashes = bits).
    density: fraction of non-zero projection entries for simhash (SLIDE's "ratio 3" is about 1/3).
    """

    kind: str = "simhash"
    num_hashes: int = 16
    num_tables: int = 25
    bin_size: int = 8
    density: float = 1.0


class SparseOptState(NamedTuple):
    """Optimizer state of the sparse methods: row-sparse Adam for E, W, b; dense Adam for the hidden bias."""

    embedding: sparse_adam.RowAdamState
    weight: sparse_adam.RowAdamState
    out_bias: sparse_adam.RowAdamState
    hidden_bias: optax.OptState


@flax.struct.dataclass
class SlideState:
    """Everything a training step reads and writes (a pytree; the step donates it).

    params: {"input": {"embedding" [F, H], "bias" [H]}, "output": {"weight" [N, H], "bias" [N]}}, the
      parameter tree of models.slide.SparseInput / SparseOutput; for "lsh" and "sampled", bfloat16 E and W
      are kept as uint16 bit patterns (sparse_adam.to_storage: row scatters in place). `model_params` gives
      the modules' view.
    opt_state: SparseOptState (methods "lsh", "sampled") or an optax Adam state over params ("dense").
    hash_fn, tables: the LSH functions and tables over the rows of W (method "lsh"; None otherwise).
    step: int32 scalar, steps taken.
    lsh_spec: static; how hash functions are (re)drawn.
    """

    params: Params
    opt_state: Any
    hash_fn: Any
    tables: Any
    step: jax.Array
    lsh_spec: LshSpec | None = flax.struct.field(pytree_node=False, default=None)


def _check(value: Any, allowed: tuple, what: str) -> None:
    if value not in allowed:
        raise ValueError(f"{what}={value!r} is not one of {', '.join(map(repr, allowed))}")


def _hidden_bias_adam(learning_rate: float = 1.0, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
    return optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)


def init_hash_fn(spec: LshSpec, key: jax.Array, dim: int) -> Any:
    """Draws the hash functions of `spec` for `dim`-dimensional vectors."""
    _check(spec.kind, LSH_KINDS, "lsh kind")
    if spec.kind == "dwta":
        return lsh.init_dwta(key, dim, spec.num_hashes, spec.num_tables, bin_size=spec.bin_size)
    return lsh.init_simhash(key, dim, spec.num_hashes, spec.num_tables, density=spec.density)


def init_params(
    key: jax.Array, num_features: int, num_labels: int, hidden: int = 128, param_dtype: Any = jnp.float32
) -> Params:
    """Parameters from the Flax modules' own initialisers (E, W ~ N(0, 0.01^2) as in SLIDE; biases 0)."""
    k_in, k_out = jax.random.split(key)
    f_in = model.SparseInput(num_features, hidden, param_dtype=param_dtype)
    f_out = model.SparseOutput(num_labels, hidden, param_dtype=param_dtype)
    ids = jnp.zeros((1, 1), jnp.int32)
    p_in = f_in.init(k_in, ids, jnp.zeros((1, 1), jnp.float32))["params"]
    p_out = f_out.init(k_out, jnp.zeros((1, hidden), jnp.float32), ids[0])["params"]
    return {"input": dict(p_in), "output": dict(p_out)}


def init_state(
    key: jax.Array,
    num_features: int,
    num_labels: int,
    hidden: int = 128,
    *,
    method: str = "lsh",
    param_dtype: Any = jnp.float32,
    moment_dtype: Any = jnp.float32,
    lsh_spec: LshSpec = LshSpec(),
) -> SlideState:
    """A fresh training state for `method` ("lsh", "sampled" or "dense").

    param_dtype is the storage dtype of E and W (float32 or bfloat16); biases stay float32. For "lsh" the
    hash functions are drawn and the tables built from the initial W.
    """
    _check(method, METHODS, "method")
    k_params, k_hash, k_tables = jax.random.split(key, 3)
    params = init_params(k_params, num_features, num_labels, hidden, param_dtype)
    if method == "dense":
        opt_state = optax.adam(1.0).init(params)
    else:
        params = jax.tree_util.tree_map(sparse_adam.to_storage, params)
        opt_state = SparseOptState(
            embedding=sparse_adam.init(params["input"]["embedding"], moment_dtype),
            weight=sparse_adam.init(params["output"]["weight"], moment_dtype),
            out_bias=sparse_adam.init(params["output"]["bias"]),
            hidden_bias=_hidden_bias_adam().init(params["input"]["bias"]),
        )
    hash_fn = tables = None
    if method == "lsh":
        hash_fn = init_hash_fn(lsh_spec, k_hash, hidden)
        tables = _build(hash_fn, params["output"]["weight"], k_tables)
    return SlideState(params=params, opt_state=opt_state, hash_fn=hash_fn, tables=tables,
                      step=jnp.zeros((), jnp.int32), lsh_spec=lsh_spec if method == "lsh" else None)


def model_params(params: Params) -> Params:
    """A state's params as the Flax modules take them (bfloat16 tables back from their uint16 storage)."""
    return jax.tree_util.tree_map(sparse_adam.from_storage, params)


def _build(hash_fn: Any, weight: jax.Array, key: jax.Array) -> Any:
    return lsh.build_tables(hash_fn, sparse_adam.from_storage(weight).astype(jnp.float32), key)


@functools.partial(jax.jit, donate_argnums=0)
def rebuild(state: SlideState, key: jax.Array) -> SlideState:
    """Re-inserts the current rows of W into the LSH tables (same hash functions)."""
    return state.replace(tables=_build(state.hash_fn, state.params["output"]["weight"], key))


@functools.partial(jax.jit, donate_argnums=0)
def redraw(state: SlideState, key: jax.Array) -> SlideState:
    """Draws new hash functions and builds the tables for them."""
    k_hash, k_tables = jax.random.split(key)
    weight = state.params["output"]["weight"]
    hash_fn = init_hash_fn(state.lsh_spec, k_hash, weight.shape[1])
    return state.replace(hash_fn=hash_fn, tables=_build(hash_fn, weight, k_tables))


# ----------------------------------------------------------------------------------------------- candidates


def sample_labels(key: jax.Array, shape: tuple[int, ...], num_labels: int, sampler: str = "uniform") -> jax.Array:
    """Random label ids int32 [shape] in [0, num_labels).

    "uniform", or "log_uniform" (Zipfian by id: P(id) = log((id + 2) / (id + 1)) / log(num_labels + 1), the
    sampler of TF's sampled softmax), which assumes ids are ranks, most frequent label first.
    """
    _check(sampler, SAMPLERS, "sampler")
    if sampler == "uniform":
        return jax.random.randint(key, shape, 0, num_labels, jnp.int32)
    u = jax.random.uniform(key, shape)
    ids = jnp.floor(jnp.exp(u * jnp.log(num_labels + 1.0))) - 1.0
    return jnp.clip(ids, 0, num_labels - 1).astype(jnp.int32)


def uniform_by_id(key: jax.Array, ids: jax.Array) -> jax.Array:
    """float32 in [0, 1), shaped like ids: an integer hash (lowbias32) of each id mixed with one random word.

    The same id gets the same number wherever it appears in one step (one word from `key`). Random enough to
    break ties, and 12-15x cheaper than threefry draws (0.4 against 4.9-6.1 ms for 670,092 ids on 2 cores,
    scratch timing under load).
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
) -> tuple[jax.Array, jax.Array]:
    """One candidate set for the whole batch, of fixed size M.

    Priority: the batch's true labels first, then retrieved ids seen at least `min_count` times across the
    batch and tables (SLIDE's "sampling" mode, threshold 2), most often retrieved first (ties at the cut
    broken at random), then M random ids (uniform or log-uniform) to fill up. Priorities are kept in a float32
    [num_labels + 1] array (padding id N lands in the last slot), but the top_k runs over the listed ids
    only (labels, retrieved, drawn; each id at its first listing): XLA:CPU's single-threaded top_k of
    8,192 over all 670,091 labels took 4.2 ms, over the ~60,000 listed ids 0.8 ms (scratch timing on 2 cores).

    Args:
      labels: int32 [B, Lmax], padded with num_labels.
      retrieved: int32 [...] ids from the LSH tables, padded with num_labels; None for sampled softmax.
      key: PRNG key for the random fill.
      num_candidates: M. If the batch has more than M distinct labels, only M of them are kept.
      min_count: >= 1.

    Returns:
      ids int32 [M] (distinct, ascending, num_labels at the unfilled slots, which come last) and mask bool
      [M] (False at those slots; a slot stays unfilled only when random draws collide). Ascending ids make
      the step's row gathers and scatters walk W and its moments in memory order.
    """
    if min_count < 1:
        raise ValueError(f"min_count={min_count} must be >= 1")
    if num_candidates > num_labels:
        raise ValueError(f"num_candidates={num_candidates} exceeds num_labels={num_labels}")
    k_fill, k_order = jax.random.split(key)
    fill = sample_labels(k_fill, (num_candidates,), num_labels, sampler)
    score = jnp.zeros(num_labels + 1, jnp.float32)
    if retrieved is not None:
        score = score.at[retrieved.ravel()].add(1.0)
        score = jnp.where(score >= min_count, score, 0.0)
    score = score.at[labels.ravel()].set(jnp.inf)
    # Each drawn id gets a random priority in (0, 1): below any retrieved id (count >= 1), above nothing. The
    # fill ids that fit are then a random subset of those drawn; top_k breaks ties by position, so with one
    # shared priority the lowest drawn ids would always win and the top of the id range never be a negative.
    score = score.at[fill].max(jax.random.uniform(k_order, (num_candidates,), minval=0.25, maxval=0.75))
    # Every id with a priority is listed; keeping only its first listing (`owner`) makes the ids distinct.
    listed = [labels.ravel(), fill] if retrieved is None else [labels.ravel(), retrieved.ravel(), fill]
    listed = jnp.concatenate(listed).astype(jnp.int32)
    position = jnp.arange(listed.size, dtype=jnp.int32)
    owner = jnp.full(num_labels + 1, listed.size, jnp.int32).at[listed].min(position)
    priority = jnp.where((owner[listed] == position) & (listed < num_labels), score[listed], 0.0)
    if retrieved is not None:
        # A random fraction per retrieved id (count >= 1): when more are kept than fit, the ones kept at the
        # cut are a random subset of those with the same count (top_k alone would keep the first listed).
        # When all fit, the fractions change nothing.
        tie = 0.5 * uniform_by_id(jax.random.fold_in(key, 1), listed)
        priority = jnp.where(priority >= 1.0, priority + tie, priority)
    priority, at = jax.lax.top_k(priority, num_candidates)
    ids = jnp.sort(jnp.where(priority > 0, listed[at], num_labels))
    return ids, ids < num_labels


def per_example_candidates(
    labels: jax.Array,
    retrieved: jax.Array | None,
    key: jax.Array,
    num_candidates: int,
    num_labels: int,
    sampler: str = "uniform",
) -> tuple[jax.Array, jax.Array]:
    """A candidate set per example, [B, m] (SLIDE's own mode).

    Each example keeps its true labels, then the ids it retrieved from its L buckets (the union, SLIDE's
    "union" ranking), then random ids to fill up to m; within each of the three, the ids that fit are a random
    subset. Per row: one sort of Lmax + R + m ids by (id, priority) to drop repeats, then one top_k by priority
    plus a random fraction (top_k alone would break ties toward the lowest ids).

    Args:
      labels: int32 [B, Lmax] padded with num_labels; retrieved: int32 [B, R] or None; m = num_candidates.

    Returns:
      ids int32 [B, m] (distinct per row, num_labels at unfilled slots) and mask bool [B, m].
    """
    if num_candidates > num_labels:
        raise ValueError(f"num_candidates={num_candidates} exceeds num_labels={num_labels}")
    b = labels.shape[0]
    k_fill, k_order = jax.random.split(key)
    fill = sample_labels(k_fill, (b, num_candidates), num_labels, sampler)
    parts = [(labels, 3), (fill, 1)] + ([(retrieved, 2)] if retrieved is not None else [])
    ids = jnp.concatenate([p for p, _ in parts], axis=1)
    prio = jnp.concatenate([jnp.full(p.shape, v, jnp.int32) for p, v in parts], axis=1)
    prio = jnp.where(ids < num_labels, prio, 0)
    if (num_labels + 1) * 4 <= 2**31:
        # (id, -priority) packed into one int32 per slot: XLA:CPU sorts a single array several times faster
        # than a two-key sort (see unique_rows); the order is the same.
        keys = jnp.sort(ids * 4 + (3 - prio), axis=1)
        ids, prio = keys >> 2, 3 - (keys & 3)
    else:
        ids, neg_prio = jax.lax.sort((ids, -prio), dimension=1, num_keys=2)
        prio = -neg_prio
    first = jnp.concatenate([jnp.ones((b, 1), bool), ids[:, 1:] != ids[:, :-1]], axis=1)
    tie_break = jax.random.uniform(k_order, ids.shape, maxval=0.5)
    priority, pos = jax.lax.top_k(jnp.where(first & (prio > 0), prio + tie_break, 0.0), num_candidates)
    mask = priority > 0
    return jnp.where(mask, jnp.take_along_axis(ids, pos, axis=1), num_labels), mask


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


# ----------------------------------------------------------------------------------------------- steps


def make_train_step(
    method: str,
    *,
    learning_rate: float = 1e-4,
    num_candidates: int = 8192,
    candidate_mode: str = "shared",
    bucket_capacity: int = 16,
    min_count: int = 2,
    sampler: str = "uniform",
    compute_dtype: Any = jnp.float32,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
) -> StepFn:
    """A jitted training step `(state, batch, key) -> (state, metrics)` that donates `state`.

    method: "lsh" (candidates from the LSH tables queried with the batch's hidden activations),
      "sampled" (true labels + random negatives: sampled softmax without logQ correction), or "dense"
      (full softmax over all labels, plain optax Adam over every parameter: the honest dense baseline).
    num_candidates: M per batch (candidate_mode "shared") or m per example ("per_example").
    candidate_mode: "shared" or "per_example" (methods "lsh" and "sampled").
    bucket_capacity: ids read per bucket per table in an LSH query.
    min_count: shared LSH mode keeps retrieved ids seen at least this often across the batch and tables.
    sampler: random fill / negatives, "uniform" or "log_uniform" (by label rank).
    compute_dtype: dtype of the matmuls' inputs (accumulation is float32).

    metrics: {"loss": softmax cross-entropy over the active neurons (all neurons for "dense"),
      "candidates": mean number of active output neurons per example}.
    """
    _check(method, METHODS, "method")
    _check(candidate_mode, CANDIDATE_MODES, "candidate_mode")
    _check(sampler, SAMPLERS, "sampler")
    if method == "dense":
        step = functools.partial(_dense_step, tx=optax.adam(learning_rate, b1=b1, b2=b2, eps=eps),
                                 dtype=compute_dtype)
    else:
        step = functools.partial(
            _sparse_step, use_lsh=method == "lsh", shared=candidate_mode == "shared",
            num_candidates=num_candidates, bucket_capacity=bucket_capacity, min_count=min_count,
            sampler=sampler, dtype=compute_dtype, hp=(learning_rate, b1, b2, eps))
    return jax.jit(step, donate_argnums=0)


def _dense_step(state: SlideState, batch: Batch, key: jax.Array, *, tx, dtype) -> tuple[SlideState, dict]:
    del key
    num_labels = state.params["output"]["weight"].shape[0]
    targets = model.label_targets(batch["labels"], num_labels)

    def loss_fn(params):
        h = model.sparse_hidden(params["input"]["embedding"], params["input"]["bias"],
                                batch["feat_ids"], batch["feat_vals"], dtype)
        z = model.output_logits(params["output"]["weight"], params["output"]["bias"], h, None, dtype)
        return model.softmax_xent(z, targets)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "candidates": jnp.asarray(num_labels, jnp.float32)}
    return state.replace(params=params, opt_state=opt_state, step=state.step + 1), metrics


def _rows_at(table: jax.Array, ids: jax.Array) -> jax.Array:
    """table's rows at ids, where a padding id (>= num_rows) reads the last real row.

    For the sparse step only: every use of a padding row there is masked (candidates) or multiplied by a
    zero feature value (input rows), and its update is dropped; clamping saves the select over all gathered
    values that reading zeros (model.gather_rows) costs.
    """
    return sparse_adam.from_storage(table.at[ids].get(mode="clip"))


def _sparse_step(
    state: SlideState, batch: Batch, key: jax.Array, *, use_lsh, shared, num_candidates, bucket_capacity,
    min_count, sampler, dtype, hp,
) -> tuple[SlideState, dict]:
    lr, b1, b2, eps = hp
    p_in, p_out = state.params["input"], state.params["output"]
    num_features = p_in["embedding"].shape[0]
    num_labels = p_out["weight"].shape[0]
    feat_ids, labels = batch["feat_ids"], batch["labels"]

    # Input layer on the batch's unique active features only; gradients come out summed per unique row.
    feat_rows, inv = unique_rows(feat_ids, num_features)
    e_rows = _rows_at(p_in["embedding"], feat_rows)
    h, hidden_vjp = jax.vjp(lambda r, bias: model.embedding_sum(r[inv], batch["feat_vals"], bias, dtype),
                            e_rows, p_in["bias"])

    retrieved = None
    if use_lsh:
        retrieved = lsh.query(state.tables, state.hash_fn, jax.lax.stop_gradient(h), bucket_capacity)
    if shared:
        cand, mask = batch_shared_candidates(labels, retrieved, key, num_candidates, num_labels, min_count,
                                             sampler)
        targets = shared_targets(labels, cand, num_labels)
    else:
        retrieved = None if retrieved is None else retrieved.reshape(labels.shape[0], -1)
        cand, mask = per_example_candidates(labels, retrieved, key, num_candidates, num_labels, sampler)
        targets = per_example_targets(labels, cand, num_labels)

    # One gather of the candidate rows; differentiate with respect to the gathered rows, never all of W.
    w_rows = _rows_at(p_out["weight"], cand)
    b_rows = _rows_at(p_out["bias"], cand)

    def out_loss(w, b, hh):
        return model.softmax_xent(model.candidate_logits(w, b, hh, dtype), targets, mask)

    loss, (g_w, g_b, g_h) = jax.value_and_grad(out_loss, argnums=(0, 1, 2))(w_rows, b_rows, h)
    g_e, g_hb = hidden_vjp(g_h)

    rows = cand
    if not shared:
        # Examples share output neurons: sum their gradient rows per unique id before the Adam update.
        size = min(cand.size, num_labels + 1)
        rows, slot = unique_rows(cand, num_labels, size)
        g_w = jax.ops.segment_sum(g_w.reshape(cand.size, -1), slot.ravel(), size)
        g_b = jax.ops.segment_sum(g_b.ravel(), slot.ravel(), size)

    opt = state.opt_state
    # Shared candidates are the updated rows, already gathered; per-example ones were gathered per slot.
    w_now, b_now = (w_rows, b_rows) if shared else (None, None)
    weight, opt_w = sparse_adam.update(p_out["weight"], opt.weight, rows, g_w, lr, b1, b2, eps, w_now)
    out_bias, opt_b = sparse_adam.update(p_out["bias"], opt.out_bias, rows, g_b, lr, b1, b2, eps, b_now)
    embedding, opt_e = sparse_adam.update(p_in["embedding"], opt.embedding, feat_rows, g_e, lr, b1, b2, eps,
                                          e_rows)
    hb_updates, opt_hb = _hidden_bias_adam(lr, b1, b2, eps).update(g_hb, opt.hidden_bias)
    params = {"input": {"embedding": embedding, "bias": optax.apply_updates(p_in["bias"], hb_updates)},
              "output": {"weight": weight, "bias": out_bias}}
    opt_state = SparseOptState(embedding=opt_e, weight=opt_w, out_bias=opt_b, hidden_bias=opt_hb)
    metrics = {"loss": loss, "candidates": jnp.sum(mask) / (1 if shared else labels.shape[0])}
    return state.replace(params=params, opt_state=opt_state, step=state.step + 1), metrics


# ----------------------------------------------------------------------------------------------- evaluation


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


@functools.partial(jax.jit, static_argnames=("k", "chunk", "dtype"))
def topk(params: Params, batch: Batch, k: int, chunk: int = 131072, dtype: Any = jnp.float32) -> jax.Array:
    """The k highest-scoring labels per example by dense scoring: int32 [B, k], best first.

    Scores all num_labels neurons in chunks of `chunk` rows (a running top-k over chunks), so the [B, N]
    logits never exist at once for large N; slices of W are read in place. params: a state's or the modules'.
    """
    params = model_params(params)
    p_in, p_out = params["input"], params["output"]
    h = model.sparse_hidden(p_in["embedding"], p_in["bias"], batch["feat_ids"], batch["feat_vals"], dtype)
    weight, bias = p_out["weight"], p_out["bias"]
    n = weight.shape[0]
    if chunk >= n:
        return jax.lax.top_k(model.candidate_logits(weight, bias, h, dtype), k)[1]

    def body(best, i):
        # The last chunk is shifted back to end at n; ids already scored by the previous chunk are masked.
        start = jnp.minimum(i * chunk, n - chunk)
        z = model.candidate_logits(jax.lax.dynamic_slice_in_dim(weight, start, chunk),
                                   jax.lax.dynamic_slice_in_dim(bias, start, chunk), h, dtype)
        ids = start + jnp.arange(chunk, dtype=jnp.int32)
        v, j = blocked_top_k(jnp.where(ids >= i * chunk, z, -jnp.inf), k)
        all_v = jnp.concatenate([best[0], v], axis=1)
        all_i = jnp.concatenate([best[1], ids[j]], axis=1)
        v, j = jax.lax.top_k(all_v, k)
        return (v, jnp.take_along_axis(all_i, j, axis=1)), None

    b = h.shape[0]
    init = (jnp.full((b, k), -jnp.inf, jnp.float32), jnp.zeros((b, k), jnp.int32))
    (_, ids), _ = jax.lax.scan(body, init, jnp.arange(-(-n // chunk), dtype=jnp.int32))
    return ids


@functools.partial(jax.jit, static_argnames=("k", "bucket_capacity", "dtype"))
def topk_lsh(
    params: Params, hash_fn: Any, tables: Any, batch: Batch, k: int, bucket_capacity: int = 16,
    dtype: Any = jnp.float32,
) -> jax.Array:
    """The k best labels per example among those its hidden activation retrieves from the LSH tables.

    int32 [B, k], best first; -1 where fewer than k neurons were retrieved (never counts as a hit).
    """
    params = model_params(params)
    p_in, p_out = params["input"], params["output"]
    h = model.sparse_hidden(p_in["embedding"], p_in["bias"], batch["feat_ids"], batch["feat_vals"], dtype)
    ids, z = model.lsh_logits(p_out["weight"], p_out["bias"], h, hash_fn, tables, bucket_capacity, dtype)
    v, j = jax.lax.top_k(z, k)
    return jnp.where(v > -jnp.inf, jnp.take_along_axis(ids, j, axis=1), -1)


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
