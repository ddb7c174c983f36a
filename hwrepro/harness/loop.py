"""The training loop every experiment shares: steps, metric logging, evaluation, progress.

The loop only synchronises with the device on logging steps: step metrics are summed on the device in
between, so JAX's asynchronous dispatch keeps the host ahead of the computation.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp

from hwrepro.harness.progress import Progress
from hwrepro.harness.records import Run


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
        checkpoint_every: int = 0,
        checkpoint_fn: Callable[[int, Any], dict] | None = None,
        label: str | None = None) -> Any:
    """Runs `num_steps` of `train_step(state, batch) -> (state, metrics)` and returns the final state.

    Every `log_every` steps (and at the last step) writes one metrics.jsonl line: step, epoch, the mean of
    each step metric since the previous line, examples/s over that window, and `train_seconds`, the time
    spent in this loop outside evaluation and checkpoints (the x axis of time-to-accuracy plots).
    `eval_fn(state) -> dict` runs every `eval_every` steps (0: only at the end) and its values join that line
    (prefixed `eval_`).
    `after_step(step, state) -> state` is for host-side schedules (e.g. SLIDE's table rebuilds).
    `checkpoint_fn(step, state) -> dict` runs every `checkpoint_every` steps (and at the last step when
    checkpoint_every > 0); it forces a metrics line and its values join it (see `checkpointer`).
    """
    progress = Progress(num_steps, label or rec.info.get("name") or "train")
    window_start, window_steps, acc = time.time(), 0, None
    train_seconds = 0.0
    for step in range(1, num_steps + 1):
        state, metrics = train_step(state, next(batches))
        if after_step is not None:
            state = after_step(step, state)
        acc = metrics if acc is None else _add_jit(acc, metrics)
        window_steps += 1
        last = step == num_steps
        checkpoint = checkpoint_fn is not None and checkpoint_every > 0 and (
            step % checkpoint_every == 0 or last)
        if step % log_every == 0 or last or checkpoint:
            means = {k: float(v) / window_steps for k, v in jax.device_get(acc).items()}
            elapsed = time.time() - window_start
            train_seconds += elapsed
            row = dict(means)
            if steps_per_epoch:
                row["epoch"] = step / steps_per_epoch
            row["examples_per_s"] = window_steps * examples_per_step / max(elapsed, 1e-9)
            row["train_seconds"] = train_seconds
            evaluated = eval_fn is not None and (last or bool(eval_every and step % eval_every == 0))
            if evaluated:
                row.update({f"eval_{k}": v for k, v in eval_fn(state).items()})
            if checkpoint:
                row.update(checkpoint_fn(step, state))
            rec.log(step, **row)
            shown = {k: v for k, v in row.items() if k in ("loss", "epoch") or k.startswith("eval_")}
            progress.update(step, force=last or evaluated, **shown)  # evaluations always print
            window_start, window_steps, acc = time.time(), 0, None
    return state


def checkpointer(rec: Run, params_of: Callable[[Any], Any], *, loss_fn: Callable | None = None,
                 probe_batch: Any = None, hessian_iters: int = 0, key: jax.Array | None = None
                 ) -> Callable[[int, Any], dict]:
    """A `checkpoint_fn` for `fit`: keeps the parameters (for the sweep report's divergence analysis) and,
    with `hessian_iters` > 0, estimates the extreme Hessian eigenvalues of `loss_fn(params, probe_batch)` by
    Lanczos (the saddle-point diagnostic), on the same fixed batch and start vector at every checkpoint."""
    from hwrepro.study.hessian import extreme_eigenvalues

    def at_checkpoint(step: int, state: Any) -> dict:
        params = params_of(state)
        rec.save_params(step, params)
        if not hessian_iters:
            return {}
        largest, smallest = extreme_eigenvalues(loss_fn, params, probe_batch, key, hessian_iters)
        return {"hessian_max": float(largest), "hessian_min": float(smallest)}

    return at_checkpoint
