"""The device mesh a run asks for (config group `parallel`), checked before anything runs, and built once JAX
has started.

    parallel.model      devices the output layer's rows are split over (mesh axis "model")
    parallel.data       devices each batch is split over (mesh axis "data")
    parallel.processes  processes joined by jax.distributed, each with numerics.cpu_devices CPU devices

1 x 1 in one process is the single-device run, unchanged. `validate` needs no JAX (the launcher calls it
before any process starts); `mesh` builds the `jax.sharding.Mesh` of shape (data, model).

Several processes: on one machine the launcher starts parallel.processes local ones
(hwrepro.harness.process.run_processes) and tells each its place in HWREPRO_PROCESS ("i/N@127.0.0.1:PORT");
under Slurm or Open MPI (`cluster()`) each task of the allocation is one process, placed by JAX's own
environment detection ("i/N@auto"). `initialize` joins them with jax.distributed before JAX's backend starts
(CPU collectives over gloo). `put_batch` and `to_host` move arrays between a process's host memory and the
mesh, which then spans devices this process cannot read.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from hwrepro.errors import ConfigError

AXES = ("data", "model")
PROCESS_ENV = "HWREPRO_PROCESS"
# A peer that stops answering ends the others after this long (JAX's coordination service heartbeat).
HEARTBEAT_SECONDS = 10
JOIN_SECONDS = 120


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


# --------------------------------------------------------------------------------------------- processes


def require_one_device(config: Mapping[str, Any], experiment: str) -> None:
    """ConfigError naming the parallel fields when they ask an experiment that has no mesh (it would train the
    whole model in every process, unshared) for devices or processes."""
    p = config.get("parallel")
    if p is not None and (p["model"], p["data"], p["processes"]) != (1, 1, 1):
        raise ConfigError(f"parallel.model={p['model']}, parallel.data={p['data']}, parallel.processes="
                          f"{p['processes']}: the {experiment} runs on one device in one process (SLIDE's output "
                          "layer is what splits over devices)")


class Place(NamedTuple):
    """This process's place in a multi-process run: index, count, coordinator ("HOST:PORT", or "auto" for
    JAX's cluster detection)."""
    index: int
    count: int
    coordinator: str

    def env(self) -> str:
        return f"{self.index}/{self.count}@{self.coordinator}"


def place() -> Place | None:
    """This process's Place from HWREPRO_PROCESS (set by the launcher), None in a one-process run."""
    value = os.environ.get(PROCESS_ENV)
    if not value:
        return None
    where, coordinator = value.split("@", 1)
    index, count = where.split("/")
    return Place(int(index), int(count), coordinator)


def cluster() -> Place | None:
    """This task's Place in a Slurm or Open MPI allocation of more than one task (then JAX finds the
    coordinator itself), else None."""
    for rank, size in (("SLURM_PROCID", "SLURM_NTASKS"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if int(os.environ.get(size, "1")) > 1 and rank in os.environ:
            return Place(int(os.environ[rank]), int(os.environ[size]), "auto")
    return None


def local_coordinator() -> str:
    """"127.0.0.1:PORT" with a port free now: where the processes of a run on this machine meet."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def own_gpus(index: int, per_process: int) -> str:
    """CUDA_VISIBLE_DEVICES for process `index` of a run on one machine with `per_process` GPUs each."""
    return ",".join(str(g) for g in range(index * per_process, (index + 1) * per_process))


def initialize() -> None:
    """Joins this process to the others of its run with jax.distributed (before JAX's backend starts); does
    nothing in a one-process run. A peer that dies ends this process within about HEARTBEAT_SECONDS."""
    where = place()
    if where is None:
        return
    import jax

    # JAX's preemption service installs a SIGTERM handler of its own in place of interrupts.catch_signals's:
    # SIGTERM (Slurm's preemption, the launcher's death) would then be ignored, not checkpointed.
    jax.config.update("jax_enable_preemption_service", False)
    timeouts = dict(initialization_timeout=JOIN_SECONDS, heartbeat_timeout_seconds=HEARTBEAT_SECONDS)
    if where.coordinator == "auto":
        jax.distributed.initialize(**timeouts)
    else:  # a run on this machine: the coordinator listens on loopback only
        jax.distributed.initialize(coordinator_address=where.coordinator, num_processes=where.count,
                                   process_id=where.index, coordinator_bind_address=where.coordinator, **timeouts)


def is_main_process() -> bool:
    """Whether this is process 0 of its run (always, in a one-process run): the one that writes the run's
    shared outputs (its model; process i > 0 keeps its own record in process-<i>/)."""
    where = place()
    return where is None or where.index == 0


def run_workdir(workdir: Path) -> Path:
    """The run's own workdir seen from this process's record folder: workdir itself, or for process i > 0
    (which records in <run workdir>/process-<i>/) its parent. Where the run's checkpoints are."""
    return Path(workdir) if is_main_process() else Path(workdir).parent


def describe(mesh) -> dict[str, Any]:
    """What run.json records of a mesh: its shape, the processes and devices, the CPU collectives."""
    import jax

    return {"mesh": dict(mesh.shape), "process_count": jax.process_count(), "process_index": jax.process_index(),
            "devices": [f"{d} (process {d.process_index})" for d in mesh.devices.flat],
            "cpu_collectives": jax.config.jax_cpu_collectives_implementation if jax.process_count() > 1 else None}


def put_batch(mesh, batch: Any) -> Any:
    """A host batch (a pytree of arrays [B, ...], the same in every process) as global arrays split over
    `data`: each process copies only the rows its own devices hold."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    sharding = NamedSharding(mesh, PartitionSpec("data"))
    return jax.tree_util.tree_map(
        lambda x: jax.make_array_from_callback(x.shape, sharding, lambda index: x[index]), batch)


def merge_over_processes(parts: dict[str, Any]) -> dict[str, Any]:
    """Host arrays [B, ...] of 4-byte dtypes that each process filled in part, zeros elsewhere (every element
    set by at most one process), merged into the whole in every process: how processes that each hold a share
    of a data set assemble a batch. One all-gather of their bits packed into one uint32 [B, total] array; the
    sum of the bit patterns is the one process's value exactly (the one-process batch bit for bit)."""
    import numpy as np
    from jax.experimental import multihost_utils

    names = list(parts)
    rows = len(parts[names[0]])
    packed = np.concatenate([parts[k].reshape(rows, -1).view(np.uint32) for k in names], axis=1)
    merged = np.asarray(multihost_utils.process_allgather(packed)).sum(axis=0, dtype=np.uint32)
    widths = np.cumsum([0] + [parts[k].reshape(rows, -1).shape[1] for k in names])
    return {k: merged[:, widths[i]:widths[i + 1]].copy().view(parts[k].dtype).reshape(parts[k].shape)
            for i, k in enumerate(names)}


def each_process(values: Any) -> Any:
    """Every process's `values` (a NumPy array of a 4- or 8-byte dtype, the same shape in each), stacked into
    [process_count, ...] in every process: a collective when the run has several processes. The values travel
    as their bits (uint32 words), so int64 counts arrive exact without JAX's 64-bit mode."""
    import jax
    import numpy as np

    values = np.ascontiguousarray(values)
    if jax.process_count() == 1:
        return values[None]
    from jax.experimental import multihost_utils

    words = np.asarray(multihost_utils.process_allgather(values.reshape(-1).view(np.uint32)))
    return words.view(values.dtype).reshape((-1,) + values.shape)


def to_host(x: Any) -> Any:
    """A (possibly multi-process) array as a NumPy array in this process, gathered from the others if need be."""
    import jax
    import numpy as np

    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)
