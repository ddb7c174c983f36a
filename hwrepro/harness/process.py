"""The one process boundary: a run in a fresh Python process, with its own XLA_FLAGS and start-up settings.

XLA reads its flags once and glibc its tunables when a process starts, so a run whose numerics this process
can no longer apply (JAX already imported, allocator tunables not set at start-up), and every point of a
sweep, runs in a child:

    parent: Run.prepare(workdir), config.json written  ->  python -m hwrepro.harness.process WORKDIR
    child:  reads WORKDIR/config.json, runs it (hwrepro.harness.runner.run_here), exits with the run's code

The config crosses the boundary once, as the run's own config.json. No JAX in the parent.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ml_collections

from hwrepro.harness import numerics, records, runner


def run_in_child(config: ml_collections.ConfigDict, workdir: Path, stdout=None, stderr=None) -> int:
    """Runs `config` (validated by the caller) in a fresh process in `workdir`; returns its exit code.

    Raises WorkdirTaken (before any process starts) when workdir holds a finished run.
    """
    workdir = records.Run.prepare(Path(workdir))
    records.write_config(workdir, config)
    cmd = [sys.executable, "-m", "hwrepro.harness.process", str(workdir)]
    # Start-up settings go in the child's environment; it applies the other numerics itself, before its JAX.
    env = numerics.startup_environment(config.numerics, os.environ)
    repo_root = str(Path(__file__).resolve().parents[2])
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


def main(argv: list[str] | None = None) -> int:
    """The child's side: `python -m hwrepro.harness.process WORKDIR`."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m hwrepro.harness.process WORKDIR (a folder whose config.json the launcher wrote)",
              file=sys.stderr)
        return runner.EXIT_BAD_INPUT
    workdir = Path(argv[0])
    config = ml_collections.ConfigDict(records.read_json(workdir / records.CONFIG_FILE))
    try:
        final = runner.run_here(config, workdir, prepared=True)
    except (Exception, KeyboardInterrupt) as e:  # the run record holds the status and traceback
        return runner.report_error(e)
    runner.print_final(final)
    return runner.EXIT_DONE


if __name__ == "__main__":
    sys.exit(main())
