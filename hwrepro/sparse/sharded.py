"""SLIDE's training step and evaluation over a (data, model) device mesh, with `jax.shard_map`.

The single-device path (hwrepro.sparse.training) is untouched; this module reuses its state, its pieces
(unique_rows, batch_shared_candidates, the row-sparse Adam, the model's logits) and adds what sharding needs.

Layout (N_pad, F_pad = num_labels, num_features rounded up to a multiple of `model`; n = N_pad / model rows
per shard; shard s owns global label ids [s * n, (s + 1) * n) and feature ids [s * F_pad / model, ...); the
<= model - 1 padding rows at the end are zero, never a candidate (the last shard's tables hold them, and its
selection skips them), never scored, never read with a nonzero value):
  W [N_pad, H], b [N_pad], their row-Adam moments (or dense Adam moments)   P("model"): split by label
  E [F_pad, H] and its moments                                               P("model"): split by feature
  LSH tables: ids int32 [model, L, n] (local ids), starts [model, L, buckets + 1]  P("model"): one set per shard
  hidden bias [H], its Adam moments, hash functions, counters               P(): replicated
  batches (feat_ids, feat_vals, labels) [B, ...]                             P("data"): split by example
Each shard builds and rebuilds its tables over its own rows only (outside shard_map: `build_tables`); the
hash functions are shared.

A sparse step ("lsh", "sampled"; batch-shared candidates), per device (d, s), with B' = B / data:
  1. h [B', H]: each shard sums the local batch's features it owns (its unique rows of E), one psum over
     `model` of [B', H] adds the parts, then bias and ReLU. No shard repeats another's work on E.
  2. all_gather over `data` of labels [B, Lmax] int32 (and, for lsh, of h [B, H]): every data replica of shard
     s sees the whole batch, so all of them select the same candidates and apply the same update.
  3. Candidates on shard s only: the batch's true labels that s owns, ids retrieved from s's tables (at most
     bucket_capacity / model of each bucket: the mesh reads as many ids a bucket as one device does), random
     ids of s (key folded with s; log_uniform by global rank): M / model local ids, so no shard touches
     another's rows.
  4. Logits [B', M / model] at the local candidates. The softmax over the union of all shards' candidates is
     exact: pmax over `model` of the row maxima [B', 1], then one psum over `model` of [B', 3] (sum of exp,
     target weight, target . logits). Loss: psum over `data` of a scalar.
  5. Gradients: the hidden activations' g_h [B', H] psum over `model` (every shard holds part of the
     logits), so every shard back-propagates the same g_h into its own rows of E; W and b rows
     [M / model, H + 1] psum over `data` (same rows on every data replica); hidden-bias gradient [H] psum
     over `data`.
  6. E's rows with data > 1, reduced sparse row updates: all_gather over `data` of each replica's unique
     local feature ids [B' F] and gradient rows [B' F, H], then one unique + segment sum, so every replica
     of shard s applies the same row-sparse Adam update to the same rows.
  7. Row-sparse Adam on the local rows of W, b and E; dense Adam on the hidden bias.
  Per step and device, in float32 words: all_gather B Lmax (+ B H for lsh) and, with data > 1, B F (H + 1);
  psums of 3 B' + 1 (+ B' for pmax) over `model`, 2 B' H over `model` (h forward, g_h backward),
  (M / model) (H + 1) + H + 1 over `data`.

The dense method (vocab-parallel full softmax): h as in step 1 (over each shard's whole part of E), logits
[B', n] on each shard's rows, the same exact normaliser (step 4), then dense gradients: g_h psum over
`model`, and over `data` the dense gradients of everything (W, b, E shards [n, H + 1], [F_pad / model, H],
hidden bias): plain data parallelism.

Bits: a sharded run's parameters are not bit-equal to the one-device run's, also for dense, where the
computation is the same up to its order: the normaliser is a sum of per-shard partial sums (psum) where one
device sums all logits in one reduction, h and g_h sums of per-shard parts, so float rounding differs in the
last bits from the first step on (tests: equal within 1e-6 relative after one step; P@k of whole runs equal
within noise). The same mesh over processes (jax.distributed, gloo) gives the in-process mesh's bits: the
reductions have the same operands in the same order.

Evaluation: each shard scores its own rows (chunked top-k), all_gather over `model` of its top-k
[B', k] values and ids, and one top-k of the model * k merged: the global top-k, equal to unsharded scoring.

    mesh = parallel.mesh(config)                               # axes ("data", "model")
    state = init_state(mesh, key, num_features, num_labels, hidden, method="lsh")
    step = make_train_step(mesh, "lsh", num_labels=num_labels, ...); state, metrics = step(state, batch, key)
    ids = topk(mesh, state.params, batch, k, num_labels=num_labels)
"""

