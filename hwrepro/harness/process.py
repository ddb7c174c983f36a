"""The one process boundary: a run in a fresh Python process, with its own XLA_FLAGS and start-up settings.

XLA reads its flags once and glibc its tunables when a process starts, so a run whose numerics this process
can no longer apply (JAX already imported, allocator tunables not set at start-up), and every point of a
sweep, runs in a child:

    parent: locks the workdir  ->  python -m hwrepro.harness.process WORKDIR   (the config in HWREPRO_CONFIG)
    child:  checks the config, Run.prepare, config.json, runs it (hwrepro.harness.runner.run_here), exits
            with the run's code

The config crosses the boundary once, as JSON in the child's environment; the child checks it (the
experiment's own checks import JAX) before it touches the workdir, so a refused config leaves an unfinished
run there as it was, to be resumed by the corrected command. The two live and die together: the
child inherits the workdir's lock (released only when both have ended); SIGINT, SIGTERM and SIGHUP to the
parent are passed on to the child, which checkpoints and records itself as interrupted; a child whose parent
dies (even by SIGKILL) gets SIGTERM (Linux's parent-death signal) and does the same. The child runs in its
own process group, so a terminal's Ctrl-C reaches it once, through the parent. No JAX in the parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import ml_collections

from hwrepro.errors import ConfigError, HwreproError, RunFailed
from hwrepro.harness import interrupts, numerics, parallel, records, runner

_PARENT_ENV = "HWREPRO_PARENT_PID"
_CONFIG_ENV = "HWREPRO_CONFIG"


def run_in_child(config: ml_collections.ConfigDict, workdir: Path, stdout=None, stderr=None,
                 banner: str = "") -> int:
    """Runs `config` (validated by the caller) in a fresh process in `workdir`; returns its exit code.

    banner: written to stdout (a file) once the workdir is this run's, before the child starts: a busy or
    finished workdir's output is left as it was.
    Raises WorkdirBusy / WorkdirTaken before any process starts when another run owns the workdir or it
    holds a finished run, and Interrupted (already reported by the child) after passing on a signal.
    """
    workdir = Path(workdir)
    lock = records.lock_workdir(workdir)
    try:
        records.refuse_finished(parallel.run_workdir(workdir))  # a Slurm task i > 0: the run's own record
        if banner:
            stdout.write(banner)
            stdout.flush()
        stamp = records.record_stamp(workdir)
        child = subprocess.Popen(_command(workdir), env=_environment(config), stdout=stdout, stderr=stderr,
                                 pass_fds=(lock,), process_group=0)
        with _forwarding_signals(child) as forwarded:
            code = child.wait()
        # Only a record the child opened (an earlier run's stays as it was until the child's Run.prepare).
        if code < 0 and records.record_stamp(workdir) != stamp and records.status_of(workdir) == "running":
            records.set_status(workdir, f"failed: killed by {signal.Signals(-code).name} before it could record "
                                        f"how it ended ({records.resume_hint(workdir)} from its last checkpoint)",
                               "hwrepro.harness.process")
        if forwarded:
            raise interrupts.Interrupted(forwarded[0], reported=True)
        return code
    finally:
        os.close(lock)


def run_processes(config: ml_collections.ConfigDict, workdir: Path) -> int:
    """Runs `config` over parallel.processes local processes joined by jax.distributed on a free loopback port;
    returns the run's exit code.

    Process 0 is the run: its record is workdir's own (config.json, run.json, metrics.jsonl, final.json).
    Process i > 0 keeps its record in workdir/process-<i>/, and every process's output goes to
    workdir/process-<i>/output.txt (process 0's is shown here too). When one process ends without success the
    others are stopped (after GRACE_SECONDS, SIGTERM, then SIGKILL after STOP_SECONDS) and run.json says which
    one and why, unless process 0 failed by itself and said so.
    """
    workdir = Path(workdir)
    count = config.parallel.processes
    coordinator = parallel.local_coordinator()
    env = _environment(config)
    lock = records.lock_workdir(workdir)
    try:
        records.refuse_finished(workdir)
        stamp = records.record_stamp(workdir)
        with contextlib.ExitStack() as outputs:
            children = []
            for i in range(count):
                own = workdir / f"process-{i}"  # its output; process i > 0 also keeps its record there
                own.mkdir(exist_ok=True)
                folder = workdir if i == 0 else own
                output = outputs.enter_context(open(own / "output.txt", "ab"))
                children.append(subprocess.Popen(
                    _command(folder), pass_fds=(lock,),
                    env=dict(env, **{parallel.PROCESS_ENV: parallel.Place(i, count, coordinator).env()},
                             **_gpus_of(config, i)),
                    stdout=subprocess.PIPE if i == 0 else output, stderr=subprocess.STDOUT, process_group=0))
                if i == 0:
                    shown = threading.Thread(target=_tee, args=(children[0].stdout, output), daemon=True)
                    shown.start()
            with _forwarding_signals(*children) as forwarded:
                codes, first, stopped = _wait_all(children, forwarded)
            shown.join(timeout=5)
    finally:
        os.close(lock)
    if first is None:
        return runner.EXIT_DONE
    opened = records.record_stamp(workdir) != stamp  # process 0 opened its record (run.json) in this run
    if forwarded:
        if codes[0] < 0 and opened and records.status_of(workdir) == "running":
            records.set_status(workdir, f"interrupted: {forwarded[0]}, then process 0 {exit_reason(codes[0])} "
                                        f"({records.resume_hint(workdir)} from its last checkpoint)",
                               "hwrepro.harness.process")
        raise interrupts.Interrupted(forwarded[0], reported=True)
    if all(code == runner.EXIT_SKIPPED for code in codes):  # the platform is missing: each process said so
        return runner.EXIT_SKIPPED
    if first != 0 or codes[0] < 0:  # else process 0 failed first, and recorded and printed why
        what = (f"process {first} of {count} {exit_reason(codes[first])} (its output: "
                f"{workdir / f'process-{first}' / 'output.txt'})")
        own = (records.status_of(workdir) if opened else None) or "done"  # done: nothing of process 0's to correct
        if own != "done":  # the cause first; process 0's own reason after it if it gave one (a lost peer, say)
            stopped_too = 0 in stopped or codes[0] < 0 or own == "running"
            after = ("; the others were stopped" if stopped else "") if stopped_too else f"; then process 0 {own}"
            records.set_status(workdir, f"failed: {what}{after}", "hwrepro.harness.process")
        print(f"error: {what}" + ("; the others were stopped" if stopped else ""), file=sys.stderr)
    return runner.EXIT_BAD_INPUT if runner.EXIT_BAD_INPUT in codes else runner.EXIT_FAILED


GRACE_SECONDS = 2  # after one process fails, for the others to fail by themselves (and say why)
STOP_SECONDS = 10  # after SIGTERM, for them to checkpoint and record before SIGKILL


def _command(folder: Path) -> list[str]:
    return [sys.executable, "-m", "hwrepro.harness.process", str(folder)]


def _environment(config: ml_collections.ConfigDict) -> dict[str, str]:
    """A child's environment: the start-up settings of its numerics (it applies the others itself, before its
    JAX), this checkout on its path, this process as its parent, the config."""
    env = numerics.startup_environment(config.numerics, os.environ)
    env["PYTHONPATH"] = _python_path(env)
    env[_PARENT_ENV] = str(os.getpid())
    env[_CONFIG_ENV] = json.dumps(records.config_dict(config))
    return env


def _gpus_of(config: ml_collections.ConfigDict, index: int) -> dict[str, str]:
    """On a GPU machine, process `index`'s share of the GPUs (CUDA_VISIBLE_DEVICES), unless the user chose."""
    if config.numerics.platform != "gpu" or "CUDA_VISIBLE_DEVICES" in os.environ:
        return {}
    per = config.parallel.model * config.parallel.data // config.parallel.processes
    return {"CUDA_VISIBLE_DEVICES": parallel.own_gpus(index, per)}


