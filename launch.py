"""hwrepro's command line: `python launch.py --config=configs/NAME.py [--workdir=DIR] [--config.a.b=value]`.

Flags only; the work happens in hwrepro.runner. JAX is not imported here, so the config's numerics
(XLA_FLAGS, threads, platform) can still take effect in this process.
"""

import re
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/NAME.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder (default: a fresh runs/<name>-<time>/).")
_SHARD = flags.DEFINE_string("shard", None, "For sweeps: run only shard i of n, written 'i/n'.")
flags.mark_flags_as_required(["config"])


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with one error line (not a traceback) for a bad --config.* override."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        message = str(e)
    except (AttributeError, KeyError) as e:
        # ml_collections raises these for an override naming a field the config does not have.
        text = str(e).replace("\\", "")
        names = re.findall(r"'(\w+)'", text)
        missing = names[0] if names else "?"
        hint = re.search(r'Did you mean "(\w+)"', text)
        culprits = [a.split("=")[0] for a in argv[1:] if a.startswith("--config.")
                    and missing in a.split("=")[0].split(".")]
        message = (f"{culprits[0] if culprits else 'a --config override'}: the config has no field {missing!r}"
                   + (f" (did you mean {hint.group(1)!r}?)" if hint else ""))
    except Exception as e:  # the config file itself failed to load (syntax error, bad import, ...)
        message = f"cannot load the config: {type(e).__name__}: {e}"
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def config_path() -> str:
    return config_flags.get_config_filename(flags.FLAGS["config"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from hwrepro import runner

    try:
        config = _CONFIG.value
        config.get("experiment")  # a config file that failed to load raises here
    except Exception as e:
        detail = [line.strip() for line in str(e).splitlines() if line.strip()]
        print(f"error: cannot load --config={config_path()}: {detail[-1] if detail else e}", file=sys.stderr)
        return 2
    try:
        return runner.launch(config, _WORKDIR.value, _SHARD.value)
    except (Exception, KeyboardInterrupt) as e:
        return runner.report_error(e)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