from __future__ import annotations

import functools
import types
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from hwrepro.harness import parallel
from hwrepro.models import sparse_layers as model
from hwrepro.sparse import lsh, sparse_adam, training
from hwrepro.sparse.candidates import SAMPLERS, batch_shared_candidates, unique_rows
from hwrepro.sparse.evaluation import lsh_logits, scored_topk, top_k_of
from hwrepro.sparse.training import Batch, LshSpec, Params, SlideState, SparseOptState, StepFn, row_tables

DATA, MODEL = "data", "model"
METHODS = training.METHODS


def _names(path) -> list[str]:
    return [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", "")))) for k in path]


def state_specs(state: Any) -> Any:
    """The PartitionSpec of every leaf of a SlideState (or of its params / optimizer state): P("model") for
    the output layer, the input embedding, their moments and the LSH tables (split along their first axis),
    P() for the rest."""
    def spec(path, leaf):
        names = _names(path)
        if "hash_fn" in names:
            return P()
        if {"tables", "output", "weight", "out_bias", "embedding"} & set(names):
            return P(MODEL)
        return P()
    return jax.tree_util.tree_map_with_path(spec, state)


def _shard_map(f, mesh, in_specs, out_specs):
    # Collectives are written out explicitly in each local function; check_vma=False leaves them as written.
    return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def _batch_specs(batch: Batch) -> Any:
    return jax.tree_util.tree_map(lambda _: P(DATA), batch)


def _axis_size(mesh, name: str) -> int:
    return mesh.shape[name]


# -------------------------------------------------------------------------------------------------- state


def init_state(
    mesh: jax.sharding.Mesh,
    key: jax.Array,
    num_features: int,
    num_labels: int,
    hidden: int = 128,
    *,
    method: str = "lsh",
    param_dtype: Any = jnp.float32,
    moment_dtype: Any = jnp.float32,
    lsh_spec: LshSpec = LshSpec(),
    params: Params | None = None,
) -> SlideState:
    """training.init_state's state laid out over `mesh` (module docstring): the same parameter values (same
    key use, or `params`: the modules' view in the single-device layout), W, b and E padded with zero rows to
    N_pad and F_pad, and LSH tables built per shard over its own rows."""
    # training.init_state's draws exactly (the "lsh" tables are built below, per shard, with its table key),
    # then padded and placed: the whole W passes through one device once.
    state = training.init_state(key, num_features, num_labels, hidden,
                                method="sampled" if method == "lsh" else method, param_dtype=param_dtype,
                                moment_dtype=moment_dtype, params=params)
    state = place(mesh, state)
    if method != "lsh":
        return state
    _, k_hash, k_tables = jax.random.split(key, 3)
    hash_fn = jax.device_put(lsh_spec.init(k_hash, hidden), NamedSharding(mesh, P()))
    tables = build_tables(mesh, hash_fn, state.params["output"]["weight"], k_tables)
    return state.replace(hash_fn=hash_fn, tables=tables, lsh_spec=lsh_spec)


def place(mesh: jax.sharding.Mesh, tree: Any) -> Any:
    """A state, or the modules' parameters, in the single-device layout laid out over `mesh` (module
    docstring): the leaves `state_specs` splits over `model` padded with zero rows to N_pad / F_pad, the rest
    replicated. How a model trained anywhere is placed for `topk_scored`."""
    shards, specs = _axis_size(mesh, MODEL), state_specs(tree)
    tree = jax.tree_util.tree_map(
        lambda x, spec: jnp.pad(x, [(0, -x.shape[0] % shards)] + [(0, 0)] * (x.ndim - 1)) if spec == P(MODEL)
        else x, tree, specs)
    return jax.device_put(tree, jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), specs))


