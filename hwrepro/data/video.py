"""Video frames for PredNet: video files, folders of frame images, .npz/.hkl frame arrays, or synthetic moving
objects; registered as the data set "video" (kind "video": a `VideoSplits` of train, val and test frames).

Everything is a `VideoFrames`: frames [n, H, W, C] (uint8 0..255, or float32 0..1), a per-frame `sources`
array naming the video each frame belongs to (consecutive frames of one video are consecutive in the
array: the reference KITTI format, X [n, H, W, 3] uint8 + sources [n] strings), and a `source` string for
the run record. Training clips are `nt` consecutive frames that never cross a source boundary.

A video file (.avi, .mp4, ...) is one source, cut in time: its first part trains, the next part validates and
its final part is the held-out test. Files are decoded by ffmpeg through imageio-ffmpeg, an optional extra
(`pip install -e '.[video]'`). Numpy only otherwise (images are decoded with Pillow, which matplotlib already
depends on); no JAX here.
"""

from __future__ import annotations

import re
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import numpy as np

from hwrepro.data import register
from hwrepro.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
VIDEO_SUFFIXES = (".avi", ".mp4", ".mkv", ".mov")
SOURCES = ("auto", "arrays", "folder", "video", "synthetic")  # data.source of the "video" data set
SPLIT_SEED_OFFSET = {"train": 0, "val": 1, "test": 2}  # synthetic splits: disjoint seeds, same generator
START_MODES = ("all", "unique")


@dataclass(frozen=True)
class VideoFrames:
    frames: np.ndarray   # [n, H, W, C] uint8 in 0..255 or float32 in 0..1
    sources: np.ndarray  # [n] str: the video of each frame
    source: str          # where the frames came from (a path, or 'synthetic: ...')


class VideoSplits(NamedTuple):
    """What a data set of kind "video" gives PredNet: training, validation and test frames."""

    train: VideoFrames
    val: VideoFrames
    test: VideoFrames


def to_unit_float(frames: np.ndarray) -> np.ndarray:
    """uint8 0..255 -> float32 0..1 (the reference's X / 255); float input is returned as float32."""
    if frames.dtype == np.uint8:
        return frames.astype(np.float32) / np.float32(255.0)
    return frames.astype(np.float32)


