"""The report as Markdown: header (axes, machine, training), final-metric table with Welch tests, bit-identical
groups, divergence, Hessian and run-status sections."""

from __future__ import annotations

import math
from typing import Any, Sequence

from hwrepro.harness import records
from hwrepro.study.report.analysis import NOT_RUN, Analysis, HessianPoint, Sweep, summarize_divergences

def _fmt(x: Any, spec: str = ".6g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, spec)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
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


def _repeats(sweep: Sweep) -> list[str]:
    return list(dict.fromkeys(r.repeat for r in sweep.runs))


def _header(sweep: Sweep, a: Analysis) -> list[str]:
    rec = sweep.record
    count = lambda *kinds: sum(1 for r in sweep.runs if r.status.split(":")[0] in kinds)
    repeats = _repeats(sweep)
    shard = f" This folder was last run as shard {rec['shard']}." if rec.get("shard") else ""
    return [f"# Sweep report: {rec.get('experiment')} '{rec.get('name')}'", "",
            f"Written {records.now()} by `python -m hwrepro.study.report`. {len(sweep.runs)} points: "
            f"{len(sweep.configurations)} configurations x {len(repeats)} repeat(s) "
            f"({', '.join(rec.get('group_over', []))}: {', '.join(repeats)}); {count('done')} done, "
            f"{count('failed')} failed, {count('skipped')} skipped, {count(NOT_RUN, 'running', 'interrupted')} not run or "
            f"unfinished (interrupted included).{shard}", "",
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
        s, cmp, pair = row.summary, row.comparison, row.paired
        warnings = dict.fromkeys((cmp.warnings if cmp else ()) + (pair.warnings if pair else ()))
        flags = " ".join(f"[{notes.setdefault(w, len(notes) + 1)}]" for w in warnings)
        diff = (_fmt(s.mean - cmp.b.mean, "+.4g") if cmp is not None else
                "(reference)" if row.configuration == a.reference else "–")
        table.append([f"`{row.configuration}`", s.n, _fmt(s.mean), _fmt(s.std, ".3g"), _fmt(s.min), _fmt(s.max),
                      diff, _fmt(cmp.mde if cmp else None, ".3g"), _fmt(cmp.welch.p if cmp else None, ".3g"),
                      _fmt(cmp.effect.hedges_g if cmp else None, ".3g"),
                      f"{_fmt(pair.p, '.3g')} ({pair.n})" if pair else "–", _fmt(pair.mde if pair else None, ".3g"),
                      flags, _fmt(row.wall_seconds, ".1f"),
                      ", ".join(f"{v} {k}" for k, v in row.statuses.items() if k != "done")])
    out += markdown_table(["configuration", "n", "mean", "std", "min", "max", "Δ mean vs ref", "MDE", "Welch p",
                           "Hedges g", "paired p (pairs)", "paired MDE", "warnings", "wall s", "not done"],
                          table) + [""]
    if notes:
        out += ["Warnings (group a = the configuration, group b = the reference):", ""]
        out += [f"{i}. {w}" for w, i in notes.items()] + [""]
    out += ["Δ is the configuration's mean minus the reference's; p is Welch's two-sided t-test (unequal "
            "variances); g is Hedges' bias-corrected standardised difference; wall s is the mean run time. "
            "MDE is the minimum detectable effect: the smallest |Δ| this comparison finds with 80% power at "
            "alpha 0.05, for its seed counts and the seeds' spreads (Welch's test, normal errors; 0 when no "
            "seed varies). Paired: the t-test of the per-seed differences from the reference's run of the same "
            "seed (for set-ups that differ in numerics: same initial parameters, same batches), and its MDE: it "
            "removes the seed-to-seed spread, so it sees smaller effects. With a few seeds a t-test has little "
            "power: a large p says the set-ups were not told apart to within about the MDE (itself estimated from "
            "a few seeds), not that they are equal.", *_multiplicity(a), ""]
    if "final" in plots:
        out += [f"![final {a.metric} per configuration]({plots['final']})", ""]
    if "curves" in plots:
        out += [f"![{a.curve_key} curves]({plots['curves']})", "",
                f"Mean `{a.curve_key}` over seeds per configuration; the band spans the seeds' min to max.", ""]
    return out


def _multiplicity(a: Analysis) -> list[str]:
    """A sentence on the p-values' multiplicity: each configuration is one more test against the reference."""
    tests = [row for row in a.rows if row.comparison]
    smallest = {name: min((p for p in ps if math.isfinite(p)), default=None) for name, ps in
                (("Welch", [row.comparison.welch.p for row in tests]),
                 ("paired", [row.paired.p for row in tests if row.paired]))}
    adjusted = [f"the smallest {name} p, {p:.3g}, becomes {min(1.0, p * len(tests)):.3g}"
                for name, p in smallest.items() if p is not None]
    if len(tests) < 2 or not adjusted:
        return []
    return [f"The p-values are not adjusted for the {len(tests)} comparisons with the reference (at alpha 0.05 "
            f"about one true null in 20 still comes out below 0.05). Holm's adjustment multiplies the smallest p "
            f"of a column by {len(tests)}: {' and '.join(adjusted)}."]


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
    out += markdown_table(["configuration", *repeats], matrix) + [""]
    if shared:
        sha = {r.name: r.final["param_sha256"] for r in done}
        out += markdown_table(["group", "runs", "param_sha256"],
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
            f"(parameters stored as float32); `{a.curve_key}` difference at the logged lines that cover the same "
            "steps in both runs (lines around a resume off the logging steps are not compared). 'first differs' is "
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
    out += markdown_table(["configuration", "seeds", "identical at all checkpoints", "params first differ (step)",
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
    out += (markdown_table(["configuration", *[f"step {s}" for s in steps]], table)
            + ["", _curvature_sentence(a.hessian), ""])
    if "hessian" in plots:
        out += [f"![Hessian eigenvalues]({plots['hessian']})", ""]
    return out


def _status_section(sweep: Sweep, a: Analysis) -> list[str]:
    by_status: dict[tuple[str, str], list[str]] = {}  # (configuration, status) -> repeats, to keep it short
    for r in sweep.runs:
        if not r.done:
            by_status.setdefault((r.configuration, r.status), []).append(r.repeat)
    out = ["## Points not in the statistics", ""]
    out += (markdown_table(["configuration", "repeats", "status"],
                   [[f"`{c}`", ", ".join(reps), status] for (c, status), reps in by_status.items()])
            if by_status else ["None: every point finished."]) + [""]
    done = [r for r in sweep.runs if r.done]
    if done and a.metric:
        out += ["## All finished runs", ""]
        out += markdown_table(["point", a.metric, "wall s", "param_sha256"],
                      [[f"`{r.name}`", _fmt(r.final.get(a.metric)), _fmt(r.final.get("wall_seconds"), ".1f"),
                        f"`{r.final.get('param_sha256', '')[:16]}`"] for r in done]) + [""]
    return out


def render(sweep: Sweep, a: Analysis, plots: dict[str, str]) -> str:
    """The Markdown text of the report; `plots` maps plot keys to the PNG files written next to it."""
    return "\n".join(_header(sweep, a) + _final_section(a, plots) + _identity_section(sweep, a)
                     + _divergence_section(sweep, a, plots) + _hessian_section(sweep, a, plots)
                     + _status_section(sweep, a))


CURVATURE_TOLERANCE = 1e-4  # |λ_min| below this times λ_max is float32 Lanczos rounding, not curvature


def _curvature_sentence(hessian: dict[str, list[HessianPoint]]) -> str:
    """Whether any run saw negative curvature beyond rounding, and how strong it was relative to the largest
    eigenvalue."""
    cells = [(c, p) for c, ps in hessian.items() for p in ps]
    negative = [(c, p) for c, p in cells if p.min_lowest < -CURVATURE_TOLERANCE * abs(p.max_mean)]
    caveat = ("Lanczos Ritz values lie inside the spectrum, so in exact arithmetic a negative λ_min shows a "
              "direction of negative curvature, while a positive one (with few iterations) does not show there "
              f"is none; in floating point a λ_min within {CURVATURE_TOLERANCE:g} x λ_max of 0 is rounding and "
              "counted as 0, and Hessian-vector products in bf16 are not exactly symmetric.")
    if not negative:
        return (f"No negative curvature beyond rounding was seen: λ_min ≥ -{CURVATURE_TOLERANCE:g} x λ_max in "
                f"every run at all {len(cells)} configuration-checkpoints, i.e. no saddle was detected. {caveat}")
    c, p = min(negative, key=lambda cp: cp[1].min_lowest / max(abs(cp[1].max_mean), 1e-30))
    return (f"Negative curvature was seen at {len(negative)} of {len(cells)} configuration-checkpoints (some "
            f"seed had λ_min < -{CURVATURE_TOLERANCE:g} x λ_max); relative to λ_max it was strongest for `{c}` at "
            f"step {p.step} (λ_min {p.min_lowest:.3g} vs λ_max {p.max_mean:.3g}). {caveat}")
