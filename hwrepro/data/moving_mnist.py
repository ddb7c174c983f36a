"""Moving MNIST (Srivastava, Mansimov & Salakhutdinov 2015) from whichever MNIST-format digits are at hand:
data set "moving_mnist" of kind "video" (PredNet).

Each video: `num_digits` 28x28 digits, each starting at a uniform random place of a `canvas` x `canvas` frame
and moving in a uniform random direction by `step` of the free range (canvas - 28) per frame, bouncing off
the borders; overlapping digits take the brighter pixel. Srivastava et al.'s set: 2 digits, 64x64, 20
frames, step 0.1 (3.6 pixels per frame). The digits come from `mnist.load` with the config's data.source and
data.dir (IDX folder, TFDS, the 5,000-digit CSV, Fashion-MNIST's IDX folder, or the synthetic stand-in),
training videos from its training images and validation / test videos from its test images.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hwrepro.data import mnist, register
from hwrepro.data.video import VideoFrames, VideoSplits, fit_frames, triangle_wave
from hwrepro.errors import DataError

DIGIT = 28
SPLIT_SEED_OFFSET = {"train": 0, "val": 1, "test": 2}
# config.data.moving_mnist's fields where a config leaves them out: Srivastava et al.'s set, 2,000 training videos
DEFAULTS = dict(num_videos=2000, eval_videos=100, num_frames=20, num_digits=2, canvas=64, step=0.1)


def trajectories(rng: np.random.Generator, num_videos: int, num_frames: int, num_digits: int, canvas: int,
                 step: float) -> np.ndarray:
    """Top-left corners of every digit in every frame, int64 [num_videos, num_frames, num_digits, 2] (y, x)
    in 0..canvas-28: a uniform start and direction per digit, `step` of the free range per frame, bouncing."""
    span = float(canvas - DIGIT)
    start = rng.uniform(0.0, 1.0, (num_videos, 1, num_digits, 2))
    angle = rng.uniform(0.0, 2 * np.pi, (num_videos, 1, num_digits))
    velocity = step * np.stack([np.sin(angle), np.cos(angle)], axis=-1)   # unit-range per frame
    t = np.arange(num_frames, dtype=np.float64)[None, :, None, None]
    return np.rint(span * triangle_wave(start + velocity * t, 1.0)).astype(np.int64)


def paint(digits: np.ndarray, corners: np.ndarray, canvas: int) -> np.ndarray:
    """Frames uint8 [V, T, canvas, canvas] holding digits uint8 [V, K, 28, 28] at corners [V, T, K, 2].

    Each canvas pixel reads the pixel of each digit under it (0 outside the digit) by one gather over
    [V, T, K, canvas, canvas], then the brightest digit wins.
    """
    pos = np.arange(canvas)
    rows = pos[None, None, None, :] - corners[..., 0, None]                 # [V, T, K, canvas] digit row
    cols = pos[None, None, None, :] - corners[..., 1, None]
    inside = ((rows >= 0) & (rows < DIGIT))[..., :, None] & ((cols >= 0) & (cols < DIGIT))[..., None, :]
    v = np.arange(len(digits))[:, None, None, None, None]
    k = np.arange(digits.shape[1])[None, None, :, None, None]
    pixels = digits[v, k, np.clip(rows, 0, DIGIT - 1)[..., :, None], np.clip(cols, 0, DIGIT - 1)[..., None, :]]
    return np.where(inside, pixels, 0).max(axis=2)


def generate(images: np.ndarray, num_videos: int, seed: int, num_frames: int = 20, num_digits: int = 2,
             canvas: int = 64, step: float = 0.1, chunk_videos: int = 128) -> np.ndarray:
    """uint8 [num_videos, num_frames, canvas, canvas] Moving MNIST videos of `images` uint8 [n, 28, 28].

    Deterministic per seed: digits, starts and directions come from `np.random.default_rng(seed)`, drawn for
    all videos at once; painting goes `chunk_videos` videos at a time to bound the gather's memory.
    """
    if canvas < DIGIT:
        raise DataError(f"Moving MNIST canvas {canvas} is smaller than a {DIGIT}x{DIGIT} digit")
    rng = np.random.default_rng(seed)
    chosen = rng.integers(0, len(images), (num_videos, num_digits))
    corners = trajectories(rng, num_videos, num_frames, num_digits, canvas, step)
    return np.concatenate([paint(images[chosen[i:i + chunk_videos]], corners[i:i + chunk_videos], canvas)
                           for i in range(0, num_videos, chunk_videos)])


def as_video(videos: np.ndarray, name: str, image_size: tuple[int, int], resize: str, source: str) -> VideoFrames:
    """[V, T, c, c] uint8 videos -> VideoFrames [V*T, h, w, 1] fitted to image_size, one source per video."""
    num_videos, num_frames = videos.shape[:2]
    frames = fit_frames(videos.reshape(-1, *videos.shape[2:], 1), image_size, resize)
    return VideoFrames(frames, np.repeat([f"{name}-{v:05d}" for v in range(num_videos)], num_frames), source)


@register("moving_mnist", kind="video", sources=mnist.MNIST_SOURCES)
def load(config: Any) -> VideoSplits:
    """Moving MNIST for PredNet from config.data: source and dir choose the digits (`mnist.load`), seed the
    videos (train, val and test from seed + 0, 1, 2 thousand), `moving_mnist` the generator's fields
    (num_videos, eval_videos, num_frames, num_digits, canvas, step; DEFAULTS for those it lacks, so any PredNet
    config takes --config.data.dataset=moving_mnist); frames fitted to image_size."""
    d = config.data
    if d.channels != 1:
        raise DataError(f"data.dataset=moving_mnist is greyscale: data.channels must be 1, not {d.channels}")
    m = {**DEFAULTS, **dict(d.get("moving_mnist", {}))}
    digits = mnist.load(d.source, d.dir, d.seed)
    pools = {"train": digits.train_images, "val": digits.test_images, "test": digits.test_images}
    shape = {k: m[k] for k in ("num_frames", "num_digits", "canvas", "step")}
    splits = []
    for split, pool in pools.items():
        seed = d.seed + 1000 * SPLIT_SEED_OFFSET[split]
        count = m["num_videos"] if split == "train" else m["eval_videos"]
        desc = (f"Moving MNIST ({count} videos x {m['num_frames']} frames, {m['num_digits']} digits in "
                f"{m['canvas']}x{m['canvas']}, step {m['step']}, seed {seed}) of {digits.source}, "
                f"{'training' if split == 'train' else 'test'} images")
        splits.append(as_video(generate(pool, count, seed, **shape), f"mmnist-{seed}", tuple(d.image_size),
                               d.resize, desc))
    return VideoSplits(*splits)
