"""What SLIDE's batch-shared candidates are made of while the main job trains, and how hard the negatives of
other hash settings would be on the trained weights (a diagnostic, not a test).

    python benchmarks/slide_candidates.py /tmp/slide_candidates   # the main job's config, final eval on 2,048 points
    python benchmarks/slide_candidates.py /tmp/c --set lsh.kind=dwta --set lsh.num_hashes=6 --set lsh.num_tables=50

Runs `configs/slide_amazon.py` (with any `--set group.field=value`) in this process with
`sparse.batch_shared_candidates` wrapped so that every step also reports, through `jax.debug.callback`, the
batch's distinct true labels, the distinct ids retrieved from the LSH tables (at least once, and at least
`min_count` times), how many retrieved non-label ids made it into the candidate set, and how many of the true
labels the tables retrieved. The wrapper only reads: the training is bit for bit the main job's. Prints the
means over the first 200 and the last 1,000 steps.

Then, on the trained weights and `--batches` fresh training batches, it builds tables for each hash setting of
`HASHES` (and none, for sampled softmax's uniform negatives) and prints how many of each point's 20
highest-scoring wrong labels (under the full softmax) the batch's shared candidate set holds: the hard
negatives that make a sparse softmax's gradient close to the full one's. A uniform set of M rows holds about
M / num_labels of them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

COLUMNS = ("distinct labels", "distinct retrieved", "retrieved >= min_count, not labels",
           "of those in the candidates", "labels retrieved >= once", "labels retrieved >= min_count")
# (kind, K, L): SLIDE's Amazon-670K setting, then SimHash at 2^14-2^18 buckets per table.
HASHES = (("dwta", 6, 50), ("simhash", 14, 50), ("simhash", 16, 25), ("simhash", 16, 50), ("simhash", 18, 50))
HARDEST = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", help="where the run's records go")
    parser.add_argument("--set", action="append", default=[], metavar="GROUP.FIELD=VALUE",
                        help="override a field of configs/slide_amazon.py (repeatable)")
    parser.add_argument("--batches", type=int, default=8, help="training batches for the hash comparison")
    parser.add_argument("--as-is", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.as_is:  # start again with the launcher's start-up environment (allocator tunables)
        import slide_bench

        slide_bench.rerun_as_launched(__file__)
    diagnose(Path(args.workdir), args.set, args.batches)


def diagnose(workdir: Path, overrides: list[str], num_batches: int) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import slide_bench

    from hwrepro import sparse
    from hwrepro.harness import runner
    from hwrepro.study import grid
    from hwrepro.harness.config import load_config_file
    from hwrepro.experiments import slide as experiment

    config = load_config_file(slide_bench.MAIN_CONFIG)
    config.eval.final_points = 2048
    config = grid.apply(config, grid.parse_settings(overrides))
    rows = []
    select = sparse.batch_shared_candidates

    def reporting_select(labels, retrieved, key, num_candidates, num_labels, min_count=2, sampler="uniform"):
        ids, mask = select(labels, retrieved, key, num_candidates, num_labels, min_count, sampler)
        if retrieved is not None:
            count, is_label, hot = retrieval_counts(labels, retrieved, num_labels, min_count)
            at = jnp.clip(ids, 0, num_labels - 1)
            values = [jnp.sum(is_label), jnp.sum(count >= 1), jnp.sum(hot & ~is_label),
                      jnp.sum(mask & hot[at] & ~is_label[at]), jnp.sum(is_label & (count >= 1)),
                      jnp.sum(is_label & hot)]
            jax.debug.callback(lambda v: rows.append(np.asarray(v)), jnp.stack(values).astype(jnp.float32))
        return ids, mask

    kept = {}
    data_class, run = experiment.Data, experiment.run

    def keeping_data(cfg):
        kept["data"] = data_class(cfg)
        return kept["data"]

    def keeping_run(cfg, rec):
        final, kept["params"] = run(cfg, rec)
        return final, kept["params"]

    sparse.batch_shared_candidates = reporting_select
    experiment.Data, experiment.run = keeping_data, keeping_run
    try:
        runner.run_here(config, workdir)
    finally:
        sparse.batch_shared_candidates = select
        experiment.Data, experiment.run = data_class, run
    table = np.stack(rows)
    for part, block in (("first 200 steps", table[:200]), ("last 1,000 steps", table[-1000:])):
        print(f"{part}: " + ", ".join(f"{name} {value:,.1f}" for name, value in zip(COLUMNS, block.mean(0))))
    compare_hashes(config, kept["params"], kept["data"], num_batches)


def retrieval_counts(labels, retrieved, num_labels: int, min_count: int):
    """Per label id, float32 / bool [num_labels]: how often the batch's queries retrieved it, whether it is
    one of the batch's true labels, and whether it was retrieved at least min_count times (padding ids,
    num_labels, are dropped)."""
    import jax.numpy as jnp

    count = jnp.zeros(num_labels + 1, jnp.float32).at[retrieved.ravel()].add(1.0)[:num_labels]
    is_label = jnp.zeros(num_labels + 1, bool).at[labels.ravel()].set(True)[:num_labels]
    return count, is_label, count >= min_count


def compare_hashes(config, params, data, num_batches: int) -> None:
    """The hard negatives in the shared candidate set of each hash setting, on the trained weights."""
    import itertools

    import jax
    import jax.numpy as jnp
    import numpy as np

    from hwrepro import sparse
    from hwrepro.sparse import lsh
    from hwrepro.models import sparse_layers as model

    m = config.model
    weight, bias = params["output"]["weight"].astype(jnp.float32), params["output"]["bias"]
    num_labels = weight.shape[0]
    batches = list(itertools.islice(data.batcher.epochs(config.train.batch_size, seed=config.seed + 1),
                                    num_batches))

    hidden_layer = model.SparseInput(*params["input"]["embedding"].shape)
    hidden = jax.jit(lambda b: hidden_layer.apply({"params": params["input"]}, b["feat_ids"], b["feat_vals"]))

    @jax.jit
    def hard_negatives_held(h, labels, ids, mask):
        logits = h @ weight.T + bias
        rows = jnp.arange(h.shape[0])[:, None]
        is_label = jnp.zeros((h.shape[0], num_labels + 1), bool).at[rows, labels].set(True)[:, :num_labels]
        hardest = jax.lax.top_k(jnp.where(is_label, -jnp.inf, logits), HARDEST)[1]
        held = jnp.zeros(num_labels + 1, bool).at[ids].set(mask)[:num_labels]
        return jnp.mean(held[hardest])

    print(f"on the trained weights, {num_batches} training batches of {config.train.batch_size}, "
          f"M = {m.num_candidates}, bucket capacity {m.bucket_capacity}, min_count {m.min_count}:")
    print(f"{'negatives':<28}{'hard negatives held':>21}{'retrieved >= min_count':>24}{'labels retrieved':>18}"
          f"{'build s':>9}")
    for kind, k, l in ((None, 0, 0),) + HASHES:
        held, hot, found, build = [], [], [], 0.0
        tables = hash_fn = None
        if kind is not None:
            options = config.lsh.get(kind)
            hash_fn = lsh.init_hash(kind, jax.random.key(config.seed), weight.shape[1], k, l,
                                    **(options.to_dict() if options is not None else {}))
            jax.block_until_ready(lsh.build_tables(hash_fn, weight, jax.random.key(0)))  # compile
            t = time.perf_counter()
            tables = jax.block_until_ready(lsh.build_tables(hash_fn, weight, jax.random.key(1)))
            build = time.perf_counter() - t
        for i, batch in enumerate(batches):
            batch = {name: jnp.asarray(v) for name, v in batch.items()}
            h = hidden(batch)
            retrieved = None if tables is None else lsh.query(hash_fn, tables, h, m.bucket_capacity)
            ids, mask = sparse.batch_shared_candidates(batch["labels"], retrieved, jax.random.key(i),
                                                      m.num_candidates, num_labels, m.min_count, m.sampler)
            held.append(float(hard_negatives_held(h, batch["labels"], ids, mask)))
            if retrieved is not None:
                count, is_label, hot_ids = retrieval_counts(batch["labels"], retrieved, num_labels, m.min_count)
                hot.append(float(jnp.sum(hot_ids & ~is_label)))
                found.append(float(jnp.sum(is_label & (count >= 1)) / jnp.sum(is_label)))
        name = f"{kind} K={k} L={l}" if kind else f"{m.sampler} random (sampled)"
        print(f"{name:<28}{np.mean(held):>20.1%}{np.mean(hot) if hot else 0:>24,.0f}"
              f"{np.mean(found) if found else 0:>17.1%}{build:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