def _area_weights(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] matrix averaging, for each output pixel, the input pixels its footprint overlaps,
    weighted by overlap length (box / 'area' resampling; also valid when upsampling)."""
    edges = np.arange(n_out + 1) * (n_in / n_out)
    lo, hi = edges[:-1, None], edges[1:, None]
    pix = np.arange(n_in)[None, :]
    overlap = np.clip(np.minimum(hi, pix + 1) - np.maximum(lo, pix), 0.0, None)
    return overlap / overlap.sum(axis=1, keepdims=True)


def resize_frames(frames: np.ndarray, size: tuple[int, int], method: str = "area") -> np.ndarray:
    """Resizes [n, H, W, C] to [n, h, w, C] with 'area' (box average) or 'nearest'; keeps the dtype
    (uint8 results are rounded)."""
    n, height, width, _ = frames.shape
    out_h, out_w = size
    if (height, width) == (out_h, out_w):
        return frames
    if method == "nearest":
        rows = np.minimum(((np.arange(out_h) + 0.5) * height / out_h).astype(np.int64), height - 1)
        cols = np.minimum(((np.arange(out_w) + 0.5) * width / out_w).astype(np.int64), width - 1)
        return frames[:, rows][:, :, cols]
    if method != "area":
        raise DataError(f"resize method must be 'area' or 'nearest', got {method!r}")
    wy, wx = _area_weights(height, out_h), _area_weights(width, out_w)
    # One axis at a time: a single three-operand einsum would loop over all of H x W x h x w.
    rows = np.einsum("yh,nhwc->nywc", wy.astype(np.float32), frames.astype(np.float32))
    out = np.einsum("nywc,xw->nyxc", rows, wx.astype(np.float32))
    if frames.dtype == np.uint8:
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return out.astype(frames.dtype)


def fit_frames(frames: np.ndarray, size: tuple[int, int], method: str = "area") -> np.ndarray:
    """Scales [n, H, W, C] so it covers `size` keeping the aspect ratio, then crops the centre to `size`.

    This is the reference KITTI preprocessing (scale to the target height, centre-crop the width); frames
    already of the target aspect ratio are plainly resized.
    """
    _, height, width, _ = frames.shape
    out_h, out_w = size
    scale = max(out_h / height, out_w / width)
    mid_h, mid_w = max(out_h, round(height * scale)), max(out_w, round(width * scale))
    scaled = resize_frames(frames, (mid_h, mid_w), method)
    top, left = (mid_h - out_h) // 2, (mid_w - out_w) // 2
    return scaled[:, top:top + out_h, left:left + out_w]


def _natural_key(path: Path) -> list:
    """Sort key that orders frame_2.png before frame_10.png."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def _image_files(folder: Path) -> list[Path]:
    files = [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    return sorted(files, key=_natural_key)


def read_image(path: Path, channels: int) -> np.ndarray:
    """One frame file as uint8 [H, W, channels] (channels 1: greyscale, 3: RGB)."""
    from PIL import Image, UnidentifiedImageError  # Pillow ships with matplotlib

    try:
        with Image.open(path) as img:
            if img.mode.startswith("I;16"):  # 16-bit greyscale: its top 8 bits (convert() would clip at 255)
                img = Image.fromarray((np.asarray(img, dtype=np.uint16) >> 8).astype(np.uint8))
            elif img.mode in ("I", "F"):
                raise DataError(f"{path}: {img.mode!r} images (32-bit) are not read: save 8- or 16-bit ones")
            pixels = np.asarray(img.convert("L" if channels == 1 else "RGB"), dtype=np.uint8)
    except DataError:
        raise
    except (OSError, ValueError, UnidentifiedImageError) as e:
        raise DataError(f"{path}: cannot read image ({e})") from None
    return pixels.reshape(*pixels.shape[:2], channels)


def read_frame_folder(path: str | Path, channels: int = 3, image_size: tuple[int, int] | None = None,
                      resize: str = "area") -> VideoFrames:
    """Frames from image files (PNG/JPEG): one sub-folder per video (its name is the source), frames in
    natural file-name order; a folder holding images directly is one video.

    Without `image_size` every frame must have the first frame's size (else DataError); with it, each video
    is fitted to it (`fit_frames`).
    """
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"{root}: not a folder of frame images")
    videos = [d for d in sorted(root.iterdir(), key=_natural_key) if d.is_dir() and _image_files(d)]
    if not videos and _image_files(root):
        videos = [root]
    if not videos:
        raise DataError(f"{root}: no {'/'.join(IMAGE_SUFFIXES)} frames in it or its sub-folders")
    frames, sources = [], []
    first_shape = None
    for video in videos:
        files = _image_files(video)
        images = [read_image(f, channels) for f in files]
        if image_size is None:
            for f, img in zip(files, images):
                first_shape = first_shape or (img.shape, f)
                if img.shape != first_shape[0]:
                    raise DataError(f"{f}: frame of shape {img.shape}, but {first_shape[1]} has "
                                    f"{first_shape[0]} (set an image size to resize)")
            frames.append(np.stack(images))
        else:
            frames.append(np.concatenate([fit_frames(img[None], image_size, resize) for img in images]))
        sources += [video.name] * len(files)
    return VideoFrames(np.concatenate(frames), np.array(sources), source=str(root))


def _load_hkl(path: Path) -> np.ndarray:
    try:
        import hickle
    except ImportError:
        raise DataError(f"{path}: reading .hkl needs the hickle package (pip install hickle), "
                        f"or convert the arrays to .npz with keys X and sources") from None
    try:
        return np.asarray(hickle.load(str(path)))
    except Exception as e:  # hickle raises assorted h5py/OSError/ValueError types on bad files
        raise DataError(f"{path}: cannot read hickle file ({e})") from None


