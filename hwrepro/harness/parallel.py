"""The device mesh a run asks for (config group `parallel`), checked before anything runs, and built once JAX
has started.

    parallel.model      devices the output layer's rows are split over (mesh axis "model")
    parallel.data       devices each batch is split over (mesh axis "data")
    parallel.processes  processes joined by jax.distributed, each with numerics.cpu_devices CPU devices

1 x 1 in one process is the single-device run, unchanged. `validate` needs no JAX (the launcher calls it
before any process starts); `mesh` builds the `jax.sharding.Mesh` of shape (data, model).
"""

from __future__ import annotations

from typing import Any, Mapping

from hwrepro.errors import ConfigError

AXES = ("data", "model")


def size(config: Mapping[str, Any]) -> int:
    """Devices in the mesh: parallel.model * parallel.data (1 for a config without a `parallel` group)."""
    p = config.get("parallel")
    return 1 if p is None else p["model"] * p["data"]


def is_sharded(config: Mapping[str, Any]) -> bool:
    """True when the run uses a mesh of more than one device."""
    return size(config) > 1


def validate(config: Mapping[str, Any]) -> None:
    """One ConfigError line naming the fields when the mesh cannot be laid over the devices or the batch.

    On the CPU the device count is known before JAX starts: parallel.processes * numerics.cpu_devices (0 counts
    as JAX's default, one). Labels and candidates are the experiment's to check (hwrepro.experiments.slide).
    """
    p = config.get("parallel")
    if p is None:
        return
    for field in ("model", "data", "processes"):
        if not isinstance(p[field], int) or p[field] < 1:
            raise ConfigError(f"parallel.{field}={p[field]!r} must be a positive integer")
    if p["processes"] > 1:
        raise ConfigError(f"parallel.processes={p['processes']}: runs over several processes are not launched yet "
                          "(one process with numerics.cpu_devices devices is)")
    n = config["numerics"]
    mesh_size = p["model"] * p["data"]
    if n["platform"] == "cpu":
        per_process = n.get("cpu_devices", 0) or 1
        devices = p["processes"] * per_process
        if mesh_size != devices:
            raise ConfigError(
                f"parallel.model={p['model']} x parallel.data={p['data']} = {mesh_size} devices, but "
                f"parallel.processes={p['processes']} x numerics.cpu_devices={n.get('cpu_devices', 0)} gives "
                f"{devices} CPU device{'s' if devices > 1 else ''}; set numerics.cpu_devices="
                f"{mesh_size // p['processes'] if mesh_size % p['processes'] == 0 else '?'}")
    elif mesh_size % p["processes"]:
        raise ConfigError(f"parallel.model={p['model']} x parallel.data={p['data']} = {mesh_size} devices do not "
                          f"divide over parallel.processes={p['processes']}")
    batch = config.get("train", {}).get("batch_size")
    if batch is not None and batch % p["data"]:
        raise ConfigError(f"train.batch_size={batch} is not a multiple of parallel.data={p['data']}")
    eval_batch = config.get("eval", {}).get("batch_size") if config.get("eval") is not None else None
    if eval_batch is not None and eval_batch % p["data"]:
        raise ConfigError(f"eval.batch_size={eval_batch} is not a multiple of parallel.data={p['data']}")


def mesh(config: Mapping[str, Any]):
    """The (data, model) `jax.sharding.Mesh` over the first parallel.data * parallel.model devices.

    Devices are taken in `jax.devices()` order (process by process), model fastest: the model shards of one
    data replica are neighbours, so the per-step collectives across `model` stay within a process when they can.
    """
    import jax
    import numpy as np

    p = config["parallel"]
    count = p["model"] * p["data"]
    devices = jax.devices()
    if count > len(devices) or len(devices) % count:
        raise ConfigError(f"parallel.model={p['model']} x parallel.data={p['data']} = {count} devices do not "
                          f"divide the {len(devices)} {jax.default_backend()} devices JAX has")
    return jax.sharding.Mesh(np.asarray(devices[:count]).reshape(p["data"], p["model"]), AXES)
