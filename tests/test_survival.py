"""Runs that survive: one owner per workdir, signals that stop what they started, resume to the same bits,
divergence and disk errors recorded, bad data directories refused. End-to-end cases use the launcher as a
user would (subprocesses) and carry the slow mark."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import launch, launch_process as start, running
from hwrepro.data import xc
from hwrepro.errors import ConfigError, DataError, RunFailed
from hwrepro.harness import interrupts, records, runner
from hwrepro.harness.loop import fit
from hwrepro.harness.records import Run

AE = "--config=configs/autoencoder_mnist.py"
LONG = ["--config.train.num_steps=8000", "--config.train.checkpoint_every=500", "--config.train.eval_every=0",
        "--config.train.log_every=250"]
SHORT = ["--config.train.num_steps=3000", "--config.train.checkpoint_every=500", "--config.train.eval_every=0",
         "--config.train.log_every=250"]


def wait_for(condition, timeout: float = 60.0) -> None:
    end = time.time() + timeout
    while not condition():
        assert time.time() < end, "timed out"
        time.sleep(0.1)


def checkpoint_steps(workdir: Path) -> list[int]:
    folder = workdir / records.CHECKPOINT_DIR
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def child_alive(workdir: Path) -> bool:
    return running(f"hwrepro.harness.process {workdir}")


def sha(workdir: Path) -> str:
    return json.loads((workdir / "final.json").read_text())["param_sha256"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run of the SHORT autoencoder config, through the launcher."""
    workdir = tmp_path_factory.mktemp("ref") / "run"
    p = launch(AE, *SHORT, f"--workdir={workdir}")
    assert p.returncode == 0, p.stderr
    return sha(workdir)


# --- one owner per workdir ----------------------------------------------------------------------------------


def test_lock_refuses_a_second_owner_until_the_first_ends(tmp_path):
    fd = records.lock_workdir(tmp_path)
    with pytest.raises(records.WorkdirBusy, match=f"in use by another run \\(pid {os.getpid()}\\)"):
        records.lock_workdir(tmp_path)
    os.close(fd)
    os.close(records.lock_workdir(tmp_path))  # released with its descriptor
    (tmp_path / "file").write_text("x")
    with pytest.raises(records.WorkdirTaken, match="is a file"):
        records.lock_workdir(tmp_path / "file")


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_the_child_and_a_rerun_resumes_to_the_same_bits(tmp_path, reference):
    workdir = tmp_path / "run"
    first = start(AE, *SHORT, f"--workdir={workdir}")
    wait_for(lambda: checkpoint_steps(workdir))
    second = launch(AE, *SHORT, f"--workdir={workdir}")  # a second run into the busy folder stops at once
    assert second.returncode == 2 and second.stderr.strip().startswith("error: workdir") \
        and "in use by another run" in second.stderr and len(second.stderr.strip().splitlines()) == 1
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 1 and err.strip().splitlines()[-1].startswith("error: interrupted by SIGTERM at step")
    assert not child_alive(workdir)
    status = json.loads((workdir / "run.json").read_text())["status"]
    assert status.startswith("interrupted: SIGTERM at step") and "checkpoint saved" in status
    kept = sorted(p.name for p in workdir.iterdir())
    typo = launch(AE, *SHORT, "--config.model.encoder_sizes=(0,)", f"--workdir={workdir}")  # refused by the experiment
    assert typo.returncode == 2 and typo.stderr.strip() == (
        "error: model.encoder_sizes=[0] must be a non-empty list of positive integers")
    assert sorted(p.name for p in workdir.iterdir()) == kept  # nothing moved aside: the resume below finds it
    again = launch(AE, *SHORT, f"--workdir={workdir}")  # the same command resumes
    assert again.returncode == 0, again.stderr
    run = json.loads((workdir / "run.json").read_text())
    assert run["status"] == "done" and run["resumed_from_step"] > 0 and run["resumes"] == 1
    assert not (workdir / records.CHECKPOINT_DIR).exists()  # only kept while the run can be resumed
    assert sha(workdir) == reference  # the same run, never interrupted
    steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 3000  # no step logged twice after the resume


