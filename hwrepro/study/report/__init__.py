"""The reports: a sweep's (do its set-ups train to different results, and where do their paths part?) and a
run's (curves, where the time went, config, environment).

    python -m hwrepro.study.report DIR [--metric test_loss] [--reference 'precision=fp32,isa=AVX512,threads=2']
    python -m hwrepro.study.report --html W [W ...] [--out FILE]

The first reads DIR/sweep.json and each point's run folder (hwrepro.study.sweep writes them) and writes
DIR/report.md with PNG plots next to it, and DIR/report.html, the same with the plots inline. The second writes
W/report.html (every run also writes its own when it ends), or for several run folders one page that overlays them;
--out FILE puts either page there instead (several folders: default report.html here). One module and command for
both: the package has no second module named `report`. A *configuration* is a set-up: the points that differ only
in their repeat fields (`group_over`, default the seed). The report gives, per configuration, the final metric over
seeds and its difference from a reference configuration (Welch's t-test, Hedges' g); which runs ended bit-identical
(param_sha256); mean loss curves; the divergence of runs that share a seed (same initial parameters and data order)
from the reference run of that seed, over the checkpoints of trajectory.npz and the logged losses; and the
Hessian's extreme eigenvalues at checkpoints (the saddle-point diagnostic). Each comparison states its minimum
detectable effect (80% power, alpha 0.05) beside the measured one. Points that failed, were skipped or have not run
are listed, never dropped silently.

numpy, scipy and matplotlib (Agg) only: no JAX, so a report can be rebuilt anywhere.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hwrepro.errors import HwreproError, RunFailed
from hwrepro.harness.records import write_text_atomic
from hwrepro.study.report.analysis import (PLOTS, REPORT_FILE, Analysis, HessianPoint, ReportError, Sweep, analyse,
                                           hash_groups, hessian_by_configuration, load, summarize_divergences,
                                           values_by_configuration)
from hwrepro.study.report.figures import time_to_accuracy, write_plots
from hwrepro.study.report.markdown import render
from hwrepro.study.report.pages import RUN_REPORT_FILE, run_report, sweep_page, write_page, write_run_report

__all__ = ["PLOTS", "REPORT_FILE", "Analysis", "HessianPoint", "ReportError", "Sweep", "analyse", "hash_groups", "hessian_by_configuration", "load",
           "render", "run_report", "summarize_divergences", "time_to_accuracy", "values_by_configuration",
           "write_plots", "write_report", "write_run_report"]


def write_report(workdir: Path, metric: str | None = None, reference: str | None = None,
                 curve_key: str | None = None) -> Path:
    """Writes DIR/report.md, its PNGs and DIR/report.html; returns report.md's path (arguments as for
    `analyse`). Every file is replaced whole (temp file + rename), the plots before the text that links them,
    so an interrupted or concurrent rebuild never leaves a report pointing at a missing or half-written plot."""
    workdir = Path(workdir)
    sweep = load(workdir)
    a = analyse(sweep, metric, reference, curve_key)
    plots = write_plots(sweep, workdir, a)
    path = workdir / REPORT_FILE
    text = render(sweep, a, plots)
    write_text_atomic(path, text)
    write_page(workdir / RUN_REPORT_FILE, sweep_page(text, workdir, f"hwrepro sweep: {sweep.record.get('name')}"))
    for key, name in PLOTS.items():  # a plot with no data this time must not survive from an earlier report
        if key not in plots:
            (workdir / name).unlink(missing_ok=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hwrepro.study.report",
        description="Write DIR/report.md, report.html and PNGs for a finished (or partial) sweep; with --html, "
                    "the HTML report of run folders; with --time-to-accuracy, plot a metric against training time "
                    "and epochs for several runs.")
    parser.add_argument("paths", nargs="+", metavar="DIR", help="the sweep folder (holds sweep.json); with "
                        "--html or --time-to-accuracy, run folders (each holds run.json and metrics.jsonl)")
    parser.add_argument("--html", action="store_true", help="write the HTML report of one run folder, or one "
                        "page overlaying several (where: --out)")
    parser.add_argument("--out", help="with --html: the page to write (default: W/report.html for one run "
                        "folder, report.html in the current folder for several)")
    parser.add_argument("--metric", help="final.json entry to compare (default: report.metric or test_loss); "
                        "with --time-to-accuracy, the metrics.jsonl entry (default eval_P@1)")
    parser.add_argument("--reference", help="reference configuration name (default: report.reference)")
    parser.add_argument("--curve", help="metrics.jsonl entry for curves (default: report.curve or loss)")
    parser.add_argument("--time-to-accuracy", metavar="OUT.png", help="write this time-to-accuracy plot instead")
    args = parser.parse_args(argv)
    try:
        print(_write(args))
    except (ReportError, HwreproError, RunFailed, OSError) as e:  # bad folders, an unwritable output: exit 2
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _write(args: argparse.Namespace) -> str:
    """What `main` writes for its parsed arguments; the line it prints."""
    if args.html and len(args.paths) == 1 and args.out is None:
        return f"report: {write_run_report(Path(args.paths[0]))}"
    if args.html:
        return f"report: {write_page(Path(args.out or RUN_REPORT_FILE), run_report([Path(p) for p in args.paths]))}"
    if args.time_to_accuracy:
        missing = [d for d in args.paths if not all((Path(d) / f).is_file() for f in ("run.json", "metrics.jsonl"))]
        if missing:
            raise ReportError(f"not a run folder (run.json and metrics.jsonl): {', '.join(missing)}")
        return str(time_to_accuracy(args.paths, Path(args.time_to_accuracy), args.metric or "eval_P@1"))
    if len(args.paths) != 1:
        raise ReportError("a sweep report takes one sweep folder")
    return f"report: {write_report(Path(args.paths[0]), args.metric, args.reference, args.curve)}"
