"""The errors hwrepro reports to a user as one line (launcher: `error: <message>`, non-zero exit)."""

from __future__ import annotations

import os


class HwreproError(Exception):
    """Base of every error whose message is meant for the user as is (no traceback)."""


class ConfigError(HwreproError, ValueError):
    """A config field is unknown, of the wrong type, or has an invalid value."""


class DataError(HwreproError, ValueError):
    """Bad or missing data; the message reads `path:line: what is wrong` where a line is known."""

    @classmethod
    def at(cls, path: str | os.PathLike, line: int, problem: str) -> DataError:
        """The error for `problem` at 1-based `line` of the file `path`, worded `path:line: problem`."""
        return cls(f"{os.fspath(path)}:{line}: {problem}")


class ModelError(HwreproError):
    """A workdir has no usable model: not a finished run, trained with train.keep_model=False, or its model
    files are damaged or from an incompatible hwrepro (hwrepro.harness.trained)."""


class RunFailed(Exception):
    """The run failed for a reason the user reads as is (a diverged loss, a full disk): exit code 1, one line."""


class PlatformUnavailable(HwreproError):
    """The config asks for a platform (e.g. gpu) this machine does not have; sweeps record it as skipped."""
