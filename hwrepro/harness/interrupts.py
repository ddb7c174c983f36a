"""Stopping a run on request: SIGINT (Ctrl-C), SIGTERM (a scheduler's preemption) and SIGHUP end it cleanly.

In the training process, `catch_signals()` turns each of them into `Interrupted`. Inside the training loop the
signal is deferred to the end of the current step (`at_step_boundary`), where the loop saves a checkpoint
and raises; anywhere else (data loading, final evaluation) it raises at once. A second signal while one is
pending raises at once too, so a run can always be stopped; the same signal again within DUPLICATE_SECONDS is
one event delivered twice (a launcher's death brought two SIGTERMs 40 ms apart), not a second request. The run
record then says `interrupted: ...`, and rerunning the same command (with the same --workdir) resumes from the
last checkpoint.
"""

from __future__ import annotations

import contextlib
import signal
import time
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(Exception):
    """The run was stopped by signal `name` (e.g. "SIGTERM"); `detail` says where (", at step 41 of 100; ...").
    `reported`: a child process has already printed the user's line."""

    def __init__(self, name: str, detail: str = "", reported: bool = False):
        super().__init__(f"interrupted by {name}{detail}")
        self.name, self.detail, self.reported = name, detail, reported

    @property
    def status(self) -> str:
        """The run record's status: `interrupted: SIGTERM at step 41 of 100; ...`."""
        return f"interrupted: {self.name}{self.detail}"


DUPLICATE_SECONDS = 0.5

_pending: list[str] = []
_pending_at = [0.0]
_deferring = [False]


def _handler(signum: int, frame) -> None:
    name = signal.Signals(signum).name
    if _deferring[0] and not _pending:
        _pending.append(name)
        _pending_at[0] = time.monotonic()
        return
    if _pending and name == _pending[0] and time.monotonic() - _pending_at[0] < DUPLICATE_SECONDS:
        return
    raise Interrupted(name)


@contextlib.contextmanager
def catch_signals() -> Iterator[None]:
    """While active, SIGINT / SIGTERM / SIGHUP raise Interrupted (deferred inside `at_step_boundary`).
    Does nothing outside the main thread, where Python cannot handle signals."""
    try:
        previous = {s: signal.signal(s, _handler) for s in SIGNALS}
    except ValueError:
        yield
        return
    _pending.clear()
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def at_step_boundary() -> Iterator[None]:
    """A signal arriving inside is kept for `pending()` (the loop's next step boundary) instead of raised; one
    still pending when the block ends without raising (the loop never acted on it) raises then."""
    _deferring[0] = True
    try:
        yield
    finally:
        _deferring[0] = False
    if _pending:
        raise Interrupted(_pending.pop())


def pending() -> str | None:
    """The name of a deferred signal (e.g. 'SIGTERM'), or None."""
    return _pending[0] if _pending else None