def build_tables(mesh: jax.sharding.Mesh, hash_fn: Any, weight: jax.Array, key: jax.Array) -> lsh.Tables:
    """LSH tables per shard over its own rows of weight [N_pad, H] (P("model")): Tables(ids int32
    [model, L, n] local ids, starts [model, L, buckets + 1]), P("model"). Shard s's in-bucket order is drawn
    from key folded with s (one model shard: from key itself, the one-device tables). No collectives: each
    process builds the shards it holds, once per model shard, and copies them to that shard's other data
    replicas' devices.

    Built outside shard_map, one lsh.build_tables (a single-device jit, NumPy's sort on the CPU) per model
    shard: XLA:CPU deadlocks when several devices of one program each run a pure_callback on a large operand
    (as in a shard_map), and XLA's sort, which would avoid the callback, is slower than NumPy's
    (docs/benchmarks.md, "The sharded step on two CPU devices").
    """
    sharding = NamedSharding(mesh, P(MODEL))
    rows = weight.shape[0] // _axis_size(mesh, MODEL)
    built: dict[int, lsh.Tables] = {}
    per_device = []
    for shard in weight.addressable_shards:
        s = (shard.index[0].start or 0) // rows
        if s not in built:
            fn, k = _on_device((hash_fn, key), shard.device)
            w = sparse_adam.from_storage(shard.data).astype(jnp.float32)
            # One model shard builds with the key itself: a data-parallel-only run has the one-device tables.
            built[s] = lsh.build_tables(fn, w, jax.random.fold_in(k, s) if _axis_size(mesh, MODEL) > 1 else k)
        per_device.append(jax.device_put(built[s], shard.device))
    return jax.tree_util.tree_map(
        lambda *parts: jax.make_array_from_single_device_arrays(
            (_axis_size(mesh, MODEL), *parts[0].shape), sharding, [x[None] for x in parts]),
        *per_device)


def _on_device(tree: Any, device: jax.Device) -> Any:
    """A replicated pytree's local copy on one device (also when the mesh spans processes)."""
    return jax.tree_util.tree_map(
        lambda x: jax.device_put(x.addressable_data(0) if isinstance(x, jax.Array) else x, device), tree)


def rebuild(mesh: jax.sharding.Mesh, state: SlideState, key: jax.Array) -> SlideState:
    """Re-inserts each shard's current rows of W into its own tables (same hash functions)."""
    return state.replace(tables=build_tables(mesh, state.hash_fn, state.params["output"]["weight"], key))


def redraw(mesh: jax.sharding.Mesh, state: SlideState, key: jax.Array) -> SlideState:
    """Draws new (shared) hash functions and builds every shard's tables for them."""
    k_hash, k_tables = jax.random.split(key)
    weight = state.params["output"]["weight"]
    hash_fn = jax.device_put(state.lsh_spec.init(k_hash, weight.shape[1]), NamedSharding(mesh, P()))
    return state.replace(hash_fn=hash_fn, tables=build_tables(mesh, hash_fn, weight, k_tables))


def gathered_params(params: Params, num_features: int, num_labels: int) -> Params:
    """The modules' parameters in the single-device layout (padding rows dropped), as NumPy arrays gathered
    from every shard and process: what param_sha256 hashes, comparable with an unsharded run."""
    params = jax.tree_util.tree_map(parallel.to_host, training.model_params(params))
    p_in, out = params["input"], params["output"]
    return {"input": {"embedding": p_in["embedding"][:num_features], "bias": p_in["bias"]},
            "output": {"weight": out["weight"][:num_labels], "bias": out["bias"][:num_labels]}}


# ------------------------------------------------------------------------------------------ the exact softmax


def _local_labels(labels: jax.Array, offset: jax.Array, rows: int, num_labels: int) -> jax.Array:
    """labels int32 [...] (global, padded with num_labels) as this shard's local ids; others -> rows."""
    mine = (labels >= offset) & (labels < offset + rows) & (labels < num_labels)
    return jnp.where(mine, labels - offset, rows)


