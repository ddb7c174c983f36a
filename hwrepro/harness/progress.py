"""Progress lines for long work (training steps, evaluation batches, sweep points). No JAX here."""

from __future__ import annotations

import sys
import time
from typing import Mapping

from hwrepro.harness.timing import shares_text


def format_seconds(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """One status line (steps/s, ETA, where the time went, latest metrics): rewritten in place on a terminal,
    otherwise printed at most every `interval` seconds so logs stay readable.

    Rate and ETA count from the first `update` on (in the training loop: the first metrics line), so
    compilation and the first, slower steps do not inflate the ETA; until a second update there is none ('–').
    """

    def __init__(self, total: int, label: str, interval: float = 10.0, stream=None, unit: str = "step",
                 units: str = "steps"):
        self.total, self.label, self.unit, self.units = total, label, unit, units
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval = 0.5 if self.tty else interval
        self.last_print = -float("inf")
        self.base: tuple[float, int] | None = None  # (time, step) of the first update: the warm-up's end

    def update(self, step: int, force: bool = False, seconds: Mapping[str, float] | None = None,
               **shown: float) -> None:
        """Shows `step` of total with the metrics `shown`; `seconds` ({activity: seconds so far}, see
        hwrepro.harness.timing.activity_seconds) adds each activity's share of the time."""
        now = time.time()
        if self.base is None:
            self.base = (now, step)
        if not force and now - self.last_print < self.interval:
            return
        self.last_print = now
        t0, s0 = self.base
        rate = (step - s0) / (now - t0) if step > s0 and now > t0 else None
        eta = "0:00:00" if step >= self.total else format_seconds((self.total - step) / rate) if rate else "–"
        speed = f"{rate:.1f} {self.units}/s " if rate else ""
        fields = " ".join(f"{k} {v:.4g}" for k, v in shown.items())
        split = shares_text(seconds or {})
        line = (f"[{self.label}] {self.unit} {step}/{self.total} ({100 * step / self.total:.0f}%) "
                f"{speed}ETA {eta} {fields}" + (f" | time: {split}" if split else "")).rstrip()
        if self.tty:
            self.stream.write("\r" + line.ljust(100) + ("\n" if step >= self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