def read_frame_arrays(path: str | Path, sources_path: str | Path | None = None,
                      image_size: tuple[int, int] | None = None, resize: str = "area") -> VideoFrames:
    """Frames from arrays: a .npz with X [n, H, W, C] and sources [n], or the reference's hickle pair
    X_<split>.hkl + sources_<split>.hkl (`sources_path` defaults to that sibling).

    X is uint8 0..255, or float in 0..1. With `image_size` the frames are fitted to it (`fit_frames`).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files if k in ("X", "sources")}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            raise DataError(f"{path}: cannot read .npz ({type(e).__name__}: {e})") from None
        missing = {"X", "sources"} - set(arrays)
        if missing:
            raise DataError(f"{path}: .npz lacks {', '.join(sorted(missing))}")
        frames, sources = arrays["X"], arrays["sources"]
    elif path.suffix == ".hkl":
        if sources_path is None:
            sources_path = path.with_name(re.sub(r"^X_", "sources_", path.name))
            if sources_path == path:
                raise DataError(f"{path}: cannot infer the sources file (expected a name X_<split>.hkl)")
        frames, sources = _load_hkl(path), _load_hkl(Path(sources_path))
    else:
        raise DataError(f"{path}: frame arrays must be .npz or .hkl")
    if np.issubdtype(frames.dtype, np.floating) and frames.size and not 0.0 <= frames.min() <= frames.max() <= 1.0:
        raise DataError(f"{path}: float frames must lie in 0..1 (found {frames.min():.4g}..{frames.max():.4g}); "
                        "store 0..255 pixels as uint8")
    if np.issubdtype(frames.dtype, np.integer) and frames.dtype != np.uint8:  # e.g. int64 from Python lists
        if frames.size and not 0 <= frames.min() <= frames.max() <= 255:
            raise DataError(f"{path}: integer frames must be 0..255 pixels (found {frames.min()}..{frames.max()}); "
                            "store them as uint8, or as floats in 0..1")
        frames = frames.astype(np.uint8)
    if frames.ndim == 3:
        frames = frames[..., None]
    if frames.ndim != 4:
        raise DataError(f"{path}: X has shape {frames.shape}, expected [n, H, W, C]")
    sources = np.asarray(sources).astype(str).reshape(-1)
    if len(sources) != len(frames):
        raise DataError(f"{path}: {len(sources)} sources for {len(frames)} frames")
    if frames.dtype != np.uint8:
        frames = frames.astype(np.float32)
    if image_size is not None:
        frames = fit_frames(frames, image_size, resize)
    return VideoFrames(frames, sources, source=str(path))


def _decoder() -> Any:
    try:
        import imageio_ffmpeg
    except ImportError:
        raise DataError("reading video files needs a decoder: pip install -e '.[video]' (imageio-ffmpeg)") from None
    return imageio_ffmpeg


def _ffmpeg_problem(error: Exception) -> str:
    """ffmpeg's last stderr line (what went wrong), from imageio-ffmpeg's multi-line error."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def video_files(path: str | Path) -> list[Path]:
    """[path] when it is a video file, the video files in it (natural order) when it is a folder, else []."""
    path = Path(path)
    if path.is_file():
        return [path] if path.suffix.lower() in VIDEO_SUFFIXES else []
    if path.is_dir():
        return sorted((p for p in path.iterdir() if p.is_file() and p.suffix.lower() in VIDEO_SUFFIXES),
                      key=_natural_key)
    return []


