"""LSH-scored prediction against dense scoring on a trained SLIDE network: P@1, share of labels scored, time.

    python benchmarks/lsh_inference.py --quick                       # the tiny synthetic set, seconds
    python benchmarks/lsh_inference.py --state /tmp/amazon_state.pkl  # the main job, trained here once
    python benchmarks/lsh_inference.py --state /tmp/lr3e-3.pkl --set train.learning_rate=3e-3 --set train.adam_eps=1e-6

Full mode trains configs/slide_amazon.py (the main job; --steps N for fewer steps, 0 = its epoch) in this
process, bit for bit the main job's training, and keeps the trained parameters and hash functions in --state
(later runs read them from there). Quick mode trains the tiny synthetic set (300 labels) for a few epochs.

Then, on --points test points (the experiment's fixed shuffled subset, batches of eval.batch_size), it scores
every label (sparse.topk, chunked) and each LSH setting below (sparse.topk_lsh_scored: the retrieved labels
scored exactly) and prints P@1 / P@5, the mean share of labels scored per point, seconds for the points
(after one batch to compile) and the speed-up over dense, plus the seconds to build the setting's tables
(compiled before):
- "training tables": the tables the network trained with, as they are at the end (hashes of w);
- "tables over w": fresh tables of the family over w, built after training (what a run training with that
  family would have);
- "inference tables": fresh tables over (w, b) for inner products (lsh.mips_rows), the final evaluation's
  default (configs/slide_amazon.py, eval.lsh);
each with multi-probe 2^m buckets per table for m in --probes.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # configs/ (the configs are modules)

MAIN_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "slide_amazon.py"
# (family, K, L, tables): "w" fresh tables over w, "mips" fresh tables over (w, b); first the run's own.
SETTINGS = (("simhash", 8, 50, "mips"), ("simhash", 10, 25, "mips"), ("dwta", 6, 50, "w"), ("dwta", 6, 50, "mips"))
QUICK_SETTINGS = (("simhash", 4, 16, "mips"), ("dwta", 2, 16, "w"), ("dwta", 2, 16, "mips"))


def config_for(quick: bool, steps: int, points: int, overrides: tuple[str, ...] = ()):
    from configs.slide_amazon import slide_config
    from hwrepro.harness.config import load_config_file
    from hwrepro.study import grid

    if quick:  # tests/test_slide_experiment.py's tiny run
        c = slide_config("tiny", "lsh")
        c.model.hidden, c.model.num_candidates = 32, 128
        c.lsh.num_hashes, c.lsh.num_tables, c.lsh.rebuild_period, c.lsh.redraw_period = 6, 8, 20, 60
        c.train.num_epochs, c.train.learning_rate, c.eval.subset = 4, 1e-2, 256
        c.data.max_features, c.data.max_labels = 32, 8
    else:
        c = load_config_file(str(MAIN_CONFIG))
    c.train.num_steps = steps
    c.train.checkpoint_every = 0
    c.eval.final_points = points
    c.eval.lsh.tables = "training"  # the run's own final evaluation: the cheapest; this script does the rest
    return grid.apply(c, grid.parse_settings(overrides))


def train(config):
    """Runs the experiment in this process (the user's path); returns its final (model params, hash_fn, tables)."""
    import jax
    import numpy as np

    from hwrepro import sparse
    from hwrepro.experiments import slide
    from hwrepro.harness import runner

    kept, fit = {}, slide.fit

    def keeping_fit(*args, **kwargs):
        kept["state"] = fit(*args, **kwargs)
        return kept["state"]

    slide.fit = keeping_fit
    try:
        with tempfile.TemporaryDirectory() as workdir:
            final = runner.run_here(config, Path(workdir) / "run", quiet=True)
    finally:
        slide.fit = fit
    state = kept["state"]
    print(f"trained {final['steps']} steps, {final['seconds_per_epoch']:.1f} s/epoch; param_sha256 "
          f"{final['param_sha256'][:16]}...", flush=True)
    host = lambda tree: jax.tree_util.tree_map(np.asarray, tree)
    tables = sparse.lsh.Tables(state.tables.ids, state.tables.starts)  # the queries' part (no kept codes)
    return host(sparse.model_params(state.params)), host(state.hash_fn), host(tables)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny synthetic set (seconds)")
    parser.add_argument("--state", type=Path, help="full mode: trained parameters, written on the first run")
    parser.add_argument("--steps", type=int, default=0, help="training steps (0: the config's epochs)")
    parser.add_argument("--points", type=int, default=8192, help="test points (a fixed shuffled subset)")
    parser.add_argument("--probes", default="0,1,2,3", help="multi-probe bits m to try (2^m buckets per table)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a config field of the trained run, e.g. train.learning_rate=3e-3 (repeatable)")
    args = parser.parse_args()
    if not args.quick and args.state is None:
        parser.error("full mode needs --state PATH (the trained state is kept there)")
    benchmark(args.quick, args.state, args.steps, min(args.points, 1000) if args.quick else args.points,
              [int(m) for m in args.probes.split(",")], tuple(args.set))


def benchmark(quick: bool, state_path: Path | None, steps: int, points: int, probes: list[int],
              overrides: tuple[str, ...] = ()) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from hwrepro import data as hwdata
    from hwrepro import sparse
    from hwrepro.sparse import lsh

    config = config_for(quick, steps, points, overrides)
    if state_path is not None and state_path.exists():
        kept = pickle.loads(state_path.read_bytes())
        if not isinstance(kept, dict) or kept.get("overrides") != list(overrides):
            sys.exit(f"{state_path} was trained with other --set overrides "
                     f"({kept.get('overrides') if isinstance(kept, dict) else 'unknown'}): remove it or pick another path")
        trained = kept["trained"]
    else:
        trained = train(config)
        if state_path is not None:
            state_path.write_bytes(pickle.dumps({"overrides": list(overrides), "trained": trained}))
    params, hash_fn, training_tables = jax.tree_util.tree_map(jnp.asarray, trained)
    test = hwdata.load(config, "labels").test
    batches = list(test.ordered(config.eval.batch_size))
    w, b = params["output"]["weight"], params["output"]["bias"]
    num_labels = w.shape[0]
    e = config.eval.lsh
    print(f"{w.shape[0]:,} labels, hidden {w.shape[1]}, {points:,} test points in batches of "
          f"{config.eval.batch_size}, {jax.devices()[0].device_kind}; {e.bucket_capacity} ids per probed bucket, "
          f"at most {e.max_scored} distinct labels scored per point (config eval.lsh)")

    def run(predict):
        """(P@1, P@5, mean share scored, seconds) over the points; the first batch compiles, untimed."""
        jax.block_until_ready(predict(batches[0]))
        hits1 = hits5 = scored = count = 0.0
        t = time.perf_counter()
        for batch in batches:
            ids, counts = predict(batch)
            labelled = np.any(batch["labels"] < num_labels, axis=1) & batch["mask"]
            p = sparse.precision_at_k(ids, batch["labels"], (1, 5), num_labels)
            n = labelled.sum()
            hits1, hits5, count = hits1 + float(p["P@1"]) * n, hits5 + float(p["P@5"]) * n, count + n
            scored += num_labels * n if counts is None else float(np.sum(np.asarray(counts)[labelled]))
        seconds = time.perf_counter() - t
        return hits1 / count, hits5 / count, scored / count / num_labels, seconds

    dense = run(lambda batch: (sparse.topk(params, {k: v for k, v in batch.items() if k != "mask"}, 5), None))
    print(f"{'scoring':<34}{'m':>2}{'P@1':>8}{'P@5':>8}{'vs dense':>9}{'scored':>9}{'seconds':>9}{'speed-up':>9}"
          f"{'build s':>9}")
    print(f"{'dense, every label':<34}{'':>2}{dense[0]:>8.4f}{dense[1]:>8.4f}{1:>9.2f}{dense[2]:>9.2%}"
          f"{dense[3]:>9.2f}{1:>9.1f}{'':>9}", flush=True)
    own = (config.lsh.kind, config.lsh.num_hashes, config.lsh.num_tables, "training")
    for kind, k, l, tables_of in (own,) + (QUICK_SETTINGS if quick else SETTINGS):
        spec = sparse.LshSpec(kind, k, l, tuple(sorted(config.lsh[kind].to_dict().items())))
        def build(key):
            if tables_of == "training":  # as they were at the end of training (last rebuilt a few steps before)
                return hash_fn, training_tables
            if tables_of == "w":
                fn = spec.init(jax.random.fold_in(key, 0), w.shape[1])
                return fn, lsh.build_tables(fn, w, jax.random.fold_in(key, 1))
            return sparse.inference_tables(w, b, spec, key)

        jax.block_until_ready(build(jax.random.key(1)))  # compiles
        t = time.perf_counter()
        fn, tables = jax.block_until_ready(build(jax.random.key(0)))
        seconds_to_build = time.perf_counter() - t
        name = f"{kind} K={k} L={l}, " + {"training": "training tables", "w": "tables over w",
                                          "mips": "inference tables"}[tables_of]
        for m in probes:
            if m > k:
                continue
            p1, p5, share, seconds = run(lambda batch: sparse.topk_lsh_scored(
                params, fn, tables, {k_: v for k_, v in batch.items() if k_ != "mask"}, 5,
                bucket_capacity=e.bucket_capacity, probe_bits=m, inner_product=tables_of == "mips",
                max_scored=e.max_scored)[1:])
            print(f"{name:<34}{m:>2}{p1:>8.4f}{p5:>8.4f}{p1 / dense[0]:>9.2f}{share:>9.2%}{seconds:>9.2f}"
                  f"{dense[3] / seconds:>9.1f}{seconds_to_build:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