def _wait_all(children: list[subprocess.Popen],
              forwarded: Sequence[str] = ()) -> tuple[list[int], int | None, set[int]]:
    """Waits for every child. Once one ends with a non-zero code, the others have GRACE_SECONDS to end by
    themselves (they often fail together, e.g. on a nan loss, and each records its own reason), then get
    SIGTERM, and SIGKILL after STOP_SECONDS; not after a signal was `forwarded` to them all: they are
    checkpointing to stop, and a second signal would cut that short. Returns the exit codes, the index of the
    first child to fail (None if none did) and the indices of those stopped."""
    first, failed_at, stopped = None, 0.0, set()
    while None in [child.poll() for child in children]:  # every child polled, each time
        if first is None:
            first = next((i for i, c in enumerate(children) if c.returncode not in (None, 0)), None)
            failed_at = time.monotonic()
        elif not forwarded:  # (a forwarded signal is stopping them already)
            since = time.monotonic() - failed_at
            if not stopped and since > GRACE_SECONDS:
                stopped = {i for i, child in enumerate(children) if child.poll() is None}
                for i in stopped:
                    children[i].terminate()
            elif stopped and since > GRACE_SECONDS + STOP_SECONDS:
                for child in children:
                    if child.poll() is None:
                        child.kill()
        time.sleep(0.05)
    codes = [child.returncode for child in children]
    if first is None:
        first = next((i for i, code in enumerate(codes) if code != 0), None)
    return codes, first, stopped


def exit_reason(code: int) -> str:
    """How a child ended, for a message: 'was killed by SIGKILL' or 'exited with code 2'."""
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"


def _tee(source, copy) -> None:
    """Copies a child's output to this process's stdout and to `copy` until it ends. A closed stdout (`| head`)
    ends the showing, not the draining: a child blocked on a full pipe would hang the run."""
    shown = True
    for chunk in iter(lambda: os.read(source.fileno(), 65536), b""):
        if shown:
            try:
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
            except (BrokenPipeError, ValueError):  # ValueError: stdout was closed
                shown = False
        copy.write(chunk)
        copy.flush()


def _python_path(env) -> str:
    """env's PYTHONPATH with this checkout's root first, so a child imports the same hwrepro."""
    return os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")]))


