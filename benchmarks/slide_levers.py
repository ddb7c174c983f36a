"""The SLIDE step's levers, each timed against the step as it is, in one process with alternated rounds.

    python benchmarks/slide_levers.py              # ~1.5 min on 2 cores
    python benchmarks/slide_levers.py --rounds 16  # more alternated rounds per comparison
    python benchmarks/slide_levers.py --parts 4    # the rebuild's parts only (~40 s)

Four parts at slide_bench's shape (synthetic Amazon-670K batches, M = 8,192 shared candidates, the main
job's hash tables), printed as they finish:

1. Where a step's time goes: each part of the lsh-shared step jitted alone (median ms), their sum against
   the whole step, and the rates the parts run at: the three candidate matmuls and one row gather and one
   row scatter of W's shape with ids the step has not touched before.
2. Row layouts for W's row-sparse Adam, the forward's row gather included: W, mu and nu as three [N, H]
   tables updated in blocks of 2,048 rows (this project's layout and the step's way); the same three tables
   updated all rows at once (the step before); with index hints (ids sorted and unique); the moments
   interleaved as one [N, 2, H] table; SLIDE's C++ layout, one [N, 3, H] table read and written once per row.
3. Exact rewrites of the whole step, each checked to give the same losses bit for bit: the targets' columns
   by binary search in the sorted candidates (no [num_labels] array), index hints on every row gather and
   scatter of the Adam, and both together. (A threshold search in place of the candidates' top_k was the third
   until c9fef9f, whose selection needs no top_k while the chosen ids fit.)
4. A table rebuild (what SLIDE's epoch pays beyond sampled softmax's) against its parts timed alone, the
   hashing with bf16 and fp32 hyperplanes (lsh.simhash.dtype).

Parts 2 and 3 alternate the variants round by round (reversed every other round), so a change in the
machine's load falls on all of them; each variant keeps its own state, so every step sees fresh ids.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import slide_bench as bench  # noqa: E402

M, H = bench.SHARED_M, bench.HIDDEN
HINTS = {"indices_are_sorted": True, "unique_indices": True}


def median_ms(fn, repeats: int = 20) -> float:
    """slide_bench's median over `repeats` calls of fn (after one untimed), each waited for."""
    import jax

    jax.block_until_ready(fn())
    return bench._median_ms(lambda: jax.block_until_ready(fn()), repeats)


def alternate(variants: dict, rounds: int, steps: int = 6) -> dict[str, float]:
    """Median over rounds of each variant's median step ms; variants: name -> a callable running one step."""
    for run in variants.values():
        for _ in range(3):
            run()
    per_round = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            per_round[name].append(bench._median_ms(variants[name], steps))
    return {name: statistics.median(ms) for name, ms in per_round.items()}


class Stepper:
    """Runs `step` (a jitted or compiled training step) on the benchmark's batches in turn, each with its own
    key; `state` is the latest state, `losses` every step's loss (read back, so each call waits for its step)."""

    def __init__(self, step, state, batches, key):
        self.step, self.state, self.batches, self.key, self.losses = step, state, batches, key, []

    def __call__(self) -> None:
        import jax

        i = len(self.losses)
        batch = self.batches[i % len(self.batches)]
        self.state, metrics = self.step(self.state, batch, jax.random.fold_in(self.key, i))
        self.losses.append(float(metrics["loss"]))


def fresh_state():
    import jax

    from hwrepro import sparse

    return sparse.init_state(jax.random.PRNGKey(0), bench.NUM_FEATURES, bench.NUM_LABELS, H, method="lsh",
                             lsh_spec=bench.main_job_lsh())


def device_batches(count: int = 4):
    import jax.numpy as jnp
    import numpy as np

    return [{k: jnp.asarray(v) for k, v in b.items()}
            for b in bench.synthetic_batches(np.random.default_rng(1), count)]


# --- 1. where the time goes ------------------------------------------------------------------------------

