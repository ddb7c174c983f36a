"""SLIDE's own costs, side by side in one run: its epoch against sampled softmax's at the same active rows, the
table rebuilds' share of it, LSH-scored against dense-scored prediction, per-example against shared candidates,
and the shared step against its arithmetic floor.

    python benchmarks/slide_costs.py                  # Amazon-670K's shape, 1 epoch x 2 seeds per method
    python benchmarks/slide_costs.py --quick          # the tiny synthetic set and 5 timed steps: a smoke run
    python benchmarks/slide_costs.py --train-points 100000 --test-points 8192   # shorter epochs
    python benchmarks/slide_costs.py --slide=--config.lsh.rebuild_period=200     # SLIDE with other settings

Epochs: `python launch.py --config=configs/slide_amazon.py` and `configs/sampled_amazon.py` (same M = 8,192
active rows, same data, same lr), alternated seed by seed so that a change in the machine's load falls on both
(each run in its own process; benchmarks/lsh_maintenance.py's `launch`). From each SLIDE run's final.json:
the rebuild seconds, and its final evaluation scored twice on the same test points, every label (dense) and
the LSH-scored path (eval.lsh: the share of labels scored, the seconds of each). Steps: one step at
Amazon-670K's shape (benchmarks/slide_bench.py's children, shared M = 8,192 and per-example m = 1,024,
alternated over `--rounds`), with the floor of the shared step (its FLOPs at this machine's [128x128]x[128x8192]
matmul rate, then with its row traffic). Prints every ratio with its target (issues 18 and 32) and whether it
holds. Results: docs/slide_costs.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lsh_maintenance  # noqa: E402  (the sibling scripts: launch runs, time steps)
import slide_bench  # noqa: E402

METHODS = (("SLIDE", "configs/slide_amazon.py"), ("sampled", "configs/sampled_amazon.py"))


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def epochs(root: Path, common: list[str], seeds: list[int], slide: list[str]) -> dict[str, list[dict]]:
    """final.json of each method and seed, alternated seed by seed (`slide`: SLIDE's own overrides); prints a
    line per run."""
    runs: dict[str, list[dict]] = {name: [] for name, _ in METHODS}
    print(f"{'run':<18}{'s/epoch':>9}{'rebuilds s':>12}{'P@1':>8}{'P@5':>8}{'LSH P@1':>9}{'scored':>9}"
          f"{'LSH s':>7}{'dense s':>9}", flush=True)
    for seed in seeds:
        for name, config in METHODS:
            own = slide if name == "SLIDE" else []
            f = lsh_maintenance.launch(root / f"{name}-{seed}", common + [f"--config.seed={seed}"] + own, config)
            if "error" in f:
                sys.exit(f"{name}, seed {seed}: {f['error']}")
            runs[name].append(f)
            lsh = (f"{f['test_lsh_P@1']:>9.4f}{f['test_lsh_share_scored']:>9.3%}{f['test_lsh_seconds']:>7.1f}"
                   if "test_lsh_P@1" in f else f"{'-':>9}{'-':>9}{'-':>7}")
            print(f"{f'{name}, seed {seed}':<18}{f['seconds_per_epoch']:>9.1f}{f['rebuild_seconds']:>12.1f}"
                  f"{f['test_P@1']:>8.4f}{f['test_P@5']:>8.4f}{lsh}{f['test_seconds']:>9.1f}", flush=True)
    return runs


def steps(rounds: int, repeats: int) -> dict[str, float]:
    """Median ms per step of the shared and per-example LSH steps (children alternated), and the floor."""
    base = {"num_labels": slide_bench.NUM_LABELS, "dtype": "fp32", "repeats": repeats, "rebuild_repeats": 0,
            "method": "lsh"}
    times: dict[str, list[float]] = {"shared": [], "per_example": []}
    floor = None
    for i in range(rounds):
        for mode in times:
            r = slide_bench.run_child(dict(base, mode=mode, floor=(mode == "shared" and i == 0)), "AVX512")
            if "error" in r:
                sys.exit(f"{mode} step: {r['error']}")
            times[mode].append(r["step_ms"])
            floor = r if "floor_ms" in r else floor
            print(f"step, {mode:<12}{r['step_ms']:>9.2f} ms (round {i + 1})", flush=True)
    return {"shared": statistics.median(times["shared"]), "per_example": statistics.median(times["per_example"]),
            "floor": floor["floor_ms"], "gflops": floor["matmul_gflops"],
            "traffic": floor["traffic_floor_ms"], "rows": floor["row_floor_ms"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny synthetic set, 1 seed, 1 round of 5 steps")
    parser.add_argument("--seeds", default="0,1", help="training seeds, comma-separated")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--train-points", type=int, default=0, help="synthetic training points (0: the whole split)")
    parser.add_argument("--test-points", type=int, default=0, help="final evaluation points (0: the whole split)")
    parser.add_argument("--rounds", type=int, default=3, help="step timings: alternated rounds per mode")
    parser.add_argument("--workdir", type=Path, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--no-steps", action="store_true", help="leave out the step timings (the last two ratios)")
    parser.add_argument("--slide", action="append", default=[], metavar="--config.a.b=X",
                        help="an override for the SLIDE runs only (repeatable)")
    args = parser.parse_args()
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    common = (lsh_maintenance.QUICK if args.quick else
              [f"--config.train.num_epochs={args.epochs}", f"--config.data.num_train={args.train_points}",
               f"--config.eval.final_points={args.test_points}"])
    common = common + ["--config.train.checkpoint_every=0", "--config.train.eval_every=0"]
    from hwrepro.harness.records import cpu_info

    cpu = cpu_info()
    print(f"CPU: {cpu['model']}, {cpu['logical_cores']} logical cores, ISA flags {' '.join(cpu['isa_flags'])}"
          + (f"; SLIDE with {' '.join(args.slide)}" if args.slide else ""), flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        runs = epochs(args.workdir or Path(scratch), common, seeds, args.slide)
    step = None if args.no_steps else steps(1 if args.quick else args.rounds, 5 if args.quick else 9)

    slide, sampled = runs["SLIDE"], runs["sampled"]
    mean = lambda runs, key: statistics.mean(f[key] for f in runs)  # noqa: E731
    epoch_ratio = mean(slide, "seconds_per_epoch") / mean(sampled, "seconds_per_epoch")
    p1_gap = [a["test_P@1"] - b["test_P@1"] for a, b in zip(slide, sampled)]
    upkeep = mean(slide, "rebuild_seconds") / mean(slide, "train_seconds")
    lsh_ratio = mean(slide, "test_lsh_P@1") / mean(slide, "test_P@1")
    share = mean(slide, "test_lsh_share_scored")
    speed = mean(slide, "test_seconds") / mean(slide, "test_lsh_seconds")
    print()
    print(f"SLIDE epoch / sampled epoch (M equal): {epoch_ratio:.2f}x, target <= 1.15x: "
          f"{verdict(epoch_ratio <= 1.15)}")
    print(f"SLIDE P@1 - sampled P@1 per seed: {', '.join(f'{g:+.4f}' for g in p1_gap)}, target >= 0 in every "
          f"seed: {verdict(min(p1_gap) >= 0)}")
    print(f"table maintenance / SLIDE epoch: {upkeep:.1%}, target < 5%: {verdict(upkeep < 0.05)}")
    print(f"LSH-scored P@1 / dense-scored P@1: {lsh_ratio:.2f}x scoring {share:.3%} of the labels, {speed:.1f}x "
          f"faster; targets >= 0.9x, <= 5%, >= 5x: {verdict(lsh_ratio >= 0.9 and share <= 0.05 and speed >= 5)}")
    if step is None:
        return
    per_example = step["per_example"] / step["shared"]
    over_floor = step["shared"] / step["floor"]
    print(f"per-example step / shared step: {step['per_example']:.1f} / {step['shared']:.1f} ms = "
          f"{per_example:.2f}x, target <= 2x: {verdict(per_example <= 2)}")
    with_traffic = step["shared"] / (step["floor"] + step["traffic"])
    with_rows = step["shared"] / (step["floor"] + step["rows"])
    print(f"shared step / arithmetic floor: {over_floor:.2f}x (floor {step['floor']:.2f} ms at {step['gflops']:.0f} "
          f"GFLOP/s), target <= 4.5x: {verdict(over_floor <= 4.5)}")
    print(f"shared step / (arithmetic + row-traffic floor): {with_traffic:.2f}x, target <= 2.5x: "
          f"{verdict(with_traffic <= 2.5)}; {with_rows:.2f}x with the rows at the random-row rate")


if __name__ == "__main__":
    main()
