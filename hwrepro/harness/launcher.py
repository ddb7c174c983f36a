"""What `python launch.py` does with a resolved config: a sweep when the config has one, else one run, in
this process when its numerics can still apply here, else in a child process (hwrepro.harness.process)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import ml_collections

from hwrepro.harness import numerics, process, runner


def default_workdir(config: ml_collections.ConfigDict) -> Path:
    return Path("runs") / f"{config.get('name', config.experiment)}-{time.strftime('%Y%m%d-%H%M%S')}"


def launch(config: ml_collections.ConfigDict, workdir: str | None = None, shard: str | None = None) -> int:
    """Runs the config into `workdir` (default: a fresh runs/<name>-<time>/); returns the exit code."""
    workdir = Path(workdir) if workdir else default_workdir(config)
    if config.get("sweep"):
        from hwrepro.study import sweep

        return sweep.run_sweep(config, workdir, shard)
    if "jax" in sys.modules or numerics.needs_fresh_process(config.numerics):
        runner.validate(config)  # the shared fields, here; the child checks the experiment's own
        code = process.run_in_child(config, workdir)
        if code < 0:
            print(f"error: the run's process was killed by {signal.Signals(-code).name}; rerun the same command to "
                  "resume from its last checkpoint", file=sys.stderr)
            return runner.EXIT_FAILED
        return code
    runner.print_final(runner.run_here(config, workdir))
    return runner.EXIT_DONE
