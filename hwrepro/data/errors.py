"""The one error data loaders raise for bad input: a single line naming the file (and line) at fault."""

from hwrepro.errors import HwreproError


class DataError(HwreproError, ValueError):
    """Bad or missing data; the message reads `path:line: what is wrong` where a line is known."""
