"""Defaults shared by every experiment config: seed, numerics, data, training loop.

Config files in `configs/` start from `base_config(experiment)` and add their model fields, so every
experiment has the same numerics controls and the same record-keeping fields. No JAX import here: configs
are read before numerics are applied.
"""

from __future__ import annotations

import importlib.util
import os

from collections.abc import Mapping
from typing import Any

import ml_collections


def numerics_config() -> ml_collections.ConfigDict:
    """The numerics controls (see hwrepro.harness.numerics for what each one changes and how it is applied)."""
    n = ml_collections.ConfigDict()
    n.platform = "cpu"            # cpu | gpu
    n.threads = 0                 # CPU cores the training process may use; 0 = all it is allowed now
    n.precision = "fp32"          # compute (activation) dtype: fp32 | bf16
    n.param_dtype = "fp32"        # parameter storage dtype: fp32 | bf16
    n.matmul_precision = "default"  # jax_default_matmul_precision: default | high | highest
    n.cpu_max_isa = ""            # XLA --xla_cpu_max_isa cap: "" (none) | SSE4_2 | AVX | AVX2 | AVX512
    n.fast_math = False           # XLA --xla_cpu_enable_fast_math
    n.gpu_deterministic = False   # XLA --xla_gpu_deterministic_ops (the analogue of cuDNN determinism)
    n.gpu_autotune = True         # False sets --xla_gpu_autotune_level=0
    n.xla_flags = ""              # extra raw XLA flags, appended last
    # CPU devices per process (jax_num_cpu_devices, set before JAX starts): 0 = JAX's default (one). A
    # parallel.model x parallel.data mesh on the CPU needs that many devices over all processes.
    n.cpu_devices = 0
    # Large allocations on transparent huge pages (glibc.malloc.hugetlb=1, set when the process starts, so the
    # launcher runs the experiment in a child process): fewer TLB misses on SLIDE's random row gathers
    # (docs/benchmarks.md). Changes speed only, never a bit.
    n.huge_pages = True
    # Freed memory kept in the process for reuse (glibc: no mmap for large blocks, one arena, no trimming; set
    # at process start like huge_pages): XLA's per-step temporaries are then reused instead of page-faulted
    # in afresh every step. Faster SLIDE and sampled steps and rebuilds for a little more peak memory
    # (docs/benchmarks.md; configs/dense_amazon.py turns it off). Changes speed only, never a bit.
    n.keep_freed_memory = True
    return n


def base_config(experiment: str) -> ml_collections.ConfigDict:
    """A config with the fields every experiment has; `experiment` names a module in hwrepro.experiments."""
    c = ml_collections.ConfigDict()
    c.experiment = experiment
    c.name = experiment           # used for the default workdir runs/<name>-<time>
    c.seed = 0
    c.numerics = numerics_config()

    # The device mesh (hwrepro.sparse.sharded): one field, one meaning. 1 x 1 is today's single-device run.
    c.parallel = ml_collections.ConfigDict()
    c.parallel.model = 1          # devices the output layer's rows (label ids) are split over: mesh axis "model"
    c.parallel.data = 1           # devices each batch is split over: mesh axis "data"
    c.parallel.processes = 1      # processes joined by jax.distributed (each with numerics.cpu_devices devices)

    c.data = ml_collections.ConfigDict()
    c.data.source = "auto"        # auto: real data when found under data.dir, else the synthetic stand-in
    c.data.dir = ""

    c.train = ml_collections.ConfigDict()
    c.train.batch_size = 128
    c.train.num_epochs = 1
    c.train.num_steps = 0         # > 0 overrides num_epochs
    c.train.learning_rate = 1e-3
    c.train.log_every = 50        # steps between metrics.jsonl lines
    c.train.eval_every = 0        # steps between evaluations; 0 = only at the end
    c.train.checkpoints = 0       # evenly spaced snapshots of the parameters in trajectory.npz (the study's report)
    c.train.checkpoint_every = 0  # steps between checkpoints of the whole training state (resume); 0 = none
    c.train.checkpoint_keep = 2   # checkpoints kept (the latest ones)
    c.train.hessian_iters = 0     # > 0: Lanczos iterations for Hessian extreme eigenvalues at checkpoints
    c.train.keep_model = True     # the finished run keeps its parameters in model/ (hwrepro.load, --predict)
    c.train.init_from = ""        # a finished run's workdir: start from its parameters (fine-tuning)

    c.log = ml_collections.ConfigDict()
    c.log.tensorboard = False     # also write metrics.jsonl's lines as TensorBoard events in workdir/tb/
    return c


def load_config_file(path: str | os.PathLike) -> ml_collections.ConfigDict:
    """`get_config()` of a config file read by path: what launch.py's --config gives, for scripts that do not
    take absl flags (the benchmarks)."""
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise AttributeError(f"{path} defines no get_config()")
    return module.get_config()


def dotted_fields(mapping: Any, prefix: str = "") -> dict[str, Any]:
    """{'group.field': value} of a nested config, dict or mapping, leaves only, in its iteration order."""
    out = {}
    for key, value in mapping.items():
        field = f"{prefix}{key}"
        out.update(dotted_fields(value, field + ".") if isinstance(value, (Mapping, ml_collections.ConfigDict))
                   else {field: value})
    return out