def read_video_file(path: str | Path, channels: int = 3, image_size: tuple[int, int] | None = None,
                    resize: str = "area", frame_step: int = 1, chunk_frames: int = 64) -> VideoFrames:
    """Every `frame_step`-th frame of a video file (from the first) as uint8 [n, H, W, channels], its sources
    the file's name. A frame_step above 1 lowers the frame rate: more motion between consecutive frames.

    Decoded by ffmpeg (imageio-ffmpeg) to RGB, or to grey for channels 1 (ffmpeg's own conversion: the
    video's luma), `chunk_frames` at a time, each chunk fitted to `image_size` (`fit_frames`: scale, centre
    crop) before the next is read, so memory holds the small frames plus one chunk at full size. DataError
    naming the file when ffmpeg cannot read it, it has no frames, or it decodes to clearly fewer frames than
    its header's duration and rate give (a file cut short: ffmpeg decodes what is there and says nothing).
    """
    path = Path(path)
    if channels not in (1, 3):
        raise DataError(f"{path}: video frames are read with 1 or 3 channels, not {channels}")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if frame_step < 1:
        raise DataError(f"data.frame_step={frame_step} must be at least 1")
    reader = _decoder().read_frames(str(path), pix_fmt="gray" if channels == 1 else "rgb24",
                                    bits_per_pixel=8 * channels)
    chunks, pending = [], []
    try:
        try:
            with warnings.catch_warnings():  # JAX warns of any fork; this one only starts ffmpeg (fork + exec)
                warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
                meta = next(reader)  # starts ffmpeg
            width, height = meta["size"]
            decoded = 0
            for index, raw in enumerate(reader):
                decoded = index + 1
                if index % frame_step:
                    continue
                pending.append(np.frombuffer(raw, np.uint8).reshape(height, width, channels))
                if len(pending) == chunk_frames:
                    chunks.append(_fit_chunk(np.stack(pending), image_size, resize))
                    pending = []
        except (OSError, RuntimeError, StopIteration, ValueError) as e:
            raise DataError(f"{path}: not a readable video ({_ffmpeg_problem(e)})") from None
    finally:
        reader.close()
    if pending:
        chunks.append(_fit_chunk(np.stack(pending), image_size, resize))
    if not chunks:
        raise DataError(f"{path}: a video with no frames")
    expected = round(float(meta.get("duration") or 0) * float(meta.get("fps") or 0))  # 0 when not given
    if decoded < 0.9 * expected - 1:  # a margin for containers whose duration is a rounded estimate
        raise DataError(f"{path}: cut short or damaged: {decoded} frames decoded of the {expected} its header "
                        f"gives ({meta['duration']} s at {meta['fps']} frames/s)")
    frames = np.concatenate(chunks)
    every = f", 1 frame in {frame_step}" if frame_step > 1 else ""
    return VideoFrames(frames, np.full(len(frames), path.name), source=f"{path}{every}")


def _fit_chunk(frames: np.ndarray, image_size: tuple[int, int] | None, resize: str) -> np.ndarray:
    return frames if image_size is None else fit_frames(frames, image_size, resize)


def _runs(sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first index, length) of each maximal run of equal consecutive sources: the videos. int64 [v] each."""
    sources = np.asarray(sources)
    starts = np.concatenate([[0], np.flatnonzero(sources[1:] != sources[:-1]) + 1]).astype(np.int64)
    return starts, np.diff(np.concatenate([starts, [len(sources)]])).astype(np.int64)


def split_by_time(video: VideoFrames, val_fraction: float, test_fraction: float) -> VideoSplits:
    """Cuts every video of `video` in time: the first frames train, the next round(val_fraction * n)
    validate, the final round(test_fraction * n) are the held-out test, so no test frame precedes or sits
    among training frames. Each split keeps the videos' names as sources (clips never cross a cut)."""
    if not (0 < val_fraction and 0 < test_fraction and val_fraction + test_fraction < 1):
        raise DataError(f"{video.source}: val and test fractions ({val_fraction}, {test_fraction}) must be "
                        f"positive and leave frames to train on")
    starts, lengths = _runs(video.sources)
    n_test = np.rint(lengths * test_fraction).astype(np.int64)
    n_train = lengths - n_test - np.rint(lengths * val_fraction).astype(np.int64)
    rank = np.arange(len(video.sources)) - np.repeat(starts, lengths)     # frame's place in its video
    part = (rank >= np.repeat(n_train, lengths)).astype(np.int64) + (rank >= np.repeat(lengths - n_test, lengths))
    where = {0: "first", 1: "middle", 2: "final"}
    return VideoSplits(*(VideoFrames(video.frames[part == i], video.sources[part == i],
                                     source=f"{video.source} ({where[i]} {int((part == i).sum())} frames)")
                         for i in range(3)))