@pytest.mark.slow
def test_sigkill_of_the_launcher_ends_its_child_and_sigkill_of_the_run_resumes_to_the_same_bits(tmp_path, reference):
    workdir = tmp_path / "run"
    first = start(AE, *LONG, f"--workdir={workdir}")
    wait_for(lambda: checkpoint_steps(workdir))
    first.kill()  # SIGKILL: the launcher cannot pass anything on; the child gets its parent-death signal
    first.wait()
    wait_for(lambda: not child_alive(workdir), timeout=30)
    assert json.loads((workdir / "run.json").read_text())["status"].startswith("interrupted: SIGTERM")
    # SIGKILL of the training process itself, mid-run: the rerun resumes from the last complete checkpoint.
    killed = tmp_path / "killed"
    run = start(AE, *SHORT, f"--workdir={killed}")
    wait_for(lambda: checkpoint_steps(killed))
    subprocess.run(["pkill", "-KILL", "-f", f"hwrepro.harness.process {killed}"])
    _, err = run.communicate(timeout=60)
    assert run.returncode == 1 and "killed by SIGKILL" in err
    assert json.loads((killed / "run.json").read_text())["status"].startswith("failed: killed by SIGKILL")
    again = launch(AE, *SHORT, f"--workdir={killed}")
    assert again.returncode == 0, again.stderr
    assert sha(killed) == reference


@pytest.mark.slow
def test_two_sweeps_into_one_folder_train_each_point_once(tmp_path):
    sweep = tmp_path / "sweep.py"
    sweep.write_text("from configs.autoencoder_mnist import get_config as base\n"
                     "import ml_collections\n"
                     "def get_config():\n"
                     "    c = base()\n"
                     "    c.train.num_steps = 300\n"
                     "    c.sweep = ml_collections.ConfigDict({'axes': {'seed': [0, 1]}})\n"
                     "    return c\n")
    a, b = (start(f"--config={sweep}", f"--workdir={tmp_path / 'out'}") for _ in range(2))
    codes = sorted(p.wait(timeout=300) for p in (a, b))
    errors = [p.stderr.read() for p in (a, b)]
    assert codes == [0, 2] and any("in use by another run" in e for e in errors), errors
    for point in ("seed=0", "seed=1"):
        assert (tmp_path / "out" / point / "output.txt").read_text().count("attempt started") == 1


# --- resume inside the loop, divergence ---------------------------------------------------------------------


def toy_step(state, batch):
    loss = np.float32(np.nan) if state["w"] > 25 else np.float32(1.0)
    return {"w": state["w"] + 1.0}, {"loss": loss}


def test_a_nan_loss_fails_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    import jax.numpy as jnp

    rec = Run.start(tmp_path, {"name": "toy"}, {}, quiet=True)
    state = {"w": jnp.float32(0.0)}
    batches = iter(range(10**6))
    with pytest.raises(RunFailed, match=r"loss is nan at step 30 \(the checkpoint at step 20 is kept\)"):
        fit(state, toy_step, batches, num_steps=100, examples_per_step=1, rec=rec, log_every=10,
            checkpoint_every=10, checkpoint_keep=2)
    assert checkpoint_steps(tmp_path) == [10, 20]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [10, 20]


def test_fit_resumes_from_its_last_checkpoint_with_the_same_result(tmp_path):
    import jax.numpy as jnp

    def step(state, batch):
        return {"w": state["w"] * 1.5 + batch}, {"loss": jnp.float32(batch)}

    def run(workdir, num_steps):
        workdir.mkdir(exist_ok=True)
        rec = Run.start(workdir, {"name": "toy"}, {}, quiet=True)
        host = {"seen": 0}
        out = fit({"w": jnp.float32(1.0)}, step, iter(range(1, 10**6)), num_steps=num_steps, examples_per_step=1,
                  rec=rec, log_every=5, checkpoint_every=10, host=host)
        rec.close()
        return out, host

    whole, _ = run(tmp_path / "whole", 40)
    run(tmp_path / "cut", 25)  # "interrupted" after 25 steps: checkpoints at 10 and 20
    resumed, host = run(tmp_path / "cut", 40)
    assert float(resumed["w"]) == float(whole["w"]) and host["train_seconds"] > 0
    rows = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [5, 10, 15, 20, 25, 30, 35, 40]  # 25 rewritten once, from step 20
    assert json.loads((tmp_path / "cut" / "run.json").read_text())["resumed_from_step"] == 20


