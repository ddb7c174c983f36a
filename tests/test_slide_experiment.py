"""SLIDE as a user runs it: configs, data from XC files, records, precision well above chance."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from hwrepro import experiments
from hwrepro.harness import runner
from hwrepro.data import xc
from hwrepro.errors import ConfigError
from hwrepro.sparse.hashes import simhash


def tiny_config(method="lsh", **data):
    from configs.slide_amazon import slide_config

    c = slide_config("tiny", method)
    c.model.hidden = 32
    c.model.num_candidates = 128
    c.lsh.num_tables = 8
    c.lsh.rebuild_period = 20
    c.lsh.redraw_period = 60
    c.train.num_epochs = 4
    c.train.learning_rate = 1e-2
    c.train.log_every = 20
    c.train.eval_every = 40
    c.eval.subset = 256
    c.data.max_features = 32
    c.data.max_labels = 8
    c.data.update(data)
    return c


@pytest.fixture(scope="module")
def lsh_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("slide") / "lsh"
    return workdir, runner.run_here(tiny_config("lsh"), workdir, quiet=True)


@pytest.mark.slow
def test_lsh_training_learns_and_records(lsh_run):
    workdir, final = lsh_run
    train = xc.synthetic("tiny", seed=0)[0]
    chance = train.label_counts().max() / train.num_points  # always predicting the most frequent label
    assert final["test_P@1"] > max(0.5, 4 * chance)
    assert final["test_P@1"] >= final["test_P@3"] >= final["test_P@5"] > 0
    assert final["rebuilds"] >= 4 and final["rebuild_seconds"] > 0
    # LSH-scored: inference tables (K = 8 bits: 256 buckets for 300 labels) score a share of the labels.
    assert 0 < final["test_lsh_share_scored"] < 1 and final["test_lsh_P@1"] > 0.5 * final["test_P@1"]
    assert final["test_lsh_seconds"] > 0 and final["test_seconds"] > 0
    run = json.loads((workdir / "run.json").read_text())
    assert run["data_source"].startswith("synthetic") and run["data_details"]["num_labels"] == 300
    assert run["lsh_hash_dtype"] == simhash.resolve_dtype("auto")  # the configs' "auto", as this CPU resolves it
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval_P@1"] for r in rows if "eval_P@1" in r]
    assert len(evals) >= 3 and evals[-1] > evals[0]
    assert all(r["train_seconds"] > 0 for r in rows)


@pytest.mark.slow
def test_incremental_tables_are_refiled_between_rebuilds(lsh_run, tmp_path):
    from hwrepro.sparse import lsh

    _, final = lsh_run
    c = tiny_config("lsh")
    c.lsh.maintenance, c.lsh.update_every = "incremental", 3
    incremental = runner.run_here(c, tmp_path / "incremental", quiet=True)
    # Full rebuilds and redraws on their schedule; a refile every third step that is not one of theirs.
    schedule = lsh.RebuildSchedule(c.lsh.rebuild_period, c.lsh.rebuild_decay, c.lsh.redraw_period)
    due = set(schedule.due_steps(final["steps"] + 1))
    assert incremental["rebuilds"] == final["rebuilds"] == len(due)
    assert incremental["refiles"] == len(set(range(3, final["steps"] + 1, 3)) - due) > 0
    assert incremental["test_P@1"] > 0.5


@pytest.mark.slow
def test_same_seed_same_bits_for_lsh(lsh_run, tmp_path, capsys):
    _, final = lsh_run
    again = runner.run_here(tiny_config("lsh"), tmp_path / "again", quiet=True)
    assert again["param_sha256"] == final["param_sha256"]
    # The final evaluation (minutes at full scale) shows progress for each scoring, ending at 100%.
    err = capsys.readouterr().err
    for scoring in ("all 300 labels scored", "LSH-scored"):
        assert re.search(rf"final eval, {scoring}\] batch (\d+)/\1 \(100%\)", err), err[-2000:]


def test_reads_xc_files_from_data_dir(unoptimized, tmp_path):
    train, test = xc.synthetic("tiny", num_train=600, num_test=200, seed=1)
    folder = tmp_path / "data" / "tiny"
    folder.mkdir(parents=True)
    xc.write_xc(folder / "train.txt", train)
    xc.write_xc(folder / "test.txt", test)
    c = tiny_config("sampled", dir=str(tmp_path / "data"))
    c.train.num_epochs = 1
    final = runner.run_here(c, tmp_path / "run", quiet=True)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert str(folder / "train.txt") in run["data_source"] and "synthetic" not in run["data_source"]
    assert run["data_details"]["num_train"] == 600 and final["steps"] == 600 // 128


@pytest.mark.slow
def test_bad_xc_file_fails_with_file_and_line(tmp_path, run_launch):
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "train.txt").write_text("2 2000 300\n1,2 5:0.5\n3 9999:1.0\n")
    (folder / "test.txt").write_text("1 2000 300\n1 5:0.5\n")
    p = run_launch("--config=configs/slide_amazon.py", "--config.data.dataset=tiny",
                   f"--config.data.dir={tmp_path}", f"--workdir={tmp_path / 'run'}")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: {folder / 'train.txt'}:3:"), p.stderr
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"].startswith("failed:")


@pytest.mark.slow
def test_text8_word2vec_runs_on_a_small_synthetic_corpus(tmp_path):
    from configs.slide_text8 import get_config

    c = get_config()
    c.data.num_train = 60_000
    c.model.hidden = 16
    c.model.num_candidates = 512
    c.lsh.num_tables = 4
    c.train.num_steps = 30
    c.train.log_every = 10
    c.train.eval_every = 0
    c.eval.subset = c.eval.final_points = 128
    final = runner.run_here(c, tmp_path / "w2v", quiet=True)
    assert np.isfinite(final["test_P@1"]) and final["steps"] == 30
    assert "synthetic" in json.loads((tmp_path / "w2v" / "run.json").read_text())["data_source"]


@pytest.mark.slow
def test_word2vec_on_a_text_file_learns_which_words_share_contexts(tmp_path, capsys):
    """Two topics that never share a window: each word's nearest neighbours (benchmarks/word_neighbours.py)
    are the other words of its topic."""
    import importlib.util

    from configs.slide_text8 import get_config

    topics = [["apple", "pear", "plum", "fig"], ["iron", "steel", "zinc", "lead"]]
    rng = np.random.default_rng(0)
    text = "\n\n".join(" ".join(rng.choice(topics[i % 2], 40)) for i in range(200))
    (tmp_path / "book.txt").write_text(text.upper())              # tokenised to lowercase
    c = get_config()
    c.model.method = "dense"
    c.model.hidden = 16
    c.data.source, c.data.dir, c.data.window, c.data.subsample = "text", str(tmp_path / "book.txt"), 2, 0.0
    c.train.num_steps, c.train.checkpoints, c.train.learning_rate = 200, 1, 1e-2
    c.train.eval_every, c.train.log_every, c.eval.subset = 0, 100, 64
    runner.run_here(c, tmp_path / "w2v", quiet=True)

    script_path = Path(__file__).resolve().parent.parent / "benchmarks" / "word_neighbours.py"
    spec = importlib.util.spec_from_file_location("word_neighbours", script_path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    capsys.readouterr()
    assert script.main([str(tmp_path / "w2v"), "--words", "apple,zinc", "--k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    near = {line.split(" ")[0]: {w.split(" ")[0] for w in line.split(": ", 1)[1].split(", ")}
            for line in lines if " (rank " in line}
    assert near == {"apple": {"pear", "plum", "fig"}, "zinc": {"iron", "steel", "lead"}}, lines


BAD_SLIDE_VALUES = [  # (field, value, what the error says)
    ("model.method", "fast", "model.method='fast' is not one of"),
    ("data.dataset", "amazon670", "data.dataset='amazon670' is not a known data set (did you mean 'amazon670k'?)"),
    ("lsh.kind", "simhsh", "lsh.kind='simhsh' is not a known hash family (did you mean 'simhash'?)"),
    ("model.num_candidates", 0, "model.num_candidates=0 must be positive"),
    ("model.min_count", 0, "model.min_count=0 must be positive"),
    ("lsh.maintenance", "lazy", "lsh.maintenance='lazy' is not one of 'rebuild', 'incremental'"),
    ("lsh.update_every", 0, "lsh.update_every=0 must be positive"),
    ("eval.lsh.tables", "none", "eval.lsh.tables='none' is not one of 'inference', 'training'"),
    ("eval.lsh.kind", "dwt", "eval.lsh.kind='dwt' is not a known hash family (did you mean 'dwta'?)"),
    ("eval.lsh.probe_bits", -1, "eval.lsh.probe_bits=-1 must not be negative"),
]


# The launcher's path is the same for every value (the config checked in a child, one line, exit 2): one launch
# for a value outside a list (fast tier) and one for a name outside a registry; the test below checks every
# value's message in process.
@pytest.mark.parametrize("field, value, message", [
    BAD_SLIDE_VALUES[0], pytest.param(*BAD_SLIDE_VALUES[1], marks=pytest.mark.slow)])
def test_bad_slide_values_are_one_line(run_launch, tmp_path, field, value, message):
    p = run_launch("--config=configs/slide_amazon.py", f"--config.{field}={value}", f"--workdir={tmp_path / 'w'}")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and message in p.stderr, p.stderr


@pytest.mark.parametrize("field, value, message", BAD_SLIDE_VALUES + [
    ("train.adam_eps", 0.0, "train.adam_eps=0.0 must be positive"),
    ("train.moments_dtype", "fp16", "train.moments_dtype='fp16' is not one of 'fp32', 'bf16'"),
    # The hash family's own checks (hashes.OptionError), named by the config field they came from:
    ("lsh.num_hashes", 31, "lsh.num_hashes=31 gives more than 2**30 buckets per table"),
    ("lsh.simhash.density", 1.5, "lsh.simhash.density=1.5 must be in (0, 1]"),
    ("lsh.simhash.dtype", "fp16", "lsh.simhash.dtype='fp16' must be one of fp32, bf16"),
    ("eval.lsh.num_hashes", 31, "eval.lsh.num_hashes=31 gives more than 2**30 buckets per table")])
def test_bad_slide_values_fail_validation(field, value, message):
    from configs.slide_amazon import get_config

    config = get_config()
    *groups, name = field.split(".")
    group = config
    for g in groups:
        group = group[g]
    group[name] = value
    runner.validate(config)  # the fields every experiment has are fine; the experiment's own checks are not
    with pytest.raises(ConfigError) as error:
        experiments.get(config.experiment).validate(config)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("fields, message", [
    ({"lsh.kind": "simhash_pairs", "lsh.num_hashes": 5}, "lsh.num_hashes=5 must be even"),
    ({"lsh.kind": "dwta", "lsh.dwta.bin_size": 200}, "lsh.dwta.bin_size=200 must be between 2 and min(dim=128, 128)"),
    ({"eval.lsh.kind": "dwta", "lsh.dwta.bin_size": 129}, "lsh.dwta.bin_size=129 must be between 2 and min(dim=130"),
    ({"lsh.kind": "dwta", "lsh.num_hashes": 11}, "lsh.num_hashes=11 gives bin_size**num_hashes = 8**11 buckets")])
def test_a_hash_family_refuses_its_sizes_and_options_at_validation(fields, message):
    from configs.slide_amazon import get_config

    config = get_config()
    for field, value in fields.items():
        config.update_from_flattened_dict({field: value})
    with pytest.raises(ConfigError, match=re.escape(message)):
        experiments.get(config.experiment).validate(config)
    config.model.method = "sampled"  # no tables: nothing to refuse
    experiments.get(config.experiment).validate(config)


@pytest.mark.slow
def test_p_at_1_plot_over_time_and_epochs(lsh_run, tmp_path):
    from hwrepro.study import report
    from hwrepro.study.report import figures

    workdir, _ = lsh_run
    out = figures.time_to_accuracy([workdir], tmp_path / "p1.png")
    assert out.stat().st_size > 10_000  # two panels with a curve each (an empty figure is ~5 KB)
    assert report.main(["--time-to-accuracy", str(tmp_path / "p.png"), str(tmp_path / "nothing")]) == 2


def test_p_at_1_plot_of_a_run_written_by_hand(tmp_path):
    """The plot of the test above, from a run folder holding what a run writes for it."""
    from hwrepro.study import report
    from hwrepro.study.report import figures

    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "run.json").write_text(json.dumps({"name": "lsh_tiny"}))
    rows = [{"step": s, "epoch": s / 40, "train_seconds": s / 8, "eval_P@1": p}
            for s, p in ((40, 0.2), (80, 0.45), (120, 0.6), (160, 0.7))]
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = figures.time_to_accuracy([workdir], tmp_path / "p1.png")
    assert out.stat().st_size > 10_000  # two panels with a curve each (an empty figure is ~5 KB)
    assert report.main(["--time-to-accuracy", str(tmp_path / "p.png"), str(tmp_path / "nothing")]) == 2


def test_more_candidates_than_labels_is_a_config_error(tmp_path):
    from hwrepro.errors import ConfigError

    config = tiny_config()
    config.model.num_candidates = 10_000  # the tiny data set has 300 labels
    with pytest.raises(ConfigError, match="num_candidates=10000 exceeds the 300 labels"):
        runner.run_here(config, tmp_path / "w", quiet=True)


def test_plot_labels_tell_runs_of_one_config_apart(tmp_path):
    from hwrepro.study.report import figures

    for folder, name in (("dwta", "lsh_amazon670k"), ("simhash", "lsh_amazon670k"), ("s", "sampled_amazon670k")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "run.json").write_text(json.dumps({"name": name}))
    labels = figures.run_labels([tmp_path / f for f in ("dwta", "simhash", "s")])
    assert labels == ["lsh_amazon670k (dwta)", "lsh_amazon670k (simhash)", "sampled_amazon670k"]


# ------------------------------------------------------------------------------------------- the kept model


def _final_eval_file(tmp_path, config):
    """The points of a tiny run's final evaluation, written as an XC file (what a user would predict)."""
    test = xc.synthetic("tiny", seed=config.data.seed)[1]
    if config.eval.final_points:
        test = xc.fixed_subset(test, config.eval.final_points, config.data.seed)
    xc.write_xc(tmp_path / "test.txt", test)
    return tmp_path / "test.txt", test


