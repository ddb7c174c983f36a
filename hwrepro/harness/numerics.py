"""Numerics controls, decided once per training process, before JAX initialises.

XLA reads XLA_FLAGS and the platform list when its backend starts, and its CPU thread pool is sized from the
process's CPU affinity at that moment; none of these can be changed afterwards. So `apply_before_jax` runs
before the first `import jax` of the training process (the runner starts a subprocess when JAX is already
imported), and `apply_after_jax` sets the few options JAX lets us change at run time. `applied()` reads back
what actually took effect, for run.json.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping

from hwrepro.errors import ConfigError, PlatformUnavailable
from hwrepro.harness import parallel

PLATFORMS = ("cpu", "gpu")
DTYPES = ("fp32", "bf16")
MATMUL_PRECISIONS = ("default", "high", "highest")
CPU_ISAS = ("", "SSE4_2", "AVX", "AVX2", "AVX512")
_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# The glibc allocator tunables behind each boolean numerics field; glibc reads them once, when a process
# starts, so the launcher starts the training process with them (`startup_environment`).
ALLOCATOR_TUNABLES = {
    # Large allocations on transparent huge pages: fewer TLB misses on random row gathers.
    "huge_pages": ("glibc.malloc.hugetlb=1",),
    # Freed memory stays in the process for reuse: no mmap for large blocks, one arena, no trimming. XLA
    # allocates a step's temporaries afresh each step, and with glibc's defaults every large one is a new
    # mmap whose pages fault in (zero-filled by the kernel) again on every step.
    "keep_freed_memory": ("glibc.malloc.mmap_max=0", "glibc.malloc.arena_max=1",
                          "glibc.malloc.trim_threshold=1099511627776"),
}
# What this process really runs with.
_STARTUP_TUNABLES = os.environ.get("GLIBC_TUNABLES", "").split(":")


def validate(n: Mapping[str, Any]) -> None:
    """Raises ConfigError naming the first numerics field with an invalid value."""
    def check(field, allowed):
        if n[field] not in allowed:
            raise ConfigError(f"numerics.{field}={n[field]!r} is not one of {', '.join(map(repr, allowed))}")
    check("platform", PLATFORMS)
    check("precision", DTYPES)
    check("param_dtype", DTYPES)
    check("matmul_precision", MATMUL_PRECISIONS)
    check("cpu_max_isa", CPU_ISAS)
    cpu_devices = n.get("cpu_devices", 0)
    if not isinstance(cpu_devices, int) or cpu_devices < 0:
        raise ConfigError(f"numerics.cpu_devices={cpu_devices!r} must be 0 (JAX's default) or a positive integer")
    available = len(os.sched_getaffinity(0))
    if not 0 <= n["threads"] <= available:
        raise ConfigError(f"numerics.threads={n['threads']} must be between 0 (all) and {available}, "
                          "the cores this process may use")


def xla_flags(n: Mapping[str, Any], inherited: str = "") -> str:
    """XLA_FLAGS for these numerics; our flags come after `inherited` so they win on conflict."""
    flags = inherited.split()
    if n["cpu_max_isa"]:
        flags.append(f"--xla_cpu_max_isa={n['cpu_max_isa']}")
    flags.append(f"--xla_cpu_enable_fast_math={str(bool(n['fast_math'])).lower()}")
    if n["threads"] == 1:
        flags.append("--xla_cpu_multi_thread_eigen=false")
    if n["platform"] == "gpu":
        flags.append(f"--xla_gpu_deterministic_ops={str(bool(n['gpu_deterministic'])).lower()}")
        if not n["gpu_autotune"]:
            flags.append("--xla_gpu_autotune_level=0")
    flags.extend(n["xla_flags"].split())
    return " ".join(flags)


def startup_environment(n: Mapping[str, Any], base: Mapping[str, str]) -> dict[str, str]:
    """`base` with what must be set before a process starts: the glibc tunables of ALLOCATOR_TUNABLES.

    A tunable the numerics manage is set only by them (a field that is off removes it); the user's others
    are kept, first.
    """
    env = dict(base)
    managed = {t.split("=")[0] for ts in ALLOCATOR_TUNABLES.values() for t in ts}
    tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and t.split("=")[0] not in managed]
    for field, ours in ALLOCATOR_TUNABLES.items():
        if n.get(field, False):
            tunables.extend(ours)
    if tunables:
        env["GLIBC_TUNABLES"] = ":".join(tunables)
    else:
        env.pop("GLIBC_TUNABLES", None)
    return env


def needs_fresh_process(n: Mapping[str, Any]) -> bool:
    """True when this process was not started with the tunables `startup_environment` sets (so the launcher
    must run the experiment in a child process for them to apply)."""
    in_effect = allocator_tunables_in_effect()
    return sys.platform == "linux" and any(n.get(field, False) and not in_effect[field] for field in in_effect)


def allocator_tunables_in_effect() -> dict[str, bool]:
    """{field: whether this process started with all of its glibc tunables} for each ALLOCATOR_TUNABLES field."""
    return {field: sys.platform == "linux" and all(t in _STARTUP_TUNABLES for t in ours)
            for field, ours in ALLOCATOR_TUNABLES.items()}


def jax_platforms(n: Mapping[str, Any]) -> str:
    """JAX_PLATFORMS for numerics.platform: JAX must be kept from falling back to another platform."""
    return "cuda" if n["platform"] == "gpu" else "cpu"


def environment(n: Mapping[str, Any], base: Mapping[str, str]) -> dict[str, str]:
    """`base` with what these numerics need before JAX starts: XLA_FLAGS, platform, thread variables, CPU
    devices (JAX_NUM_CPU_DEVICES, the environment form of jax_num_cpu_devices, read when JAX's CPU backend
    starts)."""
    env = dict(base)
    env["XLA_FLAGS"] = xla_flags(n, base.get("XLA_FLAGS", ""))
    env["JAX_PLATFORMS"] = jax_platforms(n)
    if n.get("cpu_devices", 0):
        env["JAX_NUM_CPU_DEVICES"] = str(n["cpu_devices"])
    if n["threads"]:
        for name in _THREAD_ENV:
            env[name] = str(n["threads"])
    return env


def apply_before_jax(n: Mapping[str, Any]) -> None:
    """Sets XLA_FLAGS, JAX_PLATFORMS, thread variables, CPU devices and CPU affinity in this process.

    Raises RuntimeError if JAX is already imported: the flags would silently not apply.
    """
    if "jax" in sys.modules:
        raise RuntimeError("numerics must be applied before JAX is imported; run the experiment in a subprocess")
    os.environ.update(environment(n, os.environ))
    if n["threads"]:
        os.sched_setaffinity(0, own_cores(sorted(os.sched_getaffinity(0)), n["threads"]))


def own_cores(cores: list[int], threads: int) -> list[int]:
    """The `threads` cores of `cores` this process runs on: the first ones, or process i's own slice in a
    run over several processes on one machine (hwrepro.harness.parallel), so they do not share cores."""
    where = parallel.place()
    first = (where.index * threads) % len(cores) if where else 0
    return (cores[first:] + cores[:first])[:threads]


def apply_after_jax(n: Mapping[str, Any]) -> None:
    """Sets JAX's run-time options and checks that the requested platform is really there."""
    import jax

    jax.config.update("jax_default_matmul_precision",
                      None if n["matmul_precision"] == "default" else n["matmul_precision"])
    try:
        backend = jax.default_backend()
    except (RuntimeError, AssertionError) as e:  # jax 0.10 asserts when no installed plugin serves JAX_PLATFORMS
        raise PlatformUnavailable(f"numerics.platform={n['platform']!r} is not available here "
                                  f"({str(e) or 'no backend for it is installed'})") from None
    if backend != n["platform"]:
        raise PlatformUnavailable(f"numerics.platform={n['platform']!r} but JAX runs on {backend!r}")


def jnp_dtype(name: str):
    """The jnp dtype for a numerics dtype name ('fp32' or 'bf16')."""
    import jax.numpy as jnp

    return {"fp32": jnp.float32, "bf16": jnp.bfloat16}[name]


def applied() -> dict[str, Any]:
    """What took effect in this process, read back from the OS and JAX (call after apply_after_jax)."""
    import jax

    devices = jax.devices()
    return {
        "backend": jax.default_backend(),
        "devices": [str(d) for d in devices],
        "device_count": jax.device_count(),
        "process_count": jax.process_count(),
        "device_kind": devices[0].device_kind,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "jax_platforms": os.environ.get("JAX_PLATFORMS", ""),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "thread_env": {k: os.environ[k] for k in _THREAD_ENV if k in os.environ},
        "jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
        "jax_enable_x64": bool(jax.config.jax_enable_x64),
        **allocator_tunables_in_effect(),
        "transparent_hugepage": _read_first_line("/sys/kernel/mm/transparent_hugepage/enabled"),
    }


def _read_first_line(path: str) -> str:
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return ""
