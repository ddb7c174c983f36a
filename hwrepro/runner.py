"""Runs one experiment (or a sweep) from a resolved config: numerics first, then JAX, then the record.

`launch` is what launch.py calls. A single run is done in this process when JAX has not been imported yet
(so its numerics flags can still apply) and the process was started with what the numerics need at start-up
(huge pages), else in a fresh `python -m hwrepro.runner` subprocess. Sweeps always run each point in its own
subprocess.

Exit codes (also of the subprocess): 0 done, 1 failed, 2 bad config or workdir, 3 skipped (platform missing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import ml_collections

from hwrepro import numerics
from hwrepro.errors import ConfigError, HwreproError, PlatformUnavailable

EXIT_DONE, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_SKIPPED = 0, 1, 2, 3

EXPERIMENTS = ("autoencoder", "prednet", "slide")


def default_workdir(config: ml_collections.ConfigDict) -> Path:
    return Path("runs") / f"{config.get('name', config.experiment)}-{time.strftime('%Y%m%d-%H%M%S')}"


def validate(config: ml_collections.ConfigDict) -> None:
    """Checks the fields every experiment shares; experiment modules check their own in `validate`."""
    if config.get("experiment") not in EXPERIMENTS:
        raise ConfigError(f"experiment={config.get('experiment')!r} is not one of {', '.join(EXPERIMENTS)}")
    t = config.train
    for field in ("batch_size", "log_every"):
        if t[field] <= 0:
            raise ConfigError(f"train.{field}={t[field]} must be positive")
    for field in ("num_epochs", "num_steps", "eval_every", "checkpoints", "hessian_iters"):
        if t[field] < 0:
            raise ConfigError(f"train.{field}={t[field]} must not be negative")
    if t.num_epochs == 0 and t.num_steps == 0:
        raise ConfigError("train.num_epochs and train.num_steps are both 0: nothing to train")
    if not t.learning_rate > 0:
        raise ConfigError(f"train.learning_rate={t.learning_rate} must be positive")
    if not isinstance(config.seed, int) or config.seed < 0:
        raise ConfigError(f"seed={config.seed!r} must be a non-negative integer")
    numerics.validate(config.numerics)


def experiment_module(name: str):
    import importlib

    return importlib.import_module(f"hwrepro.experiments.{name}")


def run_here(config: ml_collections.ConfigDict, workdir: Path, quiet: bool = False) -> dict[str, Any]:
    """Runs one experiment in this process and returns final.json's content.

    Numerics are applied only if JAX is not imported yet; otherwise the run goes ahead with the process's
    current settings, and run.json says so (`numerics_applied.before_jax: false`). Tests and notebooks use
    this; the launcher makes sure numerics apply.
    """
    from hwrepro.records import Run

    validate(config)
    before_jax = "jax" not in sys.modules
    if before_jax:
        numerics.apply_before_jax(config.numerics)
    numerics.apply_after_jax(config.numerics)
    module = experiment_module(config.experiment)
    if hasattr(module, "validate"):
        module.validate(config)
    workdir = Run.prepare(workdir)
    rec = Run.start(workdir, config, {"before_jax": before_jax, **numerics.applied()}, quiet=quiet)
    rec.print(f"hwrepro: {config.experiment} '{config.name}' -> {workdir}")
    try:
        final_metrics, params = module.run(config, rec)
        final = rec.finish(final_metrics, params)
    except KeyboardInterrupt:
        rec.fail("interrupted")
        raise
    except HwreproError as e:
        rec.fail(str(e))
        raise
    except Exception as e:
        (workdir / "traceback.txt").write_text(traceback.format_exc())
        rec.fail(f"{type(e).__name__}: {e} (traceback in traceback.txt)")
        raise
    return final


def run_subprocess(config: ml_collections.ConfigDict, workdir: Path, quiet: bool = False,
                   stdout=None, stderr=None) -> int:
    """Runs one experiment in a fresh Python process (its own XLA_FLAGS); returns its exit code."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / ".launch_config.json"
    config_path.write_text(json.dumps(config.to_dict()))
    cmd = [sys.executable, "-m", "hwrepro.runner", f"--config_json={config_path}", f"--workdir={workdir}"]
    if quiet:
        cmd.append("--quiet")
    # Start-up settings go in the child's environment; it applies the other numerics itself, before its JAX.
    env = numerics.startup_environment(config.numerics, os.environ)
    repo_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo_root, env.get("PYTHONPATH")]))
    child = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr)
    try:
        return child.wait()
    except KeyboardInterrupt:
        # Ctrl-C reached the child too (same process group): give it time to record itself as interrupted.
        try:
            child.wait(timeout=30)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            child.kill()
            child.wait()
        raise


def print_final(final: dict[str, Any]) -> None:
    shown = {k: v for k, v in final.items() if k != "param_sha256"}
    print("final: " + json.dumps(shown, default=str))
    print(f"param_sha256: {final['param_sha256']}")


def launch(config: ml_collections.ConfigDict, workdir: str | None = None, shard: str | None = None) -> int:
    """What `python launch.py` does: a sweep when the config has one, else one run. Returns the exit code."""
    if config.get("sweep"):
        from hwrepro import sweep

        return sweep.run_sweep(config, Path(workdir) if workdir else default_workdir(config), shard)
    workdir = Path(workdir) if workdir else default_workdir(config)
    if "jax" in sys.modules or numerics.needs_fresh_process(config.numerics):
        validate(config)
        return run_subprocess(config, workdir)
    final = run_here(config, workdir)
    print_final(final)
    return EXIT_DONE


def report_error(e: BaseException) -> int:
    """One line for the user, no traceback wall; returns the exit code.

    HwreproError messages are written for the user as they are; anything else is a bug or an environment
    problem, named by its type (the run's traceback.txt has the details).
    """
    if isinstance(e, HwreproError):
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_SKIPPED if isinstance(e, PlatformUnavailable) else EXIT_BAD_INPUT
    print(f"error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one hwrepro experiment from a resolved config.json")
    parser.add_argument("--config_json", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    config = ml_collections.ConfigDict(json.loads(Path(args.config_json).read_text()))
    try:
        final = run_here(config, Path(args.workdir), quiet=args.quiet)
    except (Exception, KeyboardInterrupt) as e:  # the run record holds the status and traceback
        return report_error(e)
    if not args.quiet:
        print_final(final)
    return EXIT_DONE


if __name__ == "__main__":
    sys.exit(main())
