"""Prediction from a kept model: points/s and peak memory of `launch.py --predict`, dense- and LSH-scored.

    python benchmarks/predict_bench.py --workdir W [--points N]

W is a finished SLIDE run (the main job's: `python launch.py --config=configs/slide_amazon.py --workdir=W`).
Its test split (the synthetic stand-in's, drawn again from the run's data.seed, or the first N points of it)
is written as an XC file, then scored twice by the command a user runs, each in its own process: dense (every
label) and `--lsh` (the inference tables, built in that process first). Prints the points/s the command
reports (its scoring loop: reading the file and building tables excluded), the whole command's wall time, its
peak RSS, and the P@1 it printed, side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def predict(workdir: Path, points: Path, out: Path, *flags: str) -> dict[str, float]:
    """Runs the predict command; returns its points/s, P@1, wall seconds and peak RSS (GB)."""
    t = time.time()
    child = subprocess.Popen([sys.executable, str(REPO / "launch.py"), f"--workdir={workdir}", f"--predict={points}",
                              f"--output={out}", "--overwrite", *flags], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.time() - t
    line = child.stdout.read().strip().splitlines()[-1]
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"predict failed: {line}")
    rate = float(re.search(r"\(([\d.,]+) points/s", line).group(1).replace(",", ""))
    return {"points_per_s": rate, "P@1": float(re.search(r"P@1 ([\d.]+)", line).group(1)), "wall_s": wall,
            "peak_rss_gb": usage.ru_maxrss / 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--points", type=int, default=0, help="the first N test points (0: all)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from hwrepro.data import xc

    config = json.loads((args.workdir / "config.json").read_text())
    d = config["data"]
    test = xc.synthetic(d["dataset"], num_test=d["num_test"] or None, seed=d["seed"])[1]
    if args.points:
        test = test.take(range(min(args.points, test.num_points)))
    with tempfile.TemporaryDirectory() as tmp:
        points = Path(tmp) / "test.txt"
        xc.write_xc(points, test)
        print(f"{test.num_points:,} test points of {args.workdir} ({config['name']})")
        for name, flags in (("dense", ()), ("lsh", ("--lsh",))):
            r = predict(args.workdir, points, Path(tmp) / f"{name}.txt", *flags)
            print(f"{name:<6} {r['points_per_s']:>9,.0f} points/s  P@1 {r['P@1']:.4f}  command {r['wall_s']:6.1f} s  "
                  f"peak RSS {r['peak_rss_gb']:.2f} GB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
