"""SLIDE training-step benchmark at Amazon-670K shape: dense vs sampled vs LSH, fp32 vs bf16, AVX2 vs AVX512.

One run prints every measurement side by side:
  python benchmarks/slide_bench.py            # full: 20 timed steps per sparse configuration
  python benchmarks/slide_bench.py --quick    # fewer repeats
  python benchmarks/slide_bench.py --quick --platform=gpu   # the same steps on the first GPU (no ISA rows)
  python benchmarks/slide_bench.py --against=REF [--rounds=4]  # the lsh-shared step, this tree against git REF

With --against, children of this tree and of REF (checked out in a temporary git worktree) alternate round by
round, so a change in the machine's load falls on both; it prints each round, the medians and their ratio,
and whether the two computed the same loss (the same bits, as far as one scalar shows).

Every configuration runs in its own child process (this script re-invokes itself with --child), because the
CPU ISA cap is an XLA flag (--xla_cpu_max_isa) that must be in XLA_FLAGS before JAX starts, the glibc
allocator tunables are read when a process starts (numerics.huge_pages and numerics.keep_freed_memory, both
on unless a row says "off"), and a child's peak resident memory (maxrss) is then the memory of that
configuration's training alone.

Batches are random synthetic points with Amazon-670K's shape (135,909 features, 670,091 labels, ~75 active
features and ~5.4 labels per point); they measure speed, not learning.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time

NUM_FEATURES, NUM_LABELS, HIDDEN, BATCH = 135_909, 670_091, 128, 128
MAX_FEATURES, MAX_LABELS = 96, 16
MEAN_FEATURES, MEAN_LABELS = 75, 5.4
SHARED_M, PER_EXAMPLE_M, BUCKET_CAPACITY = 8192, 1024, 16
MAIN_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "configs", "slide_amazon.py")


def main_job_lsh():
    """The main job's hash family (configs/slide_amazon.py): the LSH rows time the tables it trains with."""
    from hwrepro.harness.config import load_config_file
    from hwrepro.experiments.slide import lsh_spec

    return lsh_spec(load_config_file(MAIN_CONFIG))


def synthetic_batches(rng, count: int, num_labels: int = NUM_LABELS) -> list[dict]:
    """Random batches in the shared format: ~75 features (values ~ tf-idf-like) and ~5.4 labels per point."""
    import numpy as np

    batches = []
    for _ in range(count):
        nf = np.clip(rng.poisson(MEAN_FEATURES, BATCH), 1, MAX_FEATURES)
        nl = np.clip(rng.poisson(MEAN_LABELS - 1, BATCH) + 1, 1, MAX_LABELS)
        feat_ids = np.full((BATCH, MAX_FEATURES), NUM_FEATURES, np.int32)
        feat_vals = np.zeros((BATCH, MAX_FEATURES), np.float32)
        labels = np.full((BATCH, MAX_LABELS), num_labels, np.int32)
        for i in range(BATCH):
            feat_ids[i, :nf[i]] = rng.choice(NUM_FEATURES, nf[i], replace=False)
            feat_vals[i, :nf[i]] = rng.uniform(0.05, 0.3, nf[i])
            labels[i, :nl[i]] = rng.choice(num_labels, nl[i], replace=False)
        batches.append({"feat_ids": feat_ids, "feat_vals": feat_vals, "labels": labels})
    return batches


