"""SLIDE's sparse training core: state, jitted training steps (LSH, sampled, dense), table rebuilds, evaluation.

No file I/O and no logging here; the training loop (hwrepro.experiments) owns those and calls:
  state = init_state(key, num_features, num_labels, method=...)
  step = make_train_step(method, ...);  state, metrics = step(state, batch, key)
  state = rebuild(state, key) / redraw(state, key)   when RebuildSchedule says so (method "lsh" only)
  state = refile(state, key)                          between rebuilds, with incremental tables (see init_state)
  ids = topk(state.params, batch, k);  precision_at_k(ids, batch["labels"])

Batches are the shared format (dicts of arrays): feat_ids int32 [B, F] padded with num_features, feat_vals
[B, F], labels int32 [B, Lmax] padded with num_labels.

What makes a sparse step cheap, and is kept that way on purpose:
- the input embedding E is touched only at the batch's unique active features (`unique_rows`: one sort of
  packed keys, padded with num_features), its rows gathered once, differentiated as gathered rows and handed
  to the row-sparse Adam as they are (no second gather);
- the output layer is differentiated with respect to the gathered candidate rows only (one gather of W and
  b per step), never with respect to the whole W;
- E, W and b are updated with the row-sparse Adam (hwrepro.sparse.sparse_adam), whose scatters run in place because
  the step donates the state (bfloat16 tables are kept as uint16 bits for that); shared candidate ids are
  ascending, so gathers and scatters walk the tables in memory order; only the hidden bias uses a dense optax Adam;
- per-example candidates: each example's own ids (labels, retrieved) are gathered row by row, the batch's one
  random fill is scored as one matmul, and each id's gradient rows are summed into one row per distinct id
  (`compact_rows`: one scatter-min into an [num_labels + 1] array, no sort of the slots) for the Adam;
- candidate selection costs two [num_labels + 1] arrays (retrieval counts and each id's first listing; sampled
  softmax only the second), ~64x less traffic than one pass over W, and no top_k while the labels and
  retrieved ids fit in M; nothing in a step is O(num_labels * hidden).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax

from hwrepro.sparse import lsh
from hwrepro.sparse import sparse_adam
from hwrepro.models import sparse_layers as model
from hwrepro.sparse.candidates import (CANDIDATE_MODES, SAMPLERS, PerExample, batch_shared_candidates, compact_rows,
                                      per_example_candidates, per_example_targets, shared_targets, unique_rows)

METHODS = ("lsh", "sampled", "dense")

Batch = Mapping[str, jax.Array]
Params = dict[str, dict[str, jax.Array]]
StepFn = Callable[["SlideState", Batch, jax.Array], tuple["SlideState", dict[str, jax.Array]]]


class LshSpec(NamedTuple):
    """The output layer's hash family: `kind` (a name in hwrepro.sparse.hashes.FAMILIES), K = num_hashes per
    table, L = num_tables, and the family's own options as (name, value) pairs (hashable: the spec is static).

    Default: the main job's SimHash, K = 16 bits, L = 25 tables. SLIDE's Amazon-670K setting is
    LshSpec("dwta", 6, 50, (("bin_size", 8),)); in this project's measurements its retrieved negatives were
    hardly harder than uniform ones, SimHash's were (docs/benchmarks.md, "Which hash").
    """

    kind: str = "simhash"
    num_hashes: int = 16
    num_tables: int = 25
    options: tuple[tuple[str, Any], ...] = ()

    def init(self, key: jax.Array, dim: int) -> Any:
        """Draws this spec's hash functions for `dim`-dimensional vectors."""
        return lsh.init_hash(self.kind, key, dim, self.num_hashes, self.num_tables, **dict(self.options))


class SparseOptState(NamedTuple):
    """Optimizer state of the sparse methods: row-sparse Adam over the row tables (`row_tables`: E, W, b), a
    dense optax Adam for the hidden bias."""

    rows: sparse_adam.RowAdamState
    hidden_bias: optax.OptState


def row_tables(params: Params) -> dict[str, jax.Array]:
    """The tables the row-sparse Adam updates: {"embedding": E [F, H], "weight": W [N, H], "out_bias": b [N]}."""
    return {"embedding": params["input"]["embedding"], "weight": params["output"]["weight"],
            "out_bias": params["output"]["bias"]}


