"""What SLIDE's batch-shared candidates are made of while the main job trains (a diagnostic, not a test).

    python benchmarks/slide_candidates.py /tmp/slide_candidates   # the main job's config, final eval on 2,048 points

Runs `configs/slide_amazon.py` in this process with `slide.batch_shared_candidates` wrapped so that every step
also reports, through `jax.debug.callback`, the batch's distinct true labels, the distinct ids retrieved from
the LSH tables (at least once, and at least `min_count` times), how many retrieved non-label ids made it into
the candidate set, and how many of the true labels the tables retrieved. The wrapper only reads: the training
is bit for bit the main job's. Prints the means over the first 200 and the last 1,000 steps.
"""

from __future__ import annotations

import argparse
from pathlib import Path

COLUMNS = ("distinct labels", "distinct retrieved", "retrieved >= min_count, not labels",
           "of those in the candidates", "labels retrieved >= once", "labels retrieved >= min_count")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", help="where the run's records go")
    parser.add_argument("--as-is", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.as_is:  # start again with the launcher's start-up environment (allocator tunables)
        import slide_bench

        slide_bench.rerun_as_launched(__file__)
    diagnose(Path(args.workdir))


def diagnose(workdir: Path) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from hwrepro import runner, slide
    from hwrepro.config_base import load_config_file

    config = load_config_file(Path(__file__).resolve().parent.parent / "configs" / "slide_amazon.py")
    config.eval.final_points = 2048
    rows = []
    select = slide.batch_shared_candidates

    def reporting_select(labels, retrieved, key, num_candidates, num_labels, min_count=2, sampler="uniform"):
        ids, mask = select(labels, retrieved, key, num_candidates, num_labels, min_count, sampler)
        if retrieved is not None:
            count = jnp.zeros(num_labels + 1, jnp.float32).at[retrieved.ravel()].add(1.0)[:num_labels]
            is_label = jnp.zeros(num_labels + 1, bool).at[labels.ravel()].set(True)[:num_labels]
            hot = count >= min_count
            at = jnp.clip(ids, 0, num_labels - 1)
            values = [jnp.sum(is_label), jnp.sum(count >= 1), jnp.sum(hot & ~is_label),
                      jnp.sum(mask & hot[at] & ~is_label[at]), jnp.sum(is_label & (count >= 1)),
                      jnp.sum(is_label & hot)]
            jax.debug.callback(lambda v: rows.append(np.asarray(v)), jnp.stack(values).astype(jnp.float32))
        return ids, mask

    slide.batch_shared_candidates = reporting_select
    runner.run_here(config, workdir)
    table = np.stack(rows)
    for part, block in (("first 200 steps", table[:200]), ("last 1,000 steps", table[-1000:])):
        print(f"{part}: " + ", ".join(f"{name} {value:,.1f}" for name, value in zip(COLUMNS, block.mean(0))))


if __name__ == "__main__":
    main()
