"""PredNet training speed on this machine: compile time and training frames/s, per config and precision.

    JAX_PLATFORMS=cpu python benchmarks/prednet_bench.py --config=small --precision=fp32 --steps=20
    JAX_PLATFORMS=cpu python benchmarks/prednet_bench.py --config=kitti --precision=bf16 --steps=3

One JSON line per run. Compile time is lowering + compiling the jitted training step (forward, backward and
Adam update); frames/s counts every frame of every clip in a step (batch x nt) over `steps` timed steps
after one warm-up step, on random clips (data loading excluded). The time loop is unrolled as in training.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from hwrepro.harness.config import load_config_file
from hwrepro.experiments import prednet as experiment
from hwrepro.models.predictive_coding import layer_loss_weights, param_count, time_loss_weights

CONFIGS = {"small": "prednet_small", "kitti": "prednet_kitti"}


def bench(name: str, precision: str, steps: int) -> dict:
    config = load_config_file(Path(__file__).resolve().parent.parent / "configs" / f"{CONFIGS[name]}.py")
    config.numerics.precision = precision
    d, t = config.data, config.train
    state = experiment.create_state(config, jax.random.key(0), num_steps=1000)
    frames = jnp.asarray(np.random.default_rng(0).uniform(size=(t.batch_size, d.nt, *d.image_size, d.channels)),
                         jnp.float32)
    lw = jnp.asarray(layer_loss_weights(config.model.layer_loss_weights, len(config.model.stack_sizes)))
    tw = jnp.asarray(time_loss_weights(d.nt))
    start = time.perf_counter()
    step = experiment.train_step.lower(state, frames, lw, tw).compile()
    compile_s = time.perf_counter() - start
    state, metrics = step(state, frames, lw, tw)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, frames, lw, tw)
    jax.block_until_ready(metrics)
    seconds = (time.perf_counter() - start) / steps
    return {"config": name, "precision": precision, "params": param_count(state.params),
            "batch": t.batch_size, "nt": d.nt, "image": list(d.image_size), "compile_s": round(compile_s, 2),
            "step_s": round(seconds, 4), "frames_per_s": round(t.batch_size * d.nt / seconds, 1),
            "loss": float(metrics["loss"]), "backend": jax.default_backend(), "devices": len(jax.devices())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    print(json.dumps(bench(args.config, args.precision, args.steps)), flush=True)


if __name__ == "__main__":
    main()