@pytest.mark.slow
def test_predict_from_the_command_line_scores_as_the_run_evaluated(lsh_run, tmp_path, run_launch, capsys,
                                                                  monkeypatch):
    """A fresh process loads the model the run kept and scores the run's own test points: the same P@k as the
    run's dense evaluation (printed), one line a point of k `id:score`, best first; LSH-scored, the same P@k
    as the run's LSH-scored evaluation (its inference tables rebuilt alike)."""
    from hwrepro.harness import launcher, trained

    workdir, final = lsh_run
    assert final["model_bytes"] == sum(p.stat().st_size for p in (workdir / "model").rglob("*") if p.is_file())
    path, test = _final_eval_file(tmp_path, tiny_config())
    out = tmp_path / "pred.txt"
    p = run_launch(f"--workdir={workdir}", f"--predict={path}", f"--output={out}", "--k=3")
    assert p.returncode == 0, p.stderr[-2000:]
    printed = dict(re.findall(r"(P@\d) ([\d.]+)", p.stdout))
    assert {k: float(v) for k, v in printed.items()} == pytest.approx(
        {f"P@{k}": final[f"test_P@{k}"] for k in (1, 3, 5)}, abs=1e-4)
    assert re.search(r"predict test.txt\] batch (\d+)/\1 \(100%\)", p.stderr)
    lines = out.read_text().splitlines()
    assert len(lines) == test.num_points and all(len(line.split()) == 3 for line in lines)
    scores = [float(t.split(":")[1]) for t in lines[0].split()]
    assert scores == sorted(scores, reverse=True)
    again = run_launch(f"--workdir={workdir}", f"--predict={path}", f"--output={out}")
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        f"error: --output={out} exists; choose another path or add --overwrite"]
    assert out.read_text().splitlines() == lines
    capsys.readouterr()
    assert launcher.predict(str(workdir), str(path), str(out), lsh=True, overwrite=True) == 0
    printed = dict(re.findall(r"(P@\d) ([\d.]+)", capsys.readouterr().out))
    assert {k: float(v) for k, v in printed.items()} == pytest.approx(
        {f"P@{k}": final[f"test_lsh_P@{k}"] for k in (1, 3, 5)}, abs=1e-4)
    model = trained.load(workdir)
    assert model.predictor(k=5, lsh=True) is model.predictor(lsh=True)  # tables built once (k=5: the default)
    # On a machine whose "auto" resolves otherwise, the kept model hashes as the run's machine did.
    here = simhash.resolve_dtype("auto")
    assert final["config_resolved"] == {"lsh.simhash.dtype": here} and model.config.lsh.simhash.dtype == here
    batch = next(xc.XCBatcher(test, 32, 8).ordered(256))
    ids = model.predict(batch, lsh=True)[1]
    other = {"fp32": "bf16", "bf16": "fp32"}[here]
    monkeypatch.setattr(simhash, "resolve_dtype", lambda d: other if d == "auto" else d)
    np.testing.assert_array_equal(trained.load(workdir).predict(batch, lsh=True)[1], ids)


