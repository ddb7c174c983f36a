"""The sharded SLIDE step at Amazon-670K's shape: step time, per-device memory of the output layer, and the
bytes each step sends between devices, for several (data, model) meshes in one run.

    python benchmarks/shard_bench.py                          # meshes 1x1, 1x2, 2x1 (data x model), method lsh
    python benchmarks/shard_bench.py --meshes 1x1,1x2 --method sampled --steps 10
    python benchmarks/shard_bench.py --meshes 1x1,1x2,2x1,1x1@1 --rounds 3  # 1x1@1: one device on one core
    python benchmarks/shard_bench.py --meshes 1x2,1x2/2                     # /2: over 2 local processes
    python benchmarks/shard_bench.py --platform gpu --meshes 1x1,1x2,2x1,1x2/2  # a machine with >= 2 GPUs

Each mesh runs in its own child process with JAX_NUM_CPU_DEVICES = data * model (JAX fixes its devices when
it starts); `DxM@C` pins that child to C cores; `DxM/P` runs the mesh over P local processes joined by
jax.distributed on loopback (CPU collectives over gloo; hwrepro.harness.parallel), each with D * M / P
devices, and reports process 0's step time (`DxM@C/P`: process i pinned to cores [i C, (i + 1) C)). Per
device, "output layer" is W, b and their row-Adam moments, "tables" the LSH tables, read from the arrays'
addressable shards. Bytes sent: computed from the shapes (hwrepro.sparse.sharded's docstring lists the
collectives), and measured as the result sizes of the all-gather / all-reduce ops in the compiled step's HLO
(a 1-device mesh keeps trivial all-reduces that move nothing); over processes also as the loopback
interface's bytes during the timed steps. Batches: slide_bench's (~75 features and ~5.4 labels a point, as
Amazon-670K has, ids uniform), those of the one-device step table: timing, not learning. Results:
docs/benchmarks.md, "The sharded step".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

# The sibling script (this folder is on sys.path when a script of it runs).
from slide_bench import BATCH as B, HIDDEN as H, MAX_FEATURES as FMAX, MAX_LABELS as LMAX, NUM_FEATURES as F, \
    NUM_LABELS as N, SHARED_M as M, startup_environment, synthetic_batches

REPO = Path(__file__).resolve().parent.parent
_BYTES = {"f32": 4, "s32": 4, "u32": 4, "pred": 1, "bf16": 2, "u16": 2, "f64": 8, "s64": 8, "u64": 8}


def hlo_collective_bytes(hlo: str) -> dict[str, int]:
    """Result bytes of each kind of collective in an HLO module's text (per device, per call)."""
    out: dict[str, int] = {}
    for line in hlo.splitlines():
        m = re.search(r"=\s*(\(?[^=]*?\)?)\s+(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
                      r"(-start)?\(", line)
        if not m:
            continue
        size = sum(_BYTES.get(t, 4) * (eval("*".join(d.split(",")) or "1") if d else 1)
                   for t, d in re.findall(r"(\w+)\[([\d,]*)\]", m.group(1)))
        out[m.group(2)] = out.get(m.group(2), 0) + size
    return out


