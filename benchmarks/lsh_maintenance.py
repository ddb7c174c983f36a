"""What stale LSH tables cost in P@1 and what keeping them fresh costs in time: SLIDE runs side by side that
differ only in table upkeep (configs/slide_amazon.py, lsh.maintenance, lsh.update_every, lsh.rebuild_period).

    python benchmarks/lsh_maintenance.py --quick               # the tiny synthetic set, about a minute
    python benchmarks/lsh_maintenance.py                        # Amazon-670K's shape, 1,200 steps

Each variant is the user's command, `python launch.py --config=configs/slide_amazon.py` with overrides, in its
own process and workdir (under --workdir, default a temporary folder); the script prints, per variant, the
training seconds (table upkeep included), the seconds and count of full rebuilds and of incremental refiles,
their share of the training time, and the final P@1 / P@5 (dense scoring, the same test points for all).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# (name, overrides): today's schedule first, then no upkeep between redraws, then the incremental tables.
VARIANTS = (
    ("rebuild on schedule (default)", []),
    ("only redraws (stale between)", ["--config.lsh.rebuild_period=0"]),
    ("incremental every step + rebuilds", ["--config.lsh.maintenance=incremental"]),
    ("incremental every step, redraws", ["--config.lsh.maintenance=incremental", "--config.lsh.rebuild_period=0"]),
    ("incremental every 10, redraws", ["--config.lsh.maintenance=incremental", "--config.lsh.update_every=10",
                                       "--config.lsh.rebuild_period=0"]),
)
# The tiny synthetic set (300 labels), shrunk like tests/test_slide_experiment.py's run.
QUICK = ["--config.data.dataset=tiny", "--config.model.hidden=32", "--config.model.num_candidates=128",
         "--config.lsh.num_hashes=6", "--config.lsh.num_tables=8", "--config.lsh.rebuild_period=20",
         "--config.lsh.redraw_period=60", "--config.train.num_epochs=4", "--config.train.learning_rate=0.01",
         "--config.eval.subset=256", "--config.data.max_features=32", "--config.data.max_labels=8",
         "--config.eval.lsh.num_hashes=4", "--config.eval.lsh.num_tables=16",
         "--config.train.batch_size=16"]  # ~40 labels a batch: the 128 candidates hold retrieved ids too


def launch(workdir: Path, overrides: list[str], config: str = "configs/slide_amazon.py") -> dict:
    """Runs `python launch.py --config=CONFIG --workdir=WORKDIR OVERRIDES...` in its own process (a later
    `--config.a.b=` replaces an earlier one) and returns its final.json, or {"error": its last stderr line}."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    fields = dict(arg.split("=", 1) for arg in overrides)
    proc = subprocess.run([sys.executable, str(REPO / "launch.py"), f"--config={config}", f"--workdir={workdir}",
                           *(f"{k}={v}" for k, v in fields.items())], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads((workdir / "final.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny synthetic set")
    parser.add_argument("--steps", type=int, default=1200, help="training steps (full mode)")
    parser.add_argument("--points", type=int, default=4096, help="test points of the final P@k (full mode)")
    parser.add_argument("--workdir", type=Path, help="where the runs go (default: a temporary folder)")
    args = parser.parse_args()
    common = QUICK if args.quick else [f"--config.train.num_steps={args.steps}",
                                       f"--config.eval.final_points={args.points}"]
    common = common + ["--config.train.checkpoint_every=0", "--config.eval.lsh.tables=training"]
    with tempfile.TemporaryDirectory() as scratch:
        root = args.workdir or Path(scratch)
        print(f"{'table upkeep':<36}{'train s':>9}{'rebuilds':>14}{'refiles':>16}{'upkeep':>8}{'P@1':>8}{'P@5':>8}",
              flush=True)
        for i, (name, overrides) in enumerate(VARIANTS):
            f = launch(root / f"variant{i}", common + overrides)
            if "error" in f:
                print(f"{name:<36}failed: {f['error']}", flush=True)
                continue
            upkeep = f["rebuild_seconds"] + f.get("refile_seconds", 0.0)
            print(f"{name:<36}{f['train_seconds']:>9.1f}{f['rebuild_seconds']:>9.1f} ({f['rebuilds']:>2})"
                  f"{f.get('refile_seconds', 0.0):>9.1f} ({f.get('refiles', 0):>4})"
                  f"{upkeep / f['train_seconds']:>8.1%}{f['test_P@1']:>8.4f}{f['test_P@5']:>8.4f}", flush=True)


if __name__ == "__main__":
    main()
