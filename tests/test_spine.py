"""The user's contract: launcher, overrides, errors, run records, numerics, bitwise reproducibility."""

import gzip
import json
import struct
import sys

import numpy as np
import pytest

from hwrepro.harness import numerics
from hwrepro.harness import records
from hwrepro.harness import runner
from hwrepro.harness.config import numerics_config
from hwrepro.data import mnist
from hwrepro.errors import ConfigError, DataError
from hwrepro.harness.records import Run, WorkdirTaken

AE = "--config=configs/autoencoder_mnist.py"
TINY = ("--config.train.num_steps=30", "--config.train.log_every=10")


def tiny_autoencoder_config(**train):
    from configs import autoencoder_mnist

    c = autoencoder_mnist.get_config()
    c.train.num_steps = 30
    c.train.log_every = 10
    c.train.update(train)
    return c


# --- the launcher, as a user runs it ------------------------------------------------------------------


@pytest.mark.slow
def test_launch_writes_the_four_records(run_launch, tmp_path):
    workdir = tmp_path / "run"
    p = run_launch(AE, f"--workdir={workdir}", *TINY, "--config.train.batch_size=64")
    assert p.returncode == 0, p.stderr
    assert "final:" in p.stdout and "param_sha256:" in p.stdout
    assert "steps/s" in p.stderr and "ETA" in p.stderr
    config = json.loads((workdir / "config.json").read_text())
    assert config["train"]["batch_size"] == 64
    run = json.loads((workdir / "run.json").read_text())
    assert run["status"] == "done" and run["end_time"]
    assert "synthetic" in run["data_source"]
    assert run["numerics_applied"]["before_jax"] is True
    assert "--xla_cpu_enable_fast_math=false" in run["numerics_applied"]["xla_flags"]
    # The allocator tunables are on by default: the launcher ran the experiment in a child started with them.
    assert run["numerics_applied"]["huge_pages"] is (sys.platform == "linux")
    assert run["numerics_applied"]["keep_freed_memory"] is (sys.platform == "linux")
    assert {"jax", "jaxlib", "flax", "optax", "hwrepro"} <= set(run["versions"])
    assert run["cpu"]["model"] and run["seed"] == 0
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [10, 20, 30]
    assert all({"loss", "seconds", "examples_per_s", "epoch"} <= set(r) for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"]
    final = json.loads((workdir / "final.json").read_text())
    assert len(final["param_sha256"]) == 64 and final["test_loss"] > 0 and final["wall_seconds"] > 0 < final["peak_rss_mb"]


def test_finished_workdir_is_never_overwritten(run_launch, tmp_path):
    workdir = tmp_path / "done"
    workdir.mkdir()
    (workdir / "run.json").write_text(json.dumps({"status": "done"}))
    (workdir / "final.json").write_text('{"keep": 1}')
    p = run_launch(AE, f"--workdir={workdir}", *TINY)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and "already holds a finished run" in p.stderr
    assert json.loads((workdir / "final.json").read_text()) == {"keep": 1}


@pytest.mark.parametrize("override, expected", [
    ("--config.train.bogus=3", "--config.train.bogus: train has no field 'bogus'"),
    ("--config.train.batch_size.x=3", "train.batch_size is a int (256), not a group of fields"),
    ("--config.trian.batch_size=3", "did you mean 'train'"),
    ("--config.train.batch_size=abc", "invalid literal for int()"),
    ("--config.train.batch_size=0", "train.batch_size=0 must be positive"),
    ("--config.numerics.precision=fp16", "numerics.precision='fp16' is not one of"),
    ("--config.numerics.cpu_max_isa=AVX9", "numerics.cpu_max_isa='AVX9'"),
    ("--k=3", "--k goes with --predict=FILE, which this command does not have"),
    ("--config.seed=-1", "seed=-1 must be a non-negative integer"),
])
def test_bad_override_is_one_error_line(run_launch, tmp_path, override, expected):
    p = run_launch(AE, f"--workdir={tmp_path / 'w'}", override)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], p.stderr
    assert not (tmp_path / "w" / "run.json").exists()


@pytest.mark.parametrize("config_name, experiment", [("autoencoder_mnist", "autoencoder"),
                                                     ("prednet_small", "PredNet")])
def test_devices_or_processes_for_an_experiment_without_a_mesh_are_refused(config_name, experiment):
    """Both processes trained the whole model, unshared, and said nothing."""
    import importlib

    config = importlib.import_module(f"configs.{config_name}").get_config()
    config.parallel.processes, config.numerics.cpu_devices = 2, 1
    config.parallel.data = 2
    runner.validate(config)  # a mesh that fits the devices
    with pytest.raises(ConfigError, match=rf"^parallel.model=1, parallel.data=2, parallel.processes=2: the "
                                          rf"{experiment} runs on one device"):
        runner.experiment(config)