def read_video_splits(files: list[Path], nt: int, *, channels: int, image_size: tuple[int, int] | None,
                      resize: str = "area", frame_step: int = 1, val_fraction: float = 0.1,
                      test_fraction: float = 0.2) -> VideoSplits:
    """Video files as train, val and test parts of each (`split_by_time`). DataError naming the file when a
    part of every video is shorter than one clip of nt frames."""
    videos = [read_video_file(f, channels, image_size, resize, frame_step) for f in files]
    splits = []
    for name, part in zip(VideoSplits._fields, split_by_time(
            VideoFrames(np.concatenate([v.frames for v in videos]), np.concatenate([v.sources for v in videos]),
                        source=", ".join(map(str, files))), val_fraction, test_fraction)):
        _, lengths = _runs(part.sources)
        if not len(lengths) or lengths.max() < nt:
            counts = ", ".join(f"{v.source}: {len(v.frames)} frames" for v in videos)
            raise DataError(f"{counts}: too short for one clip of data.nt={nt} frames in its {name} part "
                            f"({int(lengths.max()) if len(lengths) else 0} frames; val and test take "
                            f"{val_fraction} and {test_fraction} of each video)")
        splits.append(part)
    return VideoSplits(*splits)


def triangle_wave(x: np.ndarray, span: np.ndarray | float) -> np.ndarray:
    """Position bouncing between 0 and span (a triangle wave), elementwise."""
    return span - np.abs(np.mod(x, 2 * span) - span)


def synthetic_moving_objects(num_videos: int = 64, frames_per_video: int = 20,
                             image_size: tuple[int, int] = (32, 32), channels: int = 1,
                             num_objects: int = 2, shape: str = "square",
                             object_size: tuple[float, float] = (6.0, 10.0),
                             speed: tuple[float, float] = (1.0, 2.5), seed: int = 0) -> VideoFrames:
    """Deterministic videos of objects moving at constant velocity and bouncing off the borders.

    Each object (a square or a disc, drawn anti-aliased by exact pixel coverage for squares and a one-pixel
    soft edge for discs) has a random size, start, direction, speed and grey level (channels 1) or colour
    (channels 3), all drawn from `np.random.default_rng(seed)`. Overlaps take the brighter object. Returns
    uint8 frames [num_videos * frames_per_video, H, W, channels].
    """
    if shape not in ("square", "disc"):
        raise DataError(f"synthetic object shape must be 'square' or 'disc', got {shape!r}")
    rng = np.random.default_rng(seed)
    height, width = image_size
    extent = np.array([height, width], np.float64)
    size = rng.uniform(*object_size, (num_videos, num_objects, 1))
    span = np.maximum(extent - size, 1e-6)                       # room to move, [V, K, 2]
    start = rng.uniform(0.0, 1.0, (num_videos, num_objects, 2)) * span
    angle = rng.uniform(0.0, 2 * np.pi, (num_videos, num_objects))
    speeds = rng.uniform(*speed, (num_videos, num_objects))
    velocity = speeds[..., None] * np.stack([np.sin(angle), np.cos(angle)], axis=-1)
    low = 0.2 if channels == 3 else 0.5
    colour = rng.uniform(low, 1.0, (num_videos, num_objects, channels))

    t = np.arange(frames_per_video, dtype=np.float64)[:, None, None]
    ys, xs = np.arange(height, dtype=np.float64), np.arange(width, dtype=np.float64)
    frames = np.empty((num_videos, frames_per_video, height, width, channels), np.uint8)
    for v in range(num_videos):  # one video at a time bounds memory at [T, K, H, W]
        pos = triangle_wave(start[v] + velocity[v] * t, span[v])       # [T, K, 2] top-left corners
        s = size[v, :, 0][None, :, None]                          # [1, K, 1]
        if shape == "square":
            cover_y = np.clip(np.minimum(ys + 1, pos[..., 0:1] + s) - np.maximum(ys, pos[..., 0:1]), 0, 1)
            cover_x = np.clip(np.minimum(xs + 1, pos[..., 1:2] + s) - np.maximum(xs, pos[..., 1:2]), 0, 1)
            mask = cover_y[..., :, None] * cover_x[..., None, :]  # [T, K, H, W]
        else:
            dy = ys + 0.5 - (pos[..., 0:1] + s / 2)
            dx = xs + 0.5 - (pos[..., 1:2] + s / 2)
            dist = np.sqrt(dy[..., :, None] ** 2 + dx[..., None, :] ** 2)
            mask = np.clip(s[..., None] / 2 - dist + 0.5, 0, 1)
        image = (mask[..., None] * colour[v][None, :, None, None, :]).max(axis=1)  # [T, H, W, C]
        frames[v] = np.rint(image * 255).astype(np.uint8)
    sources = np.repeat([f"synthetic-{seed}-{v:04d}" for v in range(num_videos)], frames_per_video)
    desc = (f"synthetic: bouncing {shape}s (seed {seed}, {num_videos} videos x {frames_per_video} frames, "
            f"{height}x{width}x{channels}); not real video")
    return VideoFrames(frames.reshape(-1, height, width, channels), sources, source=desc)


