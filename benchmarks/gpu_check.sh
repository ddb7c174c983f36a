#!/usr/bin/env bash
# The GPU measurements as one script for a short GPU lease (about BENCH_SECONDS + SWEEP_SECONDS, 8 minutes
# by default, plus the machine's start), run from the repository root:
#   bash benchmarks/gpu_check.sh OUTDIR
# 1. the SLIDE step benchmark on the GPU (dense, sampled, LSH at Amazon-670K shape, fp32 and bf16);
# 2. on a machine with 2 or more GPUs, the sharded SLIDE step (benchmarks/shard_bench.py: one GPU, 2 GPUs
#    by label, 2 GPUs by batch, 2 GPUs in 2 processes joined by jax.distributed), SHARD_SECONDS at most;
# 3. configs/sweep_autoencoder_gpu.py (the GPU half of the CPU-versus-GPU autoencoder sweep), cut at
#    SWEEP_SECONDS and resumable by running the same command again.
# Logs, versions and the sweep folder (a .tgz cut into 15 MB parts: cat them, untar, and rebuild its report
# anywhere with python -m hwrepro.study.report) go to OUTDIR. Without hwrepro installed, the repository root is put
# on PYTHONPATH.
set -u -o pipefail
out=${1:?usage: bash benchmarks/gpu_check.sh OUTDIR}
mkdir -p "$out"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
# One process at a time uses the GPU: taking memory as needed changes no numerics and starts each faster.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python=${PYTHON:-python3}
workdir=${WORKDIR:-runs/sweep_autoencoder_gpu}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >"$out/machine.txt" 2>&1
"$python" - >>"$out/machine.txt" 2>&1 <<'EOF'
import platform, jax, flax, optax, numpy
print("python", platform.python_version(), "jax", jax.__version__, "flax", flax.__version__,
      "optax", optax.__version__, "numpy", numpy.__version__, "devices", jax.devices())
EOF
cat "$out/machine.txt"

echo "== slide_bench --quick --platform=gpu ($(date -u +%H:%M:%S))"
timeout "${BENCH_SECONDS:-180}" "$python" benchmarks/slide_bench.py --quick --platform=gpu 2>&1 \
  | tee "$out/slide_bench_gpu.txt"

if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then  # the sharded step on 2 GPUs, in one process and in two
  echo "== shard_bench --platform=gpu ($(date -u +%H:%M:%S))"
  timeout "${SHARD_SECONDS:-240}" "$python" benchmarks/shard_bench.py --platform=gpu \
    --meshes 1x1,1x2,2x1,1x2/2 --steps 20 2>&1 | tee "$out/shard_bench_gpu.txt"
fi

echo "== sweep_autoencoder_gpu ($(date -u +%H:%M:%S))"
timeout -s TERM "${SWEEP_SECONDS:-300}" "$python" launch.py --config=configs/sweep_autoencoder_gpu.py \
  --workdir="$workdir" 2>&1 | tee "$out/sweep_autoencoder_gpu.txt"
"$python" -m hwrepro.study.report "$workdir" >/dev/null 2>&1  # a sweep cut by the time limit wrote no report yet
tar czf - "$workdir" | split -b 15m -d - "$out/sweep_autoencoder_gpu.tgz."
echo "== done ($(date -u +%H:%M:%S))"
