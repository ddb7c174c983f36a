"""The sweep report: do the set-ups of a sweep train to different results, and where do their paths part?

    python -m hwrepro.report DIR [--metric test_loss] [--reference 'precision=fp32,isa=AVX512,threads=2']

reads DIR/sweep.json and each point's run folder (hwrepro.sweep writes them) and writes DIR/report.md with
PNG plots next to it. A *configuration* is a set-up: the points that differ only in their repeat fields
(`group_over`, default the seed). The report gives, per configuration, the final metric over seeds and its
difference from a reference configuration (Welch's t-test, Hedges' g); which runs ended bit-identical
(param_sha256); mean loss curves; the divergence of runs that share a seed (same initial parameters and data
order) from the reference run of that seed, over the checkpoints of trajectory.npz and the logged losses; and
the Hessian's extreme eigenvalues at checkpoints (the saddle-point diagnostic). Points that failed, were
skipped or have not run are listed, never dropped silently.

numpy, scipy and matplotlib (Agg) only: no JAX, so a report can be rebuilt anywhere.
"""

from __future__ import annotations

import argparse
import math
import string
import sys
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from hwrepro import records, stats

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


def _read_json(path: Path) -> Any:
    try:
        return records.read_json(path)
    except (OSError, ValueError):
        return None


def load(workdir: Path) -> Sweep:
    """Reads sweep.json and every point's run.json and final.json (metrics and trajectories are read later,
    when needed)."""
    workdir = Path(workdir)
    record = _read_json(workdir / "sweep.json")
    if not isinstance(record, dict) or "points" not in record:
        raise ReportError(f"{workdir}: no readable sweep.json; is this a sweep folder (launch.py with a sweep "
                          "config)?")
    repeats = record.get("group_over", ["seed"])
    runs = []
    for p in record["points"]:
        run_dir = workdir / p["name"]
        info = _read_json(run_dir / "run.json")
        status = info.get("status", NOT_RUN) if isinstance(info, dict) else NOT_RUN
        final = _read_json(run_dir / "final.json") if status == "done" else None
        repeat = ",".join(f"{f.rsplit('.', 1)[-1]}={p['overrides'][f]}" for f in repeats if f in p["overrides"])
        runs.append(RunData(p["name"], p.get("configuration", p["name"]), p["overrides"], repeat or "-",
                            status, final, info if isinstance(info, dict) else None, run_dir))
    configurations = list(dict.fromkeys(r.configuration for r in runs))
    return Sweep(record, runs, configurations)


