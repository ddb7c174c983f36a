"""The run record: what every run leaves in its workdir.

- config.json   the resolved config
- run.json      environment fingerprint, numerics applied, data source, status (running / done / failed: why)
- metrics.jsonl one JSON object per logged step
- final.json    final metrics, wall time, this process's peak RSS, param_sha256
- log.txt       the human-readable log (what was printed)
- trajectory.npz parameters at evenly spaced steps (only when train.checkpoints > 0), for the study's report
- checkpoints/  the training state every train.checkpoint_every steps (hwrepro.harness.checkpoints), for resuming
- model/        the finished run's parameters, for hwrepro.load and --predict (hwrepro.harness.trained)
- report.html   the run's report, written when it ends (hwrepro.study.report.pages)
- tb/           TensorBoard event files, with log.tensorboard (hwrepro.harness.events)
- .lock         held by the run (or sweep) that owns the folder, released by the OS when its processes end

JSON files are replaced atomically (temp file + rename), so a run killed at any moment leaves either the old
or the new file, never half of one; they are strict JSON (a non-finite number is written as null and named in
`nonfinite`). metrics.jsonl gains whole lines only. A write that fails (a full disk) leaves the previous file,
removes its temporary and raises RecordWriteError naming the path. Importing this module does not import JAX.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import hashlib
import math
import importlib.metadata
import itertools
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hwrepro.errors import DataError, HwreproError, ModelError, RunFailed
from hwrepro.harness import parallel
from hwrepro.harness.events import EVENTS_DIR, EventLog

PACKAGES = ("hwrepro", "jax", "jaxlib", "flax", "optax", "numpy", "ml-collections", "tensorflow-datasets")
_CPU_FLAGS_OF_INTEREST = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                          "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")


CONFIG_FILE = "config.json"
SWEEP_FILE = "sweep.json"  # a sweep's folder (hwrepro.study.sweep), whose points are run folders below it
RECORD_FILES = ("config.json", "run.json", "metrics.jsonl", "final.json", "log.txt", "trajectory.npz", "traceback.txt",
                "report.html", "predictions.png")  # predictions.png: PredNet's strip of next-frame predictions
CHECKPOINT_DIR = "checkpoints"
MODEL_DIR = "model"  # the finished run's model (hwrepro.harness.trained)
LOCK_FILE = ".lock"


class RecordWriteError(RunFailed):
    """A record could not be written (e.g. the disk is full); the message names the path and the OS error."""


class WorkdirTaken(HwreproError):
    """The workdir already holds a finished run (it is never overwritten), cannot be a run folder, or holds a
    checkpoint of another training state (hwrepro.harness.checkpoints)."""


class WorkdirBusy(HwreproError):
    """Another run or sweep owns the workdir now."""


def lock_workdir(workdir: Path, name: str = LOCK_FILE) -> int:
    """Creates workdir and takes its exclusive lock (the file `name` in it); returns the lock's descriptor.

    The lock lasts as long as the descriptor is open in any process (a child process inherits it), and the
    OS releases it when they all end, killed or not. WorkdirBusy if another process holds it; WorkdirTaken
    if `workdir` is a file.
    """
    workdir = Path(workdir)
    if workdir.exists() and not workdir.is_dir():
        raise WorkdirTaken(f"--workdir {workdir} is a file, not a folder")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        fd = os.open(workdir / name, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise WorkdirTaken(f"cannot use workdir {workdir}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        owner = os.read(fd, 64).decode(errors="replace").strip()
        os.close(fd)
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise WorkdirBusy(f"workdir {workdir} is in use by another run{f' (pid {owner})' if owner else ''}; "
                              "wait for it to end or choose another --workdir") from None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def write_config(workdir: Path, config: Any) -> None:
    """workdir/config.json: the resolved config (a ConfigDict or a mapping)."""
    write_json_atomic(Path(workdir) / CONFIG_FILE, config_dict(config))


def config_dict(config: Any) -> dict[str, Any]:
    """A config as plain JSON data (what config.json holds, tuples as lists), for comparing two configs."""
    d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return json.loads(json.dumps(d, default=_json_default))


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def strict_json(obj: Any) -> tuple[Any, list[str]]:
    """(obj with every non-finite float replaced by None, the dotted paths of those values)."""
    bad: list[str] = []

    def visit(x: Any, path: str) -> Any:
        if isinstance(x, dict):
            return {k: visit(v, f"{path}.{k}" if path else str(k)) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [visit(v, f"{path}[{i}]") for i, v in enumerate(x)]
        if isinstance(x, (float, np.floating)) and not math.isfinite(x):
            bad.append(path)
            return None
        return x

    return visit(json.loads(json.dumps(obj, default=_json_default)), ""), bad


def dumps(obj: Any, **kwargs: Any) -> str:
    """Strict JSON text of obj: non-finite numbers as null, their paths listed in a top-level `nonfinite`."""
    clean, bad = strict_json(obj)
    if bad and isinstance(clean, dict):
        clean["nonfinite"] = bad
    return json.dumps(clean, allow_nan=False, **kwargs)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Replaces path with obj as strict JSON; on failure the old file stays and the temporary is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(dumps(obj, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise RecordWriteError(f"cannot write {path}: {e.strerror or e}") from None


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer, np.floating, np.bool_)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def read_run_file(path: Path, *keys: str) -> Any:
    """A finished run's JSON file (config.json, final.json, model/model.json), which must hold `keys`; ModelError,
    one line naming the file, when it cannot be read or parsed or lacks one of them."""
    try:
        content = read_json(path)
    except (OSError, ValueError) as e:
        raise ModelError(f"{path} is unreadable ({e}): the run folder is damaged") from None
    missing = [k for k in keys if not isinstance(content, dict) or k not in content]
    if missing:
        raise ModelError(f"{path} has no {missing[0]!r}: the run folder is damaged")
    return content


def _stable(data: dict[str, Any]) -> dict[str, Any]:
    """run.json's data record without what varies between identical loads (seconds), as JSON reads it back."""
    details = {k: v for k, v in (data.get("data_details") or {}).items() if k != "load_seconds"}
    return {"data_source": data.get("data_source"), "data_details": json.loads(dumps(details)) or None}