@pytest.mark.slow
def test_isa_cap_runs_in_its_own_process_and_is_recorded(run_launch, tmp_path):
    p = run_launch(AE, f"--workdir={tmp_path / 'avx2'}", *TINY, "--config.numerics.cpu_max_isa=AVX2",
                   "--config.numerics.threads=1", "--config.numerics.huge_pages=false")
    assert p.returncode == 0, p.stderr
    applied = json.loads((tmp_path / "avx2" / "run.json").read_text())["numerics_applied"]
    assert applied["huge_pages"] is False
    assert applied["keep_freed_memory"] is (sys.platform == "linux")
    assert "--xla_cpu_max_isa=AVX2" in applied["xla_flags"]
    assert "--xla_cpu_multi_thread_eigen=false" in applied["xla_flags"]
    assert len(applied["cpu_affinity"]) == 1


# --- in-process runs: reproducibility ------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("repro")
    a = runner.run_here(tiny_autoencoder_config(), base / "a", quiet=True)
    b = runner.run_here(tiny_autoencoder_config(), base / "b", quiet=True)
    other = tiny_autoencoder_config()
    other.seed = 1
    c = runner.run_here(other, base / "c", quiet=True)
    return a, b, c


@pytest.mark.slow
def test_same_config_and_seed_is_bit_identical(two_runs):
    a, b, c = two_runs
    assert a["param_sha256"] == b["param_sha256"]
    assert a["test_loss"] == b["test_loss"]
    assert c["param_sha256"] != a["param_sha256"]



def test_a_short_run_in_process_writes_the_four_records(unoptimized, tmp_path):
    """The fast tier's autoencoder run: test_launch_writes_the_four_records without the launch, on 512 IDX
    images instead of 70,000 synthetic ones."""
    data_dir, workdir = tmp_path / "mnist", tmp_path / "run"
    data_dir.mkdir()
    _write_mnist(data_dir, n_train=512, n_test=64, compress=False)
    config = tiny_autoencoder_config(batch_size=64)
    config.data.dir = str(data_dir)
    final = runner.run_here(config, workdir, quiet=True)
    assert json.loads((workdir / "config.json").read_text())["train"]["batch_size"] == 64
    run = json.loads((workdir / "run.json").read_text())
    assert run["status"] == "done" and run["end_time"] and "IDX" in run["data_source"]
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [10, 20, 30]
    assert all({"loss", "seconds", "examples_per_s", "epoch"} <= set(r) for r in rows)
    assert json.loads((workdir / "final.json").read_text()) == final
    assert len(final["param_sha256"]) == 64 and final["test_loss"] > 0 and final["wall_seconds"] > 0


def test_failed_run_is_recorded_as_failed(tmp_path, monkeypatch):
    from hwrepro.experiments import autoencoder

    def broken(config, rec):
        raise RuntimeError("boom")

    monkeypatch.setattr(autoencoder, "run", broken)
    with pytest.raises(RuntimeError):
        runner.run_here(tiny_autoencoder_config(), tmp_path / "f", quiet=True)
    run = json.loads((tmp_path / "f" / "run.json").read_text())
    assert run["status"].startswith("failed: RuntimeError: boom")
    assert (tmp_path / "f" / "traceback.txt").exists()
    assert not (tmp_path / "f" / "final.json").exists()


# --- records and numerics, unit level -----------------------------------------------------------------


def test_param_sha256_sees_every_bit_dtype_and_name():
    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float32)}
    h = records.param_sha256(params)
    assert h == records.param_sha256({k: v.copy() for k, v in params.items()})
    flipped = params["w"].copy()
    flipped.view(np.uint32)[0, 0] ^= 1  # one bit of one value
    assert records.param_sha256({**params, "w": flipped}) != h
    assert records.param_sha256({**params, "b": np.zeros(3, np.float64)}) != h
    assert records.param_sha256({"w": params["w"], "c": params["b"]}) != h