def _median_ms(fn, repeats: int) -> float:
    import numpy as np

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def matmul_gflops(dtype_name: str, repeats: int) -> float:
    """This machine's rate for the step's main product shape: [B, H] x [H, M] (jitted, median of repeats)."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.bfloat16 if dtype_name == "bf16" else jnp.float32
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(k1, (BATCH, HIDDEN), dtype)
    w = jax.random.normal(k2, (SHARED_M, HIDDEN), dtype)
    f = jax.jit(lambda a, w: jnp.einsum("bh,mh->bm", a, w, preferred_element_type=jnp.float32))
    jax.block_until_ready(f(a, w))
    ms = _median_ms(lambda: jax.block_until_ready(f(a, w)), repeats)
    return 2 * BATCH * HIDDEN * SHARED_M / ms / 1e6


def copy_gbs(platform: str = "cpu", megabytes: int = 256, repeats: int = 9) -> float:
    """The streaming memory rate where the step runs: bytes read plus written per second by a large NumPy
    copy on the CPU, by a jitted elementwise scale in the GPU's memory."""
    import numpy as np

    if platform == "gpu":
        import jax
        import jax.numpy as jnp

        x = jnp.ones(megabytes * 2**20 // 4, jnp.float32)
        scale = jax.jit(lambda x: x * 1.0001)
        jax.block_until_ready(scale(x))
        ms = _median_ms(lambda: jax.block_until_ready(scale(x)), repeats)
        return 2 * x.nbytes / ms / 1e6
    src = np.ones(megabytes * 2**20 // 4, np.float32)
    dst = np.empty_like(src)
    ms = _median_ms(lambda: np.copyto(dst, src), repeats)
    return 2 * src.nbytes / ms / 1e6


def row_gbs(num_rows: int, m: int, id_sets: int = 32) -> float:
    """Bytes per second of one jitted row gather and one row scatter of m float32 rows of a [num_rows, HIDDEN]
    table, ids sorted and unique and fresh each call (id_sets in turn, as a step's candidates are): the rate
    the step's row traffic can move at. NumPy's take and put of the same rows run at the same rate."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(4)
    ids = [jnp.asarray(np.sort(rng.choice(num_rows, m, replace=False)).astype(np.int32)) for _ in range(id_sets)]
    rows = jnp.ones((m, HIDDEN), jnp.float32)
    holder = {"table": jnp.zeros((num_rows, HIDDEN), jnp.float32), "i": 0}
    scatter = jax.jit(lambda t, i, u: t.at[i].set(u, mode="drop"), donate_argnums=0)
    gather = jax.jit(lambda t, i: t.at[i].get(mode="clip"))

    def both():
        holder["i"] += 1
        holder["table"] = scatter(holder["table"], ids[holder["i"] % id_sets], rows)
        jax.block_until_ready(gather(holder["table"], ids[(holder["i"] + id_sets // 2) % id_sets]))

    both()
    ms = _median_ms(both, 2 * id_sets)
    return 2 * rows.nbytes / ms / 1e6


def full_size_copies(compiled_text: str, num_labels: int) -> int:
    """Instructions in the optimised HLO that copy a whole [num_labels, hidden] array (W, mu or nu)."""
    shape = f"[{num_labels},{HIDDEN}]"
    count = 0
    for line in compiled_text.splitlines():
        _, sep, rhs = line.partition(" = ")
        result_type = rhs.lstrip().split(" ")[0]
        count += bool(sep) and shape in result_type and " copy(" in rhs
    return count


def child(spec: dict) -> dict:
    """Times one configuration; returns its measurements (printed as one JSON line)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from hwrepro import sparse
    from hwrepro.harness import numerics
    from hwrepro.harness.config import numerics_config

    n = numerics_config()
    n.platform = platform = spec.get("platform", "cpu")
    numerics.apply_after_jax(n)  # one clear error line when the platform is missing
    num_labels = spec["num_labels"]
    dtype = jnp.bfloat16 if spec["dtype"] == "bf16" else jnp.float32
    method, mode = spec["method"], spec.get("mode", "shared")
    m = PER_EXAMPLE_M if mode == "per_example" else SHARED_M
    out = dict(spec)
    t0 = time.perf_counter()
    state = sparse.init_state(jax.random.PRNGKey(0), NUM_FEATURES, num_labels, HIDDEN, method=method,
                             param_dtype=dtype, lsh_spec=main_job_lsh())
    jax.block_until_ready(state)
    out["init_s"] = time.perf_counter() - t0
    step = sparse.make_train_step(method, learning_rate=1e-4, num_candidates=m, candidate_mode=mode,
                                 bucket_capacity=BUCKET_CAPACITY, compute_dtype=dtype)
    batches = synthetic_batches(np.random.default_rng(1), 4, num_labels)
    key = jax.random.PRNGKey(2)
    t0 = time.perf_counter()
    compiled = step.lower(state, batches[0], key).compile()
    out["compile_s"] = time.perf_counter() - t0
    out["full_size_copies"] = full_size_copies(compiled.as_text(), num_labels)
    holder = {"state": state, "i": 0}

    def one_step():
        holder["state"], metrics = step(holder["state"], batches[holder["i"] % 4], jax.random.fold_in(key, holder["i"]))
        holder["i"] += 1
        jax.block_until_ready((holder["state"], metrics))
        holder["loss"] = float(metrics["loss"])
        holder["cand"] = float(metrics["candidates"])

    for _ in range(2):
        one_step()
    out["step_ms"] = _median_ms(one_step, spec["repeats"])
    out["loss"], out["candidates"] = holder["loss"], holder["cand"]
    if method == "lsh" and spec.get("rebuild_repeats"):
        # Each rebuild follows the steps of one rebuild period (untimed): a rebuild re-hashes only the rows
        # the steps changed since the last one (lsh.rebuild). These 4 synthetic batches change another share
        # than the main job's ~45% after 50 steps: returned as rebuild_changed.
        rebuild_ms, changed = [], []
        for _ in range(spec["rebuild_repeats"] + 1):
            for _ in range(spec["rebuild_period"]):
                one_step()
            changed.append(float(jnp.mean(holder["state"].tables.changed)))
            t0 = time.perf_counter()
            holder["state"] = sparse.rebuild(holder["state"], jax.random.PRNGKey(holder["i"]))
            jax.block_until_ready(holder["state"])
            rebuild_ms.append((time.perf_counter() - t0) * 1e3)
        out["rebuild_ms"] = float(np.median(rebuild_ms[1:]))  # the first compiles
        out["rebuild_changed"] = float(np.median(changed[1:]))
    if spec.get("floor"):
        out["matmul_gflops"] = matmul_gflops(spec["dtype"], 50)
        flops = 6 * BATCH * m * HIDDEN + 4 * BATCH * MEAN_FEATURES * HIDDEN
        out["step_gflop"] = flops / 1e9
        out["floor_ms"] = flops / out["matmul_gflops"] / 1e6
        # The rows a step must read and write however it is written: W, mu, nu at the M candidates and E, mu,
        # nu at the batch's distinct features (each read and written once), plus the candidate count array
        # over all labels (written, thresholded, read by top_k), at this machine's streaming copy rate.
        unique = np.mean([len(np.unique(b["feat_ids"][b["feat_ids"] < NUM_FEATURES])) for b in batches])
        row_bytes = HIDDEN * np.dtype(np.float32).itemsize
        traffic = (m + unique) * row_bytes * 3 * 2 + (num_labels + 1) * 4 * 3
        out["copy_gbs"] = copy_gbs(platform)
        out["traffic_mb"] = traffic / 1e6
        out["traffic_floor_ms"] = traffic / out["copy_gbs"] / 1e6
        # The same rows at the rate rows scattered over a large table move at (each row a separate memory
        # access: latency, not streaming bandwidth, bounds it on a CPU), the counts at the copy rate.
        rows = traffic - (num_labels + 1) * 4 * 3
        out["row_gbs"] = row_gbs(num_labels, m)
        out["row_floor_ms"] = (rows / out["row_gbs"] + (traffic - rows) / out["copy_gbs"]) / 1e6
    import hwrepro

    out["source"] = os.path.dirname(os.path.dirname(os.path.abspath(hwrepro.__file__)))  # the tree measured
    out["maxrss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out["huge_pages_gb"] = anon_huge_pages_gb()
    device = jax.devices()[0]
    out["device"] = device.device_kind
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use") if device.platform == "gpu" else None
    if peak is not None:
        out["device_peak_gb"] = peak / 2**30
    return out


def anon_huge_pages_gb() -> float:
    """This process's memory on transparent huge pages now (Linux; 0 elsewhere): shows the tunable took."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def startup_environment(**numerics_fields) -> dict[str, str]:
    """This process's environment plus what the launcher sets before JAX starts (the glibc allocator
    tunables of numerics.huge_pages and numerics.keep_freed_memory, both on unless given; JAX_PLATFORMS of
    numerics.platform, the CPU unless given)."""
    from hwrepro.harness import numerics
    from hwrepro.harness.config import numerics_config

    n = numerics_config()
    n.update(numerics_fields)
    return dict(numerics.startup_environment(n, os.environ), JAX_PLATFORMS=numerics.jax_platforms(n))


def rerun_as_launched(script: str) -> None:
    """Runs `script` again with the launcher's start-up environment and `--as-is` added, and exits with it."""
    sys.exit(subprocess.call([sys.executable, script, "--as-is", *sys.argv[1:]], env=startup_environment()))


def run_child(spec: dict, isa: str, tree: str | None = None) -> dict:
    """One configuration in a child process (this script, so both sides of --against measure alike);
    `tree`: the child imports hwrepro from that source tree instead."""
    platform = spec.get("platform", "cpu")
    env = startup_environment(platform=platform, huge_pages=spec.get("huge_pages", True),
                              keep_freed_memory=spec.get("keep_freed_memory", True))
    if platform == "cpu":
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_cpu_max_isa={isa}").strip()
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([tree, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raised = [line for line in lines if re.match(r"[A-Za-z_][\w.]*(: |$)", line)]  # "ValueError: ...", not notes
        return dict(spec, isa=isa, error=(raised or lines or ["failed"])[-1])
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]), isa=isa)


def against(ref: str, rounds: int, repeats: int) -> None:
    """The lsh-shared step of this tree and of git `ref`, children alternated over `rounds`."""
    import statistics
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = {"num_labels": NUM_LABELS, "dtype": "fp32", "repeats": repeats, "method": "lsh", "floor": True}
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "before")
        subprocess.run(["git", "-C", root, "worktree", "add", "--detach", "--quiet", tree, ref], check=True)
        try:
            runs = {"before": [], "after": []}
            for i in range(rounds):
                for name, where in (("before", tree), ("after", None)) if i % 2 == 0 else \
                        (("after", None), ("before", tree)):
                    r = run_child(spec, "AVX512", where)
                    if "error" in r:
                        sys.exit(f"{name}: {r['error']}")
                    if (r["source"] == tree) != (name == "before"):
                        sys.exit(f"{name}: the child imported hwrepro from {r['source']}")
                    runs[name].append(r)
                    print(f"round {i + 1} {name:<7}{r['step_ms']:>9.2f} ms/step  floor {r['floor_ms']:.2f} + "
                          f"{r['traffic_floor_ms']:.2f} ms  copies {r['full_size_copies']}  loss {r['loss']:.6f}",
                          flush=True)
        finally:
            subprocess.run(["git", "-C", root, "worktree", "remove", "--force", tree], check=False)
    med = {name: statistics.median(r["step_ms"] for r in rs) for name, rs in runs.items()}
    floor = statistics.median(r["floor_ms"] for rs in runs.values() for r in rs)
    both = floor + statistics.median(r["traffic_floor_ms"] for rs in runs.values() for r in rs)
    rows = floor + statistics.median(r["row_floor_ms"] for rs in runs.values() for r in rs)
    same = [a["loss"] == b["loss"] for a, b in zip(runs["before"], runs["after"])]
    print(f"before ({ref}) {med['before']:.2f} ms, after {med['after']:.2f} ms: after / before "
          f"{med['after'] / med['before']:.3f}; step / arithmetic floor {med['before'] / floor:.2f}x -> "
          f"{med['after'] / floor:.2f}x, / (arithmetic + row-traffic floor) {med['before'] / both:.2f}x -> "
          f"{med['after'] / both:.2f}x, / (arithmetic + row traffic at the random-row rate) "
          f"{med['before'] / rows:.2f}x -> {med['after'] / rows:.2f}x; same loss: {all(same)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="5 timed steps per configuration instead of 20, one timed rebuild instead of 3")
    parser.add_argument("--platform", choices=("cpu", "gpu"), default="cpu",
                        help="gpu: the step rows on the first GPU, fp32 and bf16 (the ISA and allocator rows "
                             "are CPU settings)")
    parser.add_argument("--against", metavar="REF",
                        help="time the lsh-shared step of this tree against git REF's, children alternated")
    parser.add_argument("--rounds", type=int, default=4, help="with --against: alternated rounds")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.against:
        against(args.against, args.rounds, 5 if args.quick else 9)
        return
    from hwrepro.harness.config import load_config_file
    from hwrepro.harness.records import cpu_info

    sparse_reps = 5 if args.quick else 20
    dense_reps = 2 if args.quick else 4
    hashes = load_config_file(MAIN_CONFIG).lsh
    base = {"num_labels": NUM_LABELS, "dtype": "fp32", "repeats": sparse_reps, "platform": args.platform,
            "rebuild_repeats": 1 if args.quick else 3, "rebuild_period": hashes.rebuild_period}
    main_isa = "AVX512" if args.platform == "cpu" else "gpu"
    if args.platform == "gpu":  # dense gets as many repeats as the sparse rows: a GPU step takes milliseconds
        runs = [("lsh shared", "gpu", dict(base, method="lsh", floor=True)),
                ("lsh per-example", "gpu", dict(base, method="lsh", mode="per_example")),
                ("sampled", "gpu", dict(base, method="sampled")),
                ("dense", "gpu", dict(base, method="dense")),
                ("lsh shared", "gpu", dict(base, method="lsh", dtype="bf16", floor=True)),
                ("dense", "gpu", dict(base, method="dense", dtype="bf16"))]
    else:
        runs = [
            ("lsh shared", "AVX512", dict(base, method="lsh", floor=True)),
            ("lsh per-example", "AVX512", dict(base, method="lsh", mode="per_example")),
            ("sampled", "AVX512", dict(base, method="sampled")),
            ("dense", "AVX512", dict(base, method="dense", repeats=dense_reps)),
            ("lsh shared", "AVX512", dict(base, method="lsh", dtype="bf16", floor=True)),
            ("lsh shared", "AVX2", dict(base, method="lsh", floor=True)),
            ("lsh shared", "AVX2", dict(base, method="lsh", dtype="bf16")),
            ("lsh shared", "AVX512", dict(base, method="lsh", num_labels=NUM_LABELS // 4)),
            ("lsh shared", "AVX512", dict(base, method="lsh", huge_pages=False)),
            ("dense", "AVX512", dict(base, method="dense", repeats=dense_reps, huge_pages=False)),
            ("lsh shared", "AVX512", dict(base, method="lsh", keep_freed_memory=False)),
            ("dense", "AVX512", dict(base, method="dense", repeats=dense_reps, keep_freed_memory=False)),
        ]
    results = []
    cpu = cpu_info()
    print(f"CPU: {cpu['model']}, {cpu['logical_cores']} logical cores, ISA flags {' '.join(cpu['isa_flags'])}"
          + ("" if "avx512f" in cpu["isa_flags"] else "; no AVX-512 here: the AVX512 rows run at the best ISA "
             "this CPU has, so they time the same code as the AVX2 rows"), flush=True)
    print(f"LSH tables as in configs/slide_amazon.py: {hashes.kind}, K = {hashes.num_hashes}, "
          f"L = {hashes.num_tables}, bucket capacity {BUCKET_CAPACITY}, shared candidate set M = {SHARED_M}",
          flush=True)
    print(f"{'configuration':<18}{'ISA':<8}{'params':<7}{'THP':<5}{'keep':<6}{'labels':>9}{'ms/step':>10}"
          f"{'rebuild ms':>12}{'floor ms':>10}{'meas/floor':>11}{'copies':>7}{'maxrss GB':>10}{'THP GB':>9}",
          flush=True)
    for name, isa, spec in runs:
        r = dict(run_child(spec, isa), name=name)
        results.append(r)
        thp = "on" if spec.get("huge_pages", True) else "off"
        keep = "on" if spec.get("keep_freed_memory", True) else "off"
        if "error" in r:
            print(f"{name:<18}{isa:<8}{spec['dtype']:<7}{thp:<5}{keep:<6} error: {r['error']}", flush=True)
            continue
        floor = f"{r['floor_ms']:.2f}" if "floor_ms" in r else "-"
        ratio = f"{r['step_ms'] / r['floor_ms']:.2f}" if "floor_ms" in r else "-"
        rebuild = f"{r['rebuild_ms']:.0f}" if "rebuild_ms" in r else "-"
        print(f"{name:<18}{isa:<8}{r['dtype']:<7}{thp:<5}{keep:<6}{r['num_labels']:>9}{r['step_ms']:>10.2f}"
              f"{rebuild:>12}{floor:>10}{ratio:>11}{r['full_size_copies']:>7}{r['maxrss_gb']:>10.2f}"
              f"{r['huge_pages_gb']:>9.2f}", flush=True)
    by = {(r["name"], r["isa"], r["dtype"], r["num_labels"], r.get("huge_pages", True),
           r.get("keep_freed_memory", True)): r for r in results if "error" not in r}
    lsh = by.get(("lsh shared", main_isa, "fp32", NUM_LABELS, True, True))
    dense = by.get(("dense", main_isa, "fp32", NUM_LABELS, True, True))
    if lsh and dense:
        print(f"dense / lsh-shared step time: {dense['step_ms'] / lsh['step_ms']:.1f}x (target >= 40x on the "
              "2-core CPU)")
    if args.platform == "gpu" and lsh:
        print(f"GPU: {lsh['device']}; device memory peak of the lsh-shared child "
              f"{lsh.get('device_peak_gb', float('nan')):.2f} GB"
              + (f", dense child {dense.get('device_peak_gb', float('nan')):.2f} GB" if dense else ""))
    for what, off in (("huge pages", (False, True)), ("keeping freed memory", (True, False))):
        lsh_off = by.get(("lsh shared", "AVX512", "fp32", NUM_LABELS, *off))
        dense_off = by.get(("dense", "AVX512", "fp32", NUM_LABELS, *off))
        if lsh_off and dense_off and lsh and dense:
            print(f"without {what}: dense / lsh-shared {dense_off['step_ms'] / lsh_off['step_ms']:.1f}x; {what} "
                  f"speed lsh-shared {lsh_off['step_ms'] / lsh['step_ms']:.2f}x (rebuild "
                  f"{lsh_off['rebuild_ms'] / lsh['rebuild_ms']:.2f}x), dense "
                  f"{dense_off['step_ms'] / dense['step_ms']:.2f}x; lsh-shared maxrss {lsh_off['maxrss_gb']:.2f} -> "
                  f"{lsh['maxrss_gb']:.2f} GB, dense {dense_off['maxrss_gb']:.2f} -> {dense['maxrss_gb']:.2f} GB")
    per_example = by.get(("lsh per-example", main_isa, "fp32", NUM_LABELS, True, True))
    if lsh and per_example:
        print(f"lsh per-example / shared step: {per_example['step_ms'] / lsh['step_ms']:.2f}x (target <= 2x); "
              f"B * m = {BATCH * PER_EXAMPLE_M:,} candidate slots against M = {SHARED_M:,}")
    if lsh:
        print(f"lsh-shared step / arithmetic floor: {lsh['step_ms'] / lsh['floor_ms']:.2f}x (target <= 4.5x); "
              f"floor = {lsh['step_gflop']:.3f} GFLOP / {lsh['matmul_gflops']:.0f} GFLOP/s measured "
              f"[{BATCH}x{HIDDEN}]x[{HIDDEN}x{SHARED_M}] matmul")
        both = lsh["floor_ms"] + lsh["traffic_floor_ms"]
        print(f"lsh-shared step / (arithmetic + row-traffic floor): {lsh['step_ms'] / both:.2f}x (target <= 2.5x); "
              f"traffic floor = "
              f"{lsh['traffic_mb']:.0f} MB of rows and counts / {lsh['copy_gbs']:.1f} GB/s measured copy rate = "
              f"{lsh['traffic_floor_ms']:.2f} ms")
        rows = lsh["floor_ms"] + lsh["row_floor_ms"]
        print(f"lsh-shared step / (arithmetic + row traffic at the random-row rate): {lsh['step_ms'] / rows:.2f}x; "
              f"rows gathered and scattered at {lsh['row_gbs']:.1f} GB/s measured (fresh ids) = "
              f"{lsh['row_floor_ms']:.2f} ms")
        print(f"lsh-shared peak memory (maxrss): {lsh['maxrss_gb']:.2f} GB (target < 6 GB); "
              f"amortised rebuild at SLIDE's every-50-batches: {lsh['rebuild_ms'] / 50:.1f} ms/step")
        small = by.get(("lsh shared", "AVX512", "fp32", NUM_LABELS // 4, True, True))
        if small:
            print(f"num_labels {NUM_LABELS // 4} -> {NUM_LABELS}: {small['step_ms']:.2f} -> {lsh['step_ms']:.2f} "
                  f"ms/step at fixed M = {SHARED_M}")
    print("JSON " + json.dumps(results))


if __name__ == "__main__":
    main()