def read_json_or_none(path: Path) -> Any:
    """`read_json`, or None when the file is missing or not JSON (a record a run never wrote, or cut short)."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def read_metrics(workdir: Path) -> list[dict[str, Any]]:
    """workdir/metrics.jsonl rows; [] when there is none (a truncated last line, from a killed run, is skipped)."""
    rows = []
    try:
        lines = (Path(workdir) / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def status_of(workdir: Path) -> str | None:
    """The status in workdir/run.json, or None when there is no readable record."""
    try:
        return read_json(Path(workdir) / "run.json").get("status")
    except (OSError, ValueError):
        return None


def model_folder(workdir: Path) -> Path:
    """workdir/model/ of a finished run that kept its model (hwrepro.harness.trained); ModelError, one line,
    naming why not. No JAX: the launcher checks train.init_from with it before any process imports JAX."""
    workdir = Path(workdir)
    if not (workdir / "run.json").is_file():
        raise ModelError(f"{workdir} is not a run folder (no run.json)")
    status = status_of(workdir)
    if status != "done":
        raise ModelError(f"{workdir} holds an unfinished run (status {status!r}): only a finished run keeps a model")
    if not (workdir / "final.json").is_file():
        raise ModelError(f"{workdir} holds no final.json: its model cannot be checked against param_sha256")
    folder = workdir / MODEL_DIR
    if not folder.is_dir():
        kept = read_json(workdir / CONFIG_FILE).get("train", {}).get("keep_model", True)
        why = ("it was trained with train.keep_model=False" if not kept
               else "it was written by an hwrepro that kept no models")
        raise ModelError(f"{workdir} keeps no model ({folder} is missing): {why}")
    return folder


def resume_hint(workdir: Path) -> str:
    """How to resume an interrupted run or sweep: the folder the command is given, since a command without
    --workdir starts a fresh one (launcher.default_workdir). From process i > 0's record folder, the run's;
    from a sweep's point, the sweep's."""
    workdir = parallel.run_workdir(Path(workdir))
    if (workdir.parent / SWEEP_FILE).exists():
        workdir = workdir.parent
    return f"the same command with --workdir={workdir} resumes it"


def refuse_finished(workdir: Path) -> None:
    """WorkdirTaken when workdir holds a finished run (run.json status 'done'), never overwritten, or a sweep."""
    if (Path(workdir) / SWEEP_FILE).exists():
        raise WorkdirTaken(f"workdir {workdir} holds a sweep ({SWEEP_FILE}); choose another --workdir for a run")
    if status_of(workdir) == "done":
        raise WorkdirTaken(f"workdir {workdir} already holds a finished run (run.json status 'done'); "
                           "choose another --workdir or remove it")


def record_stamp(workdir: Path) -> int | None:
    """When workdir/run.json was last written (ns), or None: tells whether a process wrote its record since."""
    try:
        return (Path(workdir) / "run.json").stat().st_mtime_ns
    except OSError:
        return None


def set_status(workdir: Path, status: str, by: str) -> None:
    """Writes `status` into workdir/run.json for a process that could not (it was killed, or crashed before
    its record was open), keeping what that process recorded; `by` names the writer."""
    path = Path(workdir) / "run.json"
    try:
        info = read_json(path)
    except (OSError, ValueError):
        info = {"name": Path(workdir).name}
    info.update(status=status, end_time=now(), status_by=by)
    write_json_atomic(path, info)


def param_sha256(params: Any) -> str:
    """SHA-256 of a parameter pytree: every leaf's path, dtype, shape and bytes, in tree order.

    Two runs with equal hashes ended with bit-identical parameters.
    """
    import jax

    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        a = np.asarray(jax.device_get(leaf))
        h.update(jax.tree_util.keystr(path).encode())
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def nonfinite_leaves(params: Any) -> list[str]:
    """The paths of the floating-point leaves of a pytree holding a NaN or an infinity."""
    import jax

    bad = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        a = np.asarray(jax.device_get(leaf))
        if jax.numpy.issubdtype(a.dtype, jax.numpy.floating) and not np.all(np.isfinite(a)):  # bfloat16 too
            bad.append(jax.tree_util.keystr(path))
    return bad


def cpu_info() -> dict[str, Any]:
    model, flags = platform.processor(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name":
                model = value.strip()
            elif key == "flags":
                have = set(value.split())
                flags = [f for f in _CPU_FLAGS_OF_INTEREST if f in have]
                break
    except OSError:
        pass
    return {"model": model, "isa_flags": flags, "logical_cores": os.cpu_count()}


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit() -> str | None:
    """The commit of the hwrepro checkout, with '+dirty' when it has uncommitted changes; None outside git."""
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


class Prepared(NamedTuple):
    """What `Run.prepare` did: `resumes` an unfinished run of the same config, or moved an earlier run's
    records `aside` (a folder; None when there were none)."""
    resumes: bool
    aside: Path | None


class Run:
    """An open run record in `workdir`; experiments log through it.

    Create it with `Run.start(...)` once numerics are applied (the fingerprint reads JAX back).
    """

    def __init__(self, workdir: Path, run_info: dict[str, Any], quiet: bool = False):
        self.workdir = Path(workdir)
        self.info = run_info
        self.quiet = quiet
        self.t0 = time.time()
        self._trajectory = read_trajectory(self.workdir)  # a resumed run keeps what it had saved
        self._metrics = os.open(self.workdir / "metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._log = open(self.workdir / "log.txt", "a", buffering=1)
        self.events: EventLog | None = None  # TensorBoard events, opened by `start` with log.tensorboard
        self.resumed_data: dict[str, Any] | None = None  # what the attempt resumed recorded of its data (`start`)

    @staticmethod
    def prepare(workdir: Path, config: Any) -> "Prepared":
        """Makes workdir ready for `config`: Prepared(resumes=True) when it resumes an unfinished run of that
        config, else where an earlier run went (None if there was none).

        A finished run is refused (WorkdirTaken). An unfinished run of the same config with a checkpoint is
        kept, to be resumed; any other unfinished run's records and checkpoints are moved aside to
        workdir/previous-<time>/, never deleted (`put_back` returns them when the new run is refused before
        its first step). The caller holds the workdir's lock (`lock_workdir`).
        """
        workdir = Path(workdir)
        # Process i > 0 follows the run's record: its own is done when it finished before process 0 failed.
        refuse_finished(parallel.run_workdir(workdir))
        try:
            same_config = read_json(workdir / CONFIG_FILE) == config_dict(config)
        except (OSError, ValueError):
            same_config = False
        if same_config and _has_checkpoint(parallel.run_workdir(workdir)):  # process i > 0: the run's
            return Prepared(True, None)
        stale = [p for p in workdir.iterdir() if p.name in RECORD_FILES + (CHECKPOINT_DIR, MODEL_DIR, EVENTS_DIR)]
        if not stale:
            return Prepared(False, None)
        aside = _fresh_folder(workdir / f"previous-{time.strftime('%Y%m%d-%H%M%S')}")
        for p in stale:
            os.replace(p, aside / p.name)
        if status_of(aside) == "running":  # we hold the lock: its process is gone without saying so
            set_status(aside, "interrupted: its process ended without recording how (moved aside)",
                       "hwrepro.harness.records")
        return Prepared(False, aside)

    @staticmethod
    def put_back(workdir: Path, aside: Path) -> None:
        """Returns what `prepare` moved to `aside` into workdir (whose new run left no record), so a run refused
        for bad input before its first step leaves the earlier one as it was, resumable."""
        for p in Path(aside).iterdir():
            os.replace(p, Path(workdir) / p.name)
        Path(aside).rmdir()

    @classmethod
    def start(cls, workdir: Path, config: Any, numerics_applied: dict[str, Any], quiet: bool = False) -> "Run":
        """Opens the record (config.json, run.json) in a workdir made ready by `prepare`."""
        workdir = Path(workdir)
        config_data = config_dict(config)
        # opened before any record is written: without tensorboardX this is a config error, and no run
        events = EventLog(workdir) if (config_data.get("log") or {}).get("tensorboard") else None
        write_config(workdir, config)
        previous = read_json_or_none(workdir / "run.json")  # the attempt this one resumes (`prepare` kept it)
        previous = previous if isinstance(previous, dict) else {}
        resumes = previous.get("resumes", -1) + 1
        info = {
            "status": "running",
            "experiment": config_data.get("experiment"),
            "name": config_data.get("name"),
            "seed": config_data.get("seed"),
            "start_time": now(),
            "end_time": None,
            "resumes": resumes,
            "data_source": None,
            "versions": package_versions(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "hostname": socket.gethostname(),
            "cpu": cpu_info(),
            "numerics_requested": config_data.get("numerics"),
            "numerics_applied": numerics_applied,
            "git_commit": git_commit(),
            "argv": sys.argv,
        }
        run = cls(workdir, info, quiet)
        run.events = events
        if previous.get("data_source") is not None:
            run.resumed_data = {k: previous.get(k) for k in ("data_source", "data_details")}
        run._write_info()
        return run

    def _write_info(self) -> None:
        write_json_atomic(self.workdir / "run.json", self.info)

    def seconds(self) -> float:
        return time.time() - self.t0

    def print(self, msg: str) -> None:
        """A line for the user: printed to stderr and kept in log.txt."""
        if not self.quiet:
            print(msg, file=sys.stderr, flush=True)
        try:
            self._log.write(msg + "\n")
        except OSError:  # a full disk: the run fails at its next record write, which names the file
            pass

    def note_data(self, source: str, **details: Any) -> None:
        """Records where the data came from (a path, or 'synthetic ...': always said plainly) and what the loader
        counted of it. A resumed run whose data are not those its earlier attempts recorded (another source, or
        other counts: points, truncation, per-point means) is refused with a DataError naming what changed: it
        would train on a mix of two data sets. (The counts are not a content hash: an edit that keeps every
        one of them goes unseen.)"""
        if self.resumed_data is not None:
            was, now = _stable(self.resumed_data), _stable({"data_source": source, "data_details": details})
            changed = [f"{key} {was[key]!r} -> {now[key]!r}" for key in was if now[key] != was[key]]
            if changed:
                raise DataError(f"the data differ from those this run was started on ({'; '.join(changed)[:300]}): "
                                f"resume it with its own data, or start afresh in another --workdir")
        self.info["data_source"] = source
        if details:
            self.info["data_details"] = details
        self._write_info()
        self.print(f"data: {source}")

    def note(self, key: str, value: Any) -> None:
        """Adds a fact to run.json (e.g. a setting an experiment derived)."""
        self.info[key] = value
        self._write_info()

    def log(self, step: int, **scalars: Any) -> None:
        """Appends one metrics.jsonl line: step, seconds since start, and the given scalars.

        The line is written whole or not at all: a failed write (full disk) is cut back off the file and
        raises RecordWriteError.
        """
        row = {"step": int(step), "seconds": round(self.seconds(), 4)}
        row.update({k: _scalar(v) for k, v in scalars.items()})
        line = (dumps(row) + "\n").encode()
        size = os.fstat(self._metrics).st_size
        try:
            if os.write(self._metrics, line) != len(line):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as e:
            os.ftruncate(self._metrics, size)
            raise RecordWriteError(f"cannot write {self.workdir / 'metrics.jsonl'}: {e.strerror or e}") from None
        if self.events is not None:
            self.events.add(row)

    def rewind(self, step: int) -> None:
        """Drops metrics.jsonl lines and trajectory entries after `step` (a resumed run redoes those steps)."""
        path = self.workdir / "metrics.jsonl"
        kept = [line for line in path.read_text().splitlines(keepends=True)
                if line.endswith("\n") and _logged_step(line) <= step]
        write_text_atomic(path, "".join(kept))
        os.close(self._metrics)
        self._metrics = os.open(path, os.O_WRONLY | os.O_APPEND)
        self._trajectory = {s: p for s, p in self._trajectory.items() if s <= step}
        if self.events is not None:
            self.events.rewind(step)

    def save_params(self, step: int, params: Any) -> None:
        """Adds a float32 copy of the flattened parameters at `step` to trajectory.npz (steps [k], params
        [k, P]), for comparing runs' paths through parameter space; the file is rewritten at once, so a
        resumed run keeps it."""
        from jax.flatten_util import ravel_pytree

        self._trajectory[int(step)] = np.asarray(ravel_pytree(params)[0], dtype=np.float32)
        steps = sorted(self._trajectory)
        path = self.workdir / "trajectory.npz"
        tmp = self.workdir / f".trajectory.tmp{os.getpid()}.npz"
        try:
            np.savez(tmp, steps=np.asarray(steps), params=np.stack([self._trajectory[s] for s in steps]))
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise RecordWriteError(f"cannot write {path}: {e.strerror or e}") from None

    def finish(self, final_metrics: dict[str, Any], params: Any) -> dict[str, Any]:
        """Writes final.json and marks the run done; RunFailed instead when a parameter is not finite (a
        diverged run whose loss stayed finite, e.g. saturated outputs)."""
        bad = nonfinite_leaves(params)
        if bad:
            raise RunFailed(f"the parameters are not finite at the end of training ({', '.join(bad[:3])})")
        final = {k: _scalar(v) for k, v in final_metrics.items()}
        final["wall_seconds"] = round(self.seconds(), 3)
        final["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # this process
        final["param_sha256"] = param_sha256(params)
        write_json_atomic(self.workdir / "final.json", final)
        self.info.update(status="done", end_time=now())
        self._write_info()
        self.close()
        return final

    def end(self, status: str) -> None:
        """Records how the run ended other than done (`failed: why`, `interrupted: why`) and closes it. Best
        effort: on a full disk run.json may keep its last state; the launcher prints the reason either way."""
        self.info.update(status=status, end_time=now())
        try:
            self._write_info()
            self._log.write(f"run {status}\n")  # the launcher prints the one error line the user sees
        except (OSError, RecordWriteError):
            pass
        self.close()

    def fail(self, why: str) -> None:
        self.end(f"failed: {why}")

    def discard(self) -> None:
        """Closes the record and removes what `start` wrote: for a fresh run refused before its first step,
        which leaves the workdir as `prepare` made it."""
        self.close()
        for name in (CONFIG_FILE, "run.json", "metrics.jsonl", "log.txt"):
            (self.workdir / name).unlink(missing_ok=True)
        shutil.rmtree(self.workdir / EVENTS_DIR, ignore_errors=True)  # with log.tensorboard: what start opened

    def close(self) -> None:
        if self._metrics is not None:
            os.close(self._metrics)
            self._metrics = None
        if self.events is not None:
            self.events.close()
            self.events = None
        try:
            self._log.close()
        except OSError:
            pass


def write_text_atomic(path: Path, text: str) -> None:
    """Replaces path with text (temp file + rename); RecordWriteError naming path on failure."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise RecordWriteError(f"cannot write {path}: {e.strerror or e}") from None


