"""Moving MNIST from MNIST-format digits: trajectories that bounce, frames that hold the digits where the
trajectories say, determinism per seed, and the "moving_mnist" data set through the registry and PredNet."""

import gzip
import json

import numpy as np
import pytest

from hwrepro import data
from hwrepro.data import moving_mnist, video
from hwrepro.errors import DataError


def digits(n=6, seed=0):
    """Random 28x28 'digits', every pixel non-zero, so a misplaced digit shows everywhere in its square."""
    return np.random.default_rng(seed).integers(1, 256, (n, 28, 28)).astype(np.uint8)


def test_trajectories_stay_inside_and_bounce():
    corners = moving_mnist.trajectories(np.random.default_rng(0), 50, 40, 2, 64, 0.1)
    assert corners.shape == (50, 40, 2, 2) and corners.min() == 0 and corners.max() == 36
    steps = np.abs(np.diff(corners, axis=1))
    assert steps.max() <= 4                                   # 0.1 of the 36-pixel range, rounded
    speed = np.hypot(*np.moveaxis(np.diff(corners, axis=1), -1, 0).astype(float))
    assert 3.0 < np.median(speed) < 4.2                       # 3.6 pixels per frame, away from the borders
    turned = (np.diff(np.sign(np.diff(corners[..., 0], axis=1)), axis=1) != 0).any()
    assert turned                                             # some digit reverses direction: a bounce


def test_frames_hold_the_digits_at_their_corners():
    images = digits()
    videos = moving_mnist.generate(images, num_videos=5, seed=3, num_frames=6, num_digits=2, chunk_videos=2)
    assert videos.shape == (5, 6, 64, 64) and videos.dtype == np.uint8
    rng = np.random.default_rng(3)                            # the generator's draws, in its order
    chosen = rng.integers(0, len(images), (5, 2))
    corners = moving_mnist.trajectories(rng, 5, 6, 2, 64, 0.1)
    expected = np.zeros((5, 6, 64, 64), np.uint8)
    for v in range(5):                                        # by hand: paste each digit, brighter wins
        for t in range(6):
            for k in range(2):
                y, x = corners[v, t, k]
                window = expected[v, t, y:y + 28, x:x + 28]
                np.maximum(window, images[chosen[v, k]], out=window)
    np.testing.assert_array_equal(videos, expected)
    np.testing.assert_array_equal(videos, moving_mnist.generate(images, 5, seed=3, num_frames=6))
    assert not np.array_equal(videos, moving_mnist.generate(images, 5, seed=4, num_frames=6))


def write_csv(path, n=40, seed=0):
    rng = np.random.default_rng(seed)
    rows = np.concatenate([rng.integers(0, 256, (n, 784)), np.arange(n)[:, None] % 10], axis=1)
    with gzip.open(path, "wt") as f:
        f.write("\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return path


def small_config(csv_path, **data_fields):
    from configs.prednet_moving_mnist import get_config

    c = get_config()
    c.data.update(dict(source="csv", dir=str(csv_path), **data_fields))
    c.data.moving_mnist.update(num_videos=6, eval_videos=3)
    return c


def test_data_set_by_name_from_a_csv_of_digits(tmp_path):
    path = write_csv(tmp_path / "digits.csv.gz")
    splits = data.load(small_config(path), "video")
    assert splits.train.frames.shape == (6 * 20, 32, 32, 1) and splits.test.frames.shape == (3 * 20, 32, 32, 1)
    assert len(set(splits.train.sources)) == 6 and list(splits.train.sources[:20]) == [splits.train.sources[0]] * 20
    assert f"CSV {path}" in splits.train.source and "training images" in splits.train.source
    assert "test images" in splits.test.source and not np.array_equal(splits.val.frames, splits.test.frames)
    full = data.load(small_config(path, image_size=(64, 64)), "video")
    assert full.train.frames.shape == (120, 64, 64, 1)                 # the same videos, not scaled
    np.testing.assert_array_equal(splits.train.frames, video.fit_frames(full.train.frames, (32, 32)))
    with pytest.raises(DataError, match="moving_mnist is greyscale: data.channels must be 1"):
        data.load(small_config(path, channels=3), "video")
    with pytest.raises(DataError, match="data.source=csv needs data.dir to be the CSV file"):
        data.load(small_config(tmp_path / "missing.csv"), "video")


def test_any_prednet_config_takes_moving_mnist_by_name(tmp_path, monkeypatch):
    from configs.prednet_small import get_config

    c = get_config()                                   # no data.moving_mnist group: the generator's defaults
    c.data.update(dataset="moving_mnist", source="csv", dir=str(write_csv(tmp_path / "d.csv.gz")))
    monkeypatch.setitem(moving_mnist.DEFAULTS, "num_videos", 4)
    splits = data.load(c, "video")
    assert splits.train.frames.shape == (4 * 20, 32, 32, 1) and len(set(splits.test.sources)) == 100


@pytest.mark.slow
def test_prednet_trains_on_moving_mnist(tmp_path):
    from hwrepro.harness import runner

    config = small_config(write_csv(tmp_path / "digits.csv.gz"), nt=4, num_val_clips=4)
    config.train.num_steps, config.train.batch_size, config.train.log_every = 4, 4, 2
    final = runner.run_here(config, tmp_path / "run", quiet=True)
    assert np.isfinite(final["test_mse"]) and final["test_mse_copy_last"] > 0 and -1 <= final["test_ssim"] <= 1
    assert json.loads((tmp_path / "run" / "run.json").read_text())["data_source"].startswith("Moving MNIST")
