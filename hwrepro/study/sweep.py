"""Runs a sweep: every point of `config.sweep` in its own subprocess, resumable, then the report.

    python launch.py --config=configs/sweep_autoencoder.py --workdir=runs/sweep_autoencoder [--shard=0/2]

The sweep folder DIR holds
- sweep.json       the base config (the config without `sweep` and `report`), every point (name, overrides,
                   configuration = the name without the seed), the shard this invocation ran, report settings;
- DIR/<point>/     one run folder per point (config.json, run.json, metrics.jsonl, final.json, ...), plus
                   output.txt, everything the point's process printed;
- report.md, *.png, report.html: the comparison (hwrepro.study.report), rewritten at the end of every
                   invocation that is not interrupted.

A point whose run.json says `done` is never run again, so rerunning the same command with the same --workdir
resumes a killed sweep.
A failing point is recorded (`failed: why` in its run.json) and the sweep goes on; a point asking for a
platform this machine lacks (exit code 3) is recorded as `skipped: why`. Points are run one after another:
each may use every core (its `numerics.threads` decides), and timings stay comparable.

No JAX here: each point's process must start JAX itself, with its own XLA_FLAGS.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import ml_collections

from hwrepro.errors import ConfigError, HwreproError
from hwrepro.harness import interrupts, process, records, runner
from hwrepro.harness.progress import format_seconds
from hwrepro.study import grid
from hwrepro.study.grid import Point

OUTPUT_FILE = "output.txt"
DEFAULT_GROUP_OVER = ("seed",)  # fields whose values are repeats of one configuration, not set-ups


class SweepMismatch(HwreproError):
    """DIR already holds a sweep with a different base config; resuming into it would mix results."""


def report_settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """config.report as a plain dict ({} when the config has none)."""
    report = config.get("report")
    if report is None:
        return {}
    return report.to_dict() if hasattr(report, "to_dict") else dict(report)


def group_over(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The dotted fields whose values are repeats (seeds): report.group_over, default ('seed',)."""
    return tuple(report_settings(config).get("group_over", DEFAULT_GROUP_OVER))


def point_config(config: ml_collections.ConfigDict, point: Point) -> ml_collections.ConfigDict:
    """The config one point runs: the base config (no `sweep`, no `report`) with the point's overrides."""
    out = grid.apply(config, point.overrides)
    if "report" in out:
        del out["report"]
    return out


def configuration_name(point: Point, aliases: Mapping[str, str],
                       repeats: Sequence[str] = DEFAULT_GROUP_OVER) -> str:
    """The set-up the point belongs to: its name without the repeat fields (seed), e.g.
    `precision=bf16,isa=AVX2,threads=1` for `precision=bf16,isa=AVX2,threads=1,seed=0`; `aliases` are the
    sweep's (`grid.point_aliases`). Built from the overrides, not cut from the name, so the points of one
    set-up share it even where some seeds' names were cut to length and others not."""
    return grid.point_name({f: v for f, v in point.overrides.items() if f not in repeats}, aliases)


def sweep_record(config: ml_collections.ConfigDict, points: Sequence[Point], selected: Sequence[Point],
                 shard: str | None) -> dict[str, Any]:
    """The content of sweep.json."""
    repeats, aliases = group_over(config), grid.point_aliases(config)
    return {
        "experiment": config.experiment,
        "name": config.get("name"),
        "base_config": point_config(config, Point(grid.BASE_NAME, {})).to_dict(),
        "sweep": config.sweep.to_dict(),
        "report": report_settings(config),
        "group_over": list(repeats),
        "points": [{"name": p.name, "overrides": p.overrides, "configuration": configuration_name(p, aliases, repeats)}
                   for p in points],
        "shard": shard,
        "shard_points": [p.name for p in selected],
        "written": records.now(),
    }


