"""How the synthetic Amazon-670K stand-in (hwrepro.data.xc.synthetic) compares with the real data set.

    python benchmarks/xc_standin_stats.py [--shape amazon670k] [--num-train 0] [--seed 0]

Draws the stand-in's train split (all 490,449 points by default; --num-train N for a sample, whose per-label
counts then scale by N / 490,449) and prints its statistics beside the real data set's published ones:
label frequencies (points per label, the share of labels with 0, 1, <= 5 points, the head, the slope of the
rank-frequency curve), labels and features per point, and the feature values. Published figures (Extreme
Classification Repository; PECOS's XMC tables, nnz(X) = 37,119,040 and nnz(Y) = 2,674,356 for the 490,449
training points; SLIDE's paper, feature sparsity 0.055%) are the only ones compared; the rest is printed
for the reader and marked "-" on the real side.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Amazon-670K's training split as published: counts and the averages they give.
PUBLISHED = {
    "points": 490_449,
    "features": 135_909,
    "labels": 670_091,
    "labels per point: mean": 2_674_356 / 490_449,        # 5.45
    "points per label: mean": 2_674_356 / 670_091,        # 3.99
    "features per point: mean": 37_119_040 / 490_449,     # 75.68
}


def zipf_slope(counts: np.ndarray, lo: int = 10, hi: int = 10_000) -> float:
    """Slope of log(count) against log(rank) over ranks lo..hi of the sorted non-zero counts (a power law's
    exponent, negated)."""
    c = np.sort(counts[counts > 0])[::-1].astype(np.float64)
    hi = min(hi, len(c))
    ranks = np.arange(1, len(c) + 1)
    return float(np.polyfit(np.log(ranks[lo - 1:hi]), np.log(c[lo - 1:hi]), 1)[0])


def statistics(data) -> dict[str, float]:
    """The statistics of one XCData split, by name (see the module docstring)."""
    lpp = data.labels_per_point()
    fpp = data.features_per_point()
    ppl = data.label_counts()
    vals = data.feat_values
    rows = np.repeat(np.arange(data.num_points), fpp)
    norms = np.sqrt(np.bincount(rows, weights=vals.astype(np.float64) ** 2, minlength=data.num_points))
    df = np.bincount(data.feat_indices, minlength=data.num_features)
    top = np.sort(ppl)[::-1]
    return {
        "points": data.num_points,
        "features": data.num_features,
        "labels": data.num_labels,
        "labels per point: mean": lpp.mean(),
        "labels per point: median": np.median(lpp),
        "labels per point: share with 1": np.mean(lpp == 1),
        "labels per point: max": lpp.max(),
        "points per label: mean": ppl.mean(),
        "labels with 0 points: share": np.mean(ppl == 0),
        "labels with 1 point: share": np.mean(ppl == 1),
        "labels with <= 5 points: share": np.mean(ppl <= 5),
        "most frequent label: points": top[0],
        "top 1% of labels: share of label occurrences": top[:len(top) // 100].sum() / top.sum(),
        "label rank-frequency slope (ranks 10-10,000)": zipf_slope(ppl),
        "features per point: mean": fpp.mean(),
        "features per point: median": np.median(fpp),
        "features per point: 5th / 95th percentile": f"{np.percentile(fpp, 5):.0f} / {np.percentile(fpp, 95):.0f}",
        "features per point: max": fpp.max(),
        "features used at least once: share": np.mean(df > 0),
        "feature rank-frequency slope (ranks 10-10,000)": zipf_slope(df),
        "feature value: min / median / max": f"{vals.min():.3g} / {np.median(vals):.3g} / {vals.max():.3g}",
        "feature value: distinct values": len(np.unique(vals)),
        "row L2 norm: min / max": f"{norms.min():.3g} / {norms.max():.3g}",
    }


def show(value) -> str:
    if isinstance(value, str):
        return value
    if float(value).is_integer() and abs(value) >= 1:
        return f"{int(value):,}"
    return f"{value:.4g}"


def main(argv: list[str] | None = None) -> int:
    from hwrepro.data import xc

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="amazon670k", choices=sorted(xc.SHAPES))
    p.add_argument("--num-train", type=int, default=0, help="points drawn (0: the shape's whole train split)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    t = time.time()
    train, _ = xc.synthetic(args.shape, num_train=args.num_train or None, num_test=1, seed=args.seed)
    seconds = time.time() - t
    stats = statistics(train)
    published = PUBLISHED if args.shape == "amazon670k" else {}
    print(f"{train.source}: {train.num_points:,} points drawn in {seconds:.1f} s; shape {xc.SHAPES[args.shape]}")
    print()
    print("| statistic (train split) | stand-in | real, published |")
    print("|---|---|---|")
    for name, value in stats.items():
        print(f"| {name} | {show(value)} | {show(published[name]) if name in published else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