def parts() -> None:
    import jax
    import jax.numpy as jnp

    from hwrepro import sparse
    from hwrepro.models import sparse_layers as model
    from hwrepro.sparse import candidates, lsh, sparse_adam
    from hwrepro.sparse import training

    n, nf = bench.NUM_LABELS, bench.NUM_FEATURES
    state = fresh_state()
    batches = device_batches()
    key = jax.random.PRNGKey(2)
    step = sparse.make_train_step("lsh", learning_rate=1e-4, num_candidates=M, bucket_capacity=bench.BUCKET_CAPACITY)
    run = Stepper(step, state, batches, key)
    whole = median_ms(run)
    state, batch = run.state, batches[0]
    p_in, p_out, rows = state.params["input"], state.params["output"], state.opt_state.rows
    unique = jax.jit(functools.partial(candidates.unique_rows, num_rows=nf))
    feat_rows, inv = unique(batch["feat_ids"])
    e_rows = training._rows_at(p_in["embedding"], feat_rows)

    def hidden(r, bias):
        return model.embedding_sum(r[inv], batch["feat_vals"], bias)

    forward = jax.jit(hidden)
    h = forward(e_rows, p_in["bias"])
    retrieved = lsh.query(state.hash_fn, state.tables, h, bench.BUCKET_CAPACITY)
    select = jax.jit(functools.partial(candidates.batch_shared_candidates, num_candidates=M, num_labels=n))
    cand, mask = select(batch["labels"], retrieved, key)
    w_rows, b_rows = training._rows_at(p_out["weight"], cand), training._rows_at(p_out["bias"], cand)
    targets = candidates.shared_targets(batch["labels"], cand, n)
    out_grads = jax.jit(jax.value_and_grad(
        lambda w, b, hh: model.softmax_xent(model.candidate_logits(w, b, hh), targets, mask), argnums=(0, 1, 2)))
    _, (g_w, _, g_h) = out_grads(w_rows, b_rows, h)
    hidden_vjp = jax.jit(lambda r, bias, g: jax.vjp(hidden, r, bias)[1](g))
    g_e = hidden_vjp(e_rows, p_in["bias"], g_h)[0]
    count = jnp.int32(5)
    # As the step runs them: block by block over the slots that hold real ids (all M candidates; E's distinct
    # features, listed first).
    adam = jax.jit(lambda t, mu, nu, ids, g, used: sparse_adam.update_blocks(t, mu, nu, count, ids, g, used, 1e-4,
                                                                             0.9, 0.999, 1e-8), donate_argnums=(0, 1, 2))
    tables = {"W": [p_out["weight"], rows.mu["weight"], rows.nu["weight"]],
              "E": [p_in["embedding"], rows.mu["embedding"], rows.nu["embedding"]]}
    distinct = sparse_adam.real_ids(feat_rows, nf)

    def update(name, ids, g, used):
        tables[name][:] = adam(*tables[name], ids, g, used)
        return tables[name][0]

    gather_rows = jax.jit(training._rows_at)
    query = jax.jit(lsh.query, static_argnums=3)
    measured = {
        "unique feature rows (one sort)": median_ms(lambda: unique(batch["feat_ids"])),
        "gather E rows": median_ms(lambda: gather_rows(p_in["embedding"], feat_rows)),
        "hidden layer": median_ms(lambda: forward(e_rows, p_in["bias"])),
        "LSH query": median_ms(lambda: query(state.hash_fn, state.tables, h, bench.BUCKET_CAPACITY)),
        "candidate selection": median_ms(lambda: select(batch["labels"], retrieved, key)),
        "gather W, b rows": median_ms(lambda: (gather_rows(p_out["weight"], cand), gather_rows(p_out["bias"], cand))),
        "output layer forward + backward": median_ms(lambda: out_grads(w_rows, b_rows, h)),
        "hidden layer backward": median_ms(lambda: hidden_vjp(e_rows, p_in["bias"], g_h)),
        "Adam of W (8,192 rows)": median_ms(lambda: update("W", cand, g_w, jnp.int32(M))),
        f"Adam of E ({feat_rows.shape[0]:,} slots)": median_ms(lambda: update("E", feat_rows, g_e, distinct)),
    }
    print(f"1. Where the lsh-shared step's time goes (each part jitted alone, median of 20; "
          f"{int(distinct):,} distinct features)")
    for name, ms in measured.items():
        print(f"   {name:<36}{ms:8.2f} ms")
    print(f"   {'sum of the parts':<36}{sum(measured.values()):8.2f} ms;  the whole step {whole:.2f} ms")
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(3), 3)
    hh, w, gz = (jax.random.normal(k, s) for k, s in zip((k1, k2, k3), ((128, H), (M, H), (128, M))))
    flop = 2 * 128 * H * M / 1e9
    for name, spec, a, b in (("logits  bh,mh->bm", "bh,mh->bm", hh, w), ("g_h     bm,mh->bh", "bm,mh->bh", gz, w),
                             ("g_w     bm,bh->mh", "bm,bh->mh", gz, hh)):
        product = jax.jit(functools.partial(jnp.einsum, spec))
        ms = median_ms(lambda: product(a, b), 50)
        print(f"   matmul {name}: {ms:6.2f} ms = {flop / ms * 1e3:5.0f} GFLOP/s")
    rate = bench.row_gbs(n, M)
    print(f"   one row gather and one row scatter of {M:,} x {H} float32 rows of a [{n:,}, {H}] table, fresh ids "
          f"each call: {rate:.1f} GB/s (slide_bench.row_gbs); streaming copy {bench.copy_gbs():.1f} GB/s",
          flush=True)


