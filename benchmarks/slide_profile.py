"""Where the SLIDE training step's time goes: XLA thunk times from a `jax.profiler` trace.

    python benchmarks/slide_profile.py              # with the launcher's allocator tunables
    GLIBC_TUNABLES= python benchmarks/slide_profile.py --as-is   # as this process was started

Prints the median step time, then the summed duration of each optimised-HLO instruction over the traced
steps, per step, largest first. Thunks on the two cores overlap, so the times add up to more than the step;
the profiler's own overhead makes traced steps slower. Match names to `--hlo` (the optimised HLO text).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="steps timed and traced")
    parser.add_argument("--top", type=int, default=30, help="instructions printed")
    parser.add_argument("--hlo", help="also write the step's optimised HLO text to this file")
    parser.add_argument("--as-is", action="store_true",
                        help="run in this process as started, without the launcher's glibc tunables")
    args = parser.parse_args()
    if not args.as_is:
        from hwrepro import numerics
        from hwrepro.config_base import numerics_config

        env = dict(numerics.startup_environment(numerics_config(), os.environ), JAX_PLATFORMS="cpu")
        sys.exit(subprocess.call([sys.executable, __file__, "--as-is", *sys.argv[1:]], env=env))
    profile(args)


def profile(args: argparse.Namespace) -> None:
    import jax
    import numpy as np

    import slide_bench as bench
    from hwrepro import slide

    state = slide.init_state(jax.random.PRNGKey(0), bench.NUM_FEATURES, bench.NUM_LABELS, bench.HIDDEN,
                             method="lsh")
    step = slide.make_train_step("lsh", learning_rate=1e-4, num_candidates=bench.SHARED_M,
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
    print(f"step: {bench._median_ms(one_step, args.steps):.2f} ms (median of {args.steps}, untraced)")
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