def test_prepare_moves_an_unfinished_run_aside(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"status": "failed: x"}))
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "predictions.png").write_bytes(b"PredNet's strip")
    prepared = Run.prepare(tmp_path, {"seed": 0})
    assert not prepared.resumes and prepared.aside.name.startswith("previous-")  # no checkpoint: a fresh start
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("previous-")]
    assert len(aside) == 1 and (aside[0] / "run.json").exists() and not (tmp_path / "run.json").exists()
    assert (aside[0] / "predictions.png").exists() and not (tmp_path / "predictions.png").exists()
    (tmp_path / "run.json").write_text(json.dumps({"status": "running"}))  # its process was killed
    (tmp_path / "metrics.jsonl").write_text('{"step": 2}\n')
    Run.prepare(tmp_path, {"seed": 0})  # most likely within the same second: a folder of its own all the same
    assert sorted((p / "metrics.jsonl").read_text() for p in tmp_path.glob("previous-*")) == ['{"step": 2}\n', "{}\n"]
    statuses = sorted(json.loads((p / "run.json").read_text())["status"] for p in tmp_path.glob("previous-*"))
    assert statuses == ["failed: x", "interrupted: its process ended without recording how (moved aside)"]
    (tmp_path / "run.json").write_text(json.dumps({"status": "done"}))
    with pytest.raises(WorkdirTaken):
        Run.prepare(tmp_path, {"seed": 0})


def test_process_1_resumes_a_run_it_finished_when_process_0_failed(tmp_path, monkeypatch):
    """Process 0 works on after the others end (the model, final.json): when that fails, process 1's record
    says done and the run's says failed. The same command resumes both (it refused: 'a finished run')."""
    from hwrepro.harness import parallel

    for folder, status in ((tmp_path, "failed: RecordWriteError: disk full"), (tmp_path / "process-1", "done")):
        folder.mkdir(exist_ok=True)
        (folder / "run.json").write_text(json.dumps({"status": status}))
        records.write_config(folder, {"seed": 0})
    (tmp_path / "checkpoints" / "40").mkdir(parents=True)
    monkeypatch.setenv(parallel.PROCESS_ENV, "1/2@127.0.0.1:1234")
    assert Run.prepare(tmp_path / "process-1", {"seed": 0}) == (True, None)
    # Under Slurm, task 1 launches its own child in process-1/: the launcher follows the run's record too.
    from hwrepro.harness import process

    class Started(Exception):
        pass

    def popen(*args, **kwargs):
        raise Started

    monkeypatch.setattr(process, "_environment", lambda config: {})
    monkeypatch.setattr(process.subprocess, "Popen", popen)
    with pytest.raises(Started):
        process.run_in_child(None, tmp_path / "process-1")
    (tmp_path / "run.json").write_text(json.dumps({"status": "done"}))  # the run is finished: still refused
    with pytest.raises(WorkdirTaken):
        Run.prepare(tmp_path / "process-1", {"seed": 0})
    with pytest.raises(WorkdirTaken):
        process.run_in_child(None, tmp_path / "process-1")


def test_xla_flags_follow_the_numerics_fields():
    n = numerics_config()
    n.update(cpu_max_isa="AVX2", fast_math=True, threads=1, xla_flags="--xla_foo=1")
    flags = numerics.xla_flags(n, inherited="--xla_user=2").split()
    assert flags[0] == "--xla_user=2" and flags[-1] == "--xla_foo=1"
    assert "--xla_cpu_max_isa=AVX2" in flags and "--xla_cpu_enable_fast_math=true" in flags
    assert "--xla_cpu_multi_thread_eigen=false" in flags
    assert not any("gpu" in f for f in flags)
    n.update(platform="gpu", gpu_deterministic=True, gpu_autotune=False)
    env = numerics.environment(n, {})
    assert env["JAX_PLATFORMS"] == "cuda" and env["OMP_NUM_THREADS"] == "1"
    assert "--xla_gpu_deterministic_ops=true" in env["XLA_FLAGS"]
    assert "--xla_gpu_autotune_level=0" in env["XLA_FLAGS"]


