"""SLIDE: extreme classification (Amazon-670K, WikiLSH-325K) and word2vec (Text8) with an LSH-sparse output
layer, against sampled and dense full softmax in the same code path (`model.method`).

The loop is the shared `fit`; what is SLIDE's own here: the table-rebuild schedule (timed, since rebuilds are
part of SLIDE's cost), precision@k on a fixed shuffled test subset during training and at the end on the test
split (or eval.final_points of it; text8: eval.final_points held-out centres), by dense scoring, plus LSH
scoring for the lsh method.
"""

from __future__ import annotations

import os
import time
import types
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from hwrepro import data as hwdata
from hwrepro import sparse
from hwrepro.data import xc
from hwrepro.errors import ConfigError
from hwrepro.harness import numerics, parallel, trained
from hwrepro.harness.loop import fit, snapshot_spacing, snapshotter
from hwrepro.harness.progress import Progress
from hwrepro.harness.records import Run
from hwrepro.sparse import lsh, sharded
from hwrepro.sparse.hashes import FAMILIES, OptionError, simhash

KS = (1, 3, 5)
MAINTENANCE = ("rebuild", "incremental")  # lsh.maintenance: how the tables follow W between rebuilds
EVAL_TABLES = ("inference", "training")  # eval.lsh.tables: which tables LSH-scored prediction queries
# hwrepro.sparse's functions as the run uses them on one device; sharded.on_mesh gives the same names over a
# mesh, where a batch is first placed on the mesh (put_batch) and results are read back (to_host).
ONE_DEVICE = types.SimpleNamespace(
    **{name: getattr(sparse, name) for name in ("init_state", "make_train_step", "rebuild", "redraw", "refile",
                                                "topk", "topk_lsh", "model_params")},
    put_batch=lambda batch: batch, to_host=np.asarray)


def validate(config: ml_collections.ConfigDict) -> None:
    m, d = config.model, config.data
    sources = hwdata.get(d.dataset, "labels").sources
    if d.source not in sources:
        raise ConfigError(f"data.source={d.source!r} is not one of {', '.join(map(repr, sources))} for "
                          f"data.dataset={d.dataset!r} ('auto': the files under data.dir, or the synthetic "
                          "stand-in when data.dir is empty)")
    FAMILIES.get(config.lsh.kind, "lsh.kind")
    FAMILIES.get(config.eval.lsh.kind, "eval.lsh.kind")
    checks = [("model.method", m.method, sparse.METHODS),
              ("train.moments_dtype", config.train.moments_dtype, numerics.DTYPES),
              ("model.candidate_mode", m.candidate_mode, sparse.CANDIDATE_MODES),
              ("model.sampler", m.sampler, sparse.SAMPLERS),
              ("lsh.maintenance", config.lsh.maintenance, MAINTENANCE),
              ("eval.lsh.tables", config.eval.lsh.tables, EVAL_TABLES)]
    for name, value, allowed in checks:
        if value not in allowed:
            raise ConfigError(f"{name}={value!r} is not one of {', '.join(map(repr, allowed))}")
    for name in ("model.hidden", "model.num_candidates", "model.bucket_capacity", "model.min_count",
                 "data.max_features", "data.max_labels", "lsh.num_hashes", "lsh.num_tables",
                 "lsh.update_every", "eval.subset", "eval.batch_size", "eval.lsh.num_hashes", "eval.lsh.num_tables",
                 "eval.lsh.bucket_capacity", "eval.lsh.max_scored"):
        value = config
        for field in name.split("."):
            value = value[field]
        if value <= 0:
            raise ConfigError(f"{name}={value} must be positive")
    if config.train.adam_eps <= 0:
        raise ConfigError(f"train.adam_eps={config.train.adam_eps} must be positive")
    if config.eval.lsh.probe_bits < 0:
        raise ConfigError(f"eval.lsh.probe_bits={config.eval.lsh.probe_bits} must not be negative")
    if config.lsh.rebuild_period < 0:
        raise ConfigError(f"lsh.rebuild_period={config.lsh.rebuild_period} must not be negative (0: only redraws)")
    if config.eval.final_points < 0:
        raise ConfigError(f"eval.final_points={config.eval.final_points} must not be negative")
    if m.method == "lsh":  # the tables it builds: training tables over w, inference tables over mips_rows
        _check_hash_family(config, "lsh", m.hidden)
        if config.eval.lsh.tables == "inference":
            _check_hash_family(config, "eval.lsh", m.hidden + 2)
    if parallel.is_sharded(config) and m.method != "dense":
        if m.candidate_mode != "shared":
            raise ConfigError(f"model.candidate_mode={m.candidate_mode!r}: a parallel.model x parallel.data mesh runs "
                              "batch-shared candidates only")
        if config.eval.lsh.tables == "training" and config.eval.lsh.probe_bits:
            raise ConfigError(f"eval.lsh.probe_bits={config.eval.lsh.probe_bits}: a mesh's training tables answer "
                              "single-probe queries only (eval.lsh.tables='inference' probes)")
        if config.lsh.maintenance != "rebuild":
            raise ConfigError(f"lsh.maintenance={config.lsh.maintenance!r}: a parallel.model x parallel.data mesh "
                              "rebuilds its tables (lsh.maintenance='rebuild')")
        if m.num_candidates % config.parallel.model:
            raise ConfigError(f"model.num_candidates={m.num_candidates} is not a multiple of "
                              f"parallel.model={config.parallel.model}")
    if d.dataset == "text8":  # an example is one centre word and its 2 * window context words
        if d.max_features != 1:
            raise ConfigError(f"data.max_features={d.max_features}: a text8 example has 1 feature, its centre word")
        if d.max_labels != 2 * d.window:
            raise ConfigError(f"data.max_labels={d.max_labels}: a text8 example has 2 * data.window = "
                              f"{2 * d.window} context words (set data.window)")
        if m.candidate_mode == "per_example" and m.num_candidates < 2 * d.window:
            raise ConfigError(f"model.num_candidates={m.num_candidates} is below the {2 * d.window} context words")


