"""The errors hwrepro reports to a user as one line (launcher: `error: <message>`, non-zero exit)."""


class HwreproError(Exception):
    """Base of every error whose message is meant for the user as is (no traceback)."""


class ConfigError(HwreproError, ValueError):
    """A config field is unknown, of the wrong type, or has an invalid value."""


class PlatformUnavailable(HwreproError):
    """The config asks for a platform (e.g. gpu) this machine does not have; sweeps record it as skipped."""