def _check_same_sweep(path: Path, record: dict[str, Any]) -> None:
    """Refuses to resume into a folder whose sweep.json has another base config."""
    try:
        old = records.read_json(path)
    except (OSError, ValueError):
        return
    # Through JSON both ways, so tuples and lists compare equal.
    if json.loads(json.dumps(old.get("base_config"), default=str)) != \
            json.loads(json.dumps(record["base_config"], default=str)):
        raise SweepMismatch(f"{path} holds a sweep with a different base config; its finished points would "
                            "not be comparable: choose another --workdir")


def _last_error_line(output: Path) -> str | None:
    """The last `error: ...` line the point's process printed (the runner's one-line error), if any."""
    try:
        lines = output.read_text(errors="replace").splitlines()
    except OSError:
        return None
    errors = [line[len("error: "):].strip() for line in lines if line.startswith("error: ")]
    return errors[-1] if errors else None


def _settle(run_dir: Path, code: int) -> str:
    """The point's final status after its process exited with `code`, written to run.json if the process
    could not write it itself (it crashed, was killed, or stopped before its record was open)."""
    status = records.status_of(run_dir)
    if code == runner.EXIT_DONE and status == "done":
        return status
    why = _last_error_line(run_dir / OUTPUT_FILE)
    if code == runner.EXIT_SKIPPED:
        status = f"skipped: {why or 'platform not available'}"
    elif status is None or not status.startswith(("failed", "interrupted")):
        detail = why or (f"killed by signal {-code}" if code < 0 else "no run record written")
        status = f"failed: exit code {code}: {detail} (see {OUTPUT_FILE})"
    else:
        return status
    records.set_status(run_dir, status, "hwrepro.study.sweep")
    return status


def _metric_text(run_dir: Path, metric: str | None) -> str:
    """`metric value` from final.json for the progress line ('' when there is none)."""
    try:
        final = records.read_json(run_dir / "final.json")
    except (OSError, ValueError):
        return ""
    if metric not in final:
        metric = next((k for k, v in final.items() if isinstance(v, float) and k != "wall_seconds"), None)
    if metric is None:
        return ""
    value = final[metric]
    return f", {metric} {value:.4g}" if isinstance(value, (int, float)) else f", {metric} {value}"


def run_sweep(config: ml_collections.ConfigDict, workdir: Path, shard: str | None = None) -> int:
    """Runs the sweep's points (or shard "i/n" of them) in DIR=workdir and writes the report.

    Returns runner.EXIT_DONE (0) when no point failed (skipped points are not failures), else EXIT_FAILED.
    Raises ConfigError for a bad sweep or shard and SweepMismatch for a DIR holding another sweep, before
    any point runs.
    """
    workdir = Path(workdir)
    if (workdir / "run.json").exists():
        raise ConfigError(f"--workdir={workdir} holds a run (run.json), not a sweep: choose another folder")
    points = grid.expand(config)
    selected = grid.shard(points, shard) if shard else list(points)
    # Every point's config must be runnable before the first one starts: all of its checks, the experiment's
    # own included, in one child process (they import JAX, which the sweep's process must not).
    configs = {point.name: point_config(config, point) for point in selected}
    for name, c in configs.items():
        if c.get("parallel") and c.parallel.processes > 1:
            raise ConfigError(f"parallel.processes={c.parallel.processes} (point {name}): a sweep runs each point "
                              "as one process; sweep over devices with parallel.model / parallel.data instead")
    process.check_in_child(configs)
    record = sweep_record(config, points, selected, shard)
    # One sweep (or one shard of it) at a time in DIR; the shards of a job array each hold their own lock.
    lock = records.lock_workdir(workdir) if not shard else _lock_shard(workdir, shard)
    try:
        _check_same_sweep(workdir / records.SWEEP_FILE, record)
        records.write_json_atomic(workdir / records.SWEEP_FILE, record)
        return _run_points(config, workdir, selected, record, shard, len(points))
    finally:
        os.close(lock)


def _lock_shard(workdir: Path, shard: str) -> int:
    """The lock of one shard's invocation, DIR/.lock-shard-i-of-n: the same shard run twice at once is refused,
    other shards run beside it (each point's run folder has its own lock too)."""
    i, n = (int(x) for x in shard.split("/"))
    return records.lock_workdir(workdir, f"{records.LOCK_FILE}-shard-{i}-of-{n}")