def test_a_checkpoint_of_another_state_is_refused_in_one_line_and_kept(tmp_path):
    import jax
    import jax.numpy as jnp

    from hwrepro.harness.records import WorkdirTaken

    def step(state, batch):
        return jax.tree_util.tree_map(lambda x: x + 1, state), {"loss": jnp.float32(batch)}

    def run(state, num_steps):
        rec = Run.start(tmp_path, {"name": "toy"}, {}, quiet=True)
        return fit(state, step, iter(range(1, 10**6)), num_steps=num_steps, examples_per_step=1, rec=rec,
                   log_every=5, checkpoint_every=10)

    run({"w": jnp.zeros(3)}, 15)  # "interrupted": a checkpoint at step 10
    for state, why in [({"w": jnp.zeros(3), "codes": jnp.zeros(2, jnp.int32)}, "1 arrays, where the run has 2"),
                       ({"w": jnp.zeros(4)}, "array 0 is float32 [3], where the run's is float32 [4]")]:
        with pytest.raises(WorkdirTaken, match=re.escape(f"does not fit this run's training state ({why})")):
            run(state, 30)
    assert checkpoint_steps(tmp_path) == [10]
    assert float(run({"w": jnp.zeros(3)}, 30)["w"][0]) == 30  # the right state still resumes from it


def test_a_float_array_is_restored_in_the_float_type_it_was_saved_in(tmp_path):
    """SimHash's dtype "auto" draws bf16 hyperplanes on one CPU and fp32 on another: a run resumed on the
    other keeps its own (it was refused as 'written by other code'); other differences are still refused."""
    import jax.numpy as jnp

    from hwrepro.harness.checkpoints import Checkpoints
    from hwrepro.harness.records import WorkdirTaken

    ckpt = Checkpoints(tmp_path / "checkpoints")
    ckpt.save(10, {"planes": jnp.full(3, 0.5, jnp.bfloat16), "ids": jnp.arange(2)}, {})
    ckpt.close()
    ckpt = Checkpoints(tmp_path / "checkpoints")
    try:
        state, _ = ckpt.restore(10, {"planes": jnp.zeros(3, jnp.float32), "ids": jnp.zeros(2, jnp.int32)})
        assert state["planes"].dtype == jnp.bfloat16 and float(state["planes"][0]) == 0.5
        with pytest.raises(WorkdirTaken, match="array 0 is int32 \\[2\\], where the run's is float32 \\[2\\]"):
            ckpt.restore(10, {"planes": jnp.zeros(3), "ids": jnp.zeros(2, jnp.float32)})
    finally:
        ckpt.close()


def test_a_resume_drops_metrics_lines_after_its_step_and_lines_that_do_not_parse(tmp_path):
    rec = Run.start(tmp_path, {"name": "toy"}, {}, quiet=True)
    for step in (5, 10, 15):
        rec.log(step, loss=1.0)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write("{not json}\n")
    rec.rewind(10)
    rec.log(15, loss=2.0)
    rec.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(5, 1.0), (10, 1.0), (15, 2.0)]


def test_a_signal_in_the_loop_checkpoints_then_interrupts(tmp_path):
    import jax.numpy as jnp

    def step(state, batch):
        if batch == 7:
            os.kill(os.getpid(), signal.SIGTERM)
        return {"w": state["w"] + 1.0}, {"loss": jnp.float32(1.0)}

    rec = Run.start(tmp_path, {"name": "toy"}, {}, quiet=True)
    with interrupts.catch_signals(), pytest.raises(interrupts.Interrupted) as e:
        fit({"w": jnp.float32(0.0)}, step, iter(range(1, 100)), num_steps=50, examples_per_step=1, rec=rec,
            log_every=20, checkpoint_every=20)
    assert e.value.status == (f"interrupted: SIGTERM at step 7 of 50; checkpoint saved, the same command with "
                              f"--workdir={tmp_path} resumes it")
    assert checkpoint_steps(tmp_path) == [7]