def _targets(labels: jax.Array, local_labels: jax.Array, cand: jax.Array, rows: int, num_labels: int) -> jax.Array:
    """float32 [B', M'] targets at this shard's candidates cand [M'] (local ids in [0, rows], rows = padding):
    1/|labels_b| (counted over all shards) at each of the example's labels this shard holds as a candidate."""
    m = cand.shape[0]
    pos = jnp.full(rows, m, jnp.int32).at[cand].set(jnp.arange(m, dtype=jnp.int32), mode="drop")
    return model.label_targets(labels, num_labels, columns=pos.at[local_labels].get(mode="fill", fill_value=m),
                               width=m)


def sharded_xent(logits: jax.Array, targets: jax.Array, mask: jax.Array, batch_size: int
                 ) -> tuple[jax.Array, jax.Array]:
    """model.softmax_xent over the union of every `model` shard's columns, and its gradient.

    logits, targets float32 [B', M'] (this shard's columns of this data replica's examples); mask bool
    [M'] or [B', M'] (False: not in the softmax); batch_size: B, the global batch. Sends a pmax of [B', 1] and
    a psum of [B', 3] over `model`, a psum of one scalar over `data`.

    Returns (loss, replicated: the mean cross-entropy over the global batch; d loss / d logits [B', M']).
    """
    mask = jnp.broadcast_to(mask, logits.shape)
    z_max = lax.pmax(jnp.max(jnp.where(mask, logits, -jnp.inf), axis=-1, keepdims=True), MODEL)
    e = jnp.where(mask, jnp.exp(logits - z_max), 0.0)
    parts = jnp.concatenate([jnp.sum(e, axis=-1, keepdims=True), jnp.sum(targets, axis=-1, keepdims=True),
                             jnp.sum(jnp.where(targets > 0, targets * logits, 0.0), axis=-1, keepdims=True)], -1)
    s, weight, tz = jnp.split(lax.psum(parts, MODEL), 3, axis=-1)
    loss = lax.psum(jnp.sum(weight * (z_max + jnp.log(s)) - tz), DATA) / batch_size
    return loss, (e * (weight / s) - targets) / batch_size


# ----------------------------------------------------------------------------------------------------- steps


