"""The run record: what every run leaves in its workdir.

- config.json   the resolved config
- run.json      environment fingerprint, numerics applied, data source, status (running / done / failed: why)
- metrics.jsonl one JSON object per logged step
- final.json    final metrics, wall time, param_sha256
- log.txt       the human-readable log (what was printed)
- trajectory.npz parameters at checkpoints (only when train.checkpoints > 0)

JSON files are replaced atomically (temp file + rename), so a run killed at any moment leaves either the old
or the new file, never half of one. Importing this module does not import JAX.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from hwrepro.errors import HwreproError

PACKAGES = ("hwrepro", "jax", "jaxlib", "flax", "optax", "numpy", "ml-collections", "tensorflow-datasets")
_CPU_FLAGS_OF_INTEREST = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                          "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")


CONFIG_FILE = "config.json"


def write_config(workdir: Path, config: Any) -> None:
    """workdir/config.json: the resolved config (a ConfigDict or a mapping)."""
    write_json_atomic(Path(workdir) / CONFIG_FILE, config.to_dict() if hasattr(config, "to_dict") else dict(config))


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")
    os.replace(tmp, path)


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


class WorkdirTaken(HwreproError):
    """The workdir already holds a finished run; it is never overwritten."""


class Run:
    """An open run record in `workdir`; experiments log through it.

    Create it with `Run.start(...)` once numerics are applied (the fingerprint reads JAX back).
    """

    def __init__(self, workdir: Path, run_info: dict[str, Any], quiet: bool = False):
        self.workdir = Path(workdir)
        self.info = run_info
        self.quiet = quiet
        self.t0 = time.time()
        self._trajectory: dict[int, np.ndarray] = {}
        self._metrics = open(self.workdir / "metrics.jsonl", "a", buffering=1)
        self._log = open(self.workdir / "log.txt", "a", buffering=1)

    @staticmethod
    def prepare(workdir: Path) -> Path:
        """Creates workdir, refusing one that holds a finished run. Stale records of an unfinished run are
        moved aside to workdir/previous-<time>/ rather than deleted."""
        workdir = Path(workdir)
        status = status_of(workdir)
        if status == "done":
            raise WorkdirTaken(f"workdir {workdir} already holds a finished run (run.json status 'done'); "
                               "choose another --workdir or remove it")
        workdir.mkdir(parents=True, exist_ok=True)
        stale = [p for p in workdir.iterdir()
                 if p.name in ("config.json", "run.json", "metrics.jsonl", "final.json", "log.txt")]
        if stale:
            aside = workdir / f"previous-{time.strftime('%Y%m%d-%H%M%S')}"
            aside.mkdir()
            for p in stale:
                os.replace(p, aside / p.name)
        return workdir

    @classmethod
    def start(cls, workdir: Path, config: Any, numerics_applied: dict[str, Any], quiet: bool = False,
              write_config: bool = True) -> "Run":
        """Opens the record; `write_config` False when the launcher wrote config.json already."""
        workdir = Path(workdir)
        config_dict = config.to_dict() if hasattr(config, "to_dict") else dict(config)
        if write_config:
            write_json_atomic(workdir / CONFIG_FILE, config_dict)
        info = {
            "status": "running",
            "experiment": config_dict.get("experiment"),
            "name": config_dict.get("name"),
            "seed": config_dict.get("seed"),
            "start_time": now(),
            "end_time": None,
            "data_source": None,
            "versions": package_versions(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "hostname": socket.gethostname(),
            "cpu": cpu_info(),
            "numerics_requested": config_dict.get("numerics"),
            "numerics_applied": numerics_applied,
            "git_commit": git_commit(),
            "argv": sys.argv,
        }
        run = cls(workdir, info, quiet)
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
        self._log.write(msg + "\n")

    def note_data(self, source: str, **details: Any) -> None:
        """Records where the data came from (a path, or 'synthetic ...': always said plainly)."""
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
        """Appends one metrics.jsonl line: step, seconds since start, and the given scalars."""
        row = {"step": int(step), "seconds": round(self.seconds(), 4)}
        row.update({k: _scalar(v) for k, v in scalars.items()})
        self._metrics.write(json.dumps(row, default=_json_default) + "\n")

    def save_params(self, step: int, params: Any) -> None:
        """Keeps a float32 copy of the flattened parameters at `step`; written to trajectory.npz (steps
        [k], params [k, P]) when the run finishes, for comparing runs' paths through parameter space."""
        from jax.flatten_util import ravel_pytree

        self._trajectory[int(step)] = np.asarray(ravel_pytree(params)[0], dtype=np.float32)

    def _write_trajectory(self) -> None:
        if not self._trajectory:
            return
        steps = sorted(self._trajectory)
        tmp = self.workdir / f".trajectory.tmp{os.getpid()}.npz"
        np.savez(tmp, steps=np.asarray(steps), params=np.stack([self._trajectory[s] for s in steps]))
        os.replace(tmp, self.workdir / "trajectory.npz")

    def finish(self, final_metrics: dict[str, Any], params: Any) -> dict[str, Any]:
        self._write_trajectory()
        final = {k: _scalar(v) for k, v in final_metrics.items()}
        final["wall_seconds"] = round(self.seconds(), 3)
        final["param_sha256"] = param_sha256(params)
        write_json_atomic(self.workdir / "final.json", final)
        self.info.update(status="done", end_time=now())
        self._write_info()
        self.close()
        return final

    def fail(self, why: str) -> None:
        self.info.update(status=f"failed: {why}", end_time=now())
        self._write_info()
        self._log.write(f"run failed: {why}\n")  # the launcher prints the one error line the user sees
        self.close()

    def close(self) -> None:
        self._metrics.close()
        self._log.close()


def _scalar(v: Any) -> Any:
    """A JSON-friendly version of a metric value (0-d arrays to Python numbers, never rounded: sweeps
    compare runs bit for bit)."""
    if hasattr(v, "shape") and getattr(v, "shape", None) == ():
        v = v.item() if hasattr(v, "item") else float(v)
    if isinstance(v, (np.integer, np.floating)):
        v = v.item()
    return v