# --- 2. row layouts --------------------------------------------------------------------------------------

def layouts(rounds: int) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from hwrepro.sparse import sparse_adam

    n = bench.NUM_LABELS
    rng = np.random.default_rng(0)
    id_sets = [jnp.asarray(np.sort(rng.choice(n, M, replace=False)).astype(np.int32)) for _ in range(8)]
    grad = jnp.asarray(rng.normal(size=(M, H)).astype(np.float32))
    h = jnp.asarray(rng.normal(size=(128, H)).astype(np.float32))
    count = jnp.int32(5)

    def adam(w, m, v, g):
        return sparse_adam.adam_rows(w, m, v, g, count, 1e-4, 0.9, 0.999, 1e-8)

    def forward_grad(w):  # stands for the forward pass: the gradient depends on the gathered rows
        return grad + 1e-9 * jnp.einsum("bh,mh->m", h, w)[:, None]

    def three(t, mu, nu, ids):
        w = t.at[ids].get(mode="clip")
        return sparse_adam.update_rows(t, mu, nu, count, ids, forward_grad(w), w, 1e-4, 0.9, 0.999, 1e-8)

    def blocks(t, mu, nu, ids):  # the forward's rows not reused: each block gathers its own
        g = forward_grad(t.at[ids].get(mode="clip"))
        return sparse_adam.update_blocks(t, mu, nu, count, ids, g, jnp.int32(M), 1e-4, 0.9, 0.999, 1e-8)

    def hinted(t, mu, nu, ids):
        w, m, v = (x.at[ids].get(mode="clip", **HINTS) for x in (t, mu, nu))
        new = adam(w, m, v, forward_grad(w))
        return tuple(x.at[ids].set(y, mode="drop", **HINTS) for x, y in zip((t, mu, nu), new))

    def moments_interleaved(t, mv, ids):
        w = t.at[ids].get(mode="clip", **HINTS)
        r = mv.at[ids].get(mode="clip", **HINTS)
        w, m, v = adam(w, r[:, 0], r[:, 1], forward_grad(w))
        return t.at[ids].set(w, mode="drop", **HINTS), mv.at[ids].set(jnp.stack([m, v], 1), mode="drop", **HINTS)

    def all_interleaved(s, ids):
        r = s.at[ids].get(mode="clip", **HINTS)
        new = adam(r[:, 0], r[:, 1], r[:, 2], forward_grad(r[:, 0]))
        return (s.at[ids].set(jnp.stack(new, 1), mode="drop", **HINTS),)

    table = lambda *shape: jnp.full(shape, 0.01, jnp.float32)  # noqa: E731
    setups = {"three [N, H] tables (as it is)": (blocks, [table(n, H), table(n, H), table(n, H)]),
              "three tables, all rows at once": (three, [table(n, H), table(n, H), table(n, H)]),
              "three tables, index hints": (hinted, [table(n, H), table(n, H), table(n, H)]),
              "W + moments [N, 2, H]": (moments_interleaved, [table(n, H), table(n, 2, H)]),
              "one [N, 3, H] table (SLIDE's C++)": (all_interleaved, [table(n, 3, H)])}
    turn = iter(range(10**9))

    def runner(fn, arrays):
        jitted = jax.jit(fn, donate_argnums=tuple(range(len(arrays))))

        def run():
            arrays[:] = jitted(*arrays, id_sets[next(turn) % len(id_sets)])
            jax.block_until_ready(arrays)
        return run

    medians = alternate({name: runner(fn, arrays) for name, (fn, arrays) in setups.items()}, rounds)
    print(f"2. W's row-sparse Adam by row layout ({M:,} sorted ids of {n:,} rows a step, 8 id sets in turn; the "
          f"forward's row gather included; {rounds} alternated rounds)")
    base = medians["three [N, H] tables (as it is)"]
    for name, ms in medians.items():
        print(f"   {name:<36}{ms:8.2f} ms  {ms / base:6.3f}x", flush=True)