def _check_hash_family(config: ml_collections.ConfigDict, group: str, dim: int) -> None:
    """ConfigError naming the field when the hash family of `group` ("lsh" or "eval.lsh") cannot take its K, L
    or options for `dim`-dimensional rows (the family's `check`, if it has one): before any data is read."""
    spec = lsh_spec(config, group)
    check = getattr(FAMILIES.get(spec.kind, f"{group}.kind"), "check", None)
    if check is None:
        return
    try:
        check(dim, spec.num_hashes, spec.num_tables, **dict(spec.options))
    except OptionError as e:
        field = f"{group}.{e.name}" if e.name in ("num_hashes", "num_tables") else f"lsh.{spec.kind}.{e.name}"
        raise ConfigError(f"{field}={e.value!r} {e.problem}") from None


def lsh_spec(config: ml_collections.ConfigDict, group: str = "lsh") -> sparse.LshSpec:
    """The output layer's hash family as the config's `lsh` fields give it (group "eval.lsh": the inference
    tables'); the family's own options are in lsh.<kind> for both."""
    c = config.eval.lsh if group == "eval.lsh" else config.lsh
    options = config.lsh.get(c.kind)  # the family's own options, e.g. lsh.dwta.bin_size
    options = tuple(sorted(options.to_dict().items())) if options is not None else ()
    return sparse.LshSpec(kind=c.kind, num_hashes=c.num_hashes, num_tables=c.num_tables, options=options)


# ------------------------------------------------------------------------------------------------ evaluation


class Precision:
    """P@1, P@3, P@5 summed over batches, as the run's evaluation and `predict_file` count them: the mean over
    the points that have labels (padding rows and unlabelled points left out)."""

    def __init__(self, num_labels: int):
        self.num_labels, self.hits, self.count = num_labels, {k: 0.0 for k in KS}, 0

    def add(self, ids: Any, labels: np.ndarray) -> np.ndarray:
        """Counts a batch: ids int32 [B, >= 5] best first, labels int32 [B, Lmax] (num_labels = padding);
        returns which rows have labels."""
        labelled = np.any(labels < self.num_labels, axis=1)
        for name, p in sparse.precision_at_k(ids, labels, KS, self.num_labels).items():
            self.hits[int(name[2:])] += float(p) * int(labelled.sum())
        self.count += int(labelled.sum())
        return labelled

    def result(self) -> dict[str, float]:
        return {f"P@{k}": self.hits[k] / max(self.count, 1) for k in KS}


