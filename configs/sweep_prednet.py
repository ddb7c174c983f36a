"""The CPU-versus-GPU study's PredNet comparison (arXiv 2109.01451) as one sweep on one machine.

    python launch.py --config=configs/sweep_prednet.py --workdir=runs/sweep_prednet

The set-ups of configs/sweep_autoencoder.py (CPU: precision {fp32, bf16} x ISA cap {AVX2, AVX512} x threads
{1, 2}; GPU: deterministic ops x autotuning x matmul precision; 3 seeds each) on prednet_small (synthetic
bouncing squares). It compares set-ups after the same number of steps, as the study did, not converged models.
The same sweep on real data: configs/sweep_prednet_video.py, configs/sweep_prednet_moving_mnist.py.

Sized for 40 minutes on 2 shared cores (the sweep's time: docs/results.md), where the Hessian estimate takes
longer than training a point (compiling Lanczos through the ConvLSTM). So only seed 0 of each set-up estimates
the Hessian; seeds 1 and 2 keep parameter checkpoints only. The Hessian is read-only, so it changes no bits of
training, and `train.hessian_iters` is a repeat field like the seed: it does not split set-ups in the report.
"""

import ml_collections

from configs import prednet_small
from configs.sweep_autoencoder import SEEDS, cpu_points, gpu_points, report

HESSIAN_ITERS = 4


def sweep(hessian_iters=HESSIAN_ITERS):
    s = ml_collections.ConfigDict()
    s.points = [{**setup, "seed": seed, "train.hessian_iters": hessian_iters if seed == SEEDS[0] else 0}
                for setup in cpu_points() + gpu_points() for seed in SEEDS]
    s.aliases = {"numerics": {"cpu_max_isa": "isa", "gpu_deterministic": "deterministic",
                              "gpu_autotune": "autotune", "matmul_precision": "matmul"},
                 "train": {"hessian_iters": "hessian"}}
    return s


def as_sweep(c, name, hessian_iters=HESSIAN_ITERS):
    """PredNet config `c` made the sweep `name`: the set-ups x seeds above, 4 parameter checkpoints, the loss
    logged often enough for the report's divergence curves."""
    c.name = name
    c.train.log_every = 4
    c.train.checkpoints = 4
    c.train.hessian_iters = hessian_iters  # the points set it per seed; kept here for the report header
    c.sweep = sweep(hessian_iters)
    c.report = report()
    c.report.group_over = ("seed", "train.hessian_iters")
    return c


def get_config():
    c = prednet_small.get_config()
    c.train.samples_per_epoch = 768   # 1 epoch of 48 steps of batch 16 (prednet_small: 4 x 100 steps)
    c.train.num_epochs = 1
    return as_sweep(c, "sweep_prednet")
