"""Kill a run with SIGKILL at random moments, rerun the same command, and compare the final bits.

    python benchmarks/kill_resume.py [--kills 5] [--seed 0] [--processes 2] [--set group.field=value ...]

Runs the config once uninterrupted, then `--kills` times: starts the same run in a fresh folder, sends SIGKILL
to its training process at a random moment between its first checkpoint and its end, reruns the same command
(which resumes from the last complete checkpoint) and prints whether the final param_sha256 equals the
uninterrupted run's. Default: SLIDE (LSH tables, rebuilds and hash redraws on their schedule) on the small
`tiny` data set, checkpointed every 25 steps. `--processes N`: the run over N local processes (jax.distributed,
parallel.model=N, one CPU device each), every one of them killed. Exit code 0 when every rerun has the
uninterrupted bits.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULTS = ["data.dataset=tiny", "train.num_epochs=30", "train.checkpoint_every=25", "train.log_every=25",
            "train.eval_every=0", "model.hidden=32", "model.num_candidates=128", "lsh.num_tables=8",
            "lsh.rebuild_period=20", "lsh.redraw_period=60", "data.max_features=32", "data.max_labels=8",
            "eval.final_points=256"]


def command(workdir: Path, overrides: list[str]) -> list[str]:
    return [sys.executable, str(REPO / "launch.py"), "--config=configs/slide_amazon.py", f"--workdir={workdir}",
            *(f"--config.{o}" for o in overrides)]


def final_sha(workdir: Path) -> str:
    return json.loads((workdir / "final.json").read_text())["param_sha256"]


def checkpoints(workdir: Path) -> list[str]:
    folder = workdir / "checkpoints"
    return [p.name for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []


def wait_for_checkpoint(workdir: Path, run: subprocess.Popen) -> float:
    """Waits until the run has written its first checkpoint (or ended); returns the time."""
    while not checkpoints(workdir) and run.poll() is None:
        time.sleep(0.02)
    return time.time()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random kill moments")
    parser.add_argument("--processes", type=int, default=1, help="processes of the run (each is killed)")
    parser.add_argument("--set", action="append", default=[], metavar="group.field=value")
    args = parser.parse_args()
    several = [f"parallel.processes={args.processes}", "numerics.cpu_devices=1", f"parallel.model={args.processes}"]
    overrides = DEFAULTS + (several if args.processes > 1 else []) + args.set
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="kill_resume-"))
    try:
        whole = subprocess.Popen(command(root / "whole", overrides), cwd=REPO, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        t_checkpoint = wait_for_checkpoint(root / "whole", whole)
        assert whole.wait() == 0, "the uninterrupted run failed"
        window = time.time() - t_checkpoint  # from its first checkpoint to its end
        reference = final_sha(root / "whole")
        print(f"uninterrupted: {window:.1f} s from its first checkpoint to its end, "
              f"param_sha256 {reference[:16]}...")
        same = 0
        for i in range(args.kills):
            workdir = root / f"killed{i}"
            run = subprocess.Popen(command(workdir, overrides), cwd=REPO, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
            wait_for_checkpoint(workdir, run)
            time.sleep(rng.uniform(0.0, 0.9 * window))
            # Every process of the run: process i > 0 runs as `hwrepro.harness.process <workdir>/process-<i>`.
            subprocess.run(["pkill", "-KILL", "-f", f"hwrepro.harness.process {workdir}"])
            run.wait()
            at = sorted(map(int, checkpoints(workdir)))
            finished = (workdir / "final.json").exists()
            rerun = subprocess.run(command(workdir, overrides), cwd=REPO, capture_output=True, text=True)
            resumed = json.loads((workdir / "run.json").read_text()).get("resumed_from_step")
            ok = rerun.returncode == (2 if finished else 0) and (finished or final_sha(workdir) == reference)
            same += ok
            print(f"kill {i + 1}: " + ("finished before the kill" if finished else
                                      f"checkpoints {at} on disk, resumed from step {resumed}: "
                                      f"{'same bits' if ok else 'DIFFERENT: ' + rerun.stderr.strip()[-200:]}"))
        print(f"{same}/{args.kills} reruns ended with the uninterrupted run's param_sha256")
        return 0 if same == args.kills else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
