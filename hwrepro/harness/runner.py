"""Runs one experiment in this process: numerics first, then JAX, then the experiment, all of it recorded.

Experiments are found by module name: `config.experiment = "slide"` runs `hwrepro.experiments.slide.run`
(see hwrepro.experiments). `run_here` is what the launcher's process, a child process (hwrepro.harness.process)
and tests call.

Exit codes of every hwrepro process: 0 done, 1 failed, 2 bad config, data or workdir, 3 skipped (platform missing).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import ml_collections

from hwrepro import experiments
from hwrepro.errors import ConfigError, DataError, HwreproError, ModelError, PlatformUnavailable, RunFailed
from hwrepro.harness import interrupts, numerics, parallel
from hwrepro.harness.config import dotted_fields

EXIT_DONE, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_SKIPPED = 0, 1, 2, 3


def validate(config: ml_collections.ConfigDict) -> None:
    """Checks the fields every experiment shares, without JAX; experiment modules check their own in `validate`."""
    experiments.module_name(config.get("experiment"))
    for field, value in dotted_fields(config).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{field}={value} must be a finite number")
    t = config.train
    for field in ("batch_size", "log_every", "checkpoint_keep"):
        if t[field] <= 0:
            raise ConfigError(f"train.{field}={t[field]} must be positive")
    for field in ("num_epochs", "num_steps", "eval_every", "checkpoints", "checkpoint_every", "hessian_iters"):
        if t[field] < 0:
            raise ConfigError(f"train.{field}={t[field]} must not be negative")
    if t.num_epochs == 0 and t.num_steps == 0:
        raise ConfigError("train.num_epochs and train.num_steps are both 0: nothing to train")
    if not t.learning_rate > 0:
        raise ConfigError(f"train.learning_rate={t.learning_rate} must be positive")
    if not isinstance(config.seed, int) or config.seed < 0:
        raise ConfigError(f"seed={config.seed!r} must be a non-negative integer")
    if t.init_from:
        _check_init_from(t.init_from)
    numerics.validate(config.numerics)
    parallel.validate(config)


def _check_init_from(workdir: str) -> None:
    """ConfigError naming train.init_from unless it is the workdir of a finished run that kept its model
    (before any data is read; the shapes are checked against the run's own by trained.load_params)."""
    from hwrepro.harness import records

    try:
        records.model_folder(Path(workdir))
    except ModelError as e:
        raise ConfigError(f"train.init_from={workdir!r}: {e}") from None


def experiment(config: ml_collections.ConfigDict) -> ModuleType:
    """The config's experiment module (imports it, and with it JAX), after its own checks of the config."""
    module = experiments.get(config.experiment)
    if hasattr(module, "validate"):
        module.validate(config)
    return module


def run_here(config: ml_collections.ConfigDict, workdir: Path, quiet: bool = False,
             locked: bool = False) -> dict[str, Any]:
    """Runs one experiment in this process and returns final.json's content.

    Numerics are applied only if JAX is not imported yet; otherwise the run goes ahead with the process's
    current settings, and run.json says so (`numerics_applied.before_jax: false`). The workdir is locked for
    the run (WorkdirBusy if another run owns it), and its records are touched only once the experiment has
    checked the config; an unfinished run of the same config resumes from its last checkpoint. `locked`: the
    launching process holds the workdir's lock for this one (a child process). SIGINT / SIGTERM / SIGHUP stop
    the run cleanly (interrupts.Interrupted).
    """
    from hwrepro.harness import records

    validate(config)
    lock = None if locked else records.lock_workdir(workdir)
    try:
        with interrupts.catch_signals():
            return _run_locked(config, Path(workdir), quiet)
    finally:
        if lock is not None:
            os.close(lock)


def _run_locked(config: ml_collections.ConfigDict, workdir: Path, quiet: bool) -> dict[str, Any]:
    from hwrepro.harness.records import CHECKPOINT_DIR, Run

    before_jax = "jax" not in sys.modules
    if before_jax:
        numerics.apply_before_jax(config.numerics)
    parallel.initialize()  # several processes: joined before JAX's backend starts
    numerics.apply_after_jax(config.numerics)
    module = experiment(config)  # its own checks, before the workdir is touched
    prepared = Run.prepare(workdir, config)
    try:
        rec = Run.start(workdir, config, {"before_jax": before_jax, **numerics.applied()}, quiet=quiet)
    except ConfigError:  # log.tensorboard without tensorboardX: nothing was written, the earlier run comes back
        if prepared.aside:
            Run.put_back(workdir, prepared.aside)
        raise
    rec.print(f"hwrepro: {config.experiment} '{config.name}' -> {workdir}")
    if prepared.aside:  # a resume needs the same config and a checkpoint: say where the earlier run went
        rec.print(f"the unfinished run there is not one this config resumes (another config, or no checkpoint): "
                  f"moved to {prepared.aside}")
    try:
        final_metrics, params = module.run(config, rec)
        if config.train.keep_model and parallel.is_main_process():  # process i > 0 records in process-<i>/
            from hwrepro.harness import trained

            final_metrics["model_bytes"] = trained.save(workdir, config.experiment, params)
        final = rec.finish(final_metrics, params)
    except (interrupts.Interrupted, KeyboardInterrupt) as e:
        if prepared.aside and not (workdir / "metrics.jsonl").stat().st_size:  # before a first step: as if refused
            _undo_first_attempt(rec, prepared, workdir, quiet)
        else:
            rec.end(e.status if isinstance(e, interrupts.Interrupted) else "interrupted: KeyboardInterrupt")
        raise
    except (ConfigError, DataError) as e:
        if prepared.resumes or (workdir / "metrics.jsonl").stat().st_size:
            rec.fail(str(e))
        elif isinstance(e, ConfigError) or prepared.aside:
            # Refused before a first step (e.g. train.init_from's shapes, a data.dir typo on a rerun): no record
            # of it is left, and the run it moved aside comes back, still resumable.
            _undo_first_attempt(rec, prepared, workdir, quiet)
        else:  # bad data in a folder that held no earlier run: the failed attempt is recorded
            rec.fail(str(e))
        raise
    except (HwreproError, RunFailed) as e:
        rec.fail(str(e))
        raise
    except Exception as e:
        (workdir / "traceback.txt").write_text(traceback.format_exc())
        rec.fail(f"{type(e).__name__}: {e} (traceback in traceback.txt)")
        raise
    finally:
        write_run_report(workdir, quiet)
    shutil.rmtree(workdir / CHECKPOINT_DIR, ignore_errors=True)  # only for resuming; a finished run never is
    return final


def _undo_first_attempt(rec: Any, prepared: Any, workdir: Path, quiet: bool) -> None:
    """For a new run that ends before logging a first step: removes its record and puts back the unfinished
    run `Run.prepare` moved aside (another config's), if any, still resumable by its own command."""
    from hwrepro.harness.records import Run

    rec.discard()
    if prepared.aside:
        Run.put_back(workdir, prepared.aside)
        if not quiet:
            print(f"the unfinished run moved to {prepared.aside} is back in {workdir}", flush=True)


def write_run_report(workdir: Path, quiet: bool) -> None:
    """Writes workdir/report.html for a run that ended (done, failed or interrupted), and names it for a done
    run (a failed or interrupted one ends with its own one error line). An error is one printed line, never
    raised: a report must not turn a finished run into a failed one."""
    if not (workdir / "run.json").exists():  # the record was discarded (bad input before a first step)
        return
    try:
        from hwrepro.study.report import write_run_report as write

        path = write(workdir)
    except Exception as e:
        print(f"report.html not written ({type(e).__name__}: {e}); rebuild it with "
              f"`python -m hwrepro.study.report --html {workdir}`", file=sys.stderr, flush=True)
        return
    from hwrepro.harness import records

    if not quiet and records.status_of(workdir) == "done":
        print(f"report: {path}", file=sys.stderr, flush=True)


def print_final(final: dict[str, Any]) -> None:
    shown = {k: v for k, v in final.items() if k != "param_sha256"}
    print("final: " + json.dumps(shown, default=str))
    print(f"param_sha256: {final['param_sha256']}")


def report_error(e: BaseException) -> int:
    """One line for the user, no traceback wall; returns the exit code.

    HwreproError messages are written for the user as they are; anything else is a bug or an environment
    problem, named by its type (the run's traceback.txt has the details).
    """
    if isinstance(e, HwreproError):
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_SKIPPED if isinstance(e, PlatformUnavailable) else EXIT_BAD_INPUT
    if isinstance(e, (RunFailed, interrupts.Interrupted, KeyboardInterrupt)):
        if not getattr(e, "reported", False):  # a child process printed its own line already
            print(f"error: {e or 'interrupted'}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    print(f"error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    return EXIT_FAILED
