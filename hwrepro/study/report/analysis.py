"""The report's analysis: reading a sweep folder and the statistics, bit-identity groups, divergences and
Hessian summaries the report shows. Pure functions of the loaded data; no JAX, no plotting."""

from __future__ import annotations

import math
import string
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from hwrepro.harness import records
from hwrepro.study import grid, stats

REPORT_FILE = "report.md"
PLOTS = {"curves": "curves.png", "final": "final_metric.png", "divergence": "divergence.png",
         "hessian": "hessian.png"}
NOT_RUN = "not run"


class ReportError(ValueError):
    """The folder is not a sweep (no readable sweep.json)."""


class RunData(NamedTuple):
    """One point of the sweep as found on disk."""
    name: str
    configuration: str
    overrides: dict[str, Any]
    repeat: str                 # the repeat fields' values, e.g. "seed=0": runs of one seed share it
    status: str                 # done | failed: why | skipped: why | running | not run
    final: dict[str, Any] | None
    info: dict[str, Any] | None  # run.json
    dir: Path

    @property
    def done(self) -> bool:
        return self.status == "done" and self.final is not None


class Sweep(NamedTuple):
    record: dict[str, Any]      # sweep.json
    runs: list[RunData]         # in sweep order
    configurations: list[str]   # in sweep order


# --- reading -------------------------------------------------------------------------------------------


def load(workdir: Path) -> Sweep:
    """Reads sweep.json and every point's run.json and final.json (metrics and trajectories are read later,
    when needed)."""
    workdir = Path(workdir)
    record = records.read_json_or_none(workdir / "sweep.json")
    if not isinstance(record, dict) or "points" not in record:
        raise ReportError(f"{workdir}: no readable sweep.json; is this a sweep folder (launch.py with a sweep "
                          "config)?")
    repeats = record.get("group_over", ["seed"])
    short = grid.short_names(repeats, {})  # seed; data.seed and seed: whole fields
    runs = []
    for p in record["points"]:
        run_dir = workdir / p["name"]
        info = records.read_json_or_none(run_dir / "run.json")
        status = info.get("status", NOT_RUN) if isinstance(info, dict) else NOT_RUN
        final = records.read_json_or_none(run_dir / "final.json") if status == "done" else None
        repeat = ",".join(f"{short[f]}={p['overrides'][f]}" for f in repeats if f in p["overrides"])
        runs.append(RunData(p["name"], p.get("configuration", p["name"]), p["overrides"], repeat or "-",
                            status, final, info if isinstance(info, dict) else None, run_dir))
    configurations = list(dict.fromkeys(r.configuration for r in runs))
    return Sweep(record, runs, configurations)