def test_allocator_tunables_are_start_up_settings_that_keep_the_users_others():
    n = numerics_config()
    user = "glibc.malloc.hugetlb=0:glibc.malloc.tcache_count=0:glibc.malloc.arena_max=2"
    env = numerics.startup_environment(n, {"GLIBC_TUNABLES": user})
    assert env["GLIBC_TUNABLES"].split(":") == ["glibc.malloc.tcache_count=0", "glibc.malloc.hugetlb=1",
                                                *numerics.ALLOCATOR_TUNABLES["keep_freed_memory"]]
    n.huge_pages = False
    env = numerics.startup_environment(n, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    assert env["GLIBC_TUNABLES"].split(":") == list(numerics.ALLOCATOR_TUNABLES["keep_freed_memory"])
    n.keep_freed_memory = False
    assert "GLIBC_TUNABLES" not in numerics.startup_environment(n, {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"})


def test_numerics_validation_names_the_field():
    n = numerics_config()
    n.threads = 10_000
    with pytest.raises(ConfigError, match="numerics.threads=10000"):
        numerics.validate(n)


def test_applying_numerics_after_jax_is_refused():
    import jax  # noqa: F401  (already imported by other tests; make sure)

    with pytest.raises(RuntimeError, match="before JAX is imported"):
        numerics.apply_before_jax(numerics_config())


# --- MNIST data -----------------------------------------------------------------------------------------


def _write_idx(path, array, magic, compress=False):
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    (gzip.open if compress else open)(path, "wb").write(data)


def _write_mnist(folder, n_train=12, n_test=5, compress=True):
    rng = np.random.default_rng(0)
    sfx = ".gz" if compress else ""
    for split, n in (("train", n_train), ("t10k", n_test)):
        _write_idx(folder / f"{split}-images-idx3-ubyte{sfx}", rng.integers(0, 256, (n, 28, 28)), 0x803, compress)
        _write_idx(folder / f"{split}-labels-idx1-ubyte{sfx}", rng.integers(0, 10, n), 0x801, compress)


@pytest.mark.parametrize("compress", [True, False])
def test_idx_files_load(tmp_path, compress):
    _write_mnist(tmp_path, compress=compress)
    splits = mnist.load("auto", str(tmp_path), seed=0)
    assert splits.train_images.shape == (12, 28, 28) and splits.test_labels.shape == (5,)
    assert "IDX" in splits.source and str(tmp_path) in splits.source
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(splits.train_images, rng.integers(0, 256, (12, 28, 28)).astype(np.uint8))


def test_idx_errors_name_the_file(tmp_path):
    _write_mnist(tmp_path, compress=False)
    bad = tmp_path / "train-labels-idx1-ubyte"
    _write_idx(bad, np.zeros(12), 0x803)  # images magic in a labels file
    with pytest.raises(DataError, match=f"{bad}: magic number 0x00000803, expected 0x00000801"):
        mnist.load("idx", str(tmp_path), 0)
    _write_idx(bad, np.zeros(12), 0x801)
    bad.write_bytes(bad.read_bytes()[:-3])  # truncated
    with pytest.raises(DataError, match="bytes, but dimensions"):
        mnist.load("idx", str(tmp_path), 0)
    _write_idx(bad, np.zeros(11), 0x801)
    with pytest.raises(DataError, match="11 labels for 12 images"):
        mnist.load("idx", str(tmp_path), 0)
    (tmp_path / "t10k-images-idx3-ubyte").unlink()
    with pytest.raises(DataError, match="missing t10k-images-idx3-ubyte"):
        mnist.load("idx", str(tmp_path), 0)


def test_tfds_data_source_with_mock_data():
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=7):
        splits = mnist.load_tfds(None)
    assert splits.train_images.shape == (7, 28, 28) and splits.train_images.dtype == np.uint8
    assert splits.test_labels.shape == (7,) and "TFDS" in splits.source


def test_synthetic_digits_are_deterministic_and_learnable_shapes():
    a = mnist.synthetic(3, num_train=200, num_test=50)
    b = mnist.synthetic(3, num_train=200, num_test=50)
    np.testing.assert_array_equal(a.train_images, b.train_images)
    assert "synthetic" in a.source and "not MNIST" in a.source
    assert a.train_images.dtype == np.uint8 and a.train_images.max() > 200
    # Class structure: images of one class are closer to their class mean than to other classes' means.
    x = a.train_images.reshape(200, -1).astype(np.float32)
    means = np.stack([x[a.train_labels == k].mean(0) for k in range(10)])
    nearest = np.argmin(((x[:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert (nearest == a.train_labels).mean() > 0.5
    c = mnist.synthetic(4, num_train=200, num_test=50)
    assert not np.array_equal(a.train_images, c.train_images)


def test_the_resume_hint_names_the_folder_the_command_takes(tmp_path, monkeypatch):
    from hwrepro.harness import parallel

    assert records.resume_hint(tmp_path / "run") == f"the same command with --workdir={tmp_path / 'run'} resumes it"
    (tmp_path / "sweep" / "seed=0").mkdir(parents=True)
    (tmp_path / "sweep" / "sweep.json").write_text("{}")
    assert f"--workdir={tmp_path / 'sweep'} " in records.resume_hint(tmp_path / "sweep" / "seed=0")  # a point
    monkeypatch.setenv(parallel.PROCESS_ENV, "1/2@127.0.0.1:1234")  # process 1 records in <run>/process-1
    assert f"--workdir={tmp_path / 'run'} " in records.resume_hint(tmp_path / "run" / "process-1")
