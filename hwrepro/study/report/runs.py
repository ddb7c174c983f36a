"""Run folders as the run report reads them: records, metric curves, where the time went, what the config
changed from its defaults, the environment. Pure functions of the files; no JAX, no plotting."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, Sequence

from hwrepro.harness import records
from hwrepro.harness.config import dotted_fields
from hwrepro.harness.timing import activity_seconds
from hwrepro.study.report.analysis import ReportError

REPO = Path(__file__).resolve().parents[3]  # where configs/ lives, for a run launched from elsewhere


class RunFolder(NamedTuple):
    """One run's records; `unparsed` counts metrics.jsonl lines that are not JSON (a cut-off write)."""
    dir: Path
    info: dict[str, Any]               # run.json
    final: dict[str, Any] | None       # final.json (a finished run)
    config: dict[str, Any]             # config.json ({} when missing)
    rows: list[dict[str, Any]]         # metrics.jsonl lines that parse
    unparsed: int

    @property
    def name(self) -> str:
        return str(self.info.get("name") or self.dir.name)


def load_run(path: Path) -> RunFolder:
    """Reads a run folder; ReportError when it holds no readable run.json (not a run)."""
    path = Path(path)
    info = records.read_json_or_none(path / "run.json")
    if not isinstance(info, dict):
        raise ReportError(f"{path} is not a run folder (no readable run.json)")
    rows = records.read_metrics(path)
    try:
        lines = sum(1 for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip())
    except OSError:
        lines = 0
    final = records.read_json_or_none(path / "final.json")
    config = records.read_json_or_none(path / records.CONFIG_FILE)
    return RunFolder(path, info, final if isinstance(final, dict) else None,
                     config if isinstance(config, dict) else {}, rows, lines - len(rows))


def curve_keys(runs: Sequence[RunFolder]) -> list[str]:
    """The metrics worth a curve, in order of first appearance: the training loss and every evaluation metric
    (not the timing fields)."""
    keys = [k for r in runs for row in r.rows for k, v in row.items()
            if isinstance(v, (int, float)) and (k == "loss" or (k.startswith("eval_") and not k.endswith("seconds")))]
    return list(dict.fromkeys(keys))


def curve(run: RunFolder, key: str, x: str) -> tuple[list[float], list[float]]:
    """(x values, `key` values) of the lines that have both; x 'time' is train_seconds (time in the training
    loop, evaluation and checkpoints excluded), else seconds since the run (re)started."""
    pts = []
    for row in run.rows:
        xv = row.get("train_seconds", row.get("seconds")) if x == "time" else row.get(x)
        if isinstance(row.get(key), (int, float)) and isinstance(xv, (int, float)):
            pts.append((float(xv), float(row[key])))
    return [p[0] for p in pts], [p[1] for p in pts]


def time_split(run: RunFolder) -> dict[str, float]:
    """{activity: seconds} of the whole run: the training loop's activities from its last metrics line
    (hwrepro.harness.timing), the final evaluation where the experiment timed it (final_eval_seconds), and
    `other`, the rest of the wall time (start-up, data, the final evaluation where not timed, saving)."""
    last = run.rows[-1] if run.rows else {}
    seconds = activity_seconds(last)
    final = run.final or {}
    if isinstance(final.get("final_eval_seconds"), (int, float)):
        seconds["final evaluation"] = float(final["final_eval_seconds"])
    wall = final.get("wall_seconds", last.get("seconds", 0.0))
    seconds["other"] = max(float(wall or 0.0) - sum(seconds.values()), 0.0)
    return seconds


def config_file(argv: Sequence[str]) -> Path | None:
    """The config file launch.py was given in `argv` (--config=PATH or --config PATH, without a ':arg'), as
    found from the current folder or the repository; None if there is none."""
    given = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if given is None and "--config" in argv[:-1]:
        given = argv[argv.index("--config") + 1]
    if not given:
        return None
    path = Path(given.split(":", 1)[0])
    return next((p for p in (path, REPO / path) if p.is_file()), None)


def _config_files(run: RunFolder) -> list[Path]:
    """Candidate config files for the run: the one in run.json's argv (a run launched in this process), else
    every configs/*.py (a launcher's child process or a sweep point records its own argv)."""
    given = config_file(run.info.get("argv") or [])
    return [given] if given is not None else sorted((REPO / "configs").glob("*.py"))


def defaults_for(run: RunFolder) -> tuple[str, dict[str, Any]]:
    """(what the run's config is compared with, that config as JSON data): the get_config() of its config
    file (of the candidates of the run's experiment, the one it differs least from), else the defaults every
    experiment shares (base_config), which lack the experiment's own fields."""
    from hwrepro.harness import config as base

    mine = dotted_fields(run.config)
    best: tuple[int, str, dict[str, Any]] | None = None
    for path in _config_files(run):
        try:
            theirs = records.config_dict(base.load_config_file(path))
        except Exception:  # a config file broken or changed since the run: not a candidate
            continue
        if theirs.get("experiment") != run.config.get("experiment"):
            continue
        flat = dotted_fields(theirs)
        differ = sum(1 for k in mine.keys() | flat.keys() if mine.get(k) != flat.get(k))
        if best is None or differ < best[0]:
            best = (differ, f"{path.name}'s get_config()", theirs)
    if best is not None:
        return best[1], best[2]
    return ("the defaults every experiment shares (hwrepro.harness.config.base_config; the experiment's own "
            "fields have no default there)",
            records.config_dict(base.base_config(run.config.get("experiment", "?"))))


def config_changes(run: RunFolder) -> tuple[str, list[tuple[str, Any, Any]]]:
    """(what it is compared with, [(field, default, this run's value)] where they differ; a field the defaults
    lack has default None)."""
    against, defaults = defaults_for(run)
    mine, theirs = dotted_fields(run.config), dotted_fields(defaults)
    return against, [(k, theirs.get(k), v) for k, v in mine.items() if k not in theirs or theirs[k] != v]


def environment(info: dict[str, Any]) -> list[tuple[str, Any]]:
    """run.json's environment entries as (dotted key, value), the config's numerics request left out (the
    config section shows it)."""
    return [(k, v) for k, v in dotted_fields({k: v for k, v in info.items() if k != "numerics_requested"}).items()]