@flax.struct.dataclass
class SlideState:
    """Everything a training step reads and writes (a pytree; the step donates it).

    params: {"input": {"embedding" [F, H], "bias" [H]}, "output": {"weight" [N, H], "bias" [N]}}, the
      parameter tree of models.slide.SparseInput / SparseOutput; for "lsh" and "sampled", bfloat16 E and W
      are kept as uint16 bit patterns (sparse_adam.to_storage: row scatters in place). `model_params` gives
      the modules' view.
    opt_state: SparseOptState (methods "lsh", "sampled") or an optax Adam state over params ("dense").
    hash_fn, tables: the LSH functions and tables over the rows of W (method "lsh"; None otherwise): lsh.Tables
      or lsh.BucketTables, in which each step notes the rows of W it changed (for `rebuild` or `refile`).
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


def init_params(
    key: jax.Array, num_features: int, num_labels: int, hidden: int = 128, param_dtype: Any = jnp.float32
) -> Params:
    """Parameters from the Flax modules' own initialisers (E, W ~ N(0, 0.01^2) as in SLIDE; biases 0)."""
    k_in, k_out = jax.random.split(key)
    f_in = model.SparseInput(num_features, hidden, param_dtype=param_dtype)
    f_out = model.SparseOutput(num_labels, param_dtype=param_dtype)
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
    table_capacity: int = 0,
    pending_rows: int = 0,
    params: Params | None = None,
) -> SlideState:
    """A fresh training state for `method` ("lsh", "sampled" or "dense"); `params` (the modules' view, e.g. a
    finished run's for fine-tuning) instead of freshly initialised ones, with fresh optimizer state and tables.

    param_dtype is the storage dtype of E and W (float32 or bfloat16); biases stay float32. For "lsh" the
    hash functions are drawn and the tables built from the initial W: with table_capacity 0, lsh.Tables with
    kept codes (every id, regrouped in full by each rebuild, which re-hashes only the rows changed since);
    with C > 0, lsh.BucketTables of C ids per bucket that `refile` keeps up to date between rebuilds, noting
    up to `pending_rows` changed rows (`changed_rows_per_step` per step) between two refiles. Rebuilds and
    redraws keep the layout.
    """
    _check(method, METHODS, "method")
    k_params, k_hash, k_tables = jax.random.split(key, 3)
    if params is None:
        params = init_params(k_params, num_features, num_labels, hidden, param_dtype)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    if method == "dense":
        opt_state = optax.adam(1.0).init(params)
    else:
        params = jax.tree_util.tree_map(sparse_adam.to_storage, params)
        # Optimizer states depend on shapes and dtypes only: the learning rate here is a placeholder.
        opt_state = SparseOptState(rows=sparse_adam.row_adam(1.0, moment_dtype=moment_dtype).init(row_tables(params)),
                                   hidden_bias=optax.adam(1.0).init(params["input"]["bias"]))
    hash_fn = tables = None
    if method == "lsh":
        hash_fn = lsh_spec.init(k_hash, hidden)
        layout = dict(capacity=table_capacity, pending_rows=pending_rows) if table_capacity else dict(keep_codes=True)
        tables = _build(hash_fn, params["output"]["weight"], k_tables, **layout)
    return SlideState(params=params, opt_state=opt_state, hash_fn=hash_fn, tables=tables,
                      step=jnp.zeros((), jnp.int32), lsh_spec=lsh_spec if method == "lsh" else None)


def model_params(params: Params) -> Params:
    """A state's params as the Flax modules take them (bfloat16 tables back from their uint16 storage)."""
    return jax.tree_util.tree_map(sparse_adam.from_storage, params)


def _build(hash_fn: Any, weight: jax.Array, key: jax.Array, **layout: int) -> Any:
    return lsh.build_tables(hash_fn, sparse_adam.from_storage(weight).astype(jnp.float32), key, **layout)


@functools.partial(jax.jit, donate_argnums=0)
def rebuild(state: SlideState, key: jax.Array) -> SlideState:
    """Re-inserts the current rows of W into the LSH tables (same hash functions, same layout; lsh.rebuild:
    with kept codes, only the rows the steps changed are hashed again)."""
    weight = sparse_adam.from_storage(state.params["output"]["weight"])
    return state.replace(tables=lsh.rebuild(state.hash_fn, state.tables, weight, key))


