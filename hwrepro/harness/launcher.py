"""What `python launch.py` does with a resolved config: a sweep when the config has one, else one run, in
this process when its numerics can still apply here, else in a child process (hwrepro.harness.process); with
parallel.processes > 1, that many local processes, or this task's one under Slurm / Open MPI."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import ml_collections

from hwrepro.errors import ConfigError
from hwrepro.harness import numerics, parallel, process, records, runner


def default_workdir(config: ml_collections.ConfigDict) -> Path:
    return Path("runs") / f"{config.get('name', config.experiment)}-{time.strftime('%Y%m%d-%H%M%S')}"


def launch(config: ml_collections.ConfigDict, workdir: str | None = None, shard: str | None = None) -> int:
    """Runs the config into `workdir` (default: a fresh runs/<name>-<time>/); returns the exit code."""
    workdir = Path(workdir) if workdir else default_workdir(config)
    if config.get("sweep"):
        from hwrepro.study import sweep

        return sweep.run_sweep(config, workdir, shard)
    if shard:
        raise ConfigError(f"--shard={shard}: only a sweep is split into shards, and this config has no sweep")
    if config.get("parallel") and config.parallel.processes > 1:
        runner.validate(config)
        task = parallel.cluster()
        if task is None:  # one machine: this process starts them all
            return _exit_code(process.run_processes(config, workdir), workdir)
        if task.count != config.parallel.processes:
            raise ConfigError(f"parallel.processes={config.parallel.processes} but this allocation has {task.count} "
                              "tasks")
        # Slurm / Open MPI: this task is one process of the run; task 0 keeps the run's record in workdir.
        workdir = workdir if task.index == 0 else workdir / f"process-{task.index}"  # made when it is locked
        os.environ[parallel.PROCESS_ENV] = task.env()
    if "jax" in sys.modules or numerics.needs_fresh_process(config.numerics) or parallel.place():
        runner.validate(config)  # the shared fields, here; the child checks the experiment's own
        return _exit_code(process.run_in_child(config, workdir), workdir)
    runner.print_final(runner.run_here(config, workdir))
    return runner.EXIT_DONE


def predict(workdir: str, path: str, output: str, k: int = 5, lsh: bool = False, overwrite: bool = False,
            argv: list[str] | None = None, platform: str | None = None) -> int:
    """`launch.py --workdir=W --predict=FILE --output=OUT`: scores FILE's points with the model W kept
    (hwrepro.harness.trained) through its experiment's `predict_file`, under the numerics it was trained
    with (on `platform` instead of the run's numerics.platform when given: a model trained on a GPU scores on
    a CPU), and prints what it measured (P@k when FILE has labels); returns the exit code. Bad input (no usable
    model, a malformed FILE, an OUT that exists without `overwrite`) raises before OUT is touched; a signal
    raises Interrupted and leaves OUT untouched too. `argv`: the command line, run again in a child process
    when the numerics' allocator settings must be there from the start (as a run's are). The numerics apply
    only in a process that has not imported JAX yet (a command's); from Python, the caller's JAX settings
    stand."""
    from hwrepro.errors import DataError, ModelError, PlatformUnavailable

    if k <= 0:
        raise ConfigError(f"--k={k} must be positive")
    if platform is not None and platform not in numerics.PLATFORMS:
        raise ConfigError(f"--platform={platform!r} is not one of {', '.join(numerics.PLATFORMS)}")
    if Path(output).exists() and not overwrite:
        raise DataError(f"--output={output} exists; choose another path or add --overwrite")
    if not Path(output).absolute().parent.is_dir():
        raise DataError(f"--output={output}: no folder {Path(output).absolute().parent}")
    if (Path(output).absolute().parent.resolve() / Path(output).name).is_relative_to(Path(workdir).resolve()):
        raise DataError(f"--output={output} is inside the run folder {workdir}: write it elsewhere (the run's files "
                        "are never overwritten)")
    if Path(path).is_dir():
        raise DataError(f"--predict={path} is a folder: give a file of points")
    n = None
    if "jax" not in sys.modules and (Path(workdir) / records.CONFIG_FILE).is_file():
        n = dict(records.read_run_file(Path(workdir) / records.CONFIG_FILE, "numerics")["numerics"])
        n["platform"] = platform or n["platform"]
        if argv and numerics.needs_fresh_process(n):
            return process.rerun(argv, numerics.startup_environment(n, os.environ))
        numerics.apply_before_jax(n)
    process.die_with_parent()  # when this is `rerun`'s child
    from absl import logging

    from hwrepro import experiments
    from hwrepro.harness import interrupts, trained

    logging.set_verbosity(logging.WARNING)  # app.run's default shows orbax's INFO lines about reading the model
    with interrupts.catch_signals():
        if n is not None:
            try:
                numerics.apply_after_jax(n)  # the run's matmul precision; the platform really there
            except PlatformUnavailable as e:
                raise PlatformUnavailable(f"{e}; --platform=cpu scores on this machine's CPU") from None
        model = trained.load(workdir)
        module = experiments.get(model.config.experiment)
        if not hasattr(module, "predict_file"):
            name = model.config.experiment
            raise ModelError(f"--predict reads files for experiments with a predict_file (SLIDE's); {name!r} models "
                             f"predict from Python: hwrepro.load({workdir!r}).predict")
        result = module.predict_file(model, path, output, k=k, lsh=lsh)
    shown = " ".join(f"{name} {value:.4f}" for name, value in result.items() if name.startswith("P@"))
    rate = f"{result['points_per_s']:,.0f}" if result["points_per_s"] >= 10 else f"{result['points_per_s']:.2g}"
    print(f"predicted {result['points']:,} points in {result['seconds']:.1f} s ({rate} points/s, "
          f"{'LSH' if lsh else 'dense'}-scored) -> {output}" + (f"; {shown}" if shown else ""))
    return runner.EXIT_DONE


def _exit_code(code: int, workdir: Path) -> int:
    """A child's exit code as the launcher's, saying how to resume when the child was killed."""
    if code < 0:
        print(f"error: the run's process {process.exit_reason(code)}; {records.resume_hint(workdir)} from its last "
              "checkpoint", file=sys.stderr)
        return runner.EXIT_FAILED
    return code