# --- 3. exact rewrites of the whole step -----------------------------------------------------------------

def targets_by_search(labels, cand, num_labels):
    """candidates.shared_targets without its [num_labels] position array: cand is ascending, so a label's
    column is where a binary search finds it."""
    import jax.numpy as jnp

    from hwrepro.models import sparse_layers as model

    m = cand.shape[0]
    at = jnp.searchsorted(cand, labels).astype(jnp.int32)
    hit = (cand[jnp.minimum(at, m - 1)] == labels) & (labels < num_labels)
    return model.label_targets(labels, num_labels, columns=jnp.where(hit, at, m), width=m)


def hinted_update_rows(table, mu_table, nu_table, count, row_ids, grad_rows, current_rows, lr, b1, b2, eps):
    """sparse_adam.update_rows with index hints on its gathers and scatters (the step's ids are sorted and
    unique)."""
    import jax.numpy as jnp

    from hwrepro.sparse.sparse_adam import _stored_as, adam_rows, from_storage

    g = grad_rows.astype(jnp.float32)
    mu = from_storage(mu_table.at[row_ids].get(mode="clip", **HINTS)).astype(jnp.float32)
    nu = from_storage(nu_table.at[row_ids].get(mode="clip", **HINTS)).astype(jnp.float32)
    rows = table.at[row_ids].get(mode="clip", **HINTS) if current_rows is None else current_rows
    w, mu, nu = adam_rows(from_storage(rows).astype(jnp.float32), mu, nu, g, count, lr, b1, b2, eps)
    return tuple(t.at[row_ids].set(_stored_as(x, t.dtype), mode="drop", **HINTS)
                 for t, x in ((table, w), (mu_table, mu), (nu_table, nu)))


@contextlib.contextmanager
def patched(rewrites: set[str]):
    """The step's functions swapped for the named rewrites while a step is traced."""
    from hwrepro.sparse import sparse_adam, training

    saved = training.shared_targets, sparse_adam.update_rows
    if "targets" in rewrites:
        training.shared_targets = targets_by_search
    if "hints" in rewrites:
        sparse_adam.update_rows = hinted_update_rows
    try:
        yield
    finally:
        training.shared_targets, sparse_adam.update_rows = saved


def rewrites(rounds: int) -> None:
    import jax

    from hwrepro import sparse

    variants = {"as it is": set(), "targets by binary search": {"targets"}, "index hints in the Adam": {"hints"},
                "both": {"targets", "hints"}}
    batches = device_batches()
    key = jax.random.PRNGKey(2)
    runs = {}
    for name, which in variants.items():
        state = fresh_state()
        step = sparse.make_train_step("lsh", learning_rate=1e-4, num_candidates=M,
                                      bucket_capacity=bench.BUCKET_CAPACITY)
        with patched(which):
            compiled = step.lower(state, batches[0], key).compile()
        runs[name] = Stepper(compiled, state, batches, key)
    medians = alternate(runs, rounds)
    print(f"3. Exact rewrites of the whole lsh-shared step ({rounds} alternated rounds of 6 steps)")
    base = medians["as it is"]
    steps = min(len(run.losses) for run in runs.values())
    for name, ms in medians.items():
        same = runs[name].losses[:steps] == runs["as it is"].losses[:steps]
        print(f"   {name:<36}{ms:8.2f} ms  {ms / base:6.3f}x  same losses over {steps} steps: {same}", flush=True)


