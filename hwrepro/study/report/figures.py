"""The report's figures (PNG, matplotlib Agg): a sweep's loss curves, final metric per set-up, divergence and
Hessian plots; and time-to-accuracy curves across runs (e.g. SLIDE against sampled and dense softmax).

Time to accuracy, left: against each run's `train_seconds` (time in the training loop, rebuilds included,
evaluation not), so methods are compared on the time they spent learning, on the same machine. Right: against
epochs, so they are compared on the data they have seen (what "P@1 after one epoch" means).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hwrepro.harness.records import read_json, read_metrics
from hwrepro.study.report.analysis import (PLOTS, Analysis, Sweep, at_common_steps, distinct_labels, mean_curves,
                                           values_by_configuration)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(configurations: Sequence[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(configurations) <= 10 else "tab20"]
    return {c: cmap(i % cmap.N) for i, c in enumerate(configurations)}


def _log_scale(ax, values: Sequence[np.ndarray]) -> None:
    """Log y axis; symlog (linear around 0) when some values are exactly zero, e.g. bit-identical runs."""
    flat = np.concatenate([np.ravel(v) for v in values]) if values else np.zeros(0)
    positive = flat[flat > 0]
    if flat.size and positive.size == flat.size:
        ax.set_yscale("log")
    elif positive.size:
        ax.set_yscale("symlog", linthresh=float(positive.min()))


def _plot_curves(ax, sweep: Sweep, a: Analysis, colors) -> bool:
    curves = mean_curves(sweep, a.curve_key)
    if not curves:
        return False
    for c, (steps, mean, lo, hi) in curves.items():
        ax.plot(steps, mean, color=colors[c], lw=1.2, label=c)
        ax.fill_between(steps, lo, hi, color=colors[c], alpha=0.2, lw=0)
    ax.set(xlabel="step", ylabel=a.curve_key, title=f"{a.curve_key}: mean over seeds, band min–max")
    ax.legend(fontsize=6, loc="upper right")
    return True


def _plot_final(ax, sweep: Sweep, a: Analysis, colors, present: Sequence[str]) -> None:
    values = values_by_configuration(sweep, a.metric)
    ys = np.arange(len(present))[::-1]
    ax.boxplot([values[c] for c in present], positions=ys, orientation="horizontal", widths=0.5,
               showfliers=False, medianprops={"color": "k"})
    for y, c in zip(ys, present):
        ax.scatter(values[c], np.full(len(values[c]), y), color=colors[c], s=18, zorder=3)
    ax.set_yticks(ys, present, fontsize=7)
    ax.set(xlabel=a.metric, title=f"final {a.metric} per configuration (dots: seeds)")


def _plot_divergence(ax1, ax2, sweep: Sweep, a: Analysis, colors) -> None:
    dists, diffs = [], []
    for c in sweep.configurations:
        ds = [d for d in a.divergences if d.configuration == c]
        params = [(d.steps, d.rel_distance) for d in ds if d.rel_distance.size]
        if params:
            steps, each = at_common_steps(params)
            dist = each.mean(0)
            ax1.plot(steps, dist, "o-", color=colors[c], ms=3, lw=1, label=c)
            dists.append(dist)
        losses = [(d.loss_steps, np.abs(d.loss_diff)) for d in ds if d.loss_steps.size]
        if losses:
            steps, each = at_common_steps(losses)
            diff = each.mean(0)
            ax2.plot(steps, diff, color=colors[c], lw=1, label=c)
            diffs.append(diff)
    _log_scale(ax1, dists)
    _log_scale(ax2, diffs)
    ax1.set(xlabel="step", ylabel="||θ − θ_ref|| / ||θ_ref||",
            title="parameter distance to reference (mean over seeds)")
    ax2.set(xlabel="step", ylabel=f"|Δ {a.curve_key}|", title=f"{a.curve_key} difference (mean over seeds)")
    if not dists:  # runs without parameter snapshots: the empty panel says so
        ax1.text(0.5, 0.5, "no parameter snapshots in these runs\n(train.checkpoints = 0)", ha="center",
                 va="center", transform=ax1.transAxes, fontsize=9, color="0.4")
    with_lines = [ax for ax in (ax1, ax2) if ax.get_legend_handles_labels()[0]]
    if with_lines:  # one legend, on the first panel that has curves
        with_lines[0].legend(fontsize=6)


def _plot_hessian(ax1, ax2, a: Analysis, colors) -> None:
    for c, ps in a.hessian.items():
        steps = [p.step for p in ps]
        ax1.plot(steps, [p.max_mean for p in ps], "o-", color=colors[c], ms=3, lw=1, label=c)
        ax2.plot(steps, [p.min_mean for p in ps], "o-", color=colors[c], ms=3, lw=1, label=c)
    ax2.axhline(0, color="k", lw=0.6)
    ax1.set(xlabel="step", ylabel="λ_max", title="largest Hessian eigenvalue (mean over seeds)")
    ax2.set(xlabel="step", ylabel="λ_min", title="smallest Hessian eigenvalue (mean over seeds)")
    ax1.legend(fontsize=6)


def write_plots(sweep: Sweep, workdir: Path, a: Analysis) -> dict[str, str]:
    """Writes the PNGs that have data (matplotlib's Agg backend, no display needed); returns {plot: file}."""
    plt = _pyplot()

    colors = _colors(sweep.configurations)
    written = {}

    def save(fig, key):  # to a temporary, then renamed: a reader never sees half a plot
        fig.tight_layout()
        path = workdir / PLOTS[key]
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        try:
            fig.savefig(tmp, dpi=90, format="png")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
            plt.close(fig)
        written[key] = PLOTS[key]

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    if _plot_curves(ax, sweep, a, colors):
        save(fig, "curves")
    else:
        plt.close(fig)
    values = values_by_configuration(sweep, a.metric) if a.metric else {}
    present = [c for c in sweep.configurations if values.get(c)]
    if present:
        fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.35 * len(present)))
        _plot_final(ax, sweep, a, colors, present)
        save(fig, "final")
    if a.divergences:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        _plot_divergence(*axes, sweep, a, colors)
        save(fig, "divergence")
    if a.hessian:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        _plot_hessian(*axes, a, colors)
        save(fig, "hessian")
    return written


def run_labels(workdirs: list[Path]) -> list[str]:
    """Legend labels of run folders: their config names, told apart by folder where they clash."""
    return distinct_labels([read_json(Path(w) / "run.json").get("name", Path(w).name) for w in workdirs], workdirs)


def time_to_accuracy(run_dirs: list[Path], out: Path, metric: str = "eval_P@1") -> Path:
    """`metric` against training seconds (log x axis) and against epochs, one curve per run; returns `out`."""
    plt = _pyplot()
    import matplotlib.ticker

    fig, (by_time, by_epoch) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    workdirs = list(map(Path, run_dirs))
    for workdir, name in zip(workdirs, run_labels(workdirs)):
        rows = [r for r in read_metrics(workdir) if metric in r and "train_seconds" in r]
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
