"""Sweeps and their report: grid as the launcher sees it, resume, failures, skipped GPU points, shards,
statistics against hand-computed values, bit-identical groups, and a tiny real sweep run as a user would."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import ml_collections
import numpy as np
import pytest

from conftest import launch  # python launch.py ARGS, as a user runs it
from hwrepro.harness import numerics
from hwrepro.harness import records
from hwrepro.study import report, stats
from hwrepro.study.report import analysis
from hwrepro.harness import runner
from hwrepro.study import sweep
from hwrepro.study import grid
from hwrepro.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# A tiny autoencoder sweep: 2 configurations x 2 seeds that train, one point that fails inside the run
# (data.source=idx with no data.dir) and one that needs a GPU.
TINY_SWEEP = '''
import ml_collections
from configs import autoencoder_mnist

def get_config():
    c = autoencoder_mnist.get_config()
    c.name = "tiny_sweep"
    c.train.update(num_steps=20, log_every=5, checkpoints=2, hessian_iters=4, eval_every=0)
    c.sweep = ml_collections.ConfigDict()
    c.sweep.points = ([{"numerics.precision": p, "seed": s} for p in ("fp32", "bf16") for s in (0, 1)]
                      + [{"data.source": "idx", "seed": 0}, {"numerics.platform": "gpu", "seed": 0}])
    c.report = ml_collections.ConfigDict({"metric": "test_loss", "reference": "precision=fp32", "curve": "loss"})
    return c
'''
REAL = ["precision=fp32,seed=0", "precision=fp32,seed=1", "precision=bf16,seed=0", "precision=bf16,seed=1"]
FAILS, GPU = "source=idx,seed=0", "platform=gpu,seed=0"


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _status(run_dir):
    return records.status_of(run_dir)


# --- the grid as the launcher sees it -------------------------------------------------------------------


def _sweep_config(name):
    import importlib

    return importlib.import_module(f"configs.{name}").get_config()


def test_a_point_another_process_runs_is_left_as_it_was(tmp_path):
    config = _sweep_config("sweep_autoencoder")
    point = grid.expand(config)[0]
    run_dir = tmp_path / point.name
    lock = records.lock_workdir(run_dir)  # another sweep's child holds the point
    (run_dir / sweep.OUTPUT_FILE).write_text("its own output\n")
    try:
        with pytest.raises(records.WorkdirBusy):
            sweep._attempt(config, point, run_dir)
    finally:
        os.close(lock)
    assert (run_dir / sweep.OUTPUT_FILE).read_text() == "its own output\n"  # no attempt header of ours


@pytest.mark.parametrize("name", ["sweep_autoencoder", "sweep_prednet", "sweep_prednet_video",
                                  "sweep_prednet_moving_mnist"])
def test_study_sweeps_expand_to_cpu_grid_and_gpu_points(name):
    config = _sweep_config(name)
    points = grid.expand(config)
    names = [p.name for p in points]
    assert len(names) == len(set(names)) == (8 + 8) * 3  # CPU and GPU set-ups, 3 seeds each
    point = next(p for p in points if p.name.startswith("precision=bf16,isa=AVX2,threads=1,seed=0"))
    aliases = grid.point_aliases(config)
    assert sweep.configuration_name(point, aliases, sweep.group_over(config)) == "precision=bf16,isa=AVX2,threads=1"
    c = sweep.point_config(config, point)
    assert "sweep" not in c and "report" not in c
    assert (c.numerics.precision, c.numerics.cpu_max_isa, c.numerics.threads, c.seed) == ("bf16", "AVX2", 1, 0)
    runner.validate(c)
    flags = numerics.xla_flags(c.numerics)
    assert "--xla_cpu_max_isa=AVX2" in flags and "--xla_cpu_multi_thread_eigen=false" in flags
    gpu = [p for p in points if p.overrides.get("numerics.platform") == "gpu"]
    assert len(gpu) == 24
    assert any(n.startswith("platform=gpu,deterministic=true,autotune=false,matmul=highest,seed=2") for n in names)
    configurations = {sweep.configuration_name(p, aliases, sweep.group_over(config)) for p in points}
    assert len(configurations) == 16 and config.report.reference in configurations
    assert config.train.checkpoints > 0
    assert (config.train.hessian_iters > 0) == (name in ("sweep_autoencoder", "sweep_prednet"))  # real data: none


def test_configuration_name_is_one_per_set_up_whether_or_not_names_were_cut():
    # Seeds 9, 10 and 100 make names of 199, 200 and 201 characters: the last is cut to length.
    config = ml_collections.ConfigDict({"seed": 0, "model": {"label": ""}})
    config.sweep = {"axes": {"model": {"label": ["a" * 186]}, "seed": [9, 10, 100]}}
    points = grid.expand(config)
    assert [len(p.name) for p in points] == [199, 200, 200] and not points[2].name.endswith("seed=100")
    names = {sweep.configuration_name(p, grid.point_aliases(config)) for p in points}
    assert names == {f"label={'a' * 186}"}
    # Cut inside its last pair, a name keeps one part per override, and the hash of the whole, seed included.
    config.sweep = {"axes": {"seed": [0, 1], "model": {"label": ["x" * 60 + "y" * 150]}}}
    names = {sweep.configuration_name(p, grid.point_aliases(config)) for p in grid.expand(config)}
    assert names == {grid.point_name({"model.label": "x" * 60 + "y" * 150}, {"model.label": "label"})}


def test_a_sweep_of_multi_process_points_and_a_shard_of_no_sweep_are_refused(tmp_path):
    from configs.autoencoder_mnist import get_config
    from hwrepro.harness import launcher

    config = get_config()
    with pytest.raises(ConfigError, match=r"^--shard=1/2: only a sweep is split into shards"):
        launcher.launch(config, str(tmp_path / "a"), "1/2")
    config.sweep = {"points": [{"seed": 0}, {"seed": 1, "parallel.processes": 2}]}
    with pytest.raises(ConfigError, match=r"^parallel.processes=2 \(point seed=1,processes=2\): a sweep runs"):
        launcher.launch(config, str(tmp_path / "b"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_sweep_and_a_run_never_share_a_folder(tmp_path):
    from configs.autoencoder_mnist import get_config
    from hwrepro.harness import launcher

    run, swept = tmp_path / "run", tmp_path / "sweep"
    run.mkdir()
    swept.mkdir()
    (run / "run.json").write_text('{"status": "done"}')
    (swept / "sweep.json").write_text("{}")
    config = get_config()
    with pytest.raises(records.WorkdirTaken, match=r"holds a sweep \(sweep.json\); choose another --workdir"):
        launcher.launch(config, str(swept))
    config.sweep = {"points": [{"seed": 0}]}
    with pytest.raises(ConfigError, match=r"holds a run \(run.json\), not a sweep"):
        launcher.launch(config, str(run))
    assert sorted(p.name for p in run.iterdir()) == ["run.json"] and sorted(p.name for p in swept.iterdir()) == [
        ".lock", "sweep.json"]


# --- a tiny real sweep, run as a user would: interrupt, resume, failure, GPU skipped ----------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Runs the tiny sweep three times through launch.py: interrupted with Ctrl-C during its first point,
    resumed (one point pre-created as 'running', as a killed sweep leaves it), and resumed again."""
    root = tmp_path_factory.mktemp("tiny")
    config, workdir = root / "tiny_sweep.py", root / "sweep"
    config.write_text(TINY_SWEEP)
    args = (f"--config={config}", f"--workdir={workdir}")

    # A shell that starts the test run in the background (as CI may) ignores SIGINT, and an ignored signal stays
    # ignored across exec. Catching it here for the moment of the spawn gives the sweep the default disposition
    # (exec resets caught signals), as an interactive terminal would, without a fork-time Python hook.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, str(REPO / "launch.py"), *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env(), start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.time() + 300
    while _status(workdir / REAL[0]) != "running" and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    seen_running = _status(workdir / REAL[0]) == "running"
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    out, err = proc.communicate(timeout=60)
    interrupted = dict(code=proc.returncode, out=out, err=err, status=_status(workdir / REAL[0]),
                       seen_running=seen_running,
                       others=[p.name for p in workdir.iterdir() if p.is_dir() and p.name != REAL[0]])

    stale = workdir / REAL[1]
    stale.mkdir(exist_ok=True)  # a killed sweep leaves its point 'running'; made so whatever happened above
    records.write_json_atomic(stale / "run.json", {"status": "running", "name": REAL[1]})
    first = launch(*args)
    finals = {n: (workdir / n / "final.json").read_text() for n in REAL}
    second = launch(*args)
    return dict(workdir=workdir, interrupted=interrupted, first=first, second=second, finals=finals,
                config=config)


