"""What a training-state checkpoint costs at Amazon-670K shape, measured side by side in one process.

    python benchmarks/checkpoint_cost.py [--segments 6] [--steps 200] [--every 1000]

Builds the main job's SLIDE state (LSH tables included, about 1.3 GB), then trains in alternating segments of
`--steps` steps: one without checkpoints, one with a checkpoint at its start (as the loop saves one every
`--every` steps, its asynchronous write overlapping the next steps). Prints the time the loop blocks per save
(copying the state to host memory), the extra time of a checkpointed segment over a plain one (blocking
copy, background write competing for the cores), the checkpoint's size on disk and the restore time, and the
share of training time a checkpoint every `--every` steps costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import slide_bench as bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=6, help="pairs of (plain, checkpointed) segments")
    parser.add_argument("--steps", type=int, default=200, help="training steps per segment")
    parser.add_argument("--every", type=int, default=1000, help="checkpoint interval whose cost to report")
    parser.add_argument("--as-is", action="store_true",
                        help="run in this process as started, without the launcher's glibc tunables")
    args = parser.parse_args()
    if not args.as_is:
        bench.rerun_as_launched(__file__)

    import jax
    import numpy as np

    from hwrepro import sparse
    from hwrepro.harness.checkpoints import Checkpoints
    from hwrepro.harness.records import cpu_info

    state = sparse.init_state(jax.random.key(0), bench.NUM_FEATURES, bench.NUM_LABELS, bench.HIDDEN,
                              method="lsh", lsh_spec=bench.main_job_lsh())
    step = sparse.make_train_step("lsh", learning_rate=1e-3, num_candidates=bench.SHARED_M,
                                  bucket_capacity=bench.BUCKET_CAPACITY)
    batches = bench.synthetic_batches(np.random.default_rng(1), 16)
    gigabytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(state)) / 1e9
    folder = Path(tempfile.mkdtemp(prefix="ckpt-cost-", dir=os.environ.get("TMPDIR", "/tmp")))
    ckpt = Checkpoints(folder, keep=2)
    n = 0

    def segment(save: bool) -> tuple[float, float]:
        nonlocal state, n
        jax.block_until_ready(state)
        t0 = time.perf_counter()
        blocked = 0.0
        if save:
            ckpt.save(n, state, {"train_seconds": 0.0, "experiment": {}})
            blocked = time.perf_counter() - t0
        for i in range(args.steps):
            state, _ = step(state, batches[i % len(batches)], jax.random.key(n))
            n += 1
        jax.block_until_ready(state)
        return time.perf_counter() - t0, blocked

    segment(False)  # compile and warm up
    plain, saved, blocking = [], [], []
    for _ in range(args.segments):
        plain.append(segment(False)[0])
        seconds, blocked = segment(True)
        saved.append(seconds)
        blocking.append(blocked)
    ckpt.close()
    steps = sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())
    size = sum(f.stat().st_size for f in (folder / str(steps[-1])).rglob("*") if f.is_file()) / 1e9
    t0 = time.perf_counter()
    Checkpoints(folder).restore(steps[-1], state)
    restore = time.perf_counter() - t0

    cpu = cpu_info()
    step_s = statistics.median(plain) / args.steps
    extra = statistics.median(s - p for s, p in zip(saved, plain))
    print(f"CPU: {cpu['model']} ({', '.join(cpu['isa_flags'])}), {cpu['logical_cores']} cores")
    print(f"state {gigabytes:.2f} GB; checkpoint on disk {size:.2f} GB; restore {restore:.2f} s")
    print(f"step {1000 * step_s:.1f} ms (median of {args.segments} plain segments of {args.steps} steps)")
    print(f"save blocks the loop {1000 * statistics.median(blocking):.0f} ms; a checkpointed segment takes "
          f"{extra:.2f} s more than a plain one (median of {args.segments} pairs)")
    print(f"a checkpoint every {args.every} steps: {100 * extra / (args.every * step_s):.1f}% of training time")


if __name__ == "__main__":
    main()
