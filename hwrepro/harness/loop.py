"""The training loop every experiment shares: steps, metric logging, evaluation, progress, checkpoints and
resuming, divergence and signal stops.

The loop only synchronises with the device on logging steps: step metrics are summed on the device in
between, so JAX's asynchronous dispatch keeps the host ahead of the computation.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from hwrepro.errors import RunFailed
from hwrepro.harness import interrupts, parallel
from hwrepro.harness.checkpoints import Checkpoints
from hwrepro.harness.progress import Progress
from hwrepro.harness.records import CHECKPOINT_DIR, Run, resume_hint
from hwrepro.harness.timing import activity_seconds, loop_fields, timed


def _add(acc, metrics):
    return jax.tree_util.tree_map(jnp.add, acc, metrics)


_add_jit = jax.jit(_add, donate_argnums=0)


def fit(state: Any,
        train_step: Callable[[Any, Any], tuple[Any, dict]],
        batches: Iterator[Any],
        *,
        num_steps: int,
        examples_per_step: int,
        rec: Run,
        log_every: int = 50,
        steps_per_epoch: int | None = None,
        eval_fn: Callable[[Any], dict] | None = None,
        eval_every: int = 0,
        after_step: Callable[[int, Any], Any] | None = None,
        snapshot_every: int = 0,
        snapshot_fn: Callable[[int, Any], dict] | None = None,
        checkpoint_every: int = 0,
        checkpoint_keep: int = 2,
        host: dict[str, Any] | None = None,
        label: str | None = None) -> Any:
    """Runs `num_steps` of `train_step(state, batch) -> (state, metrics)` and returns the final state.

    Every `log_every` steps (and at the last step) writes one metrics.jsonl line: step, epoch, the mean of
    each step metric since the previous line, examples/s over that window, and `train_seconds`, the time
    spent in this loop outside evaluation and checkpoints (the x axis of time-to-accuracy plots), and the
    running totals of compilation, table upkeep, evaluation and checkpoint time (hwrepro.harness.timing).
    `eval_fn(state) -> dict` runs every `eval_every` steps (0: only at the end) and its values join that line
    (prefixed `eval_`).
    `after_step(step, state) -> state` is for host-side schedules (e.g. SLIDE's table rebuilds).
    `snapshot_fn(step, state) -> dict` runs every `snapshot_every` steps (and at the last step when
    snapshot_every > 0); it forces a metrics line and its values join it (see `snapshotter`).

    Resuming: with `checkpoint_every` > 0 the whole state is checkpointed every that many steps (forcing a
    metrics line) into the run's workdir/checkpoints (process 0's workdir in a run over several processes) (the last `checkpoint_keep` kept), with `host`, a dict of the
    experiment's own JSON-able counters. When that folder holds a checkpoint, the loop starts from it: state
    and `host` restored (in place), records after its step dropped, the batches before it skipped, so
    `batches` must be the same sequence from step 1 (it is a function of the seed in every experiment).

    On return, host["train_seconds"] is the training time over all resumptions.

    Stops: a non-finite mean loss raises RunFailed ("loss is nan at step N"; the last checkpoint, taken
    before, stays). SIGINT / SIGTERM / SIGHUP (see interrupts) end the current step, then the loop writes a
    metrics line and a checkpoint (if checkpointing) and raises Interrupted.
    """
    host = {} if host is None else host
    train_seconds, start, spent = 0.0, 0, {}
    several = jax.process_count() > 1  # every process must save, and stop, at the same steps
    folder = parallel.run_workdir(rec.workdir) / CHECKPOINT_DIR  # one for all the processes of a run
    ckpt = Checkpoints(folder, checkpoint_keep) if checkpoint_every else None
    if ckpt is not None and (start := ckpt.latest_step() or 0):
        try:
            state, saved = ckpt.restore(start, state)
        except BaseException:
            ckpt.close()
            raise
        train_seconds, spent = saved["train_seconds"], saved.get("spent", {})
        host.update(saved["experiment"])
        rec.rewind(start)
        rec.note("resumed_from_step", start)
        rec.print(f"resuming from the checkpoint at step {start} of {num_steps}")
        batches = itertools.islice(batches, start, None)
    progress = Progress(num_steps, label or rec.info.get("name") or "train")
    window_start, window_steps, acc = time.time(), 0, None

    def save(step: int, state: Any) -> None:
        # Copies: orbax writes the JSON in a background thread while the loop goes on updating these dicts.
        ckpt.save(step, state, copy.deepcopy({"train_seconds": train_seconds, "spent": spent, "experiment": host}))

    try:
        with interrupts.at_step_boundary():
            for step in range(start + 1, num_steps + 1):
                batch = next(batches)
                with timed(spent, "compile_seconds") if step == start + 1 else contextlib.nullcontext():
                    state, metrics = train_step(state, batch)
                if after_step is not None:
                    state = after_step(step, state)
                acc = metrics if acc is None else _add_jit(acc, metrics)
                window_steps += 1
                last = step == num_steps
                stop = interrupts.pending()
                if several:  # the processes agree on a stop at logging and checkpoint steps only
                    on_time = step % log_every == 0 or last or (ckpt is not None and step % checkpoint_every == 0)
                    stop = _agreed_stop(stop) if on_time else None
                snapshot = snapshot_fn is not None and snapshot_every > 0 and (step % snapshot_every == 0 or last)
                # Not after the last step (the run is about to end), unless a signal stops it there.
                checkpoint = ckpt is not None and (stop is not None or (not last and step % checkpoint_every == 0))
                evaluate = eval_fn is not None and (last or bool(eval_every and step % eval_every == 0))
                if not (step % log_every == 0 or last or snapshot or checkpoint or stop or evaluate):
                    continue
                means = {k: float(v) / window_steps for k, v in jax.device_get(acc).items()}
                loss = means.get("loss")
                if loss is not None and not math.isfinite(loss):
                    raise RunFailed(f"loss is {loss} at step {step}" + (
                        f" (the checkpoint at step {ckpt.latest_step()} is kept)" if ckpt and ckpt.latest_step() else ""))
                elapsed = time.time() - window_start
                train_seconds += elapsed
                row = dict(means)
                if steps_per_epoch:
                    row["epoch"] = step / steps_per_epoch
                row["examples_per_s"] = window_steps * examples_per_step / max(elapsed, 1e-9)
                row["train_seconds"] = train_seconds
                if evaluate:
                    with timed(spent, "evaluation_seconds"):
                        row.update({f"eval_{k}": v for k, v in eval_fn(state).items()})
                if snapshot:
                    with timed(spent, "checkpoint_seconds"):
                        row.update(snapshot_fn(step, state))
                row.update(loop_fields(spent, host))
                rec.log(step, **row)
                if last and stop is None:  # a signal that came during the last step's work (every process is here)
                    stop = _agreed_stop(interrupts.pending()) if several else interrupts.pending()
                    checkpoint = ckpt is not None and stop is not None
                if checkpoint:
                    with timed(spent, "checkpoint_seconds"):
                        save(step, state)
                shown = {k: v for k, v in row.items() if k in ("loss", "epoch") or k.startswith("eval_")}
                # evaluations always print
                progress.update(step, force=last or evaluate, seconds=activity_seconds(row), **shown)
                if stop is not None:
                    raise interrupts.Interrupted(stop, f" at step {step} of {num_steps}" + (
                        f"; checkpoint saved, {resume_hint(rec.workdir)}" if ckpt else ""))
                window_start, window_steps, acc = time.time(), 0, None
    finally:
        if ckpt is not None:
            ckpt.close()
    host["train_seconds"] = train_seconds
    return state


def snapshot_spacing(num_steps: int, snapshots: int) -> int:
    """`fit`'s snapshot_every for about `snapshots` evenly spaced parameter snapshots (train.checkpoints; 0:
    none), the last step's always among them: every num_steps // snapshots steps, at least every step."""
    return max(num_steps // snapshots, 1) if snapshots else 0


def _agreed_stop(stop: str | None) -> str | None:
    """A signal pending in any process of the run (its name, or that of the lowest process that has one), so
    that all of them checkpoint and stop at the same step; None when none has. One small all-gather."""
    from jax.experimental import multihost_utils

    names = tuple(s.name for s in interrupts.SIGNALS)
    code = names.index(stop) + 1 if stop in names else 0
    codes = multihost_utils.process_allgather(np.int32(code))
    return stop or next((names[c - 1] for c in np.asarray(codes).ravel() if c), None)


def snapshotter(rec: Run, params_of: Callable[[Any], Any], *, loss_fn: Callable | None = None,
                probe_batch: Any = None, hessian_iters: int = 0, key: jax.Array | None = None
                ) -> Callable[[int, Any], dict]:
    """A `snapshot_fn` for `fit`: adds the parameters to trajectory.npz (for the sweep report's divergence
    analysis) and, with `hessian_iters` > 0, estimates the extreme Hessian eigenvalues of
    `loss_fn(params, probe_batch)` by Lanczos (the saddle-point diagnostic), on the same fixed batch and start
    vector at every snapshot."""
    from hwrepro.study.hessian import extreme_eigenvalues

    def at_snapshot(step: int, state: Any) -> dict:
        params = params_of(state)
        rec.save_params(step, params)
        if not hessian_iters:
            return {}
        largest, smallest = extreme_eigenvalues(loss_fn, params, probe_batch, key, hessian_iters)
        return {"hessian_max": float(largest), "hessian_min": float(smallest)}

    return at_snapshot