def evaluate(predict: Callable, eval_set, batch_size: int, num_labels: int,
             progress: Progress | None = None) -> dict[str, float]:
    """P@1, P@3, P@5 over every labelled point of `eval_set` (padding rows, mask False, are left out).

    predict(batch) -> (top-k ids int32 [B, k >= 5], labels scored per point int32 [B] or None); with the
    counts, also "share_scored": the mean share of all labels scored per point. `progress` (counting
    batches) is for the final evaluation, minutes long at Amazon-670K scale."""
    precision, scored = Precision(num_labels), 0.0
    for i, batch in enumerate(eval_set.ordered(batch_size), 1):
        del batch["mask"]  # padding rows have no labels: precision_at_k leaves them out
        ids, counts = predict(batch)
        labelled = precision.add(ids, batch["labels"])
        if counts is not None:
            scored += float(np.sum(np.asarray(counts)[labelled]))
        if progress is not None:
            progress.update(i, force=i == progress.total)
    out = precision.result()
    return out if scored == 0 else dict(out, share_scored=scored / max(precision.count, 1) / num_labels)


def _features(batch: dict[str, Any]) -> dict[str, Any]:
    """What scoring reads of a batch (a jitted scorer compiles once whatever else the batch carries)."""
    return {"feat_ids": batch["feat_ids"], "feat_vals": batch["feat_vals"]}


def lsh_scorer(config: ml_collections.ConfigDict, params: sparse.Params, k: int, dtype: Any) -> Callable:
    """LSH-scored top-k over inference tables built once from trained parameters (the modules' view, on this
    process's device) as config.eval.lsh says, with the config's seed: batch -> (scores [B, k], ids [B, k],
    labels scored [B]), ids -1 where fewer than k labels were retrieved. The same tables for the run's final
    evaluation and for a model loaded later."""
    e, out = config.eval.lsh, params["output"]
    hash_fn, tables = sparse.inference_tables(out["weight"], out["bias"], lsh_spec(config, "eval.lsh"),
                                              jax.random.key(config.seed))
    options = dict(bucket_capacity=e.bucket_capacity, dtype=dtype, probe_bits=e.probe_bits, inner_product=True,
                   max_scored=e.max_scored)
    return lambda batch: sparse.topk_lsh_scored(params, hash_fn, tables, _features(batch), k, **options)


def predictor(config: ml_collections.ConfigDict, state: sparse.SlideState, use_lsh: bool, dtype: Any,
              ops: Any = ONE_DEVICE) -> Callable:
    """`evaluate`'s predict: dense scoring of every label, or LSH-scored as config.eval.lsh says (for
    "inference" tables, `lsh_scorer`). `ops`: ONE_DEVICE, or its mesh version (hwrepro.sparse.sharded.on_mesh:
    batches placed on the mesh, results read back)."""
    k, e = max(KS), config.eval.lsh
    if not use_lsh:
        return lambda batch: (ops.to_host(ops.topk(state.params, ops.put_batch(batch), k, dtype=dtype)), None)
    if e.tables == "training" and ops is not ONE_DEVICE:  # a mesh: each shard queries its own tables
        return lambda batch: (ops.to_host(ops.topk_lsh(state.params, state.hash_fn, state.tables,
                                                       ops.put_batch(batch), k, bucket_capacity=e.bucket_capacity,
                                                       dtype=dtype, max_scored=e.max_scored)), None)
    if e.tables == "inference":
        params = ops.model_params(state.params)
        if ops is not ONE_DEVICE:  # the mesh's shards, gathered to the host: onto this process's device, once
            params = jax.tree_util.tree_map(jax.numpy.asarray, params)
        score = lsh_scorer(config, params, k, dtype)
    else:
        options = dict(bucket_capacity=e.bucket_capacity, dtype=dtype, probe_bits=e.probe_bits, max_scored=e.max_scored)
        score = lambda batch: sparse.topk_lsh_scored(state.params, state.hash_fn, state.tables, batch, k, **options)
    return lambda batch: score(batch)[1:]