def _running(folder: Path) -> bool:
    """Whether a run's process (hwrepro.harness.process FOLDER...) is alive."""
    from conftest import running

    return running(f"hwrepro.harness.process {folder}")
@pytest.mark.slow
def test_predict_command_on_another_platform_with_damaged_records_and_when_stopped(lsh_run, tmp_path, run_launch):
    """The command's own process: a model trained for a GPU scores on this CPU with --platform=cpu (without it,
    one line saying so, exit 3); a damaged config.json is one line naming it (exit 2); SIGTERM stops it (and
    the child it runs in for the allocator settings) with exit 1, leaving no output, temporary or final."""
    import shutil
    import signal
    import time

    from conftest import launch_process, running

    workdir, final = lsh_run
    path, test = _final_eval_file(tmp_path, tiny_config())
    gpu = tmp_path / "gpu"
    shutil.copytree(workdir, gpu)
    config = json.loads((gpu / "config.json").read_text())
    (gpu / "config.json").write_text(json.dumps(dict(config, numerics=dict(config["numerics"], platform="gpu"))))
    out = tmp_path / "out.txt"
    if not shutil.which("nvidia-smi"):
        p = run_launch(f"--workdir={gpu}", f"--predict={path}", f"--output={out}")
        assert p.returncode == 3 and not out.exists(), p.stderr[-2000:]
        line, = p.stderr.strip().splitlines()
        assert line.startswith("error: numerics.platform='gpu' is not available here") and line.endswith(
            "; --platform=cpu scores on this machine's CPU"), line
    p = run_launch(f"--workdir={gpu}", f"--predict={path}", f"--output={out}", "--platform=cpu")
    assert p.returncode == 0, p.stderr[-2000:]
    assert float(re.search(r"P@1 ([\d.]+)", p.stdout).group(1)) == pytest.approx(final["test_P@1"], abs=1e-4)
    (gpu / "config.json").write_text("{")
    p = run_launch(f"--workdir={gpu}", f"--predict={path}", f"--output={tmp_path / 'none.txt'}")
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        f"error: {gpu / 'config.json'} is unreadable (Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1)): the run folder is damaged"]
    many = tmp_path / "many.txt"  # the test points 400 times: seconds of scoring
    lines = path.read_text().splitlines()
    many.write_text("\n".join([lines[0].replace(str(test.num_points), str(400 * test.num_points), 1)]
                              + lines[1:] * 400) + "\n")
    stopped = tmp_path / "stopped.txt"
    proc = launch_process(f"--workdir={workdir}", f"--predict={many}", f"--output={stopped}")
    deadline = time.time() + 120
    while not list(tmp_path.glob("stopped.txt.tmp*")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "error: interrupted by SIGTERM" in err, err[-2000:]
    assert not stopped.exists() and not list(tmp_path.glob("stopped.txt*"))
    time.sleep(0.5)
    assert not running(f"--output={stopped}")  # neither the command nor the process it restarted itself in


@pytest.mark.slow
def test_predict_refuses_bad_input_in_one_line_and_writes_nothing(lsh_run, tmp_path):
    import shutil

    from hwrepro.harness import launcher

    workdir, _ = lsh_run
    good = tmp_path / "points.txt"
    good.write_text("5:0.5 7:1\n")
    bad_id = tmp_path / "bad_id.txt"
    bad_id.write_text("5:0.5 7:1\n3 2000:1.0\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    malformed = tmp_path / "malformed.txt"
    malformed.write_text("5:0.5\n\n1:2:3\n")
    unfinished = tmp_path / "unfinished"
    shutil.copytree(workdir, unfinished)
    run = json.loads((unfinished / "run.json").read_text())
    (unfinished / "run.json").write_text(json.dumps(dict(run, status="interrupted: SIGTERM at step 40")))
    truncated = tmp_path / "truncated"
    shutil.copytree(workdir, truncated)
    biggest = max((p for p in (truncated / "model").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 2])
    newer = tmp_path / "newer"
    shutil.copytree(workdir, newer)
    info = json.loads((newer / "model" / "model.json").read_text())
    (newer / "model" / "model.json").write_text(json.dumps(dict(info, format=99, hwrepro="9.0")))
    no_model = tmp_path / "no_model"
    shutil.copytree(workdir, no_model, ignore=shutil.ignore_patterns("model"))
    config = json.loads((no_model / "config.json").read_text())
    config["train"]["keep_model"] = False
    (no_model / "config.json").write_text(json.dumps(config))
    cases = [(tmp_path / "nowhere", good, "is not a run folder"),
             (unfinished, good, "holds an unfinished run (status 'interrupted: SIGTERM at step 40')"),
             (no_model, good, "it was trained with train.keep_model=False"),
             (truncated, good, "damaged"),
             (newer, good, "has model format 99, this hwrepro (0.1.0) reads format 1"),
             (workdir, bad_id, f"{bad_id}:2: feature index 2000 >= number of features 2000 (the model's)"),
             (workdir, malformed, f"{malformed}:3: bad feature token '1:2:3'"),
             (workdir, tmp_path / "missing.txt", "no such file"),
             (workdir, tmp_path, "is a folder: give a file of points"),
             (workdir, empty, f"{empty}: no points")]
    no_final = tmp_path / "no_final"
    shutil.copytree(workdir, no_final)
    (no_final / "final.json").write_text("{")
    cases.append((no_final, good, "final.json is unreadable (Expecting property name"))
    out = tmp_path / "out.txt"
    for folder, points, message in cases:
        with pytest.raises(Exception) as e:
            launcher.predict(str(folder), str(points), str(out))
        assert message in str(e.value) and "\n" not in str(e.value), (folder, str(e.value))
        assert runner.report_error(e.value) == runner.EXIT_BAD_INPUT
        assert not out.exists() and not list(tmp_path.glob("out.txt.tmp*"))
    inside = workdir / "final.json"
    before = inside.read_text()
    for options, message in [(dict(output=str(inside), overwrite=True), "is inside the run folder"),
                             (dict(output=str(out), k=301), "k=301 must be between 1 and the model's 300 labels")]:
        with pytest.raises(Exception, match=message) as e:
            launcher.predict(str(workdir), str(good), **{"output": str(out), **options})
        assert runner.report_error(e.value) == runner.EXIT_BAD_INPUT
    assert inside.read_text() == before and not out.exists()


@pytest.mark.slow
def test_fine_tuning_starts_from_a_finished_runs_parameters(lsh_run, tmp_path):
    workdir, final = lsh_run
    c = tiny_config("lsh")
    c.train.num_epochs, c.train.num_steps, c.train.log_every = 1, 20, 20
    c.train.init_from = str(workdir)
    tuned = runner.run_here(c, tmp_path / "tuned", quiet=True)
    run = json.loads((tmp_path / "tuned" / "run.json").read_text())
    assert run["init_from"]["param_sha256"] == final["param_sha256"]
    first = lambda w: json.loads((w / "metrics.jsonl").read_text().splitlines()[0])["loss"]  # noqa: E731
    assert first(tmp_path / "tuned") < 0.8 * first(workdir)
    assert tuned["test_P@1"] > 0.5
    c.model.hidden = 16
    with pytest.raises(ConfigError, match=r"train.init_from=.*its parameters do not fit this config's model "
                                          r"\(\['input'\]\['bias'\]: float32 \[32\] there, float32 \[16\] here\)"):
        runner.run_here(c, tmp_path / "refused", quiet=True)
    assert [p.name for p in (tmp_path / "refused").iterdir()] == [".lock"]  # no record of a refused run
