"""hwrepro's command line: `python launch.py --config=configs/NAME.py [--workdir=DIR] [--config.a.b=value]`.

Flags only; the work happens in hwrepro.harness.launcher. JAX is not imported here, so the config's numerics
(XLA_FLAGS, threads, platform) can still take effect in this process.
"""

import ast
import difflib
import re
import sys
from pathlib import Path

import ml_collections
from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/NAME.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder (default: a fresh runs/<name>-<time>/).")
_SHARD = flags.DEFINE_string("shard", None, "For sweeps: run only shard i of n, written 'i/n'.")
_PREDICT = flags.DEFINE_string("predict", None, "Score this file's points with the model --workdir kept.")
_OUTPUT = flags.DEFINE_string("output", None, "With --predict: where the predictions go (one line a point).")
_K = flags.DEFINE_integer("k", 5, "With --predict: labels per point.")
_LSH = flags.DEFINE_bool("lsh", False, "With --predict: LSH-scored (the model's inference tables) instead of dense.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "With --predict: replace an existing --output.")
_PLATFORM = flags.DEFINE_string("platform", None, "With --predict: cpu | gpu to score on (default: the run's).")


CONFIG_DIR = Path(__file__).resolve().parent / "configs"
# The fields people change most; every field of a config can be overridden the same way.
MAIN_FIELDS = """\
  --config.seed=N                      training seed (the synthetic data keep data.seed)
  --config.train.num_steps=N           stop after N steps (0: train.num_epochs epochs)
  --config.train.num_epochs=N          epochs when num_steps is 0
  --config.train.batch_size=N          --config.train.learning_rate=X
  --config.train.eval_every=N          steps between evaluations (0: only at the end)
  --config.eval.final_points=N         SLIDE configs: final P@k on N test points (0: the whole split; the
                                       whole split is most of a short run's time)
  --config.data.dir=DIR                real data (else the synthetic stand-in, said in the log)
  --config.numerics.precision=bf16     compute dtype (fp32 | bf16); also param_dtype, matmul_precision
  --config.numerics.cpu_max_isa=AVX2   XLA CPU ISA cap (SSE4_2 | AVX | AVX2 | AVX512)
  --config.numerics.threads=N          CPU cores (0: all); numerics.platform=gpu for a GPU
  --config.model.method=sampled        SLIDE configs: lsh | sampled | dense
  --config.lsh.kind=dwta               SLIDE configs: the hash family (lsh.num_hashes, lsh.num_tables)"""


def first_sentence(path: Path) -> str:
    """The first sentence of a config file's docstring, read without running the file."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    return re.split(r"(?<=\.)\s(?=[A-Z])", paragraph, maxsplit=1)[0]


def usage() -> str:
    configs = sorted(CONFIG_DIR.glob("*.py"))
    width = max(len(p.name) for p in configs)
    lines = [f"  configs/{p.name:<{width}}  {first_sentence(p)}" for p in configs]
    return f"""usage: python launch.py --config=configs/NAME.py [--workdir=DIR] [--config.a.b=value ...] [--shard=i/n]
       python launch.py --workdir=DIR --predict=FILE --output=OUT [--k=5] [--lsh] [--overwrite] [--platform=cpu]

Runs one experiment (or a sweep) and records it in DIR (default: a fresh runs/<name>-<time>/): config.json,
run.json, metrics.jsonl, final.json with param_sha256. Exit codes: 0 done, 1 failed, 2 bad input, 3 skipped.

configs:
{chr(10).join(lines)}

main overrides (any config field works: --config.group.field=value):
{MAIN_FIELDS}

flags:
  --config=FILE      the experiment config (required)
  --workdir=DIR      the run folder; a folder holding a finished run is never overwritten
  --shard=i/n        sweeps only: run every n-th point starting at i (for a job array)
  --predict=FILE     score FILE (XC text format, labels optional, or bare 'f:v f:v' lines) with the model the
                     finished run in --workdir kept; --output=OUT gets one line a point ('id:score' best
                     first); --k=N labels, --lsh LSH-scored, --overwrite replaces OUT; P@1/3/5 when FILE has labels;
                     --platform=cpu|gpu scores there instead of on the run's numerics.platform
"""


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with one error line (not a traceback) for a bad --config.* override; --help
    prints `usage()` and exits 0."""
    if any(a in ("-h", "--help", "-help", "--helpfull", "--helpshort") for a in argv[1:]):
        print(usage())
        sys.exit(0)
    try:
        rest = flags.FLAGS(argv)
    except flags.Error as e:
        message = str(e)
    except Exception as e:  # ml_collections' error for an unknown field, or the config file failed to load
        message = explain_config_error(argv) or f"cannot load the config: {type(e).__name__}: {e}"
    else:
        if len(rest) == 1:
            return rest
        message = f"unexpected argument(s): {' '.join(rest[1:])} (flags are --name=value; see --help)"
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def explain_config_error(argv: list[str]) -> str | None:
    """One line naming what is wrong with --config=FILE or a --config.a.b=value override, or None."""
    from hwrepro.harness.config import load_config_file

    path = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if path is None:
        return None
    try:
        config = load_config_file(path)
    except AttributeError as e:
        return f"cannot load --config={path}: {e}" if "get_config" in str(e) else None
    except Exception:  # noqa: BLE001 -- the generic message says what the loader raised
        return None
    for arg in argv[1:]:
        if not arg.startswith("--config."):
            continue
        field = arg[len("--config."):].split("=", 1)[0]
        node, walked = config, []
        for part in field.split("."):
            where = ".".join(walked) or "the config"
            if not isinstance(node, ml_collections.ConfigDict):
                return f"--config.{field}: {where} is a {type(node).__name__} ({node!r}), not a group of fields"
            if part not in node:
                close = difflib.get_close_matches(part, list(node.keys()), n=1)
                return (f"--config.{field}: {where} has no field {part!r}"
                        + (f" (did you mean {close[0]!r}?)" if close else ""))
            node, walked = node[part], walked + [part]
    return None


def config_path() -> str:
    return config_flags.get_config_filename(flags.FLAGS["config"])


def main(argv):
    from hwrepro.harness import launcher, runner

    if _PREDICT.value is not None:
        if not _WORKDIR.value or not _OUTPUT.value or flags.FLAGS["config"].present:
            print("error: --predict=FILE takes --workdir=DIR (a finished run) and --output=OUT, and no --config (the "
                  "run's own is used)", file=sys.stderr)
            return 2
        try:
            return launcher.predict(_WORKDIR.value, _PREDICT.value, _OUTPUT.value, _K.value, _LSH.value,
                                    _OVERWRITE.value, argv=sys.argv, platform=_PLATFORM.value)
        except (Exception, KeyboardInterrupt) as e:
            return runner.report_error(e)
    if not flags.FLAGS["config"].present:
        print("error: --config=configs/NAME.py is required (see --help)", file=sys.stderr)
        return 2
    stray = [name for name in ("output", "k", "lsh", "overwrite", "platform") if flags.FLAGS[name].present]
    if stray:
        print(f"error: --{stray[0]} goes with --predict=FILE, which this command does not have", file=sys.stderr)
        return 2
    try:
        config = _CONFIG.value
        config.get("experiment")  # a config file that failed to load raises here
    except Exception as e:
        detail = [line.strip() for line in str(e).splitlines() if line.strip()]
        print(f"error: cannot load --config={config_path()}: {detail[-1] if detail else e}", file=sys.stderr)
        return 2
    try:
        return launcher.launch(config, _WORKDIR.value, _SHARD.value)
    except (Exception, KeyboardInterrupt) as e:
        return runner.report_error(e)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
