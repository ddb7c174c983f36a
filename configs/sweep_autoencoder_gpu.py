"""The GPU half of configs/sweep_autoencoder.py, sized for a short GPU lease.

    python launch.py --config=configs/sweep_autoencoder_gpu.py --workdir=runs/sweep_autoencoder_gpu

The same training (autoencoder_mnist, 10 epochs, 3 seeds, Hessian checkpoints) at the CPU sweep's reference
set-up (fp32, ISA cap AVX512, 2 threads) on the GPU machine's own CPU, then the sweep's 8 GPU set-ups. The
CPU reference runs on the same machine and JAX version as the GPU points, so the report compares hardware,
not installations. Autotuned set-ups come first: a sweep stopped by a time limit has the set-ups a user
would run by default, and a rerun of the same command resumes it.
"""

from configs import sweep_autoencoder

REFERENCE = {"numerics.precision": "fp32", "numerics.cpu_max_isa": "AVX512", "numerics.threads": 2}


def get_config():
    c = sweep_autoencoder.get_config()
    c.name = "sweep_autoencoder_gpu"
    gpu = sorted(sweep_autoencoder.gpu_points(), key=lambda p: not p["numerics.gpu_autotune"])
    c.sweep.points = [REFERENCE] + gpu
    return c