def sequence_starts(sources: np.ndarray, nt: int, mode: str = "all") -> np.ndarray:
    """First-frame indices of the nt-frame clips that stay within one video. int64 [m].

    A video is a maximal run of equal consecutive `sources`. 'all': every start whose clip fits in its run
    (the reference's sequence_start_mode='all', including the last possible start, which its range() skips);
    'unique': non-overlapping clips, run_start + k * nt (the reference's 'unique', used for evaluation).
    Raises DataError when no video has nt frames.
    """
    if mode not in START_MODES:
        raise DataError(f"sequence start mode must be one of {START_MODES}, got {mode!r}")
    n = len(sources)
    run_starts, run_lengths = _runs(sources)
    if n == 0 or run_lengths.max() < nt:
        longest = int(run_lengths.max()) if n else 0
        raise DataError(f"no video has nt={nt} frames (longest: {longest} frames, {len(run_starts)} videos)")
    per_run = run_lengths - nt + 1 if mode == "all" else run_lengths // nt
    per_run = np.maximum(per_run, 0)
    step = 1 if mode == "all" else nt
    run_of_clip = np.repeat(np.arange(len(run_starts)), per_run)
    rank_in_run = np.arange(per_run.sum()) - np.repeat(np.cumsum(per_run) - per_run, per_run)
    return (run_starts[run_of_clip] + step * rank_in_run).astype(np.int64)


def clips(video: VideoFrames, starts: np.ndarray, nt: int) -> np.ndarray:
    """float32 [len(starts), nt, H, W, C] in 0..1: the clips beginning at `starts`."""
    return to_unit_float(video.frames[np.asarray(starts)[:, None] + np.arange(nt)[None, :]])


def batches(video: VideoFrames, nt: int, batch_size: int, seed: int, shuffle: bool = True,
            mode: str = "all") -> Iterator[np.ndarray]:
    """Endless float32 [batch_size, nt, H, W, C] batches of clips in 0..1.

    With `shuffle`, each pass over the clips is a fresh permutation from `np.random.default_rng(seed)`;
    passes are chained, so every batch is full (one compilation) and no clip is dropped for good.
    """
    starts = sequence_starts(video.sources, nt, mode)
    if len(starts) < batch_size:
        raise DataError(f"{video.source}: only {len(starts)} clips of nt={nt} frames, fewer than batch {batch_size}")
    rng = np.random.default_rng(seed)
    pending = np.empty((0,), np.int64)
    while True:
        while len(pending) < batch_size:
            pending = np.concatenate([pending, rng.permutation(starts) if shuffle else starts])
        batch, pending = pending[:batch_size], pending[batch_size:]
        yield clips(video, batch, nt)


def find_split(data_dir: str | Path, split: str) -> Path | None:
    """The real data for `split` under data_dir, or None: <split>.npz, X_<split>.hkl, or folder <split>/."""
    root = Path(data_dir)
    for candidate in (root / f"{split}.npz", root / f"X_{split}.hkl", root / split):
        if candidate.exists():
            return candidate
    return None