def _select(state: SlideState, all_labels: jax.Array, all_h: jax.Array | None, key: jax.Array, *, num_labels,
            m_local, bucket_capacity, min_count, sampler) -> tuple[jax.Array, jax.Array]:
    """This shard's candidates for the whole batch: local ids int32 [M'] ascending (rows at unfilled slots)
    and mask bool [M']. Labels it owns, ids from its own tables, random ids of its own rows; never another's."""
    rows = state.params["output"]["weight"].shape[0]
    shard = lax.axis_index(MODEL)
    offset = shard * rows
    retrieved = None
    if all_h is not None:
        tables = lsh.Tables(ids=state.tables.ids[0], starts=state.tables.starts[0])
        # The mesh reads bucket_capacity ids of a bucket in all, as one device does: each shard its share.
        retrieved = lsh.query(state.hash_fn, tables, all_h, -(-bucket_capacity // lax.psum(1, MODEL)))
    # One shard draws with the step's key itself: a data-parallel-only run picks the single-device candidates.
    key = key if lax.psum(1, MODEL) == 1 else jax.random.fold_in(key, shard)
    # The last shard's padding rows are never candidates; log_uniform draws rank ids globally.
    return batch_shared_candidates(_local_labels(all_labels, offset, rows, num_labels), retrieved, key, m_local,
                                   rows, min_count, sampler, num_valid=jnp.minimum(rows, num_labels - offset),
                                   offset=offset)


def _local_features(batch: Batch, rows: int) -> tuple[jax.Array, jax.Array]:
    """This shard's part of the batch's features (E split by feature): ids int32 [B', F] local to its `rows`
    rows of E (`rows` where another shard owns the feature) and values [B', F] (zero there). Padding slots
    (id num_features, value zero) stay zero wherever they land."""
    ids = batch["feat_ids"] - lax.axis_index(MODEL) * rows
    mine = (ids >= 0) & (ids < rows)
    return jnp.where(mine, ids, rows), jnp.where(mine, batch["feat_vals"], 0)


def _hidden(table, bias, ids, vals, dtype):
    """h float32 [B', H] = ReLU(psum over `model` of feature_sum(table[ids], vals) + bias): each shard sums
    its own features, one psum of [B', H] adds the parts. ids int32 [B', F] into table [T, H] (clamped: a
    slot past the table has value zero). Returns h and its backward: g_h [B', H], the same on every shard
    (after its psum) -> (d table [T, H], d bias [H]). The backward is written out rather than left to
    autodiff, which would also transpose the psum."""
    pre, vjp = jax.vjp(lambda t: model.feature_sum(t.at[ids].get(mode="clip"), vals, dtype), table)
    h = jax.nn.relu(lax.psum(pre, MODEL) + bias.astype(jnp.float32))

    def backward(g_h):
        g_pre = jnp.where(h > 0, g_h, 0.0)
        return vjp(g_pre)[0], jnp.sum(g_pre, axis=0)

    return h, backward


def _sparse_hidden(p_in, batch, dtype):
    """`_hidden` on the local batch's unique feature rows of this shard: h, its backward and the unique local
    rows int32 [B' F] (padded with E's local row count)."""
    feat_ids, feat_vals = _local_features(batch, p_in["embedding"].shape[0])
    feat_rows, inv = unique_rows(feat_ids, p_in["embedding"].shape[0])
    e_rows = training._rows_at(p_in["embedding"], feat_rows)
    return (*_hidden(e_rows, p_in["bias"], inv, feat_vals, dtype), feat_rows)


def _dense_hidden(p_in, batch, dtype):
    """`_hidden` over this shard's whole part of E."""
    return _hidden(p_in["embedding"], p_in["bias"], *_local_features(batch, p_in["embedding"].shape[0]), dtype)


def _gather_batch(x: jax.Array, data: int) -> jax.Array:
    return x if data == 1 else lax.all_gather(x, DATA, tiled=True)


def _sparse_step(state: SlideState, batch: Batch, key: jax.Array, *, use_lsh, num_labels, m_local, bucket_capacity,
                 min_count, sampler, dtype, row_opt, hidden_opt, data, batch_size) -> tuple[SlideState, dict]:
    p_in, p_out = state.params["input"], state.params["output"]
    rows = p_out["weight"].shape[0]
    offset = lax.axis_index(MODEL) * rows
    h, hidden_vjp, feat_rows = _sparse_hidden(p_in, batch, dtype)

    all_h = _gather_batch(jax.lax.stop_gradient(h), data) if use_lsh else None
    cand, mask = _select(state, _gather_batch(batch["labels"], data), all_h, key, num_labels=num_labels,
                         m_local=m_local, bucket_capacity=bucket_capacity, min_count=min_count, sampler=sampler)
    targets = _targets(batch["labels"], _local_labels(batch["labels"], offset, rows, num_labels), cand, rows,
                       num_labels)

    w_rows = training._rows_at(p_out["weight"], cand)
    b_rows = training._rows_at(p_out["bias"], cand)
    z, logits_vjp = jax.vjp(lambda w, b, hh: model.candidate_logits(w, b, hh, dtype), w_rows, b_rows, h)
    loss, g_z = sharded_xent(z, targets, mask, batch_size)
    g_w, g_b, g_h = logits_vjp(g_z)
    g_e, g_hb = hidden_vjp(lax.psum(g_h, MODEL))
    if data > 1:
        g_w, g_b, g_hb = lax.psum((g_w, g_b, g_hb), DATA)
        # E's shard replicated over data, reduced sparse rows: every replica sums the same gathered rows alike.
        all_rows = lax.all_gather(feat_rows, DATA, tiled=True)
        feat_rows, slot = unique_rows(all_rows, p_in["embedding"].shape[0])
        g_e = jax.ops.segment_sum(lax.all_gather(g_e, DATA, tiled=True), slot, all_rows.size)

    # Block by block, as the one-device step (training._sparse_step): E's over the blocks that hold this
    # shard's distinct features (listed first), W's and b's over all of its candidate slots.
    distinct = sparse_adam.real_ids(feat_rows, p_in["embedding"].shape[0])
    slots = jnp.int32(cand.shape[0])
    tables, opt_rows = row_opt.update(
        {"embedding": g_e, "weight": g_w, "out_bias": g_b},
        {"embedding": feat_rows, "weight": cand, "out_bias": cand},
        state.opt_state.rows, row_tables(state.params),
        used={"embedding": distinct, "weight": slots, "out_bias": slots})
    hb_updates, opt_hb = hidden_opt.update(g_hb, state.opt_state.hidden_bias)
    params = {"input": {"embedding": tables["embedding"], "bias": optax.apply_updates(p_in["bias"], hb_updates)},
              "output": {"weight": tables["weight"], "bias": tables["out_bias"]}}
    metrics = {"loss": loss, "candidates": lax.psum(jnp.sum(mask), MODEL).astype(jnp.float32)}
    return state.replace(params=params, opt_state=SparseOptState(rows=opt_rows, hidden_bias=opt_hb),
                         step=state.step + 1), metrics


def _dense_step(state: SlideState, batch: Batch, key: jax.Array, *, tx, dtype, num_labels, data, batch_size
                ) -> tuple[SlideState, dict]:
    del key
    params = state.params
    p_in, p_out = params["input"], params["output"]
    rows = p_out["weight"].shape[0]
    offset = lax.axis_index(MODEL) * rows
    h, hidden_vjp = _dense_hidden(p_in, batch, dtype)
    z, logits_vjp = jax.vjp(lambda w, b, hh: model.candidate_logits(w, b, hh, dtype), p_out["weight"],
                            p_out["bias"], h)
    local = _local_labels(batch["labels"], offset, rows, num_labels)
    targets = model.label_targets(batch["labels"], num_labels, columns=local, width=rows)
    loss, g_z = sharded_xent(z, targets, offset + jnp.arange(rows) < num_labels, batch_size)
    g_w, g_b, g_h = logits_vjp(g_z)
    g_e, g_hb = hidden_vjp(lax.psum(g_h, MODEL))
    grads = {"input": {"embedding": g_e, "bias": g_hb}, "output": {"weight": g_w, "bias": g_b}}
    if data > 1:
        grads = lax.psum(grads, DATA)
    updates, opt_state = tx.update(grads, state.opt_state, params)
    metrics = {"loss": loss, "candidates": jnp.asarray(num_labels, jnp.float32)}
    return state.replace(params=optax.apply_updates(params, updates), opt_state=opt_state,
                         step=state.step + 1), metrics


def make_train_step(
    mesh: jax.sharding.Mesh,
    method: str,
    *,
    num_labels: int,
    batch_size: int,
    learning_rate: float = 1e-4,
    num_candidates: int = 8192,
    bucket_capacity: int = 16,
    min_count: int = 2,
    sampler: str = "uniform",
    compute_dtype: Any = jnp.float32,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
) -> StepFn:
    """training.make_train_step over `mesh`: a jitted `(state, batch, key) -> (state, metrics)` donating state.

    Batch-shared candidates only: num_candidates (M) must be a multiple of the `model` axis, each shard
    choosing M / model of its own; bucket_capacity is the mesh's (each shard reads bucket_capacity / model ids,
    rounded up, of each of its own buckets). batch_size: B, the global batch (a multiple of the `data` axis).
    sampler "log_uniform": each shard draws its fill from the global Zipf law over label ids restricted to its
    own rows (`candidates.sample_labels`' offset).
    What each step sends between devices: the module docstring.
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not one of {', '.join(map(repr, METHODS))}")
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler={sampler!r} is not one of {', '.join(map(repr, SAMPLERS))}")
    shards, data = _axis_size(mesh, MODEL), _axis_size(mesh, DATA)
    if method == "dense":
        local = functools.partial(_dense_step, tx=optax.adam(learning_rate, b1=b1, b2=b2, eps=eps),
                                  dtype=compute_dtype, num_labels=num_labels, data=data, batch_size=batch_size)
    else:
        if num_candidates % shards:
            raise ValueError(f"num_candidates={num_candidates} is not a multiple of the {shards} model shards")
        local = functools.partial(
            _sparse_step, use_lsh=method == "lsh", num_labels=num_labels, m_local=num_candidates // shards,
            bucket_capacity=bucket_capacity, min_count=min_count, sampler=sampler, dtype=compute_dtype,
            row_opt=sparse_adam.row_adam(learning_rate, b1, b2, eps),
            hidden_opt=optax.adam(learning_rate, b1=b1, b2=b2, eps=eps), data=data, batch_size=batch_size)

    def step(state, batch, key):
        specs = state_specs(state)
        return _shard_map(local, mesh, (specs, _batch_specs(batch), P()), (specs, P()))(state, batch, key)

    return _one_at_a_time(mesh, jax.jit(step, donate_argnums=0))


def _one_at_a_time(mesh: jax.sharding.Mesh, fn: Any) -> Any:
    """`fn` (jitted) waiting for its results when several of the mesh's devices share this process's CPU.

    Seen once on 2 cores under heavy load (the main job with parallel.model = 2): one device's part of a step
    waited 40 s in an all-reduce for the other's, and XLA aborted ("Expected 2 threads to join the
    rendezvous"). The likely cause: XLA:CPU runs every device's part of a program on one thread pool sized by
    the cores, and with steps dispatched ahead, parts of the next step can hold those threads. One step in
    flight at a time leaves no such queue; on GPUs and across processes (one device each) dispatching ahead
    is kept.
    """
    local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    if len(local) < 2 or local[0].platform != "cpu":
        return fn

    @functools.wraps(fn)
    def wait(*args, **kwargs):
        return jax.block_until_ready(fn(*args, **kwargs))

    wait.lower = fn.lower
    return wait


def candidates(mesh: jax.sharding.Mesh, state: SlideState, batch: Batch, key: jax.Array, *, num_labels: int,
               num_candidates: int, bucket_capacity: int = 16, min_count: int = 2, sampler: str = "uniform",
               compute_dtype: Any = jnp.float32) -> tuple[jax.Array, jax.Array]:
    """The candidates the step with the same arguments uses, as global ids: int32 [model, M / model] (shard
    s's row, ascending; num_labels at unfilled slots) and the mask bool [model, M / model]."""
    shards, data = _axis_size(mesh, MODEL), _axis_size(mesh, DATA)

    def local(state, batch, key):
        h = _sparse_hidden(state.params["input"], batch, compute_dtype)[0]
        rows = state.params["output"]["weight"].shape[0]
        cand, mask = _select(state, _gather_batch(batch["labels"], data),
                             _gather_batch(h, data) if state.tables is not None else None, key,
                             num_labels=num_labels, m_local=num_candidates // shards,
                             bucket_capacity=bucket_capacity, min_count=min_count, sampler=sampler)
        return jnp.where(mask, cand + lax.axis_index(MODEL) * rows, num_labels)[None], mask[None]

    specs = state_specs(state)
    return jax.jit(_shard_map(local, mesh, (specs, _batch_specs(batch), P()), (P(MODEL), P(MODEL))))(
        state, batch, key)


# ------------------------------------------------------------------------------------------------ evaluation


def _merge_topk(values: jax.Array, ids: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Global top-k from every shard's (values, global ids) [B', k]: all_gather over `model` of both, then one
    top_k of the model * k. Ties go to the lower shard, i.e. the lower id, as in unsharded scoring."""
    values = lax.all_gather(values, MODEL, axis=1, tiled=True)
    ids = lax.all_gather(ids, MODEL, axis=1, tiled=True)
    v, j = lax.top_k(values, k)
    return v, jnp.take_along_axis(ids, j, axis=1)


def topk(mesh: jax.sharding.Mesh, params: Params, batch: Batch, k: int, *, num_labels: int, chunk: int = 131072,
         dtype: Any = jnp.float32) -> jax.Array:
    """evaluation.topk over the mesh: int32 [B, k] (P("data")), best first, equal to unsharded scoring
    (`topk_scored`'s ids)."""
    return topk_scored(mesh, params, batch, k, num_labels=num_labels, chunk=chunk, dtype=dtype)[1]


@functools.partial(jax.jit, static_argnames=("mesh", "k", "num_labels", "chunk", "dtype"))
def topk_scored(mesh: jax.sharding.Mesh, params: Params, batch: Batch, k: int, *, num_labels: int,
                chunk: int = 131072, dtype: Any = jnp.float32) -> tuple[jax.Array, jax.Array]:
    """evaluation.topk_scored over the mesh: (logits float32 [B, k], ids int32 [B, k]), both P("data").

    Each shard scores its own rows (chunks of `chunk`), then `_merge_topk`: sends [B', k] values and ids. k may
    exceed a shard's rows, not num_labels."""
    if k > num_labels:
        raise ValueError(f"topk: k={k} exceeds the {num_labels} labels")

    def local(params, batch):
        params = training.model_params(params)
        p_in, p_out = params["input"], params["output"]
        rows = p_out["weight"].shape[0]
        offset = lax.axis_index(MODEL) * rows
        h = _dense_hidden(p_in, batch, dtype)[0]
        v, ids = scored_topk(p_out["weight"], p_out["bias"], h, k, chunk, dtype, num_valid=num_labels - offset)
        return _merge_topk(v, ids + offset, k)

    return _shard_map(local, mesh, (state_specs(params), _batch_specs(batch)), (P(DATA), P(DATA)))(params, batch)


@functools.partial(jax.jit, static_argnames=("mesh", "k", "num_labels", "bucket_capacity", "dtype",
                                             "max_scored"))
def topk_lsh(mesh: jax.sharding.Mesh, params: Params, hash_fn: Any, tables: lsh.Tables, batch: Batch, k: int, *,
             num_labels: int, bucket_capacity: int = 16, dtype: Any = jnp.float32,
             max_scored: int | None = None) -> jax.Array:
    """evaluation.topk_lsh over the mesh: each shard scores the rows its own tables retrieve, then the merge.
    Each shard reads its share of a bucket's bucket_capacity ids (as the training step's query) and scores
    at most its share of max_scored distinct ids (its most retrieved, rounded up: up to shards - 1 more in
    all); with one model shard, one device's ids. int32 [B, k] (P("data")), -1 where fewer than k neurons
    were retrieved over all shards."""
    shards = mesh.shape[MODEL]
    share = lambda n: None if n is None else -(-n // shards)

    def local(params, hash_fn, tables, batch):
        params = training.model_params(params)
        p_in, p_out = params["input"], params["output"]
        rows = p_out["weight"].shape[0]
        offset = lax.axis_index(MODEL) * rows
        h = _dense_hidden(p_in, batch, dtype)[0]
        ids, z = lsh_logits(p_out["weight"], p_out["bias"], h, hash_fn, lsh.Tables(tables.ids[0], tables.starts[0]),
                            share(bucket_capacity), dtype, max_scored=share(max_scored), num_valid=num_labels - offset)
        v, best = top_k_of(z, ids, k, pad_id=rows)  # a shard may score fewer than k: -inf, dropped as -1 below
        v, ids = _merge_topk(v, best + offset, k)
        return jnp.where(v > -jnp.inf, ids, -1)

    specs = (state_specs(params), P(), lsh.Tables(P(MODEL), P(MODEL)), _batch_specs(batch))
    return _shard_map(local, mesh, specs, P(DATA))(params, hash_fn, tables, batch)


def on_mesh(mesh: jax.sharding.Mesh, num_features: int, num_labels: int, batch_size: int) -> Any:
    """This module's functions bound to a mesh, with hwrepro.sparse's signatures (init_state, make_train_step,
    rebuild, redraw, topk, topk_lsh, model_params), so a training loop written against hwrepro.sparse runs
    sharded by swapping the namespace. model_params gathers the single-device layout (`gathered_params`);
    put_batch places a host batch on the mesh and to_host reads a result back (harness.parallel), also when the
    mesh spans processes."""
    def make_step(method, *, candidate_mode="shared", **kw):
        if candidate_mode != "shared":
            raise ValueError(f"candidate_mode={candidate_mode!r}: the sharded step has batch-shared candidates only")
        return make_train_step(mesh, method, num_labels=num_labels, batch_size=batch_size, **kw)

    return types.SimpleNamespace(
        init_state=functools.partial(init_state, mesh),
        make_train_step=make_step,
        rebuild=functools.partial(rebuild, mesh),
        redraw=functools.partial(redraw, mesh),
        topk=lambda params, batch, k, **kw: topk(mesh, params, batch, k, num_labels=num_labels, **kw),
        topk_lsh=lambda params, hash_fn, tables, batch, k, **kw: topk_lsh(
            mesh, params, hash_fn, tables, batch, k, num_labels=num_labels, **kw),
        model_params=lambda params: gathered_params(params, num_features, num_labels),
        put_batch=functools.partial(parallel.put_batch, mesh),
        to_host=parallel.to_host,
    )
