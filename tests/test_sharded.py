"""The sharded SLIDE step and evaluation (hwrepro.sparse.sharded) against the single-device computation.

The checks need 4 CPU devices, which JAX fixes when it starts, so they run together in one child process
(`python tests/test_sharded.py`) with JAX_NUM_CPU_DEVICES=4; each test reads its result from it. The tiny
problem has 62 labels over 4 model shards: the last shard holds 2 padding rows.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NUM_FEATURES, NUM_LABELS, HIDDEN, BATCH, CANDIDATES, LR = 50, 62, 8, 8, 24, 1e-3
MESHES = {"m4": (1, 4), "d2m2": (2, 2)}  # (data, model)


# ------------------------------------------------------------------------------------------- in the child


def _batch(seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    feat_ids = rng.integers(0, NUM_FEATURES, (BATCH, 6)).astype(np.int32)
    feat_ids[:, -1] = NUM_FEATURES  # padding slot
    feat_vals = rng.random((BATCH, 6)).astype(np.float32) * (feat_ids < NUM_FEATURES)
    labels = rng.integers(0, NUM_LABELS, (BATCH, 3)).astype(np.int32)
    labels[::2, -1] = NUM_LABELS
    labels[1, 0] = NUM_LABELS - 1  # a label on the last shard, next to its padding rows
    return {"feat_ids": feat_ids, "feat_vals": feat_vals, "labels": labels}


def _rel(a, b):
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _reference(params, batch, cand):
    """Single-device loss and one optax Adam step (= row Adam on the touched rows, untouched rows unchanged at
    step 1) with the candidate ids [M] given, or full softmax when cand is None."""
    import jax
    import optax

    from hwrepro.models import sparse_layers as model
    from hwrepro.sparse.candidates import shared_targets

    def loss_fn(p):
        h = model.sparse_hidden(p["input"]["embedding"], p["input"]["bias"], batch["feat_ids"], batch["feat_vals"])
        if cand is None:
            z = model.output_logits(p["output"]["weight"], p["output"]["bias"], h)
            return model.softmax_xent(z, model.label_targets(batch["labels"], NUM_LABELS))
        z = model.output_logits(p["output"]["weight"], p["output"]["bias"], h, cand)
        return model.softmax_xent(z, shared_targets(batch["labels"], cand, NUM_LABELS), cand < NUM_LABELS)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    tx = optax.adam(LR)
    updates, _ = tx.update(grads, tx.init(params), params)
    return loss, grads, optax.apply_updates(params, updates)


def _first_moments(state, method):
    """Adam's first moments after one step from zero, (1 - b1) * gradient, in the modules' layout."""
    if method == "dense":
        mu = state.opt_state[0].mu
        return {"input": mu["input"], "output": mu["output"]}
    rows = state.opt_state.rows.mu
    return {"input": {"embedding": rows["embedding"], "bias": state.opt_state.hidden_bias[0].mu},
            "output": {"weight": rows["weight"], "bias": rows["out_bias"]}}


def _step_check(method, data, model_shards):
    import jax
    import numpy as np

    from hwrepro import sparse
    from hwrepro.sparse import sharded

    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:data * model_shards]).reshape(data, model_shards),
                             ("data", "model"))
    key, step_key = jax.random.split(jax.random.key(3))
    spec = sparse.LshSpec("simhash", 3, 4)
    state = sharded.init_state(mesh, key, NUM_FEATURES, NUM_LABELS, HIDDEN, method=method, lsh_spec=spec)
    single = sparse.init_state(key, NUM_FEATURES, NUM_LABELS, HIDDEN, method=method, lsh_spec=spec)
    before = jax.tree_util.tree_map(np.asarray, sharded.gathered_params(state.params, NUM_FEATURES, NUM_LABELS))
    same_init = all(np.array_equal(a, b) for a, b in zip(
        jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(sparse.model_params(single.params))))
    batch = _batch(1)
    embedding = state.params["input"]["embedding"]
    out = {"same_init": same_init,  # E split by feature: every device holds F_pad / model rows
           "embedding_rows": sorted({s.data.shape[0] for s in embedding.addressable_shards})}
    cand = None
    kw = dict(num_labels=NUM_LABELS, num_candidates=CANDIDATES, min_count=1, bucket_capacity=4)
    if method != "dense":
        ids, mask = jax.device_get(sharded.candidates(mesh, state, batch, step_key, **kw))
        rows = -(-NUM_LABELS // model_shards)
        owner = [bool(np.all((ids[s] == NUM_LABELS) | ((ids[s] >= s * rows) & (ids[s] < (s + 1) * rows))))
                 for s in range(model_shards)]
        labels = set(batch["labels"][batch["labels"] < NUM_LABELS].tolist())
        out.update(own_rows_only=all(owner), labels_in=labels <= set(ids[mask].tolist()),
                   padding_never=bool(np.all(ids[mask] < NUM_LABELS)))
        cand = ids.ravel()
    step = sharded.make_train_step(mesh, method, batch_size=BATCH, learning_rate=LR, **kw)
    state, metrics = step(state, batch, step_key)
    loss, grads, ref = _reference(before, batch, cand)
    after = sharded.gathered_params(state.params, NUM_FEATURES, NUM_LABELS)
    moments = jax.tree_util.tree_leaves(
        sharded.gathered_params(_first_moments(state, method), NUM_FEATURES, NUM_LABELS))
    out["loss_rel"] = _rel(metrics["loss"], loss)
    out["grads_rel"] = max(_rel(m, 0.1 * np.asarray(g)) for m, g in zip(moments, jax.tree_util.tree_leaves(grads)))
    # Adam's first step moves an entry by lr g / (|g| + eps): well-conditioned where |g| >> eps (1e-8), there
    # within 1e-6 relative; where |g| is a few eps, a 1e-7 relative gradient difference moves it visibly, so
    # there only the step's bound (lr) is checked.
    out["params_close"] = all(
        np.allclose(np.where(big, a, b), b, rtol=1e-6, atol=1e-9) and np.all(np.abs(a - b) <= 2 * LR)
        for a, b, big in zip(jax.tree_util.tree_leaves(after), jax.tree_util.tree_leaves(ref),
                             [np.abs(np.asarray(g)) > 1e-5 for g in jax.tree_util.tree_leaves(grads)]))
    out["rows_changed"] = int(np.sum(np.any(np.asarray(after["output"]["weight"]) != before["output"]["weight"], 1)))
    if method == "lsh":
        state = sharded.rebuild(mesh, state, jax.random.key(5))
        t = jax.device_get(state.tables)
        out["tables_local"] = bool(np.all(t.ids < rows)) and t.ids.shape == (model_shards, 4, rows)
    return out


def _topk_check(data, model_shards):
    import jax
    import numpy as np

    from hwrepro import sparse
    from hwrepro.sparse import sharded

    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:data * model_shards]).reshape(data, model_shards),
                             ("data", "model"))
    key = jax.random.key(7)
    state = sharded.init_state(mesh, key, NUM_FEATURES, NUM_LABELS, HIDDEN, method="sampled")
    single = sparse.init_state(key, NUM_FEATURES, NUM_LABELS, HIDDEN, method="sampled")
    batch = _batch(2)
    # k = 40: more than a shard's rows (16 or 31), which each shard's top-k pads.
    out = {"equal": all(np.array_equal(np.asarray(sharded.topk(mesh, state.params, batch, k, num_labels=NUM_LABELS,
                                                               chunk=chunk)),
                                       np.asarray(sparse.topk(single.params, batch, k)))
                        for k in (5, 40) for chunk in (6, 1 << 17))}
    if data == 1:  # a model trained on one device, placed on the model shards: the same top-k and scores
        import ml_collections

        from hwrepro.experiments import slide

        config = ml_collections.ConfigDict({"numerics": {"precision": "fp32"}})
        scores, ids = slide.make_predict(config, sparse.model_params(single.params), devices=model_shards)(batch)
        want_scores, want_ids = (np.asarray(x) for x in sparse.topk_scored(single.params, batch, 5))
        out["placed"] = bool(np.array_equal(ids, want_ids) and np.allclose(scores, want_scores, rtol=1e-6))
    return out


def _tables_check(data, model_shards, num_labels=20_000):
    """Each shard's tables equal lsh.build_tables over its own rows with the key folded with its index (the key
    itself for one model shard), on
    every data replica, at a size where one pure_callback per device inside a shard_map hung on XLA:CPU; a
    redraw draws the single-device hash functions."""
    import jax
    import numpy as np

    from hwrepro.sparse import lsh, sharded

    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:data * model_shards]).reshape(data, model_shards),
                             ("data", "model"))
    state = sharded.init_state(mesh, jax.random.key(0), 10, num_labels, HIDDEN, method="lsh")
    weight = np.asarray(state.params["output"]["weight"])
    rows = weight.shape[0] // model_shards
    key = jax.random.key(5)
    tables = sharded.rebuild(mesh, state, key).tables
    equal = True
    for s in range(model_shards):
        want = lsh.build_tables(jax.device_get(state.hash_fn), weight[s * rows:(s + 1) * rows],
                                jax.random.fold_in(key, s) if model_shards > 1 else key)  # one shard: the key
        for got, w in ((tables.ids, want.ids), (tables.starts, want.starts)):
            equal &= all(np.array_equal(np.asarray(x.data)[0], np.asarray(w))
                         for x in got.addressable_shards if (x.index[0].start or 0) == s)
    redrawn = sharded.redraw(mesh, state, key)
    want_fn = state.lsh_spec.init(jax.random.split(key)[0], HIDDEN)
    equal &= all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
        jax.tree_util.tree_leaves(redrawn.hash_fn), jax.tree_util.tree_leaves(want_fn)))
    return {"equal": bool(equal), "shape": list(tables.ids.shape)}


def _topk_lsh_check(data, max_scored):
    """The mesh's LSH-scored top-k over its training tables against one device's, with max_scored: one model
    shard (data replicas only) scores the same ids."""
    import jax
    import numpy as np

    from hwrepro.sparse import evaluation, sharded

    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:data]).reshape(data, 1), ("data", "model"))
    state = sharded.rebuild(mesh, sharded.init_state(mesh, jax.random.key(0), NUM_FEATURES, 300, HIDDEN,
                                                     method="lsh"), jax.random.key(5))
    batch = _batch(3)
    got = sharded.topk_lsh(mesh, state.params, state.hash_fn, state.tables, batch, 5, num_labels=300,
                           max_scored=max_scored)
    tables = jax.tree_util.tree_map(lambda x: np.asarray(x)[0], state.tables)
    want = evaluation.topk_lsh(sharded.gathered_params(state.params, NUM_FEATURES, 300),
                               jax.device_get(state.hash_fn), tables, batch, 5, max_scored=max_scored)
    got, want = np.asarray(got), np.asarray(want)
    return {"equal": bool(np.array_equal(got, want)), "retrieved": int((want >= 0).sum())}


def _topk_lsh_shards_check(max_scored, num_labels=298, shards=4):
    """The mesh's LSH-scored top-k over 4 model shards (the last with 2 padding rows, in its tables) against
    each shard's own lsh_logits over its rows and tables with its share of the bucket capacity and of
    max_scored, merged by score: the shards' offsets, shares and padding rows (never scored, never returned)."""
    import jax
    import numpy as np

    from hwrepro import sparse
    from hwrepro.models import sparse_layers as model
    from hwrepro.sparse import evaluation, lsh, sharded

    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:shards]).reshape(1, shards), ("data", "model"))
    spec = sparse.LshSpec("simhash", 2, 4)  # 4 buckets a table: the zero padding rows share one, often hit
    state = sharded.rebuild(mesh, sharded.init_state(mesh, jax.random.key(0), NUM_FEATURES, num_labels, HIDDEN,
                                                     method="lsh", lsh_spec=spec), jax.random.key(5))
    batch, k, capacity = _batch(4), 5, 300  # each shard reads whole buckets (75 of a bucket)
    got = np.asarray(sharded.topk_lsh(mesh, state.params, state.hash_fn, state.tables, batch, k,
                                      num_labels=num_labels, bucket_capacity=capacity, max_scored=max_scored))
    p = sharded.gathered_params(state.params, NUM_FEATURES, num_labels)
    h = model.sparse_hidden(*(jax.numpy.asarray(x) for x in (p["input"]["embedding"], p["input"]["bias"],
                                                               batch["feat_ids"], batch["feat_vals"])))
    weight, bias = (jax.numpy.asarray(np.asarray(state.params["output"][name])) for name in ("weight", "bias"))
    tables, fn = jax.device_get(state.tables), jax.device_get(state.hash_fn)
    rows, share = weight.shape[0] // shards, lambda n: None if n is None else -(-n // shards)
    ids, z = [], []
    for s in range(shards):
        i, v = evaluation.lsh_logits(weight[s * rows:(s + 1) * rows], bias[s * rows:(s + 1) * rows], h, fn,
                                     lsh.Tables(tables.ids[s], tables.starts[s]), share(capacity),
                                     max_scored=share(max_scored), num_valid=num_labels - s * rows)
        ids.append(np.where(np.asarray(i) < rows, np.asarray(i) + s * rows, -1))
        z.append(np.asarray(v))
    ids.append(np.full((len(h), k), -1))  # fewer than k scored in all: -1, as the mesh pads
    z.append(np.full((len(h), k), -np.inf))
    ids, z = np.concatenate(ids, axis=1), np.concatenate(z, axis=1)
    order = np.lexsort((ids, -z), axis=1)[:, :k]  # by score, ties to the lower id
    want = np.where(np.take_along_axis(z, order, 1) > -np.inf, np.take_along_axis(ids, order, 1), -1)
    padding_retrieved = int((np.asarray(lsh.query(fn, lsh.Tables(tables.ids[-1], tables.starts[-1]), h,
                                                   share(capacity))) >= num_labels - (shards - 1) * rows).sum())
    return {"equal": bool(np.array_equal(got, want)), "in_range": bool(np.all(got < num_labels)),
            "retrieved": int((want >= 0).sum()), "padding_retrieved": padding_retrieved}