def load_split(source: str, data_dir: str, split: str, *, image_size: tuple[int, int], channels: int,
               resize: str = "area", seed: int = 0, synthetic: dict | None = None) -> VideoFrames:
    """Resolves data.source for one split ('train', 'val' or 'test').

    'auto': real data under data_dir (`find_split`; DataError when data_dir is given but holds none), the
    synthetic stand-in when data_dir is empty;
    'arrays' / 'folder': force that real format (DataError when absent); 'synthetic': always synthetic,
    seeded by `seed` plus a per-split offset so the splits are different videos; `synthetic` holds extra
    `synthetic_moving_objects` arguments.
    """
    if source not in ("auto", "arrays", "folder", "synthetic"):
        raise DataError(f"data.source={source!r} is not one of auto, arrays, folder, synthetic")
    found = find_split(data_dir, split) if data_dir and source != "synthetic" else None
    if source in ("arrays", "folder"):
        if not data_dir:
            raise DataError(f"data.source={source} needs data.dir")
        if found is None or found.is_dir() != (source == "folder"):
            want = f"{split}/ (one sub-folder per video)" if source == "folder" else f"{split}.npz or X_{split}.hkl"
            raise DataError(f"{data_dir}: no {want}")
    if found is None and data_dir and source == "auto":
        present = sorted(p.name for p in Path(data_dir).iterdir()) if Path(data_dir).is_dir() else None
        raise DataError(f"data.dir={data_dir}: " + ("no such folder" if present is None else
                        f"no {split} split (looked for {split}.npz, X_{split}.hkl or a {split}/ folder of frame "
                        f"folders); found: {', '.join(present[:8]) or 'nothing'}"))
    if found is not None:
        if found.is_dir():
            return read_frame_folder(found, channels, image_size, resize)
        video = read_frame_arrays(found, image_size=image_size, resize=resize)
        if video.frames.shape[-1] != channels:
            raise DataError(f"{found}: frames have {video.frames.shape[-1]} channels, config asks for {channels}")
        return video
    split_seed = seed + 1000 * SPLIT_SEED_OFFSET.get(split, 3)
    return synthetic_moving_objects(image_size=image_size, channels=channels, seed=split_seed, **(synthetic or {}))


@register("video", kind="video", sources=SOURCES)
def load_video(config: Any) -> VideoSplits:
    """The "video" data set from config.data (source, dir, image_size, channels, resize, nt, seed, and the
    video-file and synthetic fields; a config without the video-file fields gets load_splits' defaults)."""
    d = config.data
    files = {k: d[k] for k in ("frame_step", "val_fraction", "test_fraction") if k in d}
    return load_splits(d.source, d.dir, nt=d.nt, image_size=tuple(d.image_size), channels=d.channels,
                       resize=d.resize, seed=d.seed, synthetic=dict(d.synthetic),
                       synthetic_eval_videos=d.synthetic_eval_videos, **files)


def load_splits(source: str, data_dir: str, *, nt: int, image_size: tuple[int, int], channels: int,
                resize: str = "area", seed: int = 0, synthetic: dict | None = None, synthetic_eval_videos: int = 0,
                frame_step: int = 1, val_fraction: float = 0.1, test_fraction: float = 0.2) -> VideoSplits:
    """Train, val and test frames as data.source says.

    'video', or 'auto' with data_dir a video file (VIDEO_SUFFIXES) or a folder of them and no split files:
    each video decoded once (every frame_step-th frame) and cut in time (`read_video_splits`); anything else
    resolves each split with `load_split` (the synthetic stand-in's val and test: `synthetic_eval_videos`
    videos, other seeds).
    """
    if source not in SOURCES:
        raise DataError(f"data.source={source!r} is not one of {', '.join(SOURCES)}")
    files = video_files(data_dir) if data_dir and source in ("auto", "video") else []
    if source in ("auto", "video") and data_dir and Path(data_dir).is_file() and not files:
        raise DataError(f"{data_dir}: not a video file ({', '.join(VIDEO_SUFFIXES)}); data.dir for video is such "
                        f"a file, or a folder of them or of split data (train.npz, X_train.hkl, train/)")
    if source == "video" and not files:
        raise DataError(f"data.source=video needs data.dir to be a video file ({', '.join(VIDEO_SUFFIXES)}) or a "
                        f"folder of them (got {data_dir!r})")
    if files and (source == "video" or find_split(data_dir, "train") is None):
        return read_video_splits(files, nt, channels=channels, image_size=image_size, resize=resize,
                                 frame_step=frame_step, val_fraction=val_fraction, test_fraction=test_fraction)
    held_out = dict(synthetic or {}, **({"num_videos": synthetic_eval_videos} if synthetic_eval_videos else {}))
    return VideoSplits(*(load_split(source, data_dir, split, image_size=image_size, channels=channels,
                                    resize=resize, seed=seed, synthetic=synthetic if split == "train" else held_out)
                         for split in VideoSplits._fields))
