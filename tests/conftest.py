"""Shared test set-up: JAX on CPU, the repository root on the path, helpers to run the launcher, and XLA with
most optimizations off for tests where compiling is most of the time and the optimized code is not what is
tested.

Test tiers: `pytest -m "not slow"` skips the end-to-end runs (a subprocess, or a whole config trained), each
of which has a fast counterpart checking the same part; plain `pytest` runs everything.
"""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def launch(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `python launch.py ARGS` as a user would; returns the finished process (text output)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, str(REPO / "launch.py"), *args], capture_output=True, text=True,
                          cwd=cwd or REPO, env=env, timeout=timeout)


@pytest.fixture
def run_launch():
    return launch


@contextlib.contextmanager
def _xla_optimizations(enabled: bool):
    """Compiles with XLA's optimizations on or mostly off (`jax_disable_most_optimizations`, as flax's smoke
    tests do) inside the block. The flag is not part of JAX's cache keys, so the caches are cleared where an
    executable compiled under the other setting could be reused: entering an optimized block, and leaving an
    unoptimized one (no later test runs unoptimized code it did not ask for)."""
    import jax

    before = jax.config.read("jax_disable_most_optimizations")
    if before == (not enabled):
        yield
        return
    jax.config.update("jax_disable_most_optimizations", not enabled)
    if enabled:
        jax.clear_caches()
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
        if not enabled:
            jax.clear_caches()


@pytest.fixture(scope="module")
def unoptimized_module():
    """Most XLA optimizations off for a whole module (`pytestmark = pytest.mark.usefixtures(...)`): for tests
    of what a function computes (against a reference, a hand-worked case, a probability), never of bits or
    numerics; those take `optimized`."""
    with _xla_optimizations(False):
        yield


@pytest.fixture
def unoptimized():
    """Most XLA optimizations off for one test (see `unoptimized_module`)."""
    with _xla_optimizations(False):
        yield


@pytest.fixture
def optimized():
    """XLA's default optimizations for one test in an `unoptimized_module` module: bit-identity and numerics
    tests check the code a run executes."""
    with _xla_optimizations(True):
        yield