def test_a_signal_during_the_last_steps_evaluation_checkpoints_then_interrupts_and_resumes(tmp_path):
    import jax.numpy as jnp

    def step(state, batch):
        return {"w": state["w"] + 1.0}, {"loss": jnp.float32(1.0)}

    def evaluate(state):  # the signal comes after the loop read its pending signals for the last step
        if float(state["w"]) == 10 and not evaluated:
            os.kill(os.getpid(), signal.SIGTERM)
        evaluated.append(float(state["w"]))
        return {"w": float(state["w"])}

    def run():
        rec = Run.start(tmp_path, {"name": "toy"}, {}, quiet=True)
        return fit({"w": jnp.float32(0.0)}, step, iter(range(1, 100)), num_steps=10, examples_per_step=1,
                   rec=rec, log_every=5, checkpoint_every=20, eval_fn=evaluate)

    evaluated = []
    with interrupts.catch_signals(), pytest.raises(interrupts.Interrupted, match="SIGTERM at step 10 of 10"):
        run()
    assert checkpoint_steps(tmp_path) == [10]
    with interrupts.catch_signals():
        assert float(run()["w"]) == 10  # resumed at the end: no step again


def test_the_same_signal_twice_at_once_is_one_request_and_a_later_one_stops_at_once(monkeypatch):
    monkeypatch.setattr(interrupts, "DUPLICATE_SECONDS", 0.3)
    reached = []
    with interrupts.catch_signals(), pytest.raises(interrupts.Interrupted, match="SIGTERM"):
        with interrupts.at_step_boundary():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # a duplicate: still deferred to the step boundary
            reached.append(interrupts.pending())
            time.sleep(0.4)
            os.kill(os.getpid(), signal.SIGTERM)  # a second request: raised here, at once
            reached.append("after")
    assert reached == ["SIGTERM"]


def test_a_signal_the_loop_never_acted_on_raises_when_it_ends():
    with interrupts.catch_signals(), pytest.raises(interrupts.Interrupted, match="SIGHUP"):
        with interrupts.at_step_boundary():
            os.kill(os.getpid(), signal.SIGHUP)
            assert interrupts.pending() == "SIGHUP"  # deferred, not raised, inside
    assert interrupts.pending() is None


def test_evaluations_run_every_eval_every_steps_whatever_log_every_is(tmp_path):
    import jax.numpy as jnp

    rec = Run.start(tmp_path, {"name": "toy"}, {}, quiet=True)
    fit({"w": jnp.float32(0.0)}, lambda s, b: ({"w": s["w"] + 1.0}, {"loss": jnp.float32(1.0)}),
        iter(range(1, 100)), num_steps=10, examples_per_step=1, rec=rec, log_every=5, eval_every=3,
        eval_fn=lambda s: {"w": float(s["w"])})
    rec.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("eval_w")) for r in rows] == [(3, 3.0), (5, None), (6, 6.0), (9, 9.0), (10, 10.0)]


def test_logged_lines_hold_window_means_epochs_rates_and_running_totals_across_a_resume(tmp_path):
    """The numbers a hardware study reads: the loss of a line is the mean over its window, examples/s is the
    window's examples over its own training seconds, train_seconds keeps counting through a resume, and the
    checkpoints kept are the last `checkpoint_keep`."""
    import jax.numpy as jnp

    def run(num_steps):
        rec = Run.start(tmp_path, {"name": "toy"}, {}, quiet=True)
        fit({"w": jnp.float32(0.0)}, lambda s, b: ({"w": s["w"] + 1.0}, {"loss": jnp.float32(b)}),
            iter(range(1, 100)), num_steps=num_steps, examples_per_step=4, rec=rec, log_every=5,
            steps_per_epoch=10, checkpoint_every=5, checkpoint_keep=2)
        rec.close()

    run(12)  # "interrupted" after step 12: checkpoints at 5 and 10
    assert checkpoint_steps(tmp_path) == [5, 10]
    run(22)  # resumes at 10
    assert checkpoint_steps(tmp_path) == [15, 20]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"], r["epoch"]) for r in rows] == [
        (5, 3.0, 0.5), (10, 8.0, 1.0), (15, 13.0, 1.5), (20, 18.0, 2.0), (22, 21.5, 2.2)]
    seconds = [0.0] + [r["train_seconds"] for r in rows]
    assert all(b > a for a, b in zip(seconds, seconds[1:]))  # no restart from 0 at the resume
    for r, before, steps in zip(rows, seconds, (5, 5, 5, 5, 2)):
        assert r["examples_per_s"] * (r["train_seconds"] - before) == pytest.approx(4 * steps, rel=1e-6)