@contextlib.contextmanager
def _forwarding_signals(*children: subprocess.Popen) -> Iterator[list[str]]:
    """While the children run, SIGINT / SIGTERM / SIGHUP to this process are sent on to them; yields the names
    of those forwarded (a second one reaches them too, and they then stop at once)."""
    forwarded: list[str] = []

    def forward(signum: int, frame) -> None:
        forwarded.append(signal.Signals(signum).name)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    try:
        previous = {s: signal.signal(s, forward) for s in interrupts.SIGNALS}
    except ValueError:  # not the main thread: nothing to forward from here
        previous = {}
    try:
        yield forwarded
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def die_with_parent() -> None:
    """Asks Linux for SIGTERM when the launching process dies (then interrupts.catch_signals takes over);
    exits if it died already."""
    parent = os.environ.get(_PARENT_ENV)
    if sys.platform != "linux" or not parent:
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != int(parent):
        sys.exit(runner.EXIT_FAILED)


def rerun(argv: Sequence[str], env: dict[str, str]) -> int:
    """This command (`argv`, sys.argv) again in a fresh Python process started with `env` (start-up settings
    such as glibc's tunables), tied to this one as a run's child is: SIGINT / SIGTERM / SIGHUP passed on, and
    SIGTERM to it when this process dies, if it calls `die_with_parent`. Returns its exit code; EXIT_FAILED
    after one line when a signal killed it."""
    child = subprocess.Popen([sys.executable, *argv], env=dict(env, **{_PARENT_ENV: str(os.getpid())}),
                             process_group=0)
    with _forwarding_signals(child):
        code = child.wait()
    if code < 0:
        print(f"error: the process {exit_reason(code)}", file=sys.stderr, flush=True)
        return runner.EXIT_FAILED
    return code


def check_in_child(configs: dict[str, ml_collections.ConfigDict]) -> None:
    """Runs every experiment's own checks (`validate`) on {name: config} in a child process, so the caller
    never imports JAX; ConfigError with the child's one line, naming the first config that fails."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({name: records.config_dict(c) for name, c in configs.items()}, f)
    try:
        env = dict(os.environ, PYTHONPATH=_python_path(os.environ))
        p = subprocess.run([sys.executable, "-m", "hwrepro.harness.process", "--check", f.name], env=env,
                           capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if p.returncode != runner.EXIT_DONE:
        lines = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
        if p.returncode == runner.EXIT_BAD_INPUT and lines:
            raise ConfigError(lines[-1][len("error: "):])
        sys.stderr.write(p.stderr)  # not a refusal but a crash (a bug): its traceback, then one line
        raise RunFailed(f"checking the configs crashed (exit code {p.returncode}; its output is above)")


def _check(path: str) -> int:
    for name, data in records.read_json(Path(path)).items():
        config = ml_collections.ConfigDict(data)
        try:
            runner.validate(config)
            runner.experiment(config)
        except HwreproError as e:
            print(f"error: {name}: {e}", file=sys.stderr)
            return runner.EXIT_BAD_INPUT
    return runner.EXIT_DONE


def main(argv: list[str] | None = None) -> int:
    """The child's side: `python -m hwrepro.harness.process WORKDIR` (or `--check FILE`, see check_in_child)."""
    die_with_parent()
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--check":
        return _check(argv[1])
    if len(argv) != 1 or _CONFIG_ENV not in os.environ:
        print(f"usage: python -m hwrepro.harness.process WORKDIR, with the run's config in {_CONFIG_ENV} and "
              "WORKDIR locked by the launching process (hwrepro.harness.process.run_in_child)", file=sys.stderr)
        return runner.EXIT_BAD_INPUT
    workdir = Path(argv[0])
    config = ml_collections.ConfigDict(json.loads(os.environ.pop(_CONFIG_ENV)))
    sys.stdout, sys.stderr = _Unbroken(sys.stdout), _Unbroken(sys.stderr)  # a run outlives its launcher's pipe
    try:
        final = runner.run_here(config, workdir, locked=True)
    except (Exception, KeyboardInterrupt) as e:  # the run record holds the status and traceback
        code = runner.report_error(e)
        if parallel.place() is not None:
            # JAX's exit handler would wait up to 300 s at a shutdown barrier for peers that may be stuck in a
            # collective this process left: the record is written, so end now and let the launcher stop them.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    runner.print_final(final)
    return runner.EXIT_DONE


class _Unbroken:
    """A child's stdout or stderr that drops what it cannot write once its reader (the launcher) is gone,
    where print would raise BrokenPipeError and fail the run; the run's log.txt keeps its lines."""

    def __init__(self, stream: Any):
        self._stream, self._reader_gone = stream, False

    def _try(self, call: Callable[[], Any], default: Any) -> Any:
        if not self._reader_gone:
            try:
                return call()
            except BrokenPipeError:
                self._reader_gone = True
        return default

    def write(self, text: str) -> int:
        return self._try(lambda: self._stream.write(text), len(text))

    def flush(self) -> None:
        self._try(self._stream.flush, None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


if __name__ == "__main__":
    sys.exit(main())
