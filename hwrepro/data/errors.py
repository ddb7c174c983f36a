"""The one error data loaders raise for bad input: a single line naming the file (and line) at fault."""

from __future__ import annotations

import os

from hwrepro.errors import HwreproError


class DataError(HwreproError, ValueError):
    """Bad or missing data; the message reads `path:line: what is wrong` where a line is known."""

    @classmethod
    def at(cls, path: str | os.PathLike, line: int, problem: str) -> DataError:
        """The error for `problem` at 1-based `line` of the file `path`, worded `path:line: problem`."""
        return cls(f"{os.fspath(path)}:{line}: {problem}")
