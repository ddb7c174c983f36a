"""Where a run's time goes: compilation, steps, table rebuilds, evaluation, checkpoints. No JAX here.

The training loop (hwrepro.harness.loop) times what it owns and writes the running totals on every
metrics.jsonl line, so the progress line, a report of an unfinished run and a report of a finished one all read
the same numbers:

- `train_seconds`      time in the loop's steps (already on every line), of which
- `compile_seconds`    the first step call after the loop (re)starts: tracing and compiling, then dispatch
                       (the step itself runs asynchronously, so this is almost all compilation);
- `rebuild_seconds`    an experiment's table upkeep inside `after_step`, from the counters it keeps in the
                       loop's `host` dict (`UPKEEP_COUNTERS`: SLIDE's rebuilds and refiles);
- `evaluation_seconds` time in `eval_fn` (evaluation during training);
- `checkpoint_seconds` time saving checkpoints and trajectory snapshots (the loop waits for these).

All are totals over the run's resumptions (they are kept in its checkpoints).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Mapping

UPKEEP_COUNTERS = ("rebuild_seconds", "refile_seconds")  # host counters an after_step keeps (SLIDE's tables)
LOOP_FIELDS = ("compile_seconds", "rebuild_seconds", "evaluation_seconds", "checkpoint_seconds")
ACTIVITIES = ("steps", "compile", "rebuilds", "evaluation", "checkpoints")


@contextlib.contextmanager
def timed(spent: dict[str, float], field: str) -> Iterator[None]:
    """Adds the seconds the block takes to spent[field] (also when it raises)."""
    t = time.time()
    try:
        yield
    finally:
        spent[field] = spent.get(field, 0.0) + time.time() - t


def loop_fields(spent: Mapping[str, float], host: Mapping[str, Any]) -> dict[str, float]:
    """The metrics-line fields of `LOOP_FIELDS`: the loop's own totals `spent` and the experiment's upkeep
    counters in `host` (0 where none was kept)."""
    out = {f: float(spent.get(f, 0.0)) for f in LOOP_FIELDS}
    out["rebuild_seconds"] = float(sum(host.get(k, 0.0) for k in UPKEEP_COUNTERS))
    return out


def activity_seconds(row: Mapping[str, Any]) -> dict[str, float]:
    """{activity: seconds} of `ACTIVITIES` from a metrics line: steps is train_seconds less compilation and
    rebuilds, which happen inside it. Fields a line lacks (runs recorded before they were) count 0."""
    get = lambda key: float(row.get(key) or 0.0)
    compile_s, rebuild_s = get("compile_seconds"), get("rebuild_seconds")
    return {"steps": max(get("train_seconds") - compile_s - rebuild_s, 0.0), "compile": compile_s,
            "rebuilds": rebuild_s, "evaluation": get("evaluation_seconds"), "checkpoints": get("checkpoint_seconds")}


def shares_text(seconds: Mapping[str, float]) -> str:
    """'steps 81% compile 4% rebuilds 12% evaluation 3%': each activity's share of their sum, those at 0
    left out; '' when nothing was timed."""
    total = sum(seconds.values())
    if total <= 0:
        return ""
    return " ".join(f"{k} {100 * v / total:.0f}%" for k, v in seconds.items() if v > 0)