def _run_points(config: ml_collections.ConfigDict, workdir: Path, selected: Sequence[Point],
                record: dict[str, Any], shard: str | None, num_points: int) -> int:

    metric = record["report"].get("metric")
    total = len(selected)
    print(f"sweep '{config.get('name')}': {total} point(s)"
          + (f" (shard {shard} of {num_points})" if shard else "") + f" in {workdir}", flush=True)
    counts = {"done": 0, "failed": 0, "skipped": 0}
    ran_seconds, ran = 0.0, 0
    point, interrupted = None, False
    with interrupts.catch_signals():
        try:
            for i, point in enumerate(selected, 1):
                run_dir = workdir / point.name
                prefix = f"[{i}/{total}] {point.name}:"
                if records.status_of(run_dir) == "done":
                    counts["done"] += 1
                    print(f"{prefix} already done{_metric_text(run_dir, metric)}", flush=True)
                    continue
                try:
                    status, seconds = _attempt(config, point, run_dir)
                except records.WorkdirBusy:
                    counts["skipped"] += 1
                    print(f"{prefix} skipped: another process is running it", flush=True)
                    point = None
                    continue
                except records.WorkdirTaken:
                    if records.status_of(run_dir) != "done":
                        raise
                    counts["done"] += 1  # another sweep of this folder finished it since the check above
                    print(f"{prefix} done by another process{_metric_text(run_dir, metric)}", flush=True)
                    point = None
                    continue
                kind = status.split(":")[0]
                counts[kind if kind in counts else "failed"] += 1
                line = f"{prefix} {status}"
                if kind == "done":
                    ran_seconds, ran = ran_seconds + seconds, ran + 1
                    line = f"{prefix} done in {seconds:.1f} s{_metric_text(run_dir, metric)}"
                left = sum(1 for p in selected[i:] if records.status_of(workdir / p.name) != "done")
                if left and ran:  # from the points that trained; skipped ones take seconds, so it is an upper bound
                    line += f" | ETA {format_seconds(left * ran_seconds / ran)} for {left} more"
                print(line, flush=True)
                point = None
        except (KeyboardInterrupt, interrupts.Interrupted):
            interrupted = True
            if point is not None and records.status_of(workdir / point.name) in (None, "running"):
                # The point's process may have been killed before it could say so itself.
                records.set_status(workdir / point.name, "failed: interrupted", "hwrepro.study.sweep")
                counts["failed"] += 1
                print(f"[{i}/{total}] {point.name}: failed: interrupted", flush=True)

    summary = f"{counts['done']} done, {counts['failed']} failed, {counts['skipped']} skipped"
    if interrupted:
        print(f"sweep interrupted: {summary}; {records.resume_hint(workdir)}", flush=True)
        return runner.EXIT_FAILED
    _write_report(workdir)
    print(f"sweep finished: {summary} ({workdir})", flush=True)
    return runner.EXIT_DONE if counts["failed"] == 0 else runner.EXIT_FAILED


def _attempt(config: ml_collections.ConfigDict, point: Point, run_dir: Path) -> tuple[str, float]:
    """Runs one point in its own process, its output appended to run_dir/output.txt; returns (its final
    status, seconds taken)."""
    t0 = time.time()
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / OUTPUT_FILE, "a") as out:
        code = process.run_in_child(point_config(config, point), run_dir, stdout=out, stderr=out,
                                    banner=f"=== hwrepro.study.sweep: attempt started {records.now()} ===\n")
    return _settle(run_dir, code), time.time() - t0


def _write_report(workdir: Path) -> None:
    """Writes the report; a failure is reported, never raised, so the sweep's results stay usable."""
    try:
        from hwrepro.study import report

        path = report.write_report(workdir)
        print(f"report: {path}", flush=True)
    except Exception as e:  # the runs are on disk either way; the report can be rebuilt
        print(f"report failed ({type(e).__name__}: {e}); the runs are intact, rebuild it with "
              f"`python -m hwrepro.study.report {workdir}`", file=sys.stderr, flush=True)

