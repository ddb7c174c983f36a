"""The CPU-versus-GPU study's autoencoder comparison (arXiv 2109.01451) as one sweep on one machine.

    python launch.py --config=configs/sweep_autoencoder.py --workdir=runs/sweep_autoencoder

CPU set-ups: precision {fp32, bf16} x XLA ISA cap {AVX2, AVX512} x threads {1, 2}, each with 3 seeds (24 runs).
GPU set-ups (run where a GPU is present, recorded as skipped elsewhere): XLA deterministic ops on/off (the
analogue of the study's cuDNN on/off) x autotuning on/off x matmul precision default/highest, 3 seeds each.
Each run is autoencoder_mnist's 10 epochs (2,340 steps of batch 256); the 24 CPU runs fit within 40 minutes
on 2 shared cores (the sweep's time: docs/results.md).
"""

import ml_collections

from configs import autoencoder_mnist

SEEDS = [0, 1, 2]


def cpu_points():
    """bf16 is the compute dtype; parameters and Adam stay fp32 (mixed precision, as on real hardware)."""
    return [{"numerics.precision": p, "numerics.cpu_max_isa": isa, "numerics.threads": t}
            for p in ("fp32", "bf16") for isa in ("AVX2", "AVX512") for t in (1, 2)]


def gpu_points():
    return [{"numerics.platform": "gpu", "numerics.gpu_deterministic": d, "numerics.gpu_autotune": a,
             "numerics.matmul_precision": m}
            for d in (True, False) for a in (True, False) for m in ("default", "highest")]


def sweep(seeds=SEEDS):
    """The sweep fields: explicit set-ups (CPU, then GPU), each combined with every seed."""
    s = ml_collections.ConfigDict()
    s.points = cpu_points() + gpu_points()
    s.axes = {"seed": list(seeds)}
    s.aliases = {"numerics": {"cpu_max_isa": "isa", "gpu_deterministic": "deterministic",
                              "gpu_autotune": "autotune", "matmul_precision": "matmul"}}
    return s


def report(reference="precision=fp32,isa=AVX512,threads=2"):
    r = ml_collections.ConfigDict()
    r.metric = "test_loss"
    r.reference = reference   # the machine's native set-up: every other one is compared with it
    r.curve = "loss"
    r.group_over = ("seed",)
    return r


def get_config():
    c = autoencoder_mnist.get_config()
    c.name = "sweep_autoencoder"
    c.train.eval_every = 0
    c.train.log_every = 25
    c.train.checkpoints = 5
    c.train.hessian_iters = 16
    c.sweep = sweep()
    c.report = report()
    return c