def read_trajectory(run_dir: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps [k], params [k, P]) from trajectory.npz, or None when the run kept none."""
    saved = records.read_trajectory(run_dir)
    if not saved:
        return None
    steps = sorted(saved)
    return np.asarray(steps), np.stack([saved[s] for s in steps])


# --- analysis (pure functions of the loaded data) ------------------------------------------------------


def default_metric(runs: Sequence[RunData]) -> str | None:
    """test_loss when the runs have it, else the first floating-point entry of a final.json."""
    finals = [r.final for r in runs if r.done]
    if not finals:
        return None
    if all("test_loss" in f for f in finals):
        return "test_loss"
    return next((k for k, v in finals[0].items() if isinstance(v, float) and k != "wall_seconds"), None)


def values_by_repeat(sweep: Sweep, metric: str) -> dict[str, dict[str, float]]:
    """{configuration: {repeat: metric of its finished run}} in sweep order (configurations without runs: {}).

    A finished run whose metric was not finite (final.json writes null and lists it under `nonfinite`) counts
    as nan, so the statistics warn about it instead of dropping the run unseen."""
    out: dict[str, dict[str, float]] = {c: {} for c in sweep.configurations}
    for r in sweep.runs:
        value = r.final.get(metric) if r.done else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[r.configuration][r.repeat] = float(value)
        elif r.done and metric in (r.final.get("nonfinite") or ()):
            out[r.configuration][r.repeat] = math.nan
    return out


def values_by_configuration(sweep: Sweep, metric: str) -> dict[str, list[float]]:
    """{configuration: [metric of each finished run]} in sweep order (configurations without runs: [])."""
    return {c: list(v.values()) for c, v in values_by_repeat(sweep, metric).items()}


def choose_reference(sweep: Sweep, values: dict[str, list[float]], wanted: str | None) -> tuple[str | None, str]:
    """(reference configuration, a note for the report): `wanted` if it has finished runs, else the first
    configuration that has."""
    have = [c for c in sweep.configurations if values.get(c)]
    if wanted and wanted in have:
        return wanted, ""
    chosen = have[0] if have else None
    if not wanted:
        return chosen, "no report.reference set: the first configuration with finished runs is the reference"
    why = "has no finished runs" if wanted in sweep.configurations else "is not a configuration of this sweep"
    return chosen, f"report.reference {wanted!r} {why}; using {chosen!r}"


class ConfigRow(NamedTuple):
    configuration: str
    summary: stats.Summary
    comparison: stats.Comparison | None  # against the reference; None for the reference itself or n = 0
    paired: stats.Paired | None          # against the reference's runs of the same repeats (seeds)
    wall_seconds: float
    statuses: dict[str, int]             # done / failed / skipped / not run counts


def final_table(sweep: Sweep, metric: str, reference: str | None) -> list[ConfigRow]:
    """One row per configuration: the metric's summary over seeds and its comparison with the reference, as
    independent groups (Welch) and paired by seed."""
    by_repeat = values_by_repeat(sweep, metric)
    values = {c: list(v.values()) for c, v in by_repeat.items()}
    rows = []
    for c in sweep.configurations:
        runs = [r for r in sweep.runs if r.configuration == c]
        counts: dict[str, int] = {}
        for r in runs:
            kind = r.status.split(":")[0]
            counts[kind] = counts.get(kind, 0) + 1
        walls = [r.final["wall_seconds"] for r in runs if r.done and "wall_seconds" in r.final]
        comparison = paired = None
        if reference and c != reference and values[c]:
            comparison = stats.compare(values[c], values[reference])
            common = [k for k in by_repeat[c] if k in by_repeat[reference]]
            paired = stats.paired_ttest([by_repeat[c][k] for k in common],
                                        [by_repeat[reference][k] for k in common]) if common else None
        rows.append(ConfigRow(c, stats.summarize(values[c]), comparison, paired,
                              float(np.mean(walls)) if walls else math.nan, counts))
    return rows


def hash_groups(sweep: Sweep) -> tuple[list[list[str]], dict[str, str]]:
    """(groups of run names with identical param_sha256, largest first; {run name: group label}).

    Runs reproduced by at least one other run get a letter (A, B, ...: one per group); a run that nothing
    else reproduced gets no label.
    """
    hashes = {r.name: r.final["param_sha256"] for r in sweep.runs if r.done and "param_sha256" in r.final}
    groups = stats.group_by_hash(hashes)
    labels = {}
    for i, names in enumerate(g for g in groups if len(g) > 1):
        label = _letters(i)
        labels.update({name: label for name in names})
    return groups, labels


def _letters(i: int) -> str:
    """0 -> A, 25 -> Z, 26 -> AA, ..."""
    out = ""
    i += 1
    while i:
        i, rem = divmod(i - 1, 26)
        out = string.ascii_uppercase[rem] + out
    return out


class Divergence(NamedTuple):
    """How run `name` drifts from the reference run of the same seed.

    steps/rel_distance: the checkpoints both kept and ||theta - theta_ref|| / ||theta_ref|| there;
    loss_steps/loss_diff: the last steps of the logged lines both have over the same steps (`logged_values`)
        and (curve metric - reference's) there;
    first_param_step / first_loss_step: the first of those where anything differs (None: never);
    note: why a part could not be computed ('' when all was).
    """
    name: str
    configuration: str
    repeat: str
    steps: np.ndarray
    rel_distance: np.ndarray
    first_param_step: int | None
    loss_steps: np.ndarray
    loss_diff: np.ndarray
    first_loss_step: int | None
    note: str


def curve(rows: Sequence[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the metrics rows that have `key`."""
    kept = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return (np.array([s for s, _ in kept], dtype=np.int64), np.array([v for _, v in kept], dtype=np.float64))


def logged_values(rows: Sequence[dict[str, Any]], key: str) -> dict[tuple[int, int], float]:
    """{(first step, last step) of what a metrics line measured: its `key`} over the lines that have it.

    A training metric's line holds its mean over the steps since the line before (harness.loop.fit), so two
    runs' values are comparable only over the same steps: a run stopped by a signal at step 40 and resumed
    writes a line at 40 and then one at 50 over steps 41-50, where an uninterrupted run's line at 50 covers
    31-50. An evaluation (`eval_*`) is of the state at its step alone."""
    out, before = {}, 0
    for r in rows:
        if isinstance(r.get(key), (int, float)):
            out[(r["step"] if key.startswith("eval_") else before + 1, r["step"])] = r[key]
        before = r["step"]
    return out


def _bits(x: np.ndarray) -> np.ndarray:
    """x's bytes as unsigned integers of its width, for a bitwise comparison."""
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def divergence(run: RunData, ref: RunData, curve_key: str) -> Divergence:
    """Parameter distance over common checkpoints and curve-metric difference over common logged steps."""
    notes = []
    steps, rel, first_param = np.zeros(0, np.int64), np.zeros(0), None
    a, b = read_trajectory(run.dir), read_trajectory(ref.dir)
    if a is None or b is None:
        notes.append("no trajectory.npz (train.checkpoints = 0?)")
    elif a[1].shape[1:] != b[1].shape[1:]:
        notes.append(f"parameter counts differ ({a[1].shape[1]} vs {b[1].shape[1]}): not comparable")
    else:
        steps = np.intersect1d(a[0], b[0])
        if not steps.size:
            notes.append("no checkpoint step in common")
        pa, pb = a[1][np.searchsorted(a[0], steps)], b[1][np.searchsorted(b[0], steps)]
        # The stored bits (-0.0 is not 0.0, a nan equals its own bits), as param_sha256 compares them.
        differ = np.flatnonzero(np.any(_bits(pa) != _bits(pb), axis=1))
        first_param = int(steps[differ[0]]) if differ.size else None
        pa, pb = pa.astype(np.float64), pb.astype(np.float64)
        rel = np.linalg.norm(pa - pb, axis=1) / np.maximum(np.linalg.norm(pb, axis=1), np.finfo(float).tiny)
    va, vb = (logged_values(records.read_metrics(r.dir), curve_key) for r in (run, ref))
    common = sorted(va.keys() & vb.keys(), key=lambda w: w[1])
    loss_steps = np.array([step for _, step in common], dtype=np.int64)
    loss_diff = np.array([va[w] - vb[w] for w in common], dtype=np.float64)
    differ = np.flatnonzero(loss_diff != 0)
    if not loss_steps.size:
        notes.append(f"no common logged steps with {curve_key!r}")
    return Divergence(run.name, run.configuration, run.repeat, steps, rel, first_param, loss_steps, loss_diff,
                      int(loss_steps[differ[0]]) if differ.size else None, "; ".join(notes))


def divergences(sweep: Sweep, reference: str, curve_key: str) -> list[Divergence]:
    """Every finished run of another configuration against the reference run of its seed."""
    ref_by_repeat = {r.repeat: r for r in sweep.runs if r.configuration == reference and r.done}
    return [divergence(r, ref_by_repeat[r.repeat], curve_key) for r in sweep.runs
            if r.done and r.configuration != reference and r.repeat in ref_by_repeat]


class HessianPoint(NamedTuple):
    step: int
    max_mean: float
    min_mean: float
    min_lowest: float  # the most negative smallest eigenvalue of any seed at this step
    n: int


def hessian_by_configuration(sweep: Sweep) -> dict[str, list[HessianPoint]]:
    """{configuration: [HessianPoint per checkpoint step]}, means over the seeds that logged that step."""
    out = {}
    for c in sweep.configurations:
        by_step: dict[int, list[tuple[float, float]]] = {}
        for r in sweep.runs:
            if r.configuration != c or not r.done:
                continue
            for row in records.read_metrics(r.dir):
                if isinstance(row.get("hessian_max"), (int, float)) and isinstance(row.get("hessian_min"),
                                                                                     (int, float)):
                    by_step.setdefault(row["step"], []).append((row["hessian_max"], row["hessian_min"]))
        if by_step:
            out[c] = [HessianPoint(s, float(np.mean([v[0] for v in vals])), float(np.mean([v[1] for v in vals])),
                                   float(np.min([v[1] for v in vals])), len(vals))
                      for s, vals in sorted(by_step.items())]
    return out


def at_common_steps(series: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(the steps every series has [k], each series' values there [n, k, ...]) for [(steps, values)] with
    sorted steps."""
    steps = series[0][0]
    for s, _ in series[1:]:
        steps = np.intersect1d(steps, s)
    return steps, np.stack([v[np.searchsorted(s, steps)] for s, v in series])


def mean_curves(sweep: Sweep, key: str) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """{configuration: (steps, mean, min, max)} of metric `key` over its seeds, at the steps all logged."""
    out = {}
    for c in sweep.configurations:
        curves = [curve(records.read_metrics(r.dir), key) for r in sweep.runs if r.configuration == c and r.done]
        curves = [cv for cv in curves if cv[0].size]
        if not curves:
            continue
        steps, ys = at_common_steps(curves)
        out[c] = (steps, ys.mean(0), ys.min(0), ys.max(0))
    return out


def distinct_labels(names: Sequence[str], folders: Sequence[Path]) -> list[str]:
    """Legend labels: each run's name, with its folder added where runs share a name (one config run with
    different overrides, e.g. two hash families)."""
    return [f"{n} ({Path(f).name})" if names.count(n) > 1 else n for n, f in zip(names, folders)]


class Analysis(NamedTuple):
    """Everything the report shows, computed from a loaded Sweep (see `analyse`)."""
    metric: str | None
    reference: str | None
    reference_note: str
    curve_key: str
    rows: list[ConfigRow]
    groups: list[list[str]]
    labels: dict[str, str]
    divergences: list[Divergence]
    hessian: dict[str, list[HessianPoint]]


def analyse(sweep: Sweep, metric: str | None = None, reference: str | None = None,
            curve_key: str | None = None) -> Analysis:
    """The report's numbers; unset arguments come from sweep.json's report settings, then defaults
    (test_loss, the first configuration with finished runs, 'loss')."""
    settings = sweep.record.get("report") or {}
    metric = metric or settings.get("metric") or default_metric(sweep.runs)
    curve_key = curve_key or settings.get("curve") or "loss"
    values = values_by_configuration(sweep, metric) if metric else {}
    reference, note = choose_reference(sweep, values, reference or settings.get("reference"))
    groups, labels = hash_groups(sweep)
    return Analysis(metric, reference, note, curve_key, final_table(sweep, metric, reference) if metric else [],
                    groups, labels, divergences(sweep, reference, curve_key) if reference else [],
                    hessian_by_configuration(sweep))


class DivergenceSummary(NamedTuple):
    """One configuration's divergences over seeds (steps None: never differs; nan: not computed)."""
    seeds: int
    identical: int               # seeds whose parameters equal the reference's at every common checkpoint
    with_params: int             # seeds with comparable trajectories
    first_param_step: int | None  # earliest checkpoint where any seed's parameters differ
    end_mean: float
    end_min: float
    end_max: float
    first_loss_step: int | None
    max_abs_loss_diff: float     # mean over seeds of max |curve difference|
    notes: str


def summarize_divergences(divs: Sequence[Divergence]) -> DivergenceSummary:
    ends = [float(d.rel_distance[-1]) for d in divs if d.rel_distance.size]
    firsts = [d.first_param_step for d in divs if d.rel_distance.size and d.first_param_step is not None]
    loss_firsts = [d.first_loss_step for d in divs if d.first_loss_step is not None]
    max_loss = [float(np.max(np.abs(d.loss_diff))) for d in divs if d.loss_diff.size]
    return DivergenceSummary(
        len(divs), sum(1 for d in divs if d.rel_distance.size and d.first_param_step is None), len(ends),
        min(firsts) if firsts else None, float(np.mean(ends)) if ends else math.nan,
        min(ends) if ends else math.nan, max(ends) if ends else math.nan,
        min(loss_firsts) if loss_firsts else None, float(np.mean(max_loss)) if max_loss else math.nan,
        "; ".join(sorted({d.note for d in divs if d.note})))