def _logged_step(line: str) -> float:
    """The step of one metrics.jsonl line (0 without one); inf for a line that does not parse, which a rewind
    drops (read_metrics skips such lines too)."""
    try:
        return json.loads(line).get("step", 0)
    except (ValueError, AttributeError):
        return math.inf


def _fresh_folder(path: Path) -> Path:
    """Creates and returns `path`, or `path-2`, `path-3`, ... when it exists: never an existing folder."""
    for i in itertools.count(1):
        candidate = path if i == 1 else path.with_name(f"{path.name}-{i}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue


def _has_checkpoint(workdir: Path) -> bool:
    """Whether workdir/checkpoints holds a finished checkpoint (a folder named by its step)."""
    folder = Path(workdir) / CHECKPOINT_DIR
    return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())


def read_trajectory(workdir: Path) -> dict[int, np.ndarray]:
    """{step: flattened float32 params [P]} from workdir/trajectory.npz ({} when there is none)."""
    try:
        with np.load(Path(workdir) / "trajectory.npz") as z:
            return {int(s): p for s, p in zip(z["steps"], z["params"])}
    except (OSError, ValueError, KeyError):
        return {}


def _scalar(v: Any) -> Any:
    """A JSON-friendly version of a metric value (0-d arrays to Python numbers, never rounded: sweeps
    compare runs bit for bit)."""
    if hasattr(v, "shape") and getattr(v, "shape", None) == ():
        v = v.item() if hasattr(v, "item") else float(v)
    if isinstance(v, (np.integer, np.floating)):
        v = v.item()
    return v
