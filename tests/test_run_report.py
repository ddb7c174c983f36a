"""A run's report.html, the time accounting behind it and the progress line, TensorBoard event files: on run
folders written by hand (every number known), plus one tiny real run (slow)."""

import io
import json
import re

import pytest

from configs import autoencoder_mnist
from hwrepro.harness import progress, records, runner, timing
from hwrepro.study import report
from hwrepro.study.report import pages, runs, svg

SHA = "ab" * 32


def _write_run(workdir, name="ae", lines=None, final=True, status="done", steps=40, argv=None):
    """A run folder as a run leaves it: its config differs from configs/autoencoder_mnist.py in num_steps."""
    workdir.mkdir(parents=True)
    config = autoencoder_mnist.get_config()
    config.name = name
    config.train.num_steps = steps
    records.write_config(workdir, config)
    records.write_json_atomic(workdir / "run.json", {
        "status": status, "name": name, "experiment": "autoencoder", "start_time": "2026-12-07T00:00:00+00:00",
        "resumes": 0, "versions": {"jax": "0.10.2"}, "cpu": {"model": "Hand CPU", "logical_cores": 2},
        "argv": argv or ["launch.py", "--config=configs/autoencoder_mnist.py", f"--config.train.num_steps={steps}"]})
    rows = lines if lines is not None else [
        {"step": 10, "seconds": 3.0, "loss": 0.6, "train_seconds": 2.0, "compile_seconds": 1.5,
         "rebuild_seconds": 0.0, "evaluation_seconds": 0.0, "checkpoint_seconds": 0.0},
        {"step": 20, "seconds": 5.0, "loss": 0.5, "eval_loss": 0.55, "train_seconds": 3.0, "compile_seconds": 1.5,
         "rebuild_seconds": 0.5, "evaluation_seconds": 1.0, "checkpoint_seconds": 0.25}]
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if final:
        records.write_json_atomic(workdir / "final.json", {"test_loss": 0.55, "wall_seconds": 10.0,
                                                           "param_sha256": SHA})
    return workdir


def test_time_split_of_a_run_by_hand(tmp_path):
    """Steps are train_seconds less compilation and rebuilds; other is the wall time left over."""
    split = runs.time_split(runs.load_run(_write_run(tmp_path / "w")))
    assert split == {"steps": 1.0, "compile": 1.5, "rebuilds": 0.5, "evaluation": 1.0, "checkpoints": 0.25,
                     "other": 10.0 - 4.25}
    assert timing.shares_text({"steps": 3.0, "compile": 1.0, "rebuilds": 0.0}) == "steps 75% compile 25%"
    assert timing.loop_fields({"compile_seconds": 2.0}, {"rebuild_seconds": 1.0, "refile_seconds": 0.5}) == {
        "compile_seconds": 2.0, "rebuild_seconds": 1.5, "evaluation_seconds": 0.0, "checkpoint_seconds": 0.0}