@pytest.mark.slow
def test_ctrl_c_records_the_running_point_as_interrupted(tiny):
    i = tiny["interrupted"]
    assert i["seen_running"], f"the first point never showed as running: {i['out']}\n{i['err']}"
    assert i["code"] != 0
    assert i["status"].startswith("interrupted: SIGINT")  # the point's process recorded it itself
    assert "interrupted" in i["out"] and f"the same command with --workdir={tiny['workdir']} resumes it" in i["out"]
    assert i["others"] == []  # nothing after the interrupted point ran


@pytest.mark.slow
def test_resumed_sweep_reruns_unfinished_points_and_goes_on_after_a_failure(tiny):
    workdir, first = tiny["workdir"], tiny["first"]
    assert first.returncode == 1, first.stdout + first.stderr  # one point failed
    for name in REAL:
        assert _status(workdir / name) == "done"
        assert f"{name}: done in " in first.stdout and "test_loss" in first.stdout
    # The interrupted point and the stale 'running' one were run again; their old records moved aside.
    for name in REAL[:2]:
        aside = list((workdir / name).glob("previous-*/run.json"))
        assert aside and json.loads(aside[0].read_text())["status"] != "done"
        assert f"is not one this config resumes (another config, or no checkpoint): moved to {aside[0].parent}" in (
            workdir / name / "output.txt").read_text()
    assert "[1/6] precision=fp32,seed=0: done in" in first.stdout and "ETA" in first.stdout
    assert _status(workdir / FAILS).startswith("failed: ") and "data.dir" in _status(workdir / FAILS)
    assert "sweep finished: 4 done, 1 failed, 1 skipped" in first.stdout
    assert sorted(p.name for p in workdir.iterdir() if p.is_dir()) == sorted(REAL + [FAILS, GPU])