def test_the_last_step_is_always_snapshotted_and_a_rewind_keeps_its_own_step(tmp_path):
    import jax.numpy as jnp

    rec = Run.start(tmp_path, {"name": "toy"}, {}, quiet=True)
    snapshots = []
    fit({"w": jnp.float32(0.0)}, lambda s, b: ({"w": s["w"] + 1.0}, {"loss": jnp.float32(1.0)}),
        iter(range(1, 100)), num_steps=10, examples_per_step=1, rec=rec, log_every=100, snapshot_every=3,
        snapshot_fn=lambda step, state: rec.save_params(step, state) or snapshots.append(step) or {})
    assert snapshots == [3, 6, 9, 10]
    rec.rewind(9)  # a resume from a checkpoint at step 9 keeps the snapshot taken there
    rec.save_params(10, {"w": jnp.float32(10.0)})
    rec.close()
    assert sorted(records.read_trajectory(tmp_path)) == [3, 6, 9, 10]


def test_bfloat16_parameters_are_checked_for_non_finite_values():
    import jax.numpy as jnp

    params = {"w": jnp.array([1.0, float("nan")], jnp.bfloat16), "b": jnp.ones(2, jnp.bfloat16),
              "ids": jnp.array([1, 2])}
    assert records.nonfinite_leaves(params) == ["['w']"]


# --- records ------------------------------------------------------------------------------------------------


def test_records_are_strict_json_with_non_finite_values_named(tmp_path):
    records.write_json_atomic(tmp_path / "f.json", {"loss": float("nan"), "x": [1.0, float("inf")], "ok": 2})

    def refuse(constant):
        raise ValueError(constant)

    data = json.loads((tmp_path / "f.json").read_text(), parse_constant=refuse)
    assert data == {"loss": None, "x": [1.0, None], "ok": 2, "nonfinite": ["loss", "x[1]"]}


@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs (root only); skips where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mount
    subprocess.run(["umount", "-l", str(mount)])


def test_a_full_disk_fails_the_run_naming_the_file_and_leaves_no_partial_files(small_disk):
    from configs.autoencoder_mnist import get_config

    config = get_config()
    config.train.num_steps, config.train.checkpoints, config.train.log_every = 60, 6, 10
    with pytest.raises(RunFailed, match=r"cannot write .*trajectory.npz: No space left on device"):
        runner.run_here(config, small_disk / "run", quiet=True)
    workdir = small_disk / "run"
    status = json.loads((workdir / "run.json").read_text())["status"]
    assert status.startswith("failed: cannot write") and "No space left on device" in status
    assert not [p.name for p in workdir.iterdir() if ".tmp" in p.name]
    assert (workdir / "metrics.jsonl").read_text().endswith("\n")


def test_a_metrics_line_that_does_not_fit_is_cut_back_off(small_disk):
    rec = Run.start(small_disk, {"name": "toy"}, {}, quiet=True)
    rec.log(1, loss=1.0)
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    (small_disk / "filler").write_bytes(b"x" * (free - 16))
    with pytest.raises(records.RecordWriteError, match="metrics.jsonl: No space left on device"):
        rec.log(2, loss=1.0, padding="y" * 8192)
    lines = (small_disk / "metrics.jsonl").read_text()
    assert lines.endswith("\n") and [json.loads(line)["step"] for line in lines.splitlines()] == [1]


# --- data ---------------------------------------------------------------------------------------------------


def tiny_slide(**data):
    from configs.slide_amazon import slide_config

    c = slide_config("tiny", "sampled")
    c.model.hidden, c.model.num_candidates = 16, 64
    c.train.num_steps, c.data.max_features, c.data.max_labels = 5, 16, 4
    c.data.update(data)
    return c