def computed_bytes(method: str, data: int, model: int) -> int:
    """Bytes one device receives per step from the collectives of the sharded step (docstring's list)."""
    bp = B // data
    total = 0
    if method != "dense":
        if data > 1:
            total += 4 * B * LMAX + (4 * B * H if method == "lsh" else 0)            # labels (+ h) all_gather
            total += 4 * B * FMAX * (H + 1)                                          # E rows + ids all_gather
            total += 4 * ((M // model) * (H + 1) + H + 1)                            # W, b rows, hidden bias psum
        if model > 1:
            total += 4 * (bp + 3 * bp + 2 * bp * H)                  # pmax, psum [B',3], h and g_h psums
    else:
        if model > 1:
            total += 4 * (bp + 3 * bp + 2 * bp * H)
        if data > 1:
            total += 4 * ((-(-N // model)) * (H + 1) + (-(-F // model)) * H + H)
    return total


def child(method: str, data: int, model: int, steps: int) -> dict:
    from hwrepro.harness import parallel

    parallel.initialize()  # a mesh over several processes: joined before JAX's backend starts
    import jax
    import numpy as np

    from hwrepro.sparse import sharded

    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:data * model]).reshape(data, model), ("data", "model"))
    t = time.time()
    state = sharded.init_state(mesh, jax.random.key(0), F, N, H, method=method)
    jax.block_until_ready(state)
    init_s = time.time() - t
    per_device: dict[str, dict[str, int]] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        names = set(sharded._names(path))
        part = "tables" if "tables" in names else "output" if {"output", "weight", "out_bias"} & names else None
        for shard in leaf.addressable_shards if part else ():
            mine = per_device.setdefault(str(shard.device), {"output": 0, "tables": 0})
            mine[part] += shard.data.nbytes
    rng = np.random.default_rng(0)
    batches = [parallel.put_batch(mesh, b) for b in synthetic_batches(rng, 4)]
    step = sharded.make_train_step(mesh, method, num_labels=N, batch_size=B, learning_rate=1e-3, num_candidates=M)
    key = jax.random.key(1)
    t = time.time()
    hlo = step.lower(state, batches[0], key).compile().as_text()
    compile_s = time.time() - t
    for i in range(3):
        state, metrics = step(state, batches[i % 4], jax.random.fold_in(key, i))
    jax.block_until_ready(metrics)
    loopback = _loopback_bytes()
    t = time.time()
    for i in range(steps):
        state, metrics = step(state, batches[i % 4], jax.random.fold_in(key, i))
    jax.block_until_ready(metrics)
    step_s = time.time() - t
    loopback = (_loopback_bytes() - loopback) / steps / jax.process_count() if jax.process_count() > 1 else None
    return {"method": method, "data": data, "model": model, "step_ms": 1e3 * step_s / steps,
            "init_s": round(init_s, 1), "compile_s": round(compile_s, 1),
            "output_layer_MB_per_device": {d: round(b["output"] / 2**20, 1) for d, b in sorted(per_device.items())},
            "tables_MB_per_device": {d: round(b["tables"] / 2**20, 1) for d, b in sorted(per_device.items())},
            "bytes_per_step_computed": computed_bytes(method, data, model),
            "hlo_collective_result_bytes": hlo_collective_bytes(hlo),
            "loopback_bytes_per_step_and_process": loopback}


def _loopback_bytes() -> int:
    """Bytes sent over the loopback interface so far (Linux /proc/net/dev; all processes on it, heartbeats
    included): what processes joined on 127.0.0.1 really send each other."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, fields = line.partition(":")
        if name.strip() == "lo":
            return int(fields.split()[8])  # transmit bytes
    return 0


def parse_mesh(spec: str) -> tuple[int, int, int, int]:
    """"DxM[@C][/P]" -> (data, model, cores per process or 0 for all, processes)."""
    m = re.fullmatch(r"(\d+)x(\d+)(?:@(\d+))?(?:/(\d+))?", spec)
    if not m:
        raise SystemExit(f"mesh {spec!r}: expected DATAxMODEL[@CORES][/PROCESSES], e.g. 1x2, 1x1@1, 1x2@1/2")
    return int(m[1]), int(m[2]), int(m[3] or 0), int(m[4] or 1)


def run_mesh(mesh: str, method: str, steps: int, platform: str = "cpu") -> dict:
    """One mesh "DxM[@C][/P]" in fresh child processes; process 0's result, with every process's devices'
    memory merged in (or {"error": ...})."""
    from hwrepro.harness import parallel

    data, model, _, processes = parse_mesh(mesh)
    coordinator = parallel.local_coordinator()
    per = data * model // processes
    # As a training run starts: the launcher's glibc allocator tunables (numerics.huge_pages and
    # keep_freed_memory; without them the one-device step took twice as long here) and JAX_PLATFORMS.
    env = startup_environment(platform=platform)
    if platform == "cpu":
        env["JAX_NUM_CPU_DEVICES"] = str(per)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--child", mesh, "--method", method, "--steps", str(steps)], text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=dict(env, **({parallel.PROCESS_ENV: parallel.Place(i, processes, coordinator).env()}
                         if processes > 1 else {}),
                 **({"CUDA_VISIBLE_DEVICES": parallel.own_gpus(i, per)} if platform == "gpu" and processes > 1
                    else {}))) for i in range(processes)]
    outputs = [p.communicate(timeout=1800) for p in procs]
    results = [json.loads(line[7:]) for out, _ in outputs for line in out.splitlines() if line.startswith("RESULT ")]
    if len(results) < processes:
        return {"error": "".join(err for _, err in outputs)[-2000:]}
    for key in ("output_layer_MB_per_device", "tables_MB_per_device"):
        results[0][key] = {d: mb for r in results for d, mb in r[key].items()}
    return results[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--meshes", default="1x1,1x2,2x1", help="data x model meshes, comma-separated")
    ap.add_argument("--method", default="lsh", choices=("lsh", "sampled", "dense"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--platform", default="cpu", choices=("cpu", "gpu"),
                    help="gpu: one GPU per device of the mesh (benchmarks/gpu_check.sh on a multi-GPU machine)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the meshes this many times, interleaved (a shared machine's load drifts)")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        data, model, cores, _ = parse_mesh(a.child)
        if cores:  # before JAX starts: XLA sizes its thread pools from the affinity; process i takes its own
            from hwrepro.harness.numerics import own_cores

            os.sched_setaffinity(0, own_cores(sorted(os.sched_getaffinity(0)), cores))
        result = child(a.method, data, model, a.steps)
        print("RESULT " + json.dumps({"mesh": a.child, **result}), flush=True)
        return
    steps: dict[str, list[float]] = {}
    for _ in range(a.rounds):
        for mesh in a.meshes.split(","):
            result = run_mesh(mesh, a.method, a.steps, a.platform)
            print(json.dumps(result) if "step_ms" in result else f"mesh {mesh} failed: {result['error']}", flush=True)
            if "step_ms" in result:
                steps.setdefault(mesh, []).append(result["step_ms"])
    base = statistics.median(steps.get("1x1", [float("nan")]))
    for mesh, ms in steps.items():
        print(f"{mesh}: median step {statistics.median(ms):.1f} ms over {len(ms)} rounds "
              f"({', '.join(f'{x:.1f}' for x in ms)}), {statistics.median(ms) / base:.2f}x the 1x1 step", flush=True)

if __name__ == "__main__":
    main()