@pytest.mark.slow
def test_gpu_point_is_skipped_not_failed(tiny):
    status = _status(tiny["workdir"] / GPU)
    assert status.startswith("skipped: ") and "gpu" in status
    assert f"[6/6] {GPU}: skipped:" in tiny["first"].stdout


@pytest.mark.slow
def test_second_resume_skips_done_points_and_keeps_their_results(tiny):
    second, workdir = tiny["second"], tiny["workdir"]
    assert second.returncode == 1
    for name in REAL:
        assert f"{name}: already done, test_loss" in second.stdout
        assert (workdir / name / "final.json").read_text() == tiny["finals"][name]
    assert f"{FAILS}: failed:" in second.stdout and f"{GPU}: skipped:" in second.stdout
    assert "sweep finished: 4 done, 1 failed, 1 skipped" in second.stdout


@pytest.mark.slow
def test_a_sweep_with_another_base_config_is_refused(tiny):
    p = launch(f"--config={tiny['config']}", f"--workdir={tiny['workdir']}", "--config.train.num_steps=30")
    assert p.returncode == 2 and "different base config" in p.stderr
    assert "already done" not in p.stdout


@pytest.mark.slow
def test_tiny_sweep_report_renders_with_plots(tiny):
    workdir = tiny["workdir"]
    p = subprocess.run([sys.executable, "-m", "hwrepro.study.report", str(workdir)], capture_output=True, text=True,
                       cwd=REPO, env=_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    text = (workdir / "report.md").read_text()
    for png in report.PLOTS.values():
        assert (workdir / png).read_bytes()[:8] == PNG_MAGIC
        assert f"]({png})" in text
    sweep_data = report.load(workdir)
    values = report.values_by_configuration(sweep_data, "test_loss")
    finals = {n: json.loads(tiny["finals"][n]) for n in REAL}
    assert values["precision=bf16"] == [finals[n]["test_loss"] for n in REAL[2:]]
    assert f"| `precision=fp32` | 2 | {np.mean(values['precision=fp32']):.6g} |" in text
    assert "reference configuration: `precision=fp32`" in text
    assert "| `source=idx` | seed=0 | failed: " in text and "| `platform=gpu` | seed=0 | skipped: " in text
    cpu = json.loads((workdir / REAL[0] / "run.json").read_text())["cpu"]["model"]
    assert f"- machine: {cpu}, " in text
    # Same seed, other precision: the parameters drift apart, and the report sees it from the first checkpoint.
    divs = [d for d in report.analyse(sweep_data).divergences if d.configuration == "precision=bf16"]
    assert [d.repeat for d in divs] == ["seed=0", "seed=1"]
    for d in divs:
        assert list(d.steps) == [10, 20] and d.first_param_step == 10 and np.all(d.rel_distance > 0)
    hessian = report.hessian_by_configuration(sweep_data)
    assert [p.step for p in hessian["precision=fp32"]] == [10, 20]
    assert all(p.n == 2 and p.max_mean > 0 for p in hessian["precision=fp32"])


# --- shards -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_shard_runs_its_round_robin_share(tmp_path, capsys):
    from configs import autoencoder_mnist
    import ml_collections

    config = autoencoder_mnist.get_config()
    config.sweep = ml_collections.ConfigDict({"points": [{"numerics.platform": "gpu"}], "axes": {"seed": [0, 1, 2, 3]}})
    assert sweep.run_sweep(config, tmp_path, "1/2") == runner.EXIT_DONE  # skipped points are not failures
    out = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["platform=gpu,seed=1",
                                                                        "platform=gpu,seed=3"]
    assert "[1/2] platform=gpu,seed=1: skipped:" in out and "0 done, 0 failed, 2 skipped" in out
    record = json.loads((tmp_path / "sweep.json").read_text())
    assert record["shard"] == "1/2" and record["shard_points"] == ["platform=gpu,seed=1", "platform=gpu,seed=3"]
    assert len(record["points"]) == 4 and record["base_config"]["train"]["batch_size"] == 256
    assert "not run" in (tmp_path / "report.md").read_text()
    with pytest.raises(ConfigError, match="shard"):
        sweep.run_sweep(config, tmp_path, "2/2")


# --- the report's numbers against hand-computed values ------------------------------------------------


def _fake_run(workdir, name, configuration, seed, value, sha, metrics=(), trajectory=None, status="done"):
    run_dir = workdir / name
    run_dir.mkdir(parents=True)
    records.write_json_atomic(run_dir / "run.json", {"status": status, "name": name,
                                                     "cpu": {"model": "Hand CPU", "logical_cores": 2}})
    if status == "done":
        records.write_json_atomic(run_dir / "final.json", {"test_loss": value, "wall_seconds": 1.0,
                                                           "param_sha256": sha})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    if trajectory is not None:
        np.savez(run_dir / "trajectory.npz", steps=np.array([10, 20]), params=np.asarray(trajectory, np.float32))
    return {"name": name, "overrides": {"cfg": configuration, "seed": seed}, "configuration": f"cfg={configuration}"}


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    """A sweep folder written by hand: configurations ref, b, c (2 seeds + 1 failed) and same (bit-identical
    to ref), with trajectories, losses and Hessian estimates chosen so every number is known."""
    workdir = tmp_path_factory.mktemp("hand")
    ref_traj = [[3.0, 4.0], [3.0, 4.0]]
    ref_metrics = [{"step": 5, "loss": 0.5}, {"step": 10, "loss": 0.4, "hessian_max": 2.0, "hessian_min": -0.5}]
    points = []
    for seed, value in enumerate([1.0, 2.0, 3.0]):
        metrics = [dict(m) for m in ref_metrics]
        if seed == 1:
            metrics[1].update(hessian_max=4.0, hessian_min=0.5)
        points.append(_fake_run(workdir, f"cfg=ref,seed={seed}", "ref", seed, value, f"sha-ref-{seed}", metrics,
                                ref_traj))
        points.append(_fake_run(workdir, f"cfg=b,seed={seed}", "b", seed, value + 1.0, f"sha-b-{seed}",
                                [{"step": 5, "loss": 0.5}, {"step": 10, "loss": 0.45}],
                                [[3.0, 4.0], [3.0, 4.5]] if seed == 0 else None))
        points.append(_fake_run(workdir, f"cfg=c,seed={seed}", "c", seed, [5.0, 7.0, None][seed], f"sha-c-{seed}",
                                status="done" if seed < 2 else "failed: ValueError: boom"))
        points.append(_fake_run(workdir, f"cfg=same,seed={seed}", "same", seed, value, f"sha-ref-{seed}",
                                ref_metrics, ref_traj))
    records.write_json_atomic(workdir / "sweep.json", {
        "experiment": "autoencoder", "name": "hand", "base_config": {"train": {"hessian_iters": 8}},
        "report": {"metric": "test_loss", "reference": "cfg=ref", "curve": "loss"}, "group_over": ["seed"],
        "points": points, "shard": None})
    path = report.write_report(workdir)
    return dict(workdir=workdir, text=path.read_text(), sweep=report.load(workdir))


def test_the_header_counts_an_interrupted_point_as_unfinished(tmp_path):
    points = [_fake_run(tmp_path, "cfg=a,seed=0", "a", 0, 1.0, "sha-0"),
              _fake_run(tmp_path, "cfg=a,seed=1", "a", 1, None, "sha-1", status="interrupted: SIGTERM at step 3")]
    records.write_json_atomic(tmp_path / "sweep.json", {
        "experiment": "autoencoder", "name": "cut", "base_config": {}, "report": {"metric": "test_loss"},
        "group_over": ["seed"], "points": points, "shard": None})
    text = report.write_report(tmp_path).read_text()
    assert "1 done, 0 failed, 0 skipped, 1 not run or unfinished (interrupted included)." in text


def test_final_statistics_match_hand_computed_values(hand):
    a = report.analyse(hand["sweep"])
    rows = {r.configuration: r for r in a.rows}
    ref, b, c = rows["cfg=ref"], rows["cfg=b"], rows["cfg=c"]
    assert ref.summary == (3, 2.0, 1.0, 1.0, 3.0) and ref.comparison is None
    assert c.summary.n == 2 and c.statuses == {"done": 2, "failed": 1}
    # b - ref: difference 1, both variances 1: t = 1 / sqrt(1/3 + 1/3), Welch df = 4.
    t = 1.0 / math.sqrt(2.0 / 3.0)
    u = t / math.sqrt(4.0 + t * t)  # Student t with 4 df: F(t) = 1/2 + (3/4) u (1 - u^2 / 3)
    p = 2.0 * (1.0 - (0.5 + 0.75 * u * (1.0 - u * u / 3.0)))
    g = 1.0 * 2.0 / math.sqrt(2.0 * math.pi)  # d = 1, Hedges' J(4) = Gamma(2) / (sqrt(2) Gamma(3/2))
    assert b.comparison.welch.t == pytest.approx(t) and b.comparison.welch.df == pytest.approx(4.0)
    assert b.comparison.welch.p == pytest.approx(p, rel=1e-9)
    assert b.comparison.effect.hedges_g == pytest.approx(g, rel=1e-9)
    text = hand["text"]
    mde = stats.minimum_detectable_effect(3, 1.0, 3, 1.0)
    # Paired by seed, b is ref + 1 in every seed: no spread, so no paired p, and an MDE of 0.
    assert b.paired.n == 3 and math.isnan(b.paired.p) and b.paired.mde == 0.0
    assert f"| `cfg=b` | 3 | 3 | 1 | 2 | 4 | +1 | {mde:.3g} | {p:.3g} | {g:.3g} | – (3) | 0 | [1] |" in text
    assert "1. paired p undefined: the differences have zero spread (every pair differs by 1)" in text
    # c against ref over the seeds both finished (0, 1): differences 4, 5; t = 4.5 / (sqrt(1/2) / sqrt(2)) = 9.
    assert c.paired.n == 2 and c.paired.t == pytest.approx(9.0) and c.paired.df == 1
    assert c.paired.p == pytest.approx(2.0 * (0.5 - math.atan(9.0) / math.pi))  # Student t, 1 df: Cauchy
    assert f"| {c.paired.p:.3g} (2) | {c.paired.mde:.3g} |" in text
    assert "| `cfg=c` | 2 | 6 |" in text and "fewer than 3" in text and "1 failed" in text
    assert "not adjusted for the 3 comparisons with the reference" in text
    assert "| `cfg=c` | seed=2 | failed: ValueError: boom |" in text


def test_a_finished_run_whose_metric_was_not_finite_stays_in_the_statistics(tmp_path):
    """final.json writes a nan loss as null and lists it under `nonfinite`: the run counts as nan and the
    report warns, where it was dropped unseen (n = 1 of 2 finished runs)."""
    points = [_fake_run(tmp_path, f"cfg={c},seed={s}", c, s, 1.0 + s, f"sha-{c}-{s}") for c in ("ref", "b")
              for s in (0, 1)]
    final = tmp_path / "cfg=b,seed=1" / "final.json"
    final.write_text(records.dumps({**json.loads(final.read_text()), "test_loss": math.nan}))
    records.write_json_atomic(tmp_path / "sweep.json", {
        "experiment": "autoencoder", "name": "nan", "base_config": {}, "report": {"metric": "test_loss",
        "reference": "cfg=ref"}, "group_over": ["seed"], "points": points, "shard": None})
    values = report.values_by_configuration(report.load(tmp_path), "test_loss")
    assert values["cfg=ref"] == [1.0, 2.0] and values["cfg=b"][0] == 1.0 and math.isnan(values["cfg=b"][1])
    text = report.write_report(tmp_path).read_text()
    assert "| `cfg=b` | 2 |" in text and "group a contains non-finite values (nan or inf)" in text


def test_bit_identical_runs_are_grouped_in_the_report(hand):
    groups, labels = report.hash_groups(hand["sweep"])
    shared = [g for g in groups if len(g) > 1]
    assert shared == [["cfg=ref,seed=0", "cfg=same,seed=0"], ["cfg=ref,seed=1", "cfg=same,seed=1"],
                      ["cfg=ref,seed=2", "cfg=same,seed=2"]]
    assert labels["cfg=same,seed=1"] == labels["cfg=ref,seed=1"] == "B" and "cfg=b,seed=0" not in labels
    text = hand["text"]
    assert "| `cfg=ref` | A | B | C |" in text and "| `cfg=same` | A | B | C |" in text
    assert "| `cfg=b` | · | · | · |" in text and "| `cfg=c` | · | · | failed |" in text
    assert "8 distinct final parameter sets among 11 finished runs; 6 run(s) share" in text


def test_divergence_against_the_reference_run_of_the_same_seed(hand):
    divs = report.analyse(hand["sweep"]).divergences
    b0 = next(d for d in divs if d.name == "cfg=b,seed=0")
    assert list(b0.steps) == [10, 20] and b0.first_param_step == 20
    np.testing.assert_allclose(b0.rel_distance, [0.0, 0.5 / 5.0])  # ||(0, 0.5)|| / ||(3, 4)||
    np.testing.assert_allclose(b0.loss_diff, [0.0, 0.05])
    assert b0.first_loss_step == 10
    b1 = next(d for d in divs if d.name == "cfg=b,seed=1")
    assert b1.steps.size == 0 and "no trajectory" in b1.note
    same = report.summarize_divergences([d for d in divs if d.configuration == "cfg=same"])
    assert (same.identical, same.with_params, same.first_param_step, same.end_mean) == (3, 3, None, 0.0)
    assert same.first_loss_step is None
    b = report.summarize_divergences([d for d in divs if d.configuration == "cfg=b"])
    assert (b.first_param_step, b.end_mean, b.first_loss_step) == (20, pytest.approx(0.1), 10)
    assert b.max_abs_loss_diff == pytest.approx(0.05)
    assert "| `cfg=same` | 3 | 3/3 | never | 0 (0–0) | never | 0 |" in hand["text"]
    assert "| `cfg=b` | 3 | 0/1 | 20 | 0.1 | 10 | 0.05 | no trajectory.npz" in hand["text"]


def test_hessian_means_over_seeds_and_negative_curvature_sentence(hand):
    h = report.hessian_by_configuration(hand["sweep"])
    assert h["cfg=ref"] == [report.HessianPoint(10, 8.0 / 3.0, -0.5 / 3.0, -0.5, 3)]
    assert "cfg=b" not in h
    text = hand["text"]
    assert "| `cfg=ref` | 2.667 / -0.167 |" in text
    assert "Negative curvature was seen at 2 of 2 configuration-checkpoints" in text
    for png in ("final_metric.png", "divergence.png", "hessian.png", "curves.png"):
        assert (hand["workdir"] / png).read_bytes()[:8] == PNG_MAGIC


def test_repeats_whose_fields_share_a_last_name_stay_apart(tmp_path):
    """group_over (seed, data.seed): a point that sets seed=0 and one that sets data.seed=0 are two repeats,
    where both were labelled seed=0 and one of them dropped from n."""
    points = [_fake_run(tmp_path, f"cfg=a,{f}=0", "a", 0, v, f"sha-{f}")
              for f, v in (("seed", 1.0), ("data.seed", 2.0))]
    points[1]["overrides"] = {"cfg": "a", "data.seed": 0}
    records.write_json_atomic(tmp_path / "sweep.json", {
        "experiment": "autoencoder", "name": "two-seeds", "base_config": {}, "group_over": ["seed", "data.seed"],
        "report": {"metric": "test_loss"}, "points": points, "shard": None})
    data = report.load(tmp_path)
    assert [r.repeat for r in data.runs] == ["seed=0", "data.seed=0"]
    assert report.values_by_configuration(data, "test_loss") == {"cfg=a": [1.0, 2.0]}


def test_curvature_within_rounding_of_zero_is_not_called_negative():
    from hwrepro.study.report import markdown

    rounding = {"c": [report.HessianPoint(10, 16.7, 1.0, -1.8e-6, 3)]}  # float32 Lanczos on a PSD Hessian
    assert markdown._curvature_sentence(rounding).startswith("No negative curvature beyond rounding was seen")
    real = {"c": [report.HessianPoint(10, 16.7, 1.0, -0.01, 3)]}
    assert markdown._curvature_sentence(real).startswith("Negative curvature was seen at 1 of 1")


def test_a_sign_of_zero_is_a_difference_in_the_stored_bits(tmp_path):
    """-0.0 == 0.0 as floats, but not as bits: param_sha256 tells them apart, and so does the divergence."""
    runs = [_fake_run(tmp_path, f"cfg={c},seed=0", c, 0, 1.0, f"sha-{c}", trajectory=[[3.0, z], [3.0, 4.0]])
            for c, z in (("ref", 0.0), ("b", -0.0))]
    records.write_json_atomic(tmp_path / "sweep.json", {
        "experiment": "autoencoder", "name": "zero", "base_config": {}, "group_over": ["seed"], "shard": None,
        "report": {"metric": "test_loss", "reference": "cfg=ref"}, "points": runs})
    (div,) = report.analyse(report.load(tmp_path)).divergences
    assert div.first_param_step == 10 and div.rel_distance[0] == 0.0


def test_a_resumed_runs_losses_are_compared_with_the_lines_over_the_same_steps(tmp_path):
    """A run stopped by a signal at step 15 and resumed logs a line at 15 and one at 20 over steps 16-20; the
    reference's line at 20 is the mean over 11-20. Comparing those two said "loss first differs at 20" of
    bit-identical runs. Evaluations are of the state at their step, comparable whatever the lines before."""
    ref_rows = [{"step": 10, "loss": 1.0}, {"step": 20, "loss": 0.8, "eval_x": 0.5}, {"step": 30, "loss": 0.6}]
    resumed = [{"step": 10, "loss": 1.0}, {"step": 15, "loss": 0.85}, {"step": 20, "loss": 0.75, "eval_x": 0.5},
               {"step": 30, "loss": 0.6}]
    drifted = [dict(r) for r in resumed[:3]] + [{"step": 30, "loss": 0.61}]
    points = [_fake_run(tmp_path, f"cfg={c},seed=0", c, 0, 1.0, f"sha-{c}", rows)
              for c, rows in (("ref", ref_rows), ("resumed", resumed), ("drifted", drifted))]
    records.write_json_atomic(tmp_path / "sweep.json", {
        "experiment": "autoencoder", "name": "resumed", "base_config": {}, "group_over": ["seed"],
        "report": {"metric": "test_loss", "reference": "cfg=ref", "curve": "loss"}, "points": points, "shard": None})
    divs = {d.configuration: d for d in report.analyse(report.load(tmp_path)).divergences}
    assert list(divs["cfg=resumed"].loss_steps) == [10, 30] and divs["cfg=resumed"].first_loss_step is None
    assert divs["cfg=drifted"].first_loss_step == 30
    np.testing.assert_allclose(divs["cfg=drifted"].loss_diff, [0.0, 0.01])
    assert analysis.logged_values(resumed, "eval_x") == analysis.logged_values(ref_rows, "eval_x") == {
        (20, 20): 0.5}
    assert analysis.logged_values(resumed, "loss")[(16, 20)] == 0.75


def test_divergence_plot_of_runs_without_snapshots_says_so_and_keeps_its_legend(tmp_path):
    """Loss curves but no trajectory.npz (train.checkpoints=0): the parameter panel says why it is empty and the
    legend goes to the loss panel (matplotlib warned of a legend with nothing in it)."""
    import warnings

    from hwrepro.study.report import figures

    points = [_fake_run(tmp_path, f"cfg={c},seed=0", c, 0, 1.0, f"sha-{c}",
                        [{"step": 5, "loss": first}, {"step": 10, "loss": last}])
              for c, first, last in (("ref", 0.5, 0.4), ("b", 0.6, 0.7))]
    records.write_json_atomic(tmp_path / "sweep.json", {
        "experiment": "autoencoder", "name": "no-snapshots", "base_config": {}, "group_over": ["seed"],
        "report": {"metric": "test_loss", "reference": "cfg=ref", "curve": "loss"}, "points": points, "shard": None})
    sweep_data = report.load(tmp_path)
    a = report.analyse(sweep_data)
    assert a.divergences and not any(d.rel_distance.size for d in a.divergences)
    plt = figures._pyplot()
    fig, (params, losses) = plt.subplots(1, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figures._plot_divergence(params, losses, sweep_data, a, figures._colors(sweep_data.configurations))
    assert params.get_legend() is None and "no parameter snapshots" in params.texts[0].get_text()
    assert [t.get_text() for t in losses.get_legend().get_texts()] == ["cfg=b"]
    plt.close(fig)


def test_report_of_a_folder_without_a_sweep_is_one_error_line(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "sweep.json" in err and err.count("\n") == 1


@pytest.mark.slow
def test_a_failing_report_loses_no_results(tmp_path, capsys, monkeypatch):
    from configs import autoencoder_mnist
    import ml_collections

    def broken(workdir):
        raise RuntimeError("plotting broke")

    monkeypatch.setattr(report, "write_report", broken)
    config = autoencoder_mnist.get_config()
    config.sweep = ml_collections.ConfigDict({"points": [{"numerics.platform": "gpu"}]})
    assert sweep.run_sweep(config, tmp_path) == runner.EXIT_DONE
    captured = capsys.readouterr()
    assert "report failed (RuntimeError: plotting broke)" in captured.err
    assert "python -m hwrepro.study.report" in captured.err and "0 done, 0 failed, 1 skipped" in captured.out
    assert _status(tmp_path / "platform=gpu").startswith("skipped: ")


def test_report_states_the_minimum_detectable_effect_and_has_an_html_twin(hand):
    """b against ref: 3 seeds each with spread 1, so the MDE is that of (3, 1, 3, 1) (4.3 standard errors),
    beside Δ = +1; report.html has the same table and its PNGs inline."""
    mde = stats.minimum_detectable_effect(3, 1.0, 3, 1.0)
    assert mde == pytest.approx(4.2957 * math.sqrt(2 / 3), rel=1e-3)
    assert "| Δ mean vs ref | MDE | Welch p |" in hand["text"]
    page = (hand["workdir"] / "report.html").read_text()
    assert "<td>+1</td><td>" + f"{mde:.3g}" + "</td>" in page and "<th>MDE</th>" in page
    assert page.count('<img src="data:image/png;base64,') == hand["text"].count("![")


def test_a_point_keeps_the_status_its_own_process_recorded(tmp_path):
    """A point that recorded how it ended (interrupted, failed) keeps it; one that exited without a record,
    or killed, is recorded as failed with what its output's last error line says."""
    for status in ("interrupted: SIGTERM at step 3 of 10; checkpoint saved", "failed: RunFailed: loss is nan"):
        records.write_json_atomic(tmp_path / "run.json", {"status": status})
        assert sweep._settle(tmp_path, 1) == status
        assert json.loads((tmp_path / "run.json").read_text())["status"] == status
    records.write_json_atomic(tmp_path / "run.json", {"status": "running"})
    (tmp_path / sweep.OUTPUT_FILE).write_text("step 2\nerror: MemoryError\n")
    assert sweep._settle(tmp_path, -9) == f"failed: exit code -9: MemoryError (see {sweep.OUTPUT_FILE})"