def main():
    results = {}
    results["topk-lsh-d2"] = {n: _topk_lsh_check(2, n) for n in (None, 3)}  # 3: fewer than retrieved
    results["topk-lsh-m4"] = {n: _topk_lsh_shards_check(n) for n in (None, 3, 200)}
    for name, (data, model_shards) in MESHES.items():
        results[f"tables-{name}"] = _tables_check(data, model_shards)
    results["tables-d2"] = _tables_check(2, 1)  # data-parallel only: the one-device run's tables
    for name, (data, model_shards) in MESHES.items():
        for method in ("lsh", "sampled", "dense"):
            results[f"{method}-{name}"] = _step_check(method, data, model_shards)
        results[f"topk-{name}"] = _topk_check(data, model_shards)
    print("RESULTS " + json.dumps(results))


# ------------------------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def results():
    # Most XLA optimizations off, as conftest's unoptimized modules: compiling the many small sharded programs
    # is most of the child's time (31 s against 23 s), and what it checks is the sharding, not XLA's fusions.
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="4", JAX_DISABLE_MOST_OPTIMIZATIONS="true")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULTS "):])


@pytest.mark.slow
@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("method", ["lsh", "sampled", "dense"])
def test_sharded_step_equals_single_device_with_the_same_candidates(results, method, mesh):
    r = results[f"{method}-{mesh}"]
    assert r["same_init"]
    assert r["embedding_rows"] == [-(-NUM_FEATURES // MESHES[mesh][1])], r
    assert r["loss_rel"] < 1e-6, r
    assert r["grads_rel"] < 1e-6, r
    assert r["params_close"], r
    assert r["rows_changed"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("method", ["lsh", "sampled"])
def test_each_shard_selects_only_its_own_rows(results, method, mesh):
    r = results[f"{method}-{mesh}"]
    assert r["own_rows_only"] and r["padding_never"] and r["labels_in"], r


@pytest.mark.slow
@pytest.mark.parametrize("mesh", list(MESHES))
def test_lsh_tables_hold_local_ids(results, mesh):
    assert results[f"lsh-{mesh}"]["tables_local"]


@pytest.mark.slow
@pytest.mark.parametrize("mesh", list(MESHES))
def test_each_shard_builds_its_own_tables(results, mesh):
    data, model_shards = MESHES[mesh]
    assert results[f"tables-{mesh}"] == {"equal": True, "shape": [model_shards, 25, 20_000 // model_shards]}
    assert results["tables-d2"] == {"equal": True, "shape": [1, 25, 20_000]}


@pytest.mark.slow
def test_lsh_top_k_over_data_replicas_equals_one_device_with_max_scored(results):
    for n, r in results["topk-lsh-d2"].items():
        assert r["equal"] and r["retrieved"] > 0, (n, r)


@pytest.mark.slow
def test_lsh_top_k_over_model_shards_merges_each_shards_share(results):
    for n, r in results["topk-lsh-m4"].items():
        assert r["equal"] and r["in_range"] and r["retrieved"] > 0, (n, r)
        assert r["padding_retrieved"] > 0, (n, r)  # the last shard's reads returned its padding rows


@pytest.mark.slow
@pytest.mark.parametrize("mesh", list(MESHES))
def test_sharded_topk_equals_unsharded(results, mesh):
    assert results[f"topk-{mesh}"]["equal"]
    assert results[f"topk-{mesh}"].get("placed", True)
    assert "placed" in results["topk-m4"]  # a one-device model predicts over 4 model shards


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()


@pytest.mark.parametrize("overrides, message", [
    (dict(model=2), "parallel.model=2 x parallel.data=1 = 2 devices, but parallel.processes=1 x "
                    "numerics.cpu_devices=0 gives 1 CPU device; set numerics.cpu_devices=2"),
    (dict(model=2, data=2, cpu_devices=2), "= 4 devices, but parallel.processes=1 x numerics.cpu_devices=2"),
    (dict(data=3, cpu_devices=3), "train.batch_size=128 is not a multiple of parallel.data=3"),
    (dict(model=2, processes=2, cpu_devices=2), "= 2 devices, but parallel.processes=2 x numerics.cpu_devices=2 "
                                                "gives 4 CPU devices; set numerics.cpu_devices=1"),
    (dict(model=0), "parallel.model=0 must be a positive integer"),
    (dict(cpu_devices=-1), "numerics.cpu_devices=-1 must be 0"),
])
def test_mesh_that_does_not_fit_is_one_config_error(overrides, message):
    from configs.slide_amazon import slide_config
    from hwrepro.errors import ConfigError
    from hwrepro.harness import runner

    c = slide_config("tiny", "lsh")
    c.numerics.cpu_devices = overrides.pop("cpu_devices", 0)
    c.parallel.update(overrides)
    with pytest.raises(ConfigError) as e:
        runner.validate(c)
    assert message in str(e.value) and "\n" not in str(e.value)


def _tiny_config_file(tmp_path: Path, epochs: int) -> Path:
    config = tmp_path / f"tiny{epochs}.py"
    config.write_text(f"import sys\nsys.path.insert(0, {str(REPO / 'tests')!r})\n"
                      "from test_slide_experiment import tiny_config\n\ndef get_config():\n"
                      f"    c = tiny_config('lsh')\n    c.train.num_epochs = {epochs}\n    return c\n")
    return config


TWO_PROCESSES = ("--config.parallel.processes=2", "--config.numerics.cpu_devices=1", "--config.parallel.model=2")


@pytest.mark.slow
def test_launch_with_two_model_shards_matches_the_single_device_run(tmp_path, run_launch):
    """The user's path: the tiny SLIDE config on one device and on parallel.model=2 (2 CPU devices, in the
    launcher's child process): P@1 within a few standard errors (each shard picks its own candidates, so the
    random negatives differ; the dense and sampled steps' equality to one device is checked step by step in
    the 4-device child above). lsh over two local processes (jax.distributed on loopback, gloo), checkpointing
    as it goes: the one-process mesh's final.json scores and parameter bits, hashed from the gathered
    parameters by both processes; process 1 keeps its own record under process-1/."""
    config = _tiny_config_file(tmp_path, 2)
    runs = [("lsh", "one", ()), ("lsh", "two", ("--config.parallel.model=2", "--config.numerics.cpu_devices=2")),
            # The two-process run also checkpoints (every process saves its shards at steps 20, 40, 60): same bits.
            ("lsh", "processes", TWO_PROCESSES + ("--config.train.checkpoint_every=20",))]
    finals = {}
    for method, name, extra in runs:
        proc = run_launch(f"--config={config}", f"--workdir={tmp_path / (method + name)}",
                          f"--config.model.method={method}", *extra)
        assert proc.returncode == 0, proc.stderr[-2000:]
        finals[method, name] = json.loads((tmp_path / (method + name) / "final.json").read_text())
    p = finals["lsh", "one"]["test_P@1"]
    assert abs(finals["lsh", "two"]["test_P@1"] - p) < 4 * (p * (1 - p) / 1000) ** 0.5

    def scores(final):  # P@k and the share of labels scored (not the evaluations' seconds)
        return {k: v for k, v in final.items() if k.startswith("test_") and not k.endswith("seconds")}
    two, processes = finals["lsh", "two"], finals["lsh", "processes"]
    assert processes["param_sha256"] == two["param_sha256"]
    assert scores(processes) == scores(two) and "test_P@1" in scores(two)
    workdir = tmp_path / "lshprocesses"
    assert json.loads((workdir / "process-1" / "final.json").read_text())["param_sha256"] == two["param_sha256"]
    own = (workdir / "process-1" / "report.html").read_text()  # process 1's record has its own report
    assert two["param_sha256"] in own and f"<code>{workdir / 'process-1'}</code></td>" in own
    run = json.loads((workdir / "run.json").read_text())
    assert run["parallel"]["process_count"] == 2 and run["parallel"]["cpu_collectives"] == "gloo"
    assert (workdir / "process-0" / "output.txt").stat().st_size > 0
    assert json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])["checkpoint_seconds"] > 0
    # Each process held half of the points (and its batches were the one-process batches: the same bits); the
    # data statistics are the whole split's, as the one-process run's.
    assert run["data_details"].pop("points_held") == {"train": 2000, "test": 500}
    one = json.loads((tmp_path / "lshone" / "run.json").read_text())["data_details"]
    assert {k: v for k, v in run["data_details"].items() if k != "load_seconds"} == {
        k: v for k, v in one.items() if k != "load_seconds"}
    # The models the mesh runs kept load on this process's one device and score as the mesh evaluated.
    from hwrepro.data import xc
    from hwrepro.experiments import slide
    from hwrepro.harness import trained

    xc.write_xc(tmp_path / "test.txt", xc.synthetic("tiny", seed=0)[1])  # the final evaluation's points
    assert not (workdir / "process-1" / "model").exists()
    for name in ("two", "processes"):
        model = trained.load(tmp_path / f"lsh{name}")
        got = slide.predict_file(model, str(tmp_path / "test.txt"), str(tmp_path / f"{name}.txt"))
        assert {k: got[k] for k in ("P@1", "P@3", "P@5")} == pytest.approx(
            {f"P@{k}": finals["lsh", name][f"test_P@{k}"] for k in (1, 3, 5)}, abs=1e-6)


def test_a_process_knows_its_place_from_the_launcher_or_the_cluster(monkeypatch):
    from hwrepro.harness import parallel

    for name in ("HWREPRO_PROCESS", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert parallel.place() is None and parallel.cluster() is None
    monkeypatch.setenv("HWREPRO_PROCESS", parallel.Place(1, 2, "127.0.0.1:1234").env())
    assert parallel.place() == parallel.Place(1, 2, "127.0.0.1:1234")
    monkeypatch.setenv("SLURM_NTASKS", "1")  # a one-task allocation is not a multi-process run
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert parallel.cluster() is None
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_PROCID", "3")
    assert parallel.cluster() == parallel.Place(3, 4, "auto")


@pytest.mark.slow
def test_a_refused_two_process_run_leaves_the_earlier_record_as_it_was(tmp_path, run_launch):
    """Both processes refuse the config before they touch the workdir: the unfinished run in it keeps its
    run.json (status included) and is not moved aside."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    earlier = {"status": "interrupted: SIGTERM at step 40 of 200; checkpoint saved"}
    (workdir / "run.json").write_text(json.dumps(earlier))
    proc = run_launch(f"--config={_tiny_config_file(tmp_path, 2)}", f"--workdir={workdir}", *TWO_PROCESSES,
                      "--config.model.method=lsh", "--config.lsh.num_hashes=31")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: lsh.num_hashes=31 gives more than 2**30 buckets per table" in proc.stdout + proc.stderr
    assert json.loads((workdir / "run.json").read_text()) == earlier
    assert sorted(p.name for p in workdir.iterdir() if not p.name.startswith(("process-", "."))) == ["run.json"]


def _running(folder: Path) -> bool:
    """Whether a run's process (hwrepro.harness.process FOLDER...) is alive."""
    from conftest import running

    return running(f"hwrepro.harness.process {folder}")


def _wait_for_a_step_of_process_1(proc: subprocess.Popen, workdir: Path) -> None:
    """Returns once process 1 of the launched run has logged a step (within 120 s, its launcher alive)."""
    import time

    deadline, metrics = time.time() + 120, workdir / "process-1" / "metrics.jsonl"
    while not metrics.exists() or not metrics.read_text().strip():
        assert proc.poll() is None and time.time() < deadline, "process 1 never logged a step"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_dead_process_ends_the_others_with_a_clear_error(tmp_path):
    """SIGKILL to process 1 of 2 mid-training: the launcher stops process 0 (blocked in a collective with the
    dead peer) and exits 1 within 30 s, naming the dead process in its last line and in run.json."""
    import time

    from conftest import launch_process

    workdir = tmp_path / "run"
    proc = launch_process(f"--config={_tiny_config_file(tmp_path, 20)}", f"--workdir={workdir}", *TWO_PROCESSES)
    try:
        _wait_for_a_step_of_process_1(proc, workdir)
        subprocess.run(["pkill", "-KILL", "-f", f"hwrepro.harness.process {workdir / 'process-1'}"], check=True)
        killed = time.time()
        _, err = proc.communicate(timeout=60)
        assert time.time() - killed < 30
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert err.strip().splitlines()[-1].startswith("error: process 1 of 2 was killed by SIGKILL")
    status = json.loads((workdir / "run.json").read_text())["status"]
    assert status.startswith("failed: process 1 of 2 was killed by SIGKILL")
    assert not _running(workdir)


@pytest.mark.slow
def test_sigterm_to_a_two_process_run_checkpoints_and_the_same_command_resumes(tmp_path):
    """Slurm's preemption: SIGTERM to the launcher reaches both processes, which checkpoint at a step they agree
    on and record 'interrupted' (JAX's preemption service had replaced the SIGTERM handler: the run went on
    to the end). The same command resumes both and finishes."""
    import time

    from conftest import launch, launch_process

    workdir = tmp_path / "run"
    args = (f"--config={_tiny_config_file(tmp_path, 6)}", f"--workdir={workdir}", *TWO_PROCESSES,
            "--config.train.checkpoint_every=20")
    proc = launch_process(*args)
    try:
        _wait_for_a_step_of_process_1(proc, workdir)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-2000:]
    for folder in (workdir, workdir / "process-1"):
        assert json.loads((folder / "run.json").read_text())["status"].startswith("interrupted: SIGTERM at step ")
    resumed = launch(*args)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    run = json.loads((workdir / "run.json").read_text())
    assert run["status"] == "done" and run["resumes"] == 1
    assert not _running(workdir)