@functools.partial(jax.jit, donate_argnums=0)
def refile(state: SlideState, key: jax.Array) -> SlideState:
    """Moves the rows of W changed since the last refile or rebuild to the buckets they hash to now
    (lsh.refile; lsh.BucketTables only): O(changed rows), where a rebuild is O(N)."""
    return state.replace(tables=lsh.refile(state.hash_fn, state.tables,
                                           sparse_adam.from_storage(state.params["output"]["weight"]), key))


def changed_rows_per_step(candidate_mode: str, num_candidates: int, batch_size: int, own_per_example: int) -> int:
    """How many row ids of W a sparse step notes as changed, padding included: the `pending_rows` of
    init_state for one step between refiles. Shared: M. Per example: B * own_per_example + m in whole
    `sparse_adam` blocks, own_per_example being the width of each example's own ids (labels, Lmax, plus
    retrieved ids, L * bucket_capacity)."""
    _check(candidate_mode, CANDIDATE_MODES, "candidate_mode")
    if candidate_mode == "shared":
        return num_candidates
    return sparse_adam.padded_size(batch_size * own_per_example + num_candidates)


@functools.partial(jax.jit, donate_argnums=0)
def redraw(state: SlideState, key: jax.Array) -> SlideState:
    """Draws new hash functions and builds the tables for them."""
    k_hash, k_tables = jax.random.split(key)
    weight = state.params["output"]["weight"]
    hash_fn = state.lsh_spec.init(k_hash, weight.shape[1])
    return state.replace(hash_fn=hash_fn, tables=_build(hash_fn, weight, k_tables, **lsh.layout(state.tables)))


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
            sampler=sampler, dtype=compute_dtype, row_opt=sparse_adam.row_adam(learning_rate, b1, b2, eps),
            hidden_opt=optax.adam(learning_rate, b1=b1, b2=b2, eps=eps))
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
    min_count, sampler, dtype, row_opt, hidden_opt,
) -> tuple[SlideState, dict]:
    p_in, p_out = state.params["input"], state.params["output"]
    num_features = p_in["embedding"].shape[0]
    num_labels = p_out["weight"].shape[0]
    feat_ids, labels = batch["feat_ids"], batch["labels"]

    # Input layer on the batch's unique active features only; gradients come out summed per unique row.
    # Slots in whole blocks of E's row Adam (sparse_adam.update_blocks), which otherwise pads a copy each step.
    feat_rows, inv = unique_rows(feat_ids, num_features, sparse_adam.padded_size(feat_ids.size))
    e_rows = _rows_at(p_in["embedding"], feat_rows)
    h, hidden_vjp = jax.vjp(lambda r, bias: model.embedding_sum(r[inv], batch["feat_vals"], bias, dtype),
                            e_rows, p_in["bias"])

    retrieved = None
    if use_lsh:
        retrieved = lsh.query(state.hash_fn, state.tables, jax.lax.stop_gradient(h), bucket_capacity)
    if shared:
        cand, mask = batch_shared_candidates(labels, retrieved, key, num_candidates, num_labels, min_count,
                                             sampler)
        targets = shared_targets(labels, cand, num_labels)
        # One gather of the candidate rows; differentiate with respect to the gathered rows, never all of W.
        rows, w_rows, b_rows = cand, _rows_at(p_out["weight"], cand), _rows_at(p_out["bias"], cand)

        def out_loss(w, b, hh):
            return model.softmax_xent(model.candidate_logits(w, b, hh, dtype), targets, mask)

        loss, (g_w, g_b, g_h) = jax.value_and_grad(out_loss, argnums=(0, 1, 2))(w_rows, b_rows, h)
        active = jnp.sum(mask)
        used = jnp.int32(cand.shape[0])  # every slot: the M candidates (padding ids among them are dropped)
    else:
        retrieved = None if retrieved is None else retrieved.reshape(labels.shape[0], -1)
        sets = per_example_candidates(labels, retrieved, key, num_candidates, num_labels, sampler)
        loss, rows, used, (g_w, g_b, g_h) = _per_example_output(p_out, h, labels, sets, dtype)
        active = (jnp.sum(sets.own < num_labels) + jnp.sum(sets.fill_mask)) / labels.shape[0]
    g_e, g_hb = hidden_vjp(g_h)

    # Every row Adam runs block by block (sparse_adam.update_blocks), which keeps each block's gathered rows
    # and updates in cache between the gathers, the arithmetic and the scatters. E's over the blocks that hold
    # the batch's distinct features (feat_rows lists them first; the slots are sized for B * max_features ids:
    # 9,178 distinct features in slide_bench's 12,288): the whole step 0.86-0.91x as long as with one update
    # over every slot. W's and b's over all M shared candidates (re-gathering W's rows rather than reusing the
    # forward's): 0.94x. The same bits either way (docs/benchmarks.md, "Why the step misses its arithmetic
    # floor").
    distinct = sparse_adam.real_ids(feat_rows, num_features)
    tables, opt_rows = row_opt.update(
        {"embedding": g_e, "weight": g_w, "out_bias": g_b},
        {"embedding": feat_rows, "weight": rows, "out_bias": rows},
        state.opt_state.rows, row_tables(state.params), used={"embedding": distinct, "weight": used, "out_bias": used})
    hb_updates, opt_hb = hidden_opt.update(g_hb, state.opt_state.hidden_bias)
    params = {"input": {"embedding": tables["embedding"], "bias": optax.apply_updates(p_in["bias"], hb_updates)},
              "output": {"weight": tables["weight"], "bias": tables["out_bias"]}}
    opt_state = SparseOptState(rows=opt_rows, hidden_bias=opt_hb)
    tables = lsh.note_changed(state.tables, rows) if use_lsh else state.tables  # for rebuild or refile
    metrics = {"loss": loss, "candidates": active}
    return state.replace(params=params, opt_state=opt_state, tables=tables, step=state.step + 1), metrics