def write_xc_pair(folder: Path, test_labels: int = 300) -> None:
    train, test = xc.synthetic("tiny", num_train=200, num_test=50, seed=0)
    folder.mkdir(parents=True, exist_ok=True)
    xc.write_xc(folder / "train.txt", train)
    xc.write_xc(folder / "test.txt", test)
    if test_labels != 300:
        text = (folder / "test.txt").read_text().split("\n", 1)
        (folder / "test.txt").write_text(text[0].rsplit(" ", 1)[0] + f" {test_labels}\n" + text[1])


@pytest.mark.parametrize("layout, message", [
    ("missing", "no such folder"),
    ("gz_only", r"no tiny train/test text files .* found: train.txt.gz"),
    ("no_test", r"no tiny train/test text files .* found: train.txt"),
    ("header", r"test.txt:1: header gives 2000 features and 301 labels, but .*train.txt gives 2000 and 300"),
])
def test_a_data_dir_that_holds_no_usable_data_set_is_an_error(tmp_path, layout, message):
    folder = tmp_path / "xc"
    if layout == "gz_only":
        folder.mkdir()
        (folder / "train.txt.gz").write_bytes(b"")
    elif layout == "no_test":
        write_xc_pair(folder)
        (folder / "test.txt").unlink()
    elif layout == "header":
        write_xc_pair(folder, test_labels=301)
    with pytest.raises(DataError, match=message):
        runner.run_here(tiny_slide(dir=str(folder)), tmp_path / "w", quiet=True)


@pytest.mark.parametrize("stop", ["data.dir typo", "tensorboard without tensorboardX", "Ctrl-C while loading"])
def test_a_rerun_that_ends_before_its_first_step_puts_the_unfinished_run_back(tmp_path, monkeypatch, stop):
    """A rerun of another config moves the unfinished run aside; refused (a typo in data.dir, log.tensorboard
    without tensorboardX) or stopped before its first step, it puts it back: the original command still
    resumes it."""
    workdir = tmp_path / "w"
    (workdir / "checkpoints" / "40").mkdir(parents=True)
    (workdir / "config.json").write_text('{"seed": 0}')
    (workdir / "run.json").write_text('{"status": "interrupted: SIGTERM at step 40"}')
    (workdir / "metrics.jsonl").write_text('{"step": 40}\n')
    before = {p.relative_to(workdir): p.read_bytes() if p.is_file() else None for p in workdir.rglob("*")}
    config = tiny_slide(dir=str(tmp_path / "typo")) if stop == "data.dir typo" else tiny_slide()
    error, message = DataError, "no such folder"
    if stop == "tensorboard without tensorboardX":
        config.log.tensorboard = True
        monkeypatch.setitem(sys.modules, "tensorboardX", None)
        error, message = ConfigError, "tensorboardX"
    elif stop == "Ctrl-C while loading":
        from hwrepro import data

        def interrupted(*args, **kwargs):
            raise interrupts.Interrupted("SIGINT")
        monkeypatch.setattr(data, "load", interrupted)
        error, message = interrupts.Interrupted, "SIGINT"
    with pytest.raises(error, match=message):
        runner.run_here(config, workdir, quiet=True)
    after = {p.relative_to(workdir): p.read_bytes() if p.is_file() else None for p in workdir.rglob("*")
             if p.name not in (".lock", "report.html")}
    assert after == before


@pytest.mark.slow
def test_a_resume_on_other_data_is_refused_and_on_its_own_goes_on(tmp_path, monkeypatch):
    """An interrupted run over XC files whose files are then replaced (another draw, the same shapes): the same
    command is refused in one line naming what changed, and resumes once the files are back."""
    folder, workdir = tmp_path / "xc", tmp_path / "w"
    write_xc_pair(folder)
    calls = iter(range(10**6))
    monkeypatch.setattr(interrupts, "pending", lambda: "SIGTERM" if next(calls) == 2 else None)  # after step 3
    with pytest.raises(interrupts.Interrupted):
        runner.run_here(tiny_slide(dir=str(folder)), workdir, quiet=True)
    monkeypatch.undo()
    original = {name: (folder / name).read_bytes() for name in ("train.txt", "test.txt")}
    train, test = xc.synthetic("tiny", num_train=200, num_test=50, seed=1)
    xc.write_xc(folder / "train.txt", train)
    xc.write_xc(folder / "test.txt", test)
    with pytest.raises(DataError, match=r"^the data differ from those this run was started on \(data_details "):
        runner.run_here(tiny_slide(dir=str(folder)), workdir, quiet=True)
    for name, content in original.items():
        (folder / name).write_bytes(content)
    final = runner.run_here(tiny_slide(dir=str(folder)), workdir, quiet=True)
    run = json.loads((workdir / "run.json").read_text())
    assert run["status"] == "done" and run["resumes"] == 2 and run["resumed_from_step"] == 3 and final["steps"] == 5


