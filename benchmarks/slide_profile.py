"""Where the SLIDE training step's time goes: XLA thunk times from a `jax.profiler` trace.

    python benchmarks/slide_profile.py              # with the launcher's allocator tunables
    GLIBC_TUNABLES= python benchmarks/slide_profile.py --as-is   # as this process was started
    python benchmarks/slide_profile.py --skip-updates both        # ablation: the step without its Adam updates
    python benchmarks/slide_profile.py --mode per_example         # SLIDE's own mode: m = 1,024 per example

Prints the median step time, then the summed duration of each optimised-HLO instruction over the traced
steps, per step, largest first. Thunks on the two cores overlap, so the times add up to more than the step;
the profiler's own overhead makes traced steps slower. Match names to `--hlo` (the optimised HLO text).

`--skip-updates` is an ablation, not a training step: the row-sparse Adam update of E ("input"), of W
("output") or of both is left out (their gradients are still computed), to show what the updates cost.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import sys
import tempfile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="steps timed and traced")
    parser.add_argument("--top", type=int, default=30, help="instructions printed")
    parser.add_argument("--hlo", help="also write the step's optimised HLO text to this file")
    parser.add_argument("--as-is", action="store_true",
                        help="run in this process as started, without the launcher's glibc tunables")
    parser.add_argument("--skip-updates", choices=("input", "output", "both"),
                        help="ablation: leave out the row-sparse Adam update of E, of W or of both")
    parser.add_argument("--mode", choices=("shared", "per_example"), default="shared",
                        help="candidate mode: one set of M = 8,192 per batch, or m = 1,024 per example")
    args = parser.parse_args()
    if not args.as_is:
        import slide_bench

        slide_bench.rerun_as_launched(__file__)
    profile(args)


def skip_updates(which: str, num_features: int, num_labels: int) -> None:
    """Makes the step's row-sparse Adam a no-op for E ("input"), W ("output") or both.

    The gradient rows still feed the step's outputs (through a zero-weighted sum into one moment entry), so
    XLA keeps computing them; only the gathers of the moments, the Adam arithmetic and the scatters go.
    """
    import jax.numpy as jnp

    from hwrepro.sparse import sparse_adam

    update_rows = sparse_adam.update_rows
    skipped = {"input": [num_features], "output": [num_labels], "both": [num_features, num_labels]}[which]

    def maybe_update(table, mu, nu, count, row_ids, grad_rows, *args):
        if table.ndim == 2 and table.shape[0] in skipped:
            keep_grads = 0.0 * jnp.sum(grad_rows.astype(jnp.float32))
            return table, mu.at[0, 0].add(keep_grads.astype(mu.dtype)), nu
        return update_rows(table, mu, nu, count, row_ids, grad_rows, *args)

    sparse_adam.update_rows = maybe_update


def profile(args: argparse.Namespace) -> None:
    import jax
    import numpy as np

    import slide_bench as bench
    from hwrepro import sparse

    if args.skip_updates:
        skip_updates(args.skip_updates, bench.NUM_FEATURES, bench.NUM_LABELS)
    state = sparse.init_state(jax.random.PRNGKey(0), bench.NUM_FEATURES, bench.NUM_LABELS, bench.HIDDEN,
                             method="lsh", lsh_spec=bench.main_job_lsh())
    m = bench.SHARED_M if args.mode == "shared" else bench.PER_EXAMPLE_M
    step = sparse.make_train_step("lsh", learning_rate=1e-4, num_candidates=m, candidate_mode=args.mode,
                                 bucket_capacity=bench.BUCKET_CAPACITY)
    batches = bench.synthetic_batches(np.random.default_rng(1), 4)
    key = jax.random.PRNGKey(2)
    if args.hlo:
        with open(args.hlo, "w") as f:
            f.write(step.lower(state, batches[0], key).compile().as_text())
    holder = {"state": state, "i": 0}

    def one_step():
        holder["state"], _ = step(holder["state"], batches[holder["i"] % 4], jax.random.fold_in(key, holder["i"]))
        holder["i"] += 1
        jax.block_until_ready(holder["state"])

    for _ in range(3):
        one_step()
    label = f"step without the Adam update of {args.skip_updates}" if args.skip_updates else "step"
    print(f"{label}: {bench._median_ms(one_step, args.steps):.2f} ms (median of {args.steps}, untraced)")
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        for _ in range(args.steps):
            one_step()
        jax.profiler.stop_trace()
        (path,) = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
    per_op = collections.Counter()
    for e in events:
        name = e.get("name", "")
        # XLA instruction thunks only: host-side Python and runtime bookkeeping events carry other names.
        if e.get("ph") == "X" and not name.startswith(("$", "Thunk", "Pjit", "Common")) and " " not in name:
            per_op[name] += e.get("dur", 0)
    print("ms/step  instruction")
    for name, micros in per_op.most_common(args.top):
        print(f"{micros / args.steps / 1e3:7.3f}  {name}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