def _per_example_output(p_out: dict, h: jax.Array, labels: jax.Array, sets: PerExample, dtype: Any):
    """The output layer's loss and row gradients over per-example candidate sets.

    Each example's own ids (labels, retrieved: [B, W] slots) are scored row by row, the batch's fill as one
    [B, H] x [H, m] product, one softmax over both per example. Examples share rows: each id's gradient rows
    are summed into one row per distinct id (`compact_rows`, first slot first), which the Adam updates block
    by block (`sparse_adam.update_blocks`: the distinct rows are about two thirds of the slots).
    Returns (loss, rows int32 [S] (the distinct ids first, then N; S: B * W + m in whole Adam blocks),
    used int32 [] (distinct ids), (g_w [S, H], g_b [S], g_h [B, H])).
    """
    num_labels = p_out["weight"].shape[0]
    m = sets.fill.shape[0]
    mask = jnp.concatenate([sets.own < num_labels, sets.fill_mask], axis=1)
    targets = jnp.pad(per_example_targets(labels, sets.own, num_labels), ((0, 0), (0, m)))  # no label in fill
    gathered = [_rows_at(p_out[name], ids) for ids in (sets.own, sets.fill) for name in ("weight", "bias")]

    def out_loss(w_own, b_own, w_fill, b_fill, hh):
        z = jnp.concatenate([model.candidate_logits(w_own, b_own, hh, dtype),
                             model.candidate_logits(w_fill, b_fill, hh, dtype)], axis=1)
        return model.softmax_xent(z, targets, mask)

    loss, (g_wo, g_bo, g_wf, g_bf, g_h) = jax.value_and_grad(out_loss, argnums=(0, 1, 2, 3, 4))(*gathered, h)
    ids = jnp.concatenate([sets.own.ravel(), sets.fill])
    size = sparse_adam.padded_size(ids.size)
    rows, index = compact_rows(ids, num_labels, size)
    g_w = jax.ops.segment_sum(jnp.concatenate([g_wo.reshape(-1, g_wo.shape[-1]), g_wf]), index, size)
    g_b = jax.ops.segment_sum(jnp.concatenate([g_bo.ravel(), g_bf]), index, size)
    return loss, rows, sparse_adam.real_ids(rows, num_labels), (g_w, g_b, g_h)