def test_run_report_shows_curves_final_metrics_time_config_and_environment(tmp_path, capsys):
    workdir = _write_run(tmp_path / "w")
    assert report.main(["--html", str(workdir)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {workdir / 'report.html'}"
    page = (workdir / "report.html").read_text()
    # loss and evaluation loss, each against step and training time, and the share bar
    assert page.count("<svg") == 5 and "loss (evaluation) against step" in page
    assert SHA in page and "Hand CPU" in page and "0.10.2" in page
    # the config against the config file it was launched with: only the changed fields
    assert "compared with autoencoder_mnist.py's get_config()" in page
    changed = re.findall(r"<tr><td><code>([^<]+)</code></td><td>([^<]+)</td><td>([^<]+)</td></tr>", page)
    assert changed == [("name", "autoencoder_mnist", "ae"), ("train.num_steps", "0", "40")]
    assert "<td>other</td><td>5.75</td><td>57.5%</td>" in page


def test_a_truncated_metrics_file_still_gets_a_report_that_says_so(tmp_path):
    workdir = _write_run(tmp_path / "w", final=False, status="interrupted: SIGTERM at step 20 of 40")
    with open(workdir / "metrics.jsonl", "a") as f:
        f.write('{"step": 30, "seconds": 7.0, "lo')  # a write cut off by a kill
    runner.write_run_report(workdir, quiet=True)
    page = (workdir / "report.html").read_text()
    assert "1 line(s) do not parse" in page and "the 2 line(s) that do" in page
    assert "interrupted: SIGTERM" in page and "No final.json" in page


def test_html_of_a_folder_that_is_not_a_run_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert report.main(["--html", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path / 'empty'} is not a run folder (no readable run.json)\n"


def test_one_runs_page_goes_where_out_says(tmp_path):
    a = _slide_like(tmp_path / "a", "a", (0.1, 0.2, 0.3), 0.1)
    assert report.main(["--html", str(a), "--out", str(tmp_path / "page.html")]) == 0
    assert "P@1 (evaluation) against training time" in (tmp_path / "page.html").read_text()
    assert not (a / "report.html").exists()


def test_the_report_commands_bad_paths_are_one_line_exit_2(tmp_path, capsys):
    a = _slide_like(tmp_path / "a", "a", (0.1, 0.2, 0.3), 0.1)
    no_run_json = tmp_path / "m"
    no_run_json.mkdir()
    (no_run_json / "metrics.jsonl").write_text('{"step": 1, "eval_P@1": 0.5}\n')
    for argv, message in [
            (["--html", str(a), str(a), "--out", str(tmp_path / "no" / "x.html")], "cannot write"),
            (["--time-to-accuracy", str(tmp_path / "p.png"), str(no_run_json)], "not a run folder"),
            (["--time-to-accuracy", str(tmp_path / "no" / "p.png"), str(a)], "No such file or directory")]:
        assert report.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def _slide_like(workdir, name, p_at_1, seconds_per_step):
    rows = [{"step": s, "seconds": s * seconds_per_step + 1, "train_seconds": s * seconds_per_step, "loss": 1 / s,
             "eval_P@1": p} for s, p in zip((10, 20, 30), p_at_1)]
    return _write_run(workdir, name=name, lines=rows, argv=["x"])


def test_several_runs_are_overlaid_on_one_page(tmp_path):
    a = _slide_like(tmp_path / "lsh", "lsh", (0.1, 0.2, 0.3), 0.1)
    b = _slide_like(tmp_path / "dense", "dense", (0.15, 0.25, 0.35), 10.0)
    out = tmp_path / "both.html"
    assert report.main(["--html", str(a), str(b), "--out", str(out)]) == 0
    page = out.read_text()
    charts = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    p1_by_time = next(c for c in charts if "P@1 (evaluation) against training time" in c)
    assert p1_by_time.count("<polyline") == 2 and ">lsh<" in p1_by_time and ">dense<" in p1_by_time
    assert "training time (s) (log scale)" in p1_by_time  # 3 s against 300 s: one log axis for both
    # the runs' configs compared with each other: only the name differs
    assert re.search(r"<td><code>name</code></td><td>lsh</td><td>dense</td>", page)


def test_the_page_loads_nothing(tmp_path):
    page = pages.run_report([_write_run(tmp_path / "w")])
    assert "default-src 'none'" in page and not re.search(r"(src|href)=\"(?!data:)", page)
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page)  # the SVG namespace is a name, not a fetch


def test_markdown_subset_to_html():
    text = "# T\n\n| a | b |\n|---|---|\n| `x\\|y` | 1<br>2 |\n\n- **bold** <i>\n\n![f](fig)"
    out = pages.markdown_html(text, {"fig": "<svg></svg>"})
    assert out == ("<h1>T</h1>\n<table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td><code>x|y</code>"
                   "</td><td>1<br>2</td></tr></tbody></table>\n<ul><li><strong>bold</strong> &lt;i&gt;</li></ul>\n"
                   "<figure><svg></svg></figure>")


def test_ticks_are_round_and_cover_the_range():
    assert svg.nice_ticks(0.13, 0.91) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert svg.log_ticks(3.0, 300.0) == [1.0, 10.0, 100.0, 1000.0]
    # A flat curve far from zero (a diverged but finite loss): one tick, a range around it all the same.
    chart = svg.line_chart([svg.Series("run", [1.0, 2.0], [8.5e17, 8.5e17])], "loss", "step", "loss")
    assert chart.count("<polyline") == 1 and "nan" not in chart


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_eta_leaves_out_the_warm_up_and_the_line_says_where_time_went(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(progress.time, "time", clock)
    out = io.StringIO()
    p = progress.Progress(1000, "run", interval=0.0, stream=out)
    clock.now = 130.0  # 30 s of compilation and the first 50 steps
    p.update(50, loss=0.5)
    clock.now = 140.0  # then 100 steps in 10 s: 850 left at 10 steps/s
    p.update(150, seconds={"steps": 8.0, "compile": 30.0, "evaluation": 2.0, "checkpoints": 0.0}, loss=0.4)
    first, second = out.getvalue().splitlines()
    assert first == "[run] step 50/1000 (5%) ETA – loss 0.5"
    assert second == ("[run] step 150/1000 (15%) 10.0 steps/s ETA 0:01:25 loss 0.4 "
                      "| time: steps 20% compile 75% evaluation 5%")


def test_tensorboard_events_read_back_with_tensorboard(tmp_path):
    pytest.importorskip("tensorboardX", reason="tensorboardX is not installed: pip install -e '.[tensorboard]'")
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                      reason="tensorboard is not installed: pip install -e '.[test]'")
    config = autoencoder_mnist.get_config()
    config.log.tensorboard = True
    workdir = tmp_path / "w"
    workdir.mkdir()
    rec = records.Run.start(workdir, config, {}, quiet=True)
    rec.log(1, loss=0.5, **{"eval_P@1": 0.1, "train_seconds": 1.0})
    rec.log(2, loss=0.4)
    rec.rewind(1)  # a resumed run redoes step 2: the first step-2 event must not stay
    rec.log(2, loss=0.3)
    rec.close()
    events = accumulator.EventAccumulator(str(workdir / "tb"))
    events.Reload()
    scalars = lambda tag: [(e.step, pytest.approx(e.value)) for e in events.Scalars(tag)]
    assert scalars("train/loss") == [(1, 0.5), (2, 0.3)]
    assert scalars("eval/P_1") == [(1, 0.1)] and scalars("time/train_seconds") == [(1, 1.0)]


@pytest.mark.slow
def test_a_real_run_with_its_report_broken_is_still_done_and_the_report_rebuilds(tmp_path, monkeypatch, capsys):
    """A tiny autoencoder run whose report writer fails: the run is still done, one line says how to rebuild
    the report, and the rebuilt one reads the loop's timing from the metrics lines."""
    config = autoencoder_mnist.get_config()
    config.train.update(num_steps=6, log_every=3, batch_size=8)

    def broken(workdir):
        raise OSError("disk full")

    monkeypatch.setattr(report, "write_run_report", broken)
    runner.run_here(config, tmp_path / "w", quiet=True)
    assert records.status_of(tmp_path / "w") == "done" and not (tmp_path / "w" / "report.html").exists()
    assert capsys.readouterr().err.splitlines()[-1] == ("report.html not written (OSError: disk full); rebuild it "
                                                        f"with `python -m hwrepro.study.report --html {tmp_path / 'w'}`")
    rows = records.read_metrics(tmp_path / "w")
    assert rows[0]["compile_seconds"] > 0 and rows[-1]["evaluation_seconds"] > 0
    monkeypatch.undo()
    assert report.main(["--html", str(tmp_path / "w")]) == 0
    page = (tmp_path / "w" / "report.html").read_text()
    assert "compared with autoencoder_mnist.py's get_config()" in page  # the closest config file