# ------------------------------------------------------------------------------------------- a kept model


def make_predict(config: ml_collections.ConfigDict, params: sparse.Params, *, k: int = 5,
                 lsh: bool = False, devices: int = 1) -> Callable:
    """A trained model's prediction (hwrepro.load): batch {"feat_ids" int32 [B, F] padded with num_features,
    "feat_vals" float32 [B, F]} -> (scores float32 [B, k], label ids int32 [B, k]) as NumPy, best first.
    Dense-scored (every label), or with `lsh` LSH-scored through inference tables built here once (eval.lsh's
    settings, the config's seed: the run's own final LSH-scored evaluation when eval.lsh.tables is "inference",
    the configs' default; a kept model has no training tables, so a run that scored with them ("training") is
    scored here with inference tables); ids -1 (score -inf) where
    fewer than k labels were retrieved. `devices` > 1 (dense only): the output layer split by label over that
    many of this process's devices (sharded.place, sharded.topk_scored), whatever layout it was trained in."""
    dtype = numerics.jnp_dtype(config.numerics.precision)
    num_labels = params["output"]["weight"].shape[0]
    if not 1 <= k <= num_labels:
        raise ConfigError(f"k={k} must be between 1 and the model's {num_labels:,} labels")
    if devices > 1:
        if lsh:
            raise ValueError("make_predict: LSH-scored prediction runs on one device (devices=1)")
        if devices > len(jax.devices()):
            raise ValueError(f"make_predict: devices={devices}, but this process has {len(jax.devices())} (on a CPU: "
                             "numerics.cpu_devices, or XLA_FLAGS=--xla_force_host_platform_device_count, before JAX "
                             "starts)")
        mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:devices]).reshape(1, devices), ("data", "model"))
        placed = sharded.place(mesh, params)
        return lambda batch: tuple(parallel.to_host(x) for x in sharded.topk_scored(
            mesh, placed, parallel.put_batch(mesh, _features(batch)), k, num_labels=num_labels, dtype=dtype))
    params = jax.tree_util.tree_map(jax.numpy.asarray, params)
    if lsh:
        score = lsh_scorer(config, params, k, dtype)
        return lambda batch: tuple(np.asarray(x) for x in score(batch)[:2])
    return lambda batch: tuple(np.asarray(x) for x in sparse.topk_scored(params, _features(batch), k, dtype=dtype))


