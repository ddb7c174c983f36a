"""TensorBoard event files of a run, in workdir/tb/ (with `log.tensorboard`), for `tensorboard --logdir runs/`.

Written with tensorboardX (the `tensorboard` extra), so no TensorFlow is needed. Each metrics.jsonl line becomes
scalars at its step, grouped by kind: `train/loss`, `eval/P_1` (from eval_P@1), `time/train_seconds` (any
*_seconds field and examples_per_s). A resumed run drops the events after its checkpoint's step (TensorBoard's
purge step), as it drops those metrics lines.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from hwrepro.errors import ConfigError

EVENTS_DIR = "tb"


def tag(key: str) -> str:
    """The TensorBoard tag of a metrics-line field, in the characters tags allow (eval_P@1 -> eval/P_1)."""
    if key.startswith("eval_"):
        name = "eval/" + key.removeprefix("eval_")
    elif key.endswith("seconds") or key == "examples_per_s":
        name = "time/" + key
    else:
        name = "train/" + key
    return re.sub(r"[^A-Za-z0-9_./-]", "_", name)


def _writer(folder: Path, purge_step: int | None = None) -> Any:
    """A tensorboardX writer into folder (ConfigError when tensorboardX is not installed)."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise ConfigError("log.tensorboard=True needs tensorboardX: pip install -e '.[tensorboard]'") from None
    # the suffix keeps a resumed run's file from replacing one opened in the same second
    return SummaryWriter(str(folder), purge_step=purge_step, flush_secs=10, filename_suffix=f".{purge_step or 0}")


class EventLog:
    """An open event file in workdir/tb/; `add` a metrics line, `rewind` on resuming, `close` at the end."""

    def __init__(self, workdir: Path):
        self.folder = Path(workdir) / EVENTS_DIR
        self._writer = _writer(self.folder)

    def add(self, row: Mapping[str, Any]) -> None:
        """The numeric fields of a metrics line (`step` gives their step; `seconds` is the event's own time)."""
        for key, value in row.items():
            if key not in ("step", "seconds") and isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(tag(key), value, row["step"])

    def rewind(self, step: int) -> None:
        """Starts a new event file that hides the events after `step` (a resumed run redoes those steps)."""
        self._writer.close()
        self._writer = _writer(self.folder, purge_step=step + 1)

    def close(self) -> None:
        self._writer.close()
