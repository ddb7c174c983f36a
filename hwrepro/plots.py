"""Time-to-accuracy plots across runs (e.g. SLIDE against sampled and dense softmax).

    python -m hwrepro.plots OUT.png RUN_DIR [RUN_DIR ...] [--metric eval_P@1]

Left: against each run's `train_seconds` (time in the training loop, rebuilds included, evaluation not), so
methods are compared on the time they spent learning, on the same machine. Right: against epochs, so they
are compared on the data they have seen (what "P@1 after one epoch" means).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hwrepro.records import read_json, read_metrics


def run_labels(workdirs: list[Path]) -> list[str]:
    """Legend labels: each run's config name, with its folder added where runs share a name (one config run
    with different overrides, e.g. two hash families)."""
    names = [read_json(Path(w) / "run.json").get("name", Path(w).name) for w in workdirs]
    return [f"{n} ({Path(w).name})" if names.count(n) > 1 else n for w, n in zip(workdirs, names)]


def time_to_accuracy(run_dirs: list[Path], out: Path, metric: str = "eval_P@1") -> Path:
    """`metric` against training seconds (log x axis) and against epochs, one curve per run; returns `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (by_time, by_epoch) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    workdirs = list(map(Path, run_dirs))
    for workdir, name in zip(workdirs, run_labels(workdirs)):
        rows = [r for r in read_metrics(workdir) if metric in r]
        if not rows:
            continue
        by_time.plot([r["train_seconds"] for r in rows], [r[metric] for r in rows], marker="o", label=name)
        by_epoch.plot([r.get("epoch", r["step"]) for r in rows], [r[metric] for r in rows], marker="o", label=name)
    by_time.set_xscale("log")
    by_time.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    by_time.set_xlabel("training time (s, log scale)")
    by_time.set_ylabel(metric.removeprefix("eval_"))
    by_epoch.set_xlabel("epochs (steps where a run has no epochs)")
    for ax in (by_time, by_epoch):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("run_dirs", nargs="+")
    parser.add_argument("--metric", default="eval_P@1")
    args = parser.parse_args(argv)
    missing = [d for d in args.run_dirs if not (Path(d) / "metrics.jsonl").exists()]
    if missing:
        print(f"error: no metrics.jsonl in {', '.join(missing)}", file=sys.stderr)
        return 2
    print(time_to_accuracy(args.run_dirs, Path(args.out), args.metric))
    return 0


if __name__ == "__main__":
    sys.exit(main())
