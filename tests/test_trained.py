"""A finished run keeps its model (hwrepro.harness.trained): saved in the workdir, loaded back in other code,
refused in one line when it is not usable; fine-tuning from it; the public API's names all import."""

import importlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import hwrepro
from hwrepro.errors import ConfigError, ModelError
from hwrepro.harness import runner

REPO = Path(__file__).resolve().parent.parent


def tiny_autoencoder(**train):
    from configs.autoencoder_mnist import get_config

    c = get_config()
    c.model.encoder_sizes = (8,)
    c.data.num_train, c.data.num_test = 256, 64
    c.train.update(dict(batch_size=32, num_steps=6, log_every=3), **train)
    return c


@pytest.fixture(scope="module")
def autoencoder_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("trained") / "ae"
    return workdir, runner.run_here(tiny_autoencoder(), workdir, quiet=True)


def test_a_finished_run_keeps_its_model_and_load_gives_it_back(autoencoder_run):
    workdir, final = autoencoder_run
    model = hwrepro.load(workdir)
    assert final["model_bytes"] == sum(p.stat().st_size for p in (workdir / "model").rglob("*") if p.is_file())
    assert model.config.experiment == "autoencoder" and list(model.config.model.encoder_sizes) == [8]
    assert model.final["param_sha256"] == final["param_sha256"]
    assert model.params["enc0"]["kernel"].shape == (784, 8)
    # The experiment's own prediction: the model's reconstructions, as applying the Flax module gives them.
    from hwrepro.experiments.autoencoder import make_model

    x = np.random.default_rng(0).random((5, 784)).astype(np.float32)
    logits = make_model(model.config).apply({"params": model.params}, x)
    np.testing.assert_allclose(model.predict(x), 1 / (1 + np.exp(-np.asarray(logits))), rtol=1e-5, atol=1e-6)


def test_a_save_cut_short_leaves_no_temporary_model(autoencoder_run, tmp_path, monkeypatch):
    from hwrepro.harness import interrupts, records, trained

    params = hwrepro.load(autoencoder_run[0]).params
    stale = tmp_path / ".model.tmp1"  # an earlier process's save, killed: removed by the next save
    stale.mkdir()
    (stale / "part").write_bytes(b"x")

    def stopped(path, obj):
        raise interrupts.Interrupted("SIGTERM")
    with monkeypatch.context() as m:  # a signal while model.json is written, after the parameters
        m.setattr(records, "write_json_atomic", stopped)
        with pytest.raises(interrupts.Interrupted):
            trained.save(tmp_path, "autoencoder", params)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert trained.save(tmp_path, "autoencoder", params) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.slow
def test_keep_model_false_keeps_none_and_load_says_why(tmp_path):
    runner.run_here(tiny_autoencoder(keep_model=False), tmp_path / "ae", quiet=True)
    assert not (tmp_path / "ae" / "model").exists()
    assert "model_bytes" not in json.loads((tmp_path / "ae" / "final.json").read_text())
    with pytest.raises(ModelError, match="keeps no model .*it was trained with train.keep_model=False"):
        hwrepro.load(tmp_path / "ae")


def test_damaged_or_foreign_model_files_are_refused_in_one_line(autoencoder_run, tmp_path):
    workdir, _ = autoencoder_run

    def copy(name):
        shutil.copytree(workdir, tmp_path / name)
        return tmp_path / name

    cut = copy("cut")
    biggest = max((p for p in (cut / "model").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[:100])
    flipped = copy("flipped") / biggest.relative_to(cut)  # same size, one byte of a parameter changed
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    foreign = copy("foreign")
    info = json.loads((foreign / "model" / "model.json").read_text())
    (foreign / "model" / "model.json").write_text(json.dumps(dict(info, format=2, hwrepro="0.2.0")))
    running = copy("running")
    run = json.loads((running / "run.json").read_text())
    (running / "run.json").write_text(json.dumps(dict(run, status="running")))
    no_final = copy("no_final")
    (no_final / "final.json").unlink()
    cases = [(cut, "damaged"), (tmp_path / "flipped", "damaged"), (foreign, "model format 2, this hwrepro (0.1.0) reads format 1"),
             (running, "unfinished run (status 'running')"), (tmp_path / "nothing", "not a run folder"),
             (no_final, "holds no final.json")]
    for folder, message in cases:
        with pytest.raises(ModelError) as e:
            hwrepro.load(folder)
        assert message in str(e.value) and "\n" not in str(e.value), (folder.name, str(e.value))


@pytest.mark.slow
def test_init_from_starts_from_a_finished_run_and_refuses_another_shape(autoencoder_run, tmp_path):
    workdir, final = autoencoder_run
    tuned = runner.run_here(tiny_autoencoder(init_from=str(workdir)), tmp_path / "tuned", quiet=True)
    run = json.loads((tmp_path / "tuned" / "run.json").read_text())
    assert run["init_from"] == {"workdir": str(workdir.absolute()), "param_sha256": final["param_sha256"]}
    assert tuned["test_loss"] < final["test_loss"]  # six more steps from where the first run ended
    c = tiny_autoencoder(init_from=str(workdir))
    c.model.encoder_sizes = (4,)
    with pytest.raises(ConfigError, match=re.escape("its parameters do not fit this config's model "
                                                    "(['dec0']['kernel']: float32 [8, 784] there, float32 [4, 784] here)")):
        runner.run_here(c, tmp_path / "refused", quiet=True)
    assert [p.name for p in (tmp_path / "refused").iterdir()] == [".lock"]
    for missing in (tmp_path / "nowhere", tmp_path / "refused"):
        with pytest.raises(ConfigError, match="train.init_from=.*: .* (is not a run folder|holds an unfinished run)"):
            runner.validate(tiny_autoencoder(init_from=str(missing)))


def test_every_public_name_imports_and_readme_uses_only_public_names():
    for name in hwrepro.PUBLIC_API:
        module, _, attr = name.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), name
    readme = (REPO / "README.md").read_text()
    usage = readme[readme.index("## Using a trained model"):readme.index("## Layout")]
    used = set(re.findall(r"\b(sparse(?:\.lsh|\.sparse_adam)?\.[A-Za-z_]\w*)\(", usage))
    assert used and all(f"hwrepro.{name}" in hwrepro.PUBLIC_API for name in used), sorted(used)
    assert "hwrepro.load(" in usage
