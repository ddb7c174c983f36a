"""Shared test set-up: JAX on CPU, the repository root on the path, helpers to run the launcher, and XLA with
most optimizations off where compiling is most of a test's time and the optimized code is not what it tests.

Test tiers: `pytest -m "not slow"` leaves out the tests marked slow (end-to-end runs: a launch in a subprocess,
a whole config trained; and experiment-level bit identity); plain `pytest` runs everything.
"""

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


# --- one XLA compilation cache for the session ---------------------------------------------------------------

_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def pytest_configure(config):
    """Points JAX's persistent compilation cache at a fresh folder for this session, through the environment, so
    the xdist workers and every run the tests launch (each a fresh process) share it: the same program compiled
    in another launch of the same config (a sweep's seeds, a resumed run, the many tiny runs) is read back, not
    compiled again. The cache key holds the XLA flags, the compile options (most optimizations off or on
    included), the JAX version and the devices, so a run reads only an executable XLA would have built for it
    again. Left alone when the caller set a cache; removed at the end by the process that made it."""
    if _CACHE_ENV in os.environ or hasattr(config, "workerinput"):
        return
    config._hwrepro_xla_cache = {_CACHE_ENV: tempfile.mkdtemp(prefix="hwrepro-tests-xla-cache-"),
                                 "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",  # tiny runs compile fast
                                 "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    os.environ.update(config._hwrepro_xla_cache)


def pytest_unconfigure(config):
    settings = getattr(config, "_hwrepro_xla_cache", None)
    if settings:
        shutil.rmtree(settings[_CACHE_ENV], ignore_errors=True)
        for name in settings:
            del os.environ[name]


def _launch_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def launch(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `python launch.py ARGS` as a user would; returns the finished process (text output)."""
    return subprocess.run([sys.executable, str(REPO / "launch.py"), *args], capture_output=True, text=True,
                          cwd=cwd or REPO, env=_launch_env(), timeout=timeout)


def running(pattern: str) -> bool:
    """Whether a live process's command line matches `pattern` (`pgrep -f`): e.g. a run's child process,
    "hwrepro.harness.process WORKDIR", after its launcher was stopped."""
    return subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True).returncode == 0


def launch_process(*args: str) -> subprocess.Popen:
    """`python launch.py ARGS` started and left running (text pipes), for tests that act on it meanwhile."""
    return subprocess.Popen([sys.executable, str(REPO / "launch.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=_launch_env())


@pytest.fixture
def run_launch():
    return launch


# --- XLA with most optimizations off ----------------------------------------------------------------------

DISABLE = "jax_disable_most_optimizations"
COMPILED = "/jax/core/compile/backend_compile_duration"  # the event JAX records for every XLA compile
_state = {"listening": False,  # _note_compile registered with JAX
          "unoptimized_cached": False}  # whether a cache may hold an executable compiled with DISABLE on


def _note_compile(event: str, duration: float, **kwargs) -> None:
    import jax

    if event == COMPILED and jax.config.read(DISABLE):
        _state["unoptimized_cached"] = True


def _optimizations(enabled: bool) -> None:
    """Sets DISABLE; optimizations back on clear JAX's caches if anything was compiled without them since the
    last clearing (the flag is not part of the cache keys), so no test runs unoptimized code it did not ask for."""
    import jax

    if not _state["listening"]:
        jax.monitoring.register_event_duration_secs_listener(_note_compile)
        _state["listening"] = True
    jax.config.update(DISABLE, not enabled)
    if enabled and _state["unoptimized_cached"]:
        jax.clear_caches()
        _state["unoptimized_cached"] = False


@contextlib.contextmanager
def _xla_optimizations(enabled: bool):
    import jax

    before = not jax.config.read(DISABLE)
    _optimizations(enabled)
    try:
        yield
    finally:
        _optimizations(before)


@pytest.fixture(scope="module")
def unoptimized_module():
    """Most XLA optimizations off (DISABLE, as flax's smoke tests compile) for a whole module, by
    `pytestmark = pytest.mark.usefixtures("unoptimized_module")`: for tests of what a function computes
    (against a reference, a hand-worked case, a probability), never of bits or numerics; those take
    `optimized`."""
    with _xla_optimizations(False):
        yield


@pytest.fixture
def unoptimized():
    """Most XLA optimizations off for one test (see `unoptimized_module`)."""
    with _xla_optimizations(False):
        yield


@pytest.fixture
def optimized():
    """XLA's default optimizations for one test in an `unoptimized_module` module: bit-identity, numerics and
    end-to-end tests check the code a run executes."""
    with _xla_optimizations(True):
        yield


# Seconds each module's tests took in the whole suite (`pytest --durations=0`, summed per module; 2-core AMD EPYC
# with AVX-512, 2026-12-08, 650 s in all). Only their order matters: longest first.
MODULE_SECONDS = {"test_sharded.py": 144, "test_survival.py": 94, "test_slide_experiment.py": 78,
                  "test_slide_core.py": 77, "test_sweep.py": 61, "test_lsh.py": 58, "test_prednet.py": 43,
                  "test_video_data.py": 22, "test_spine.py": 19, "test_trained.py": 15, "test_extending.py": 10,
                  "test_moving_mnist.py": 10, "test_hessian.py": 6, "test_row_adam.py": 5}


def pytest_collection_modifyitems(items):
    """The longest modules first (MODULE_SECONDS; the others after them, in collection order), so that
    pytest-xdist (README's command runs `-n 2 --dist loadfile`: each module whole on one worker) starts them
    first and no long one is left to run alone at the end. In each module, the tests that take `optimized`
    first: they compile before anything in the module is compiled unoptimized, so no cache is cleared for
    them, and the tests after them reuse what they compiled."""
    first = {}
    for item in items:
        first.setdefault(item.path, len(first))
    items.sort(key=lambda item: (-MODULE_SECONDS.get(item.path.name, 0), first[item.path],
                                 "optimized" not in item.fixturenames))