def predict_file(model: Any, path: str, output: str, *, k: int = 5, lsh: bool = False) -> dict[str, Any]:
    """Scores every point of `path` (an XC file, labels optional, or bare `f:v` lines: xc.read_points) with a
    kept model (hwrepro.harness.trained.Trained) and writes `output`: one line a point, `id:score` of its k
    best labels, best first. Returns the points, seconds, points/s and, when the file has labels, P@1/3/5
    (`Precision`, as the run's evaluation counts them). `output` is written under a temporary name and
    renamed into place when complete."""
    c, p = model.config, model.params
    points = xc.read_points(path, p["input"]["embedding"].shape[0], p["output"]["weight"].shape[0])
    batcher = xc.XCBatcher(points, c.data.max_features, xc.evaluation_label_width(points, c.data.max_labels))
    predict = model.predictor(k=max(k, *KS), lsh=lsh)
    num_batches = -(-points.num_points // c.eval.batch_size)
    progress = Progress(num_batches, f"predict {os.path.basename(path)}" + (" (LSH-scored)" if lsh else ""),
                        unit="batch", units="batches")
    precision = Precision(points.num_labels)
    tmp = f"{output}.tmp{os.getpid()}"
    t = time.time()
    try:
        with open(tmp, "w") as out:
            for i, batch in enumerate(batcher.ordered(c.eval.batch_size), 1):
                rows = int(batch.pop("mask").sum())
                scores, ids = predict(batch)
                precision.add(ids, batch["labels"])
                out.writelines(" ".join(f"{j}:{v:.6g}" for j, v in zip(row_ids[:k], row_scores[:k]) if j >= 0)
                               + "\n" for row_ids, row_scores in zip(ids[:rows].tolist(), scores[:rows].tolist()))
                progress.update(i, force=i == num_batches)
        os.replace(tmp, output)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    seconds = time.time() - t
    result = {"points": points.num_points, "seconds": seconds, "points_per_s": points.num_points / max(seconds, 1e-9)}
    return dict(result, **precision.result()) if precision.count else result


# ------------------------------------------------------------------------------------------------------ run


def run(config: ml_collections.ConfigDict, rec: Run):
    m, d = config.model, config.data
    t_data = time.time()
    data = hwdata.load(config, "labels")
    rec.note_data(data.source, load_seconds=round(time.time() - t_data, 2), **data.details)
    if m.method != "dense" and m.num_candidates > data.num_labels:
        raise ConfigError(f"model.num_candidates={m.num_candidates} exceeds the {data.num_labels:,} labels of "
                          f"data.dataset={d.dataset!r}")
    rec.print(f"{data.num_features:,} features -> {m.hidden} hidden -> {data.num_labels:,} outputs, "
              f"method {m.method}" + (f" ({m.candidate_mode}, {m.num_candidates} candidates)"
                                      if m.method != "dense" else ""))
    compute_dtype = numerics.jnp_dtype(config.numerics.precision)
    ops = ONE_DEVICE  # a mesh: the same functions over it (hwrepro.sparse.sharded)
    if parallel.is_sharded(config):
        mesh = parallel.mesh(config)
        ops = sharded.on_mesh(mesh, data.num_features, data.num_labels, config.train.batch_size)
        rec.note("parallel", parallel.describe(mesh))
        rec.print(f"mesh: data {mesh.shape['data']} x model {mesh.shape['model']} over {jax.device_count()} "
                  f"{jax.default_backend()} devices in {jax.process_count()} process(es)")
    spec = lsh_spec(config)
    init_key, step_key, table_key = jax.random.split(jax.random.key(config.seed), 3)
    incremental = m.method == "lsh" and config.lsh.maintenance == "incremental"
    layout = {}
    if incremental:  # buckets of model.bucket_capacity ids, room for the rows changed between two refiles
        own = data.label_slots + config.lsh.num_tables * m.bucket_capacity  # an example's own ids: labels, retrieved
        per_step = sparse.changed_rows_per_step(m.candidate_mode, m.num_candidates, config.train.batch_size, own)
        layout = dict(table_capacity=m.bucket_capacity, pending_rows=config.lsh.update_every * per_step)
    param_dtype = numerics.jnp_dtype(config.numerics.param_dtype)
    initial = None  # fine-tuning: a finished run's parameters, checked against this run's shapes
    if config.train.init_from:
        fresh = jax.eval_shape(lambda k: sparse.init_params(k, data.num_features, data.num_labels, m.hidden,
                                                            param_dtype), init_key)
        initial = trained.start_from(config, fresh, rec)
    state = ops.init_state(init_key, data.num_features, data.num_labels, m.hidden, method=m.method,
                           param_dtype=param_dtype, moment_dtype=numerics.jnp_dtype(config.train.moments_dtype),
                           lsh_spec=spec, params=initial, **layout)
    step_fn = ops.make_train_step(m.method, learning_rate=config.train.learning_rate,
                                    num_candidates=m.num_candidates, candidate_mode=m.candidate_mode,
                                    bucket_capacity=m.bucket_capacity, min_count=m.min_count, sampler=m.sampler,
                                    compute_dtype=compute_dtype, eps=config.train.adam_eps)
    num_steps = config.train.num_steps or config.train.num_epochs * data.steps_per_epoch

    def train_step(state, batch):
        return step_fn(state, ops.put_batch(batch), jax.random.fold_in(step_key, state.step))

    schedule = lsh.RebuildSchedule(config.lsh.rebuild_period or None, config.lsh.rebuild_decay,
                                   config.lsh.redraw_period or None, config.lsh.redraw_decay)
    timing = {"rebuild_seconds": 0.0, "rebuilds": 0, "eval_seconds": 0.0}
    if incremental:
        timing.update(refile_seconds=0.0, refiles=0)

    def after_step(step, state):
        if m.method != "lsh":
            return state
        due = schedule.due(step)
        if not (due or (incremental and step % config.lsh.update_every == 0)):
            return state
        jax.block_until_ready(state)  # steps still in flight are training time, not table upkeep
        t = time.time()
        key = jax.random.fold_in(table_key, step)
        if not due:
            state = ops.refile(state, key)
        else:
            state = ops.redraw(state, key) if schedule.redraw_due(step) else ops.rebuild(state, key)
        jax.block_until_ready(state.tables)
        what = "rebuild" if due else "refile"
        timing[f"{what}_seconds"] += time.time() - t
        timing[f"{what}s"] += 1
        return state

    def eval_subset(state):
        t = time.time()
        out = evaluate(predictor(config, state, False, compute_dtype, ops), data.subset, config.eval.batch_size,
                       data.num_labels)
        timing["eval_seconds"] += time.time() - t
        return out

    snapshots = config.train.checkpoints  # parameters kept in trajectory.npz (e.g. word vectors to inspect)
    state = fit(state, train_step, data.train_batches(), num_steps=num_steps,
                examples_per_step=config.train.batch_size, rec=rec, log_every=config.train.log_every,
                steps_per_epoch=data.steps_per_epoch, eval_fn=eval_subset, eval_every=config.train.eval_every,
                after_step=after_step, snapshot_every=snapshot_spacing(num_steps, snapshots),
                snapshot_fn=snapshotter(rec, lambda s: ops.model_params(s.params)),
                checkpoint_every=config.train.checkpoint_every,
                checkpoint_keep=config.train.checkpoint_keep, host=timing)
    planes = getattr(state.hash_fn, "planes", None)
    if m.method == "lsh" and planes is not None:  # SimHash's "auto" depends on the machine; a resume keeps the run's
        rec.note("lsh_hash_dtype", next(k for k, v in simhash.DTYPES.items() if np.dtype(v) == planes.dtype))
    train_seconds = timing.pop("train_seconds")

    final = {"method": m.method, "steps": num_steps, "epochs": num_steps / data.steps_per_epoch,
             "train_seconds": train_seconds,
             "seconds_per_epoch": train_seconds * data.steps_per_epoch / num_steps,
             "examples_per_s": num_steps * config.train.batch_size / train_seconds, **timing}
    t = time.time()
    num_batches = -(-data.num_test // config.eval.batch_size)
    for prefix, use_lsh in [("test_", False)] + ([("test_lsh_", True)] if m.method == "lsh" else []):
        scoring = "LSH-scored" if use_lsh else f"all {data.num_labels:,} labels scored"
        progress = Progress(num_batches, f"{config.name} final eval, {scoring}", unit="batch", units="batches")
        t_scoring = time.time()  # an LSH-scored evaluation's time includes building its inference tables
        final.update({prefix + k: v for k, v in evaluate(
            predictor(config, state, use_lsh, compute_dtype, ops), data.test, config.eval.batch_size,
            data.num_labels, progress).items()})
        final[prefix + "seconds"] = time.time() - t_scoring
    final["final_eval_seconds"] = time.time() - t
    kind = config.eval.lsh.kind
    if config.eval.lsh.tables == "inference" and config.lsh.get(kind, {}).get("dtype") == "auto":
        # The inference tables' hashing dtype on this machine: a kept model predicts with the same tables anywhere.
        final[trained.RESOLVED] = {f"lsh.{kind}.dtype": simhash.resolve_dtype("auto")}
    where = f" on {data.num_test:,} test points"  # what was scored (text8: held-out pairs)
    rec.print(f"{m.method}: {final['seconds_per_epoch']:.1f} s/epoch (rebuilds {timing['rebuild_seconds']:.1f} s), "
              + " ".join(f"P@{k} {final[f'test_P@{k}']:.4f}" for k in KS) + where)
    return final, ops.model_params(state.params)