def test_an_edit_that_keeps_size_and_time_invalidates_the_cache(tmp_path):
    write_xc_pair(tmp_path)
    path = tmp_path / "train.txt"
    before = xc.read_xc(path)
    stat = path.stat()
    header, first, rest = path.read_text().split("\n", 2)
    label = first.split(" ")[0].split(",")[0]
    swapped = label[:-1] + str((int(label[-1]) + 1) % 10)  # same length, still below the 300 labels
    path.write_text("\n".join([header, swapped + first[len(label):], rest]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    after = xc.read_xc(path)
    assert after.label_indices[0] == int(swapped) != before.label_indices[0]


def test_a_batch_larger_than_the_data_and_a_bad_data_source_are_config_errors(tmp_path):
    config = tiny_slide(num_train=50, num_test=20)
    config.train.batch_size = 128
    with pytest.raises(ConfigError, match="train.batch_size=128 exceeds the 50 training points"):
        runner.run_here(config, tmp_path / "a", quiet=True)
    with pytest.raises(ConfigError, match="data.source='idx' is not one of 'auto'"):
        runner.run_here(tiny_slide(source="idx"), tmp_path / "b", quiet=True)


@pytest.mark.slow
def test_a_sweep_checks_every_point_before_the_first_one_runs(tmp_path, run_launch):
    sweep = tmp_path / "sweep.py"
    sweep.write_text("from configs.autoencoder_mnist import get_config as base\n"
                     "def get_config():\n"
                     "    c = base()\n"
                     "    c.train.num_steps = 20\n"
                     "    c.sweep = dict(points=[{'seed': 0}, {'seed': 1, 'model.encoder_sizes': (0,)}])\n"
                     "    return c\n")
    p = run_launch(f"--config={sweep}", f"--workdir={tmp_path / 'out'}")
    assert p.returncode == 2 and p.stderr.strip() == (
        "error: seed=1,encoder_sizes=0: model.encoder_sizes=[0] must be a non-empty list of positive integers")
    assert not (tmp_path / "out" / "seed=0").exists()


def test_snapshots_are_evenly_spaced_and_never_every_zero_steps():
    from hwrepro.harness.loop import snapshot_spacing

    assert [snapshot_spacing(100, 4), snapshot_spacing(10, 30), snapshot_spacing(10, 0)] == [25, 1, 0]


def _child(marker: Path, seconds: float) -> subprocess.Popen:
    """A child that exits 1 after `seconds`, writing `marker` if it gets SIGTERM first."""
    code = (f"import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: open({str(marker)!r}, 'w').close())\n"
            f"time.sleep({seconds})\nsys.exit(1)\n")
    return subprocess.Popen([sys.executable, "-c", code])


@pytest.mark.parametrize("forwarded", [[], ["SIGTERM"]])
def test_a_failed_process_stops_the_others_unless_a_signal_is_already_stopping_them(tmp_path, monkeypatch,
                                                                                    forwarded):
    """After one process fails, the others get GRACE_SECONDS to fail by themselves, then SIGTERM; when the
    user's signal was forwarded to all of them, they are checkpointing to stop and get no second one."""
    from hwrepro.harness import process

    monkeypatch.setattr(process, "GRACE_SECONDS", 0.5)
    children = [_child(tmp_path / "fast", 0.1), _child(tmp_path / "slow", 2.0)]
    codes, first, stopped = process._wait_all(children, forwarded)
    assert codes == [1, 1] and first == 0
    assert stopped == (set() if forwarded else {1}) and (tmp_path / "slow").exists() != bool(forwarded)