# --- 4. a table rebuild's parts ---------------------------------------------------------------------------

def rebuild_parts(rebuilds: int = 3) -> None:
    """A rebuild after each of `rebuilds` periods of 50 steps, against its two parts timed alone: hashing
    (every row of W with the main job's hyperplanes in bf16 and in fp32, then scaled to the share the steps
    changed) and grouping (lsh._host_group_by_bucket: per table, the ids in a random rank's order and one
    stable NumPy sort of their bucket codes, tables spread over the cores)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from hwrepro import sparse
    from hwrepro.sparse import lsh, sparse_adam

    state = fresh_state()
    step = sparse.make_train_step("lsh", learning_rate=1e-4, num_candidates=M, bucket_capacity=bench.BUCKET_CAPACITY)
    batches = device_batches()
    key = jax.random.PRNGKey(2)
    run = Stepper(step, state, batches, key)

    def period():
        for _ in range(50):
            run()

    hash_all = jax.jit(lsh.table_codes)
    fns = {dtype: state.hash_fn._replace(planes=jnp.array(state.hash_fn.planes, dtype, copy=True))  # rebuilds
           for dtype in (jnp.bfloat16, jnp.float32)}                                            # donate theirs
    period()
    run.state = sparse.rebuild(run.state, key)  # compiles
    weight = sparse_adam.from_storage(run.state.params["output"]["weight"])
    for fn in fns.values():  # compiles, at the timed shape
        codes = jax.block_until_ready(hash_all(fn, weight))
    lsh._host_group_by_bucket(np.asarray(codes), np.asarray(lsh._row_seeds(key, codes.shape[0])),
                              buckets=lsh.num_buckets(state.hash_fn))  # first-call costs (threads, pages)
    print(f"4. A table rebuild after 50 steps (hyperplanes in {state.hash_fn.planes.dtype}), and its parts timed "
          "alone (ms)")
    for r in range(rebuilds):
        period()
        state = jax.block_until_ready(run.state)
        changed = float(jnp.mean(state.tables.changed))
        weight = sparse_adam.from_storage(state.params["output"]["weight"])
        hashing = {}
        for dtype, fn in list(fns.items())[::1 if r % 2 == 0 else -1]:  # alternated order
            t0 = time.perf_counter()
            codes = jax.block_until_ready(hash_all(fn, weight))
            hashing[jnp.dtype(dtype).name] = (time.perf_counter() - t0) * 1e3
        t1 = time.perf_counter()
        lsh._host_group_by_bucket(np.asarray(codes), np.asarray(lsh._row_seeds(key, codes.shape[0])),
                                  buckets=lsh.num_buckets(state.hash_fn))
        t2 = time.perf_counter()
        run.state = jax.block_until_ready(sparse.rebuild(state, jax.random.fold_in(key, r)))
        t3 = time.perf_counter()
        every = ", ".join(f"{name} {ms:.0f} (the changed: ~{ms * changed:.0f})" for name, ms in hashing.items())
        print(f"   {changed:.0%} of W's rows changed: rebuild {(t3 - t2) * 1e3:5.0f}; hashing every row {every}; "
              f"grouping {codes.shape[0]} tables {(t2 - t1) * 1e3:4.0f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="alternated rounds in parts 2 and 3")
    parser.add_argument("--parts", default="1234", help="which parts to run, e.g. 4 (default: all)")
    parser.add_argument("--as-is", action="store_true", help="run as this process was started, without the "
                        "launcher's glibc tunables")
    args = parser.parse_args()
    if not args.as_is:
        bench.rerun_as_launched(__file__)
    from hwrepro.harness.records import cpu_info

    cpu = cpu_info()
    print(f"CPU: {cpu['model']}, {cpu['logical_cores']} logical cores, ISA flags {' '.join(cpu['isa_flags'])}",
          flush=True)
    for part, run in zip("1234", (parts, lambda: layouts(args.rounds), lambda: rewrites(args.rounds), rebuild_parts)):
        if part in args.parts:
            run()


if __name__ == "__main__":
    main()
