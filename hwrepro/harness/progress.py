"""Progress lines for long work (training steps, evaluation batches, sweep points). No JAX here."""

from __future__ import annotations

import sys
import time


def format_seconds(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """One status line (steps/s, ETA, latest metrics): rewritten in place on a terminal, otherwise printed
    at most every `interval` seconds so logs stay readable."""

    def __init__(self, total: int, label: str, interval: float = 10.0, stream=None, unit: str = "step",
                 units: str = "steps", start: int = 0):
        self.total, self.label, self.unit, self.units, self.start = total, label, unit, units, start
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval = 0.5 if self.tty else interval
        self.t0 = time.time()
        self.last_print = -float("inf")

    def update(self, step: int, force: bool = False, **shown: float) -> None:
        now = time.time()
        if not force and now - self.last_print < self.interval:
            return
        self.last_print = now
        elapsed = now - self.t0
        rate = (step - self.start) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - step) / rate if rate > 0 else 0.0
        fields = " ".join(f"{k} {v:.4g}" for k, v in shown.items())
        line = (f"[{self.label}] {self.unit} {step}/{self.total} ({100 * step / self.total:.0f}%) "
                f"{rate:.1f} {self.units}/s ETA {format_seconds(eta)} {fields}").rstrip()
        if self.tty:
            self.stream.write("\r" + line.ljust(100) + ("\n" if step >= self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