def read_trajectory(run_dir: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps [k], params [k, P]) from trajectory.npz, or None when the run kept none."""
    try:
        with np.load(Path(run_dir) / "trajectory.npz") as z:
            return np.asarray(z["steps"]), np.asarray(z["params"])
    except (OSError, KeyError, ValueError):
        return None


# --- analysis (pure functions of the loaded data) ------------------------------------------------------


def default_metric(runs: Sequence[RunData]) -> str | None:
    """test_loss when the runs have it, else the first floating-point entry of a final.json."""
    finals = [r.final for r in runs if r.done]
    if not finals:
        return None
    if all("test_loss" in f for f in finals):
        return "test_loss"
    return next((k for k, v in finals[0].items() if isinstance(v, float) and k != "wall_seconds"), None)


def values_by_configuration(sweep: Sweep, metric: str) -> dict[str, list[float]]:
    """{configuration: [metric of each finished run]} in sweep order (configurations without runs: [])."""
    out = {c: [] for c in sweep.configurations}
    for r in sweep.runs:
        if r.done and isinstance(r.final.get(metric), (int, float)):
            out[r.configuration].append(float(r.final[metric]))
    return out


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
    wall_seconds: float
    statuses: dict[str, int]             # done / failed / skipped / not run counts


def final_table(sweep: Sweep, metric: str, reference: str | None) -> list[ConfigRow]:
    """One row per configuration: the metric's summary over seeds and its comparison with the reference."""
    values = values_by_configuration(sweep, metric)
    rows = []
    for c in sweep.configurations:
        runs = [r for r in sweep.runs if r.configuration == c]
        counts: dict[str, int] = {}
        for r in runs:
            kind = r.status.split(":")[0]
            counts[kind] = counts.get(kind, 0) + 1
        walls = [r.final["wall_seconds"] for r in runs if r.done and "wall_seconds" in r.final]
        comparison = (stats.compare(values[c], values[reference])
                      if reference and c != reference and values[c] else None)
        rows.append(ConfigRow(c, stats.summarize(values[c]), comparison,
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
    loss_steps/loss_diff: the logged steps both have and (curve metric - reference's);
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
        pa, pb = a[1][np.searchsorted(a[0], steps)], b[1][np.searchsorted(b[0], steps)]
        differ = np.flatnonzero(np.any(pa != pb, axis=1))  # exact comparison of the stored bits
        first_param = int(steps[differ[0]]) if differ.size else None
        pa, pb = pa.astype(np.float64), pb.astype(np.float64)
        rel = np.linalg.norm(pa - pb, axis=1) / np.maximum(np.linalg.norm(pb, axis=1), np.finfo(float).tiny)
    sa, va = curve(records.read_metrics(run.dir), curve_key)
    sb, vb = curve(records.read_metrics(ref.dir), curve_key)
    loss_steps, ia, ib = np.intersect1d(sa, sb, return_indices=True)
    loss_diff = va[ia] - vb[ib]
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


def mean_curves(sweep: Sweep, key: str) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """{configuration: (steps, mean, min, max)} of metric `key` over its seeds, at the steps all logged."""
    out = {}
    for c in sweep.configurations:
        curves = [curve(records.read_metrics(r.dir), key) for r in sweep.runs if r.configuration == c and r.done]
        curves = [cv for cv in curves if cv[0].size]
        if not curves:
            continue
        steps = curves[0][0]
        for s, _ in curves[1:]:
            steps = np.intersect1d(steps, s)
        ys = np.stack([v[np.searchsorted(s, steps)] for s, v in curves])
        out[c] = (steps, ys.mean(0), ys.min(0), ys.max(0))
    return out


# --- rendering -----------------------------------------------------------------------------------------


def _fmt(x: Any, spec: str = ".6g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, spec)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cell = lambda v: str(v).replace("|", "\\|")
    return (["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(map(cell, r)) + " |" for r in rows])


def _axes_text(sweep: Sweep) -> list[str]:
    """One line per swept field: its values, in sweep order."""
    fields: dict[str, list[Any]] = {}
    for p in sweep.record["points"]:
        for f, v in p["overrides"].items():
            fields.setdefault(f, [])
            if v not in fields[f]:
                fields[f].append(v)
    return [f"`{f}` ∈ {{{', '.join(map(str, vs))}}}" for f, vs in fields.items()]


def _machine_text(sweep: Sweep) -> list[str]:
    infos = [r.info for r in sweep.runs if r.done and r.info] or [r.info for r in sweep.runs if r.info]
    if not infos:
        return ["- machine: no run record yet"]
    info = infos[0]
    cpu = info.get("cpu") or {}
    applied = info.get("numerics_applied") or {}
    versions = info.get("versions") or {}
    hosts = sorted({i.get("hostname") for i in infos if i.get("hostname")})
    lines = [
        f"- machine: {cpu.get('model', '?')}, {cpu.get('logical_cores', '?')} logical cores, ISA flags "
        f"{', '.join(cpu.get('isa_flags', [])) or '?'}; host(s) {', '.join(hosts) or '?'}",
        f"- software: jax {versions.get('jax')}, jaxlib {versions.get('jaxlib')}, flax {versions.get('flax')}, "
        f"optax {versions.get('optax')}, Python {info.get('python')}; platform {info.get('platform')}; "
        f"backend {applied.get('backend', '?')} ({applied.get('device_kind', '?')})",
        f"- data: {info.get('data_source') or '?'}",
        f"- hwrepro commit: {info.get('git_commit') or 'unknown'}",
    ]
    return lines


def _training_text(base: dict[str, Any]) -> str:
    t = base.get("train", {})
    length = f"{t.get('num_steps')} steps" if t.get("num_steps") else f"{t.get('num_epochs')} epochs"
    return (f"- training: {length}, batch {t.get('batch_size')}, learning rate {t.get('learning_rate')}, "
            f"{t.get('checkpoints')} checkpoints, Hessian Lanczos iterations {t.get('hessian_iters')}")


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


def _repeats(sweep: Sweep) -> list[str]:
    return list(dict.fromkeys(r.repeat for r in sweep.runs))


def _header(sweep: Sweep, a: Analysis) -> list[str]:
    rec = sweep.record
    count = lambda *kinds: sum(1 for r in sweep.runs if r.status.split(":")[0] in kinds)
    repeats = _repeats(sweep)
    shard = f" This folder was last run as shard {rec['shard']}." if rec.get("shard") else ""
    return [f"# Sweep report: {rec.get('experiment')} '{rec.get('name')}'", "",
            f"Written {records.now()} by `python -m hwrepro.report`. {len(sweep.runs)} points: "
            f"{len(sweep.configurations)} configurations x {len(repeats)} repeat(s) "
            f"({', '.join(rec.get('group_over', []))}: {', '.join(repeats)}); {count('done')} done, "
            f"{count('failed')} failed, {count('skipped')} skipped, {count(NOT_RUN, 'running')} not run or "
            f"unfinished.{shard}", "",
            "- axes: " + "; ".join(_axes_text(sweep)),
            _training_text(rec.get("base_config", {})), *_machine_text(sweep),
            f"- metric: `{a.metric}` (final.json); curves: `{a.curve_key}` (metrics.jsonl); reference "
            f"configuration: `{a.reference}`" + (f" ({a.reference_note})" if a.reference_note else ""), ""]


def _final_section(a: Analysis, plots: dict[str, str]) -> list[str]:
    out = ["## Final metric per configuration", ""]
    if a.metric is None:
        return out + ["No finished runs: nothing to summarise.", ""]
    notes: dict[str, int] = {}
    table = []
    for row in a.rows:
        s, cmp = row.summary, row.comparison
        flags = " ".join(f"[{notes.setdefault(w, len(notes) + 1)}]" for w in (cmp.warnings if cmp else ()))
        diff = (f"{s.mean - cmp.b.mean:+.4g}" if cmp is not None else
                "(reference)" if row.configuration == a.reference else "–")
        table.append([f"`{row.configuration}`", s.n, _fmt(s.mean), _fmt(s.std, ".3g"), _fmt(s.min), _fmt(s.max),
                      diff, _fmt(cmp.welch.p if cmp else None, ".3g"),
                      _fmt(cmp.effect.hedges_g if cmp else None, ".3g"), flags, _fmt(row.wall_seconds, ".1f"),
                      ", ".join(f"{v} {k}" for k, v in row.statuses.items() if k != "done")])
    out += _table(["configuration", "n", "mean", "std", "min", "max", "Δ mean vs ref", "Welch p", "Hedges g",
                   "warnings", "wall s", "not done"], table) + [""]
    if notes:
        out += ["Warnings (group a = the configuration, group b = the reference):", ""]
        out += [f"{i}. {w}" for w, i in notes.items()] + [""]
    out += ["Δ is the configuration's mean minus the reference's; p is Welch's two-sided t-test (unequal "
            "variances); g is Hedges' bias-corrected standardised difference; wall s is the mean run time. "
            "With a few seeds a t-test has little power: a large p says the set-ups were not told apart, not "
            "that they are equal.", ""]
    if "final" in plots:
        out += [f"![final {a.metric} per configuration]({plots['final']})", ""]
    if "curves" in plots:
        out += [f"![{a.curve_key} curves]({plots['curves']})", "",
                f"Mean `{a.curve_key}` over seeds per configuration; the band spans the seeds' min to max.", ""]
    return out


def _identity_section(sweep: Sweep, a: Analysis) -> list[str]:
    out = ["## Bit-identical runs", ""]
    done = [r for r in sweep.runs if r.done]
    if not done:
        return out + ["No finished runs.", ""]
    shared = [g for g in a.groups if len(g) > 1]
    out += [f"{len(a.groups)} distinct final parameter sets among {len(done)} finished runs; "
            f"{sum(len(g) for g in shared)} run(s) share their final parameters bit for bit with another run "
            f"({len(shared)} group(s)). Runs with the same letter ended with identical parameters (same "
            "param_sha256); '·' means no other run reproduced it.", ""]
    repeats = _repeats(sweep)
    matrix = []
    for c in sweep.configurations:
        runs = [r for r in sweep.runs if r.configuration == c]
        if any(r.done for r in runs):
            cells = {r.repeat: a.labels.get(r.name, "·") if r.done else r.status.split(":")[0] for r in runs}
            matrix.append([f"`{c}`"] + [cells.get(k, "") for k in repeats])
    out += _table(["configuration", *repeats], matrix) + [""]
    if shared:
        sha = {r.name: r.final["param_sha256"] for r in done}
        out += _table(["group", "runs", "param_sha256"],
                      [[a.labels[g[0]], "<br>".join(f"`{n}`" for n in g), f"`{sha[g[0]][:16]}…`"]
                       for g in shared]) + [""]
    return out


def _divergence_section(sweep: Sweep, a: Analysis, plots: dict[str, str]) -> list[str]:
    out = ["## Divergence from the reference run of the same seed", ""]
    if not a.divergences:
        return out + ["No pairs to compare (needs finished runs of the reference and of another configuration "
                      "with the same seed).", ""]
    out += ["Runs of one seed start from the same parameters and see the same batches, so any difference comes "
            "from the numerics. Distance: ||θ(t) − θ_ref(t)|| / ||θ_ref(t)|| at the checkpoints of trajectory.npz "
            f"(parameters stored as float32); `{a.curve_key}` difference at the logged steps. 'first differs' is "
            "the earliest checkpoint (or logged step), over seeds, where anything differs; 'never' means "
            "bit-identical at every one.", ""]
    first = lambda step: "never" if step is None else str(step)
    table = []
    for c in sweep.configurations:
        ds = [d for d in a.divergences if d.configuration == c]
        if not ds:
            continue
        s = summarize_divergences(ds)
        spread = f" ({s.end_min:.2g}–{s.end_max:.2g})" if s.with_params > 1 else ""
        table.append([f"`{c}`", s.seeds, f"{s.identical}/{s.with_params}",
                      first(s.first_param_step) if s.with_params else "–", _fmt(s.end_mean, ".3g") + spread,
                      first(s.first_loss_step), _fmt(s.max_abs_loss_diff, ".3g"), s.notes])
    out += _table(["configuration", "seeds", "identical at all checkpoints", "params first differ (step)",
                   "distance at end: mean (min–max)", f"{a.curve_key} first differs (step)",
                   f"max |Δ{a.curve_key}| (mean over seeds)", "notes"], table) + [""]
    if "divergence" in plots:
        out += [f"![divergence]({plots['divergence']})", ""]
    return out


def _hessian_section(sweep: Sweep, a: Analysis, plots: dict[str, str]) -> list[str]:
    out = ["## Saddle-point diagnostic: Hessian extreme eigenvalues at checkpoints", ""]
    if not a.hessian:
        return out + ["No Hessian estimates were logged (train.hessian_iters = 0 or no checkpoints).", ""]
    steps = sorted({p.step for ps in a.hessian.values() for p in ps})
    table = []
    for c, ps in a.hessian.items():
        at = {p.step: p for p in ps}
        table.append([f"`{c}`"] + [f"{at[s].max_mean:.4g} / {at[s].min_mean:.3g}" if s in at else ""
                                   for s in steps])
    iters = sweep.record.get("base_config", {}).get("train", {}).get("hessian_iters")
    ns = sorted({p.n for ps in a.hessian.values() for p in ps})
    runs = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]} to {ns[-1]}"
    out += [f"λ_max / λ_min of the training loss's Hessian on a fixed probe batch, mean over the runs that "
            f"estimated it ({runs} per cell), by Lanczos with {iters} iterations.", ""]
    out += _table(["configuration", *[f"step {s}" for s in steps]], table) + ["", _curvature_sentence(a.hessian), ""]
    if "hessian" in plots:
        out += [f"![Hessian eigenvalues]({plots['hessian']})", ""]
    return out


def _status_section(sweep: Sweep, a: Analysis) -> list[str]:
    by_status: dict[tuple[str, str], list[str]] = {}  # (configuration, status) -> repeats, to keep it short
    for r in sweep.runs:
        if not r.done:
            by_status.setdefault((r.configuration, r.status), []).append(r.repeat)
    out = ["## Points not in the statistics", ""]
    out += (_table(["configuration", "repeats", "status"],
                   [[f"`{c}`", ", ".join(reps), status] for (c, status), reps in by_status.items()])
            if by_status else ["None: every point finished."]) + [""]
    done = [r for r in sweep.runs if r.done]
    if done and a.metric:
        out += ["## All finished runs", ""]
        out += _table(["point", a.metric, "wall s", "param_sha256"],
                      [[f"`{r.name}`", _fmt(r.final.get(a.metric)), _fmt(r.final.get("wall_seconds"), ".1f"),
                        f"`{r.final.get('param_sha256', '')[:16]}`"] for r in done]) + [""]
    return out


def render(sweep: Sweep, a: Analysis, plots: dict[str, str]) -> str:
    """The Markdown text of the report; `plots` maps plot keys to the PNG files written next to it."""
    return "\n".join(_header(sweep, a) + _final_section(a, plots) + _identity_section(sweep, a)
                     + _divergence_section(sweep, a, plots) + _hessian_section(sweep, a, plots)
                     + _status_section(sweep, a))


def _curvature_sentence(hessian: dict[str, list[HessianPoint]]) -> str:
    """Whether any run saw negative curvature, and how strong it was relative to the largest eigenvalue."""
    cells = [(c, p) for c, ps in hessian.items() for p in ps]
    negative = [(c, p) for c, p in cells if p.min_lowest < 0]
    caveat = ("Lanczos Ritz values lie inside the spectrum, so a negative λ_min proves a direction of negative "
              "curvature, while a positive one (with few iterations) does not prove there is none.")
    if not negative:
        return (f"No negative curvature was seen: λ_min ≥ 0 in every run at all {len(cells)} "
                f"configuration-checkpoints, i.e. no saddle was detected. {caveat}")
    c, p = min(negative, key=lambda cp: cp[1].min_lowest / max(abs(cp[1].max_mean), 1e-30))
    return (f"Negative curvature was seen at {len(negative)} of {len(cells)} configuration-checkpoints (some "
            f"seed had λ_min < 0); relative to λ_max it was strongest for `{c}` at step {p.step} "
            f"(λ_min {p.min_lowest:.3g} vs λ_max {p.max_mean:.3g}). {caveat}")


# --- plots ---------------------------------------------------------------------------------------------


def _colors(configurations: Sequence[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(configurations) <= 10 else "tab20"]
    return {c: cmap(i % cmap.N) for i, c in enumerate(configurations)}


def _common_mean(xs: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(steps all series have, the mean of the series there) for [(steps, values)] with sorted steps."""
    steps = xs[0][0]
    for s, _ in xs[1:]:
        steps = np.intersect1d(steps, s)
    return steps, np.mean([v[np.searchsorted(s, steps)] for s, v in xs], axis=0)


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
            steps, dist = _common_mean(params)
            ax1.plot(steps, dist, "o-", color=colors[c], ms=3, lw=1, label=c)
            dists.append(dist)
        losses = [(d.loss_steps, np.abs(d.loss_diff)) for d in ds if d.loss_steps.size]
        if losses:
            steps, diff = _common_mean(losses)
            ax2.plot(steps, diff, color=colors[c], lw=1, label=c)
            diffs.append(diff)
    _log_scale(ax1, dists)
    _log_scale(ax2, diffs)
    ax1.set(xlabel="step", ylabel="||θ − θ_ref|| / ||θ_ref||",
            title="parameter distance to reference (mean over seeds)")
    ax2.set(xlabel="step", ylabel=f"|Δ {a.curve_key}|", title=f"{a.curve_key} difference (mean over seeds)")
    ax1.legend(fontsize=6)


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = _colors(sweep.configurations)
    written = {}

    def save(fig, key):
        fig.tight_layout()
        fig.savefig(workdir / PLOTS[key], dpi=90)
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


# --- entry points --------------------------------------------------------------------------------------


def write_report(workdir: Path, metric: str | None = None, reference: str | None = None,
                 curve_key: str | None = None) -> Path:
    """Writes DIR/report.md and its PNGs; returns the report's path (arguments as for `analyse`)."""
    workdir = Path(workdir)
    sweep = load(workdir)
    a = analyse(sweep, metric, reference, curve_key)
    for name in PLOTS.values():  # a plot with no data this time must not survive from an earlier report
        (workdir / name).unlink(missing_ok=True)
    plots = write_plots(sweep, workdir, a)
    path = workdir / REPORT_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(render(sweep, a, plots))
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hwrepro.report",
                                     description="Write DIR/report.md and PNGs for a finished (or partial) sweep.")
    parser.add_argument("workdir", help="the sweep folder (holds sweep.json)")
    parser.add_argument("--metric", help="final.json entry to compare (default: report.metric or test_loss)")
    parser.add_argument("--reference", help="reference configuration name (default: report.reference)")
    parser.add_argument("--curve", help="metrics.jsonl entry for curves (default: report.curve or loss)")
    args = parser.parse_args(argv)
    try:
        path = write_report(Path(args.workdir), args.metric, args.reference, args.curve)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
