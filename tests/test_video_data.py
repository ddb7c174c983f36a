"""hwrepro.data.video: clips never cross a source boundary, readers of video files, frame folders and arrays,
the synthetic stand-in, and a DataError naming the file for bad input."""

import importlib.util
import json

import numpy as np
import pytest
from PIL import Image

from hwrepro.data import video
from hwrepro.errors import DataError


def indexed_video(sources):
    """Frame i is filled with the value i, so a clip shows which frames it took."""
    n = len(sources)
    frames = np.broadcast_to(np.arange(n, dtype=np.uint8)[:, None, None, None], (n, 2, 2, 1)).copy()
    return video.VideoFrames(frames, np.array(sources), source="indexed")


def test_sequence_starts_by_hand():
    sources = ["a"] * 5 + ["b"] * 2 + ["c"] * 4
    np.testing.assert_array_equal(video.sequence_starts(sources, 3), [0, 1, 2, 7, 8])  # 'b' too short
    np.testing.assert_array_equal(video.sequence_starts(sources, 3, "unique"), [0, 7])
    np.testing.assert_array_equal(video.sequence_starts(sources, 2, "unique"), [0, 2, 5, 7, 9])
    # A source that comes back after another is a different run of frames: no clip spans the gap.
    np.testing.assert_array_equal(video.sequence_starts(["a", "a", "b", "a", "a"], 2), [0, 3])
    np.testing.assert_array_equal(video.sequence_starts(["a"] * 4, 4), [0])  # the last possible start counts


def test_sources_too_short_for_nt_and_bad_mode():
    with pytest.raises(DataError, match="nt=6.*longest: 5"):
        video.sequence_starts(["a"] * 5 + ["b"] * 3, 6)
    with pytest.raises(DataError, match="mode"):
        video.sequence_starts(["a"] * 5, 2, "random")


def test_batches_stay_within_one_source_and_follow_the_seed():
    sources = ["a"] * 7 + ["b"] * 3 + ["c"] * 9
    vid = indexed_video(sources)
    stream = video.batches(vid, nt=4, batch_size=5, seed=3)
    seen, passes = set(), []
    for _ in range(6):
        batch = next(stream)
        passes.append(np.rint(batch[:, 0, 0, 0, 0] * 255).astype(int))
        assert batch.shape == (5, 4, 2, 2, 1) and batch.dtype == np.float32
        idx = np.rint(batch[:, :, 0, 0, 0] * 255).astype(int)              # [5, 4] frame indices
        np.testing.assert_array_equal(np.diff(idx, axis=1), 1)              # consecutive frames
        assert all(len({sources[i] for i in clip}) == 1 for clip in idx)   # one source each
        seen.update(idx[:, 0])
    assert seen == set(video.sequence_starts(sources, 4))                  # 30 draws: 3 passes over 10 clips
    orders = np.concatenate(passes).reshape(3, 10)                          # each pass a fresh permutation
    assert len({tuple(o) for o in orders}) == 3 and all(sorted(o) == sorted(orders[0]) for o in orders)
    first = next(video.batches(vid, 4, 5, seed=3))
    np.testing.assert_array_equal(first, next(video.batches(vid, 4, 5, seed=3)))
    assert not np.array_equal(first, next(video.batches(vid, 4, 5, seed=4)))
    with pytest.raises(DataError, match="only 10 clips"):
        next(video.batches(vid, 4, 11, seed=0))


def test_clips_are_scaled_to_unit_range():
    vid = video.VideoFrames(np.full((4, 2, 2, 1), 255, np.uint8), np.array(["a"] * 4), "x")
    np.testing.assert_array_equal(video.clips(vid, np.array([0, 1]), 3), 1.0)
    floats = video.VideoFrames(np.full((4, 2, 2, 1), 0.25, np.float64), np.array(["a"] * 4), "x")
    assert video.clips(floats, np.array([0]), 2).dtype == np.float32


def test_synthetic_moving_objects_is_deterministic_and_moves():
    a = video.synthetic_moving_objects(num_videos=3, frames_per_video=12, seed=5)
    b = video.synthetic_moving_objects(num_videos=3, frames_per_video=12, seed=5)
    c = video.synthetic_moving_objects(num_videos=3, frames_per_video=12, seed=6)
    np.testing.assert_array_equal(a.frames, b.frames)
    assert not np.array_equal(a.frames, c.frames)
    assert a.frames.shape == (36, 32, 32, 1) and a.frames.dtype == np.uint8
    assert a.source.startswith("synthetic") and "seed 5" in a.source
    assert len(set(a.sources)) == 3 and list(a.sources[:12]) == [a.sources[0]] * 12
    assert (a.frames.reshape(36, -1).max(axis=1) > 100).all()          # objects stay in view (bouncing)
    assert (np.abs(np.diff(a.frames[:12].astype(int), axis=0)).sum(axis=(1, 2, 3)) > 0).all()  # and move
    discs = video.synthetic_moving_objects(num_videos=1, frames_per_video=2, image_size=(16, 24), channels=3,
                                           shape="disc", seed=0)
    assert discs.frames.shape == (2, 16, 24, 3)


def test_resize_area_nearest_and_fit():
    frames = np.arange(2 * 4 * 6 * 1, dtype=np.float32).reshape(2, 4, 6, 1)
    area = video.resize_frames(frames, (2, 3), "area")
    np.testing.assert_allclose(area, frames.reshape(2, 2, 2, 3, 2, 1).mean(axis=(2, 4)))  # 2x2 block means
    nearest = video.resize_frames(frames, (2, 3), "nearest")
    np.testing.assert_array_equal(nearest, frames[:, 1::2, 1::2])
    up = video.resize_frames(frames[:, :2, :2], (4, 4), "area")
    np.testing.assert_array_equal(up, frames[:, :2, :2].repeat(2, 1).repeat(2, 2))
    as_uint8 = video.resize_frames(np.array([[[[0], [255]]]], np.uint8), (1, 1), "area")
    assert as_uint8.dtype == np.uint8 and as_uint8[0, 0, 0, 0] == 128  # 127.5 rounded
    # KITTI's 375x1242 camera frames: scaled to height 128, centre-cropped to width 160.
    wide = np.zeros((1, 375, 1242, 3), np.uint8)
    wide[:, :, 621:] = 255
    fitted = video.fit_frames(wide, (128, 160))
    assert fitted.shape == (1, 128, 160, 3)
    assert fitted[0, 0, 0, 0] == 0 and fitted[0, 0, -1, 0] == 255       # the centre is kept
    with pytest.raises(DataError, match="resize method"):
        video.resize_frames(frames, (2, 3), "bicubic")


def write_frames(folder, count, size=(6, 8), mode="RGB", suffix=".png", start=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(start)
    arrays = []
    for i in range(count):
        channels = 3 if mode == "RGB" else 1
        pixels = rng.integers(0, 256, (*size, channels), dtype=np.uint8)
        Image.fromarray(pixels if channels == 3 else pixels[..., 0], mode).save(folder / f"frame_{i + 1}{suffix}")
        arrays.append(pixels)
    return np.stack(arrays)


def test_frame_folder_reads_videos_in_natural_order(tmp_path):
    first = write_frames(tmp_path / "vid_a", 11)             # frame_1 .. frame_11: 2 before 10
    second = write_frames(tmp_path / "vid_b", 3, start=1)
    vid = video.read_frame_folder(tmp_path, channels=3)
    np.testing.assert_array_equal(vid.frames, np.concatenate([first, second]))
    assert list(vid.sources) == ["vid_a"] * 11 + ["vid_b"] * 3
    assert vid.source == str(tmp_path)
    grey = write_frames(tmp_path / "grey" / "clip", 2, mode="L")
    np.testing.assert_array_equal(video.read_frame_folder(tmp_path / "grey", channels=1).frames, grey)
    resized = video.read_frame_folder(tmp_path, channels=3, image_size=(3, 4))
    assert resized.frames.shape == (14, 3, 4, 3)
    write_frames(tmp_path / "jpegs", 2, suffix=".jpg")
    assert video.read_frame_folder(tmp_path / "jpegs").frames.shape == (2, 6, 8, 3)


def test_frame_folder_errors(tmp_path):
    write_frames(tmp_path / "ok" / "v", 2)
    (tmp_path / "ok" / "v" / "frame_3.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match="frame_3.png: cannot read image"):
        video.read_frame_folder(tmp_path / "ok")
    write_frames(tmp_path / "mixed" / "v", 2)
    write_frames(tmp_path / "mixed" / "w", 1, size=(5, 8))
    with pytest.raises(DataError, match=r"w/frame_1.png: frame of shape \(5, 8, 3\)"):
        video.read_frame_folder(tmp_path / "mixed")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no .png"):
        video.read_frame_folder(tmp_path / "empty")


def test_frame_arrays_npz_and_errors(tmp_path):
    frames = np.random.default_rng(0).integers(0, 256, (5, 4, 6, 3), dtype=np.uint8)
    sources = np.array(["x"] * 3 + ["y"] * 2)
    np.savez(tmp_path / "train.npz", X=frames, sources=sources)
    vid = video.read_frame_arrays(tmp_path / "train.npz")
    np.testing.assert_array_equal(vid.frames, frames)
    assert list(vid.sources) == list(sources)
    assert video.read_frame_arrays(tmp_path / "train.npz", image_size=(2, 3)).frames.shape == (5, 2, 3, 3)
    np.savez(tmp_path / "short.npz", X=frames, sources=sources[:4])
    with pytest.raises(DataError, match="short.npz: 4 sources for 5 frames"):
        video.read_frame_arrays(tmp_path / "short.npz")
    np.savez(tmp_path / "nokey.npz", X=frames)
    with pytest.raises(DataError, match="nokey.npz: .npz lacks sources"):
        video.read_frame_arrays(tmp_path / "nokey.npz")
    np.savez(tmp_path / "flat.npz", X=frames.reshape(5, -1), sources=sources)
    with pytest.raises(DataError, match=r"flat.npz: X has shape \(5, 72\)"):
        video.read_frame_arrays(tmp_path / "flat.npz")
    (tmp_path / "broken.npz").write_bytes(b"garbage")
    with pytest.raises(DataError, match="broken.npz: cannot read"):
        video.read_frame_arrays(tmp_path / "broken.npz")
    np.savez(tmp_path / "ints.npz", X=frames.astype(np.int64), sources=sources)  # what np.savez makes of lists
    assert video.read_frame_arrays(tmp_path / "ints.npz").frames.dtype == np.uint8  # then scaled like uint8
    np.savez(tmp_path / "wide.npz", X=frames.astype(np.uint16) * 200, sources=sources)
    with pytest.raises(DataError, match=r"wide.npz: integer frames must be 0..255 pixels \(found 0..51000\)"):
        video.read_frame_arrays(tmp_path / "wide.npz")


def test_16_bit_frames_are_scaled_not_clipped(tmp_path):
    from PIL import Image

    ramp = (np.arange(48, dtype=np.uint16) * 1300).reshape(6, 8)
    Image.fromarray(ramp).save(tmp_path / "frame_1.png")
    pixels = video.read_image(tmp_path / "frame_1.png", channels=1)
    np.testing.assert_array_equal(pixels[..., 0], (ramp >> 8).astype(np.uint8))


def test_hickle_files_need_hickle(tmp_path):
    if importlib.util.find_spec("hickle") is not None:
        pytest.skip("hickle is installed here")
    (tmp_path / "X_train.hkl").write_bytes(b"")
    with pytest.raises(DataError, match="X_train.hkl: reading .hkl needs the hickle package"):
        video.read_frame_arrays(tmp_path / "X_train.hkl")


def test_load_split_auto_real_or_synthetic(tmp_path):
    synthetic = dict(num_videos=2, frames_per_video=4)
    auto = video.load_split("auto", "", "train", image_size=(8, 8), channels=1, synthetic=synthetic)
    assert auto.source.startswith("synthetic") and auto.frames.shape == (8, 8, 8, 1)
    val = video.load_split("auto", "", "val", image_size=(8, 8), channels=1, synthetic=synthetic)
    assert not np.array_equal(auto.frames, val.frames)                  # splits are different videos
    with pytest.raises(DataError, match="no val split .*; found: nothing"):  # a given data.dir never falls back
        video.load_split("auto", str(tmp_path), "val", image_size=(8, 8), channels=1, synthetic=synthetic)
    np.savez(tmp_path / "train.npz", X=np.zeros((4, 16, 16, 1), np.uint8), sources=np.array(["s"] * 4))
    real = video.load_split("auto", str(tmp_path), "train", image_size=(8, 8), channels=1)
    assert real.source == str(tmp_path / "train.npz") and real.frames.shape == (4, 8, 8, 1)
    with pytest.raises(DataError, match="config asks for 3"):
        video.load_split("arrays", str(tmp_path), "train", image_size=(8, 8), channels=3)
    with pytest.raises(DataError, match="no test.npz or X_test.hkl"):
        video.load_split("arrays", str(tmp_path), "test", image_size=(8, 8), channels=1)
    with pytest.raises(DataError, match="no train/"):
        video.load_split("folder", str(tmp_path), "train", image_size=(8, 8), channels=1)


# ------------------------------------------------------------------------------------------- video files

def write_video(path, frames):
    """A lossless video file of uint8 frames [n, H, W, 3]: FFV1 in .avi, x264 RGB (qp 0) in .mp4."""
    import imageio_ffmpeg

    path.parent.mkdir(parents=True, exist_ok=True)
    codec = dict(codec="ffv1", pix_fmt_out="bgr0") if path.suffix == ".avi" else dict(
        codec="libx264rgb", pix_fmt_out="rgb24", output_params=["-qp", "0"])
    writer = imageio_ffmpeg.write_frames(str(path), frames.shape[2:0:-1], fps=10, macro_block_size=1,
                                         ffmpeg_log_level="error", **codec)
    writer.send(None)
    for frame in frames:
        writer.send(np.ascontiguousarray(frame).tobytes())
    writer.close()
    assert path.stat().st_size > 0
    return path


def numbered_frames(n, size=(8, 12)):
    """Frame i: a grey level of 10 * i (so a frame shows where it came from), with a coloured left half."""
    frames = np.broadcast_to((10 * np.arange(n, dtype=np.uint8))[:, None, None, None], (n, *size, 3)).copy()
    frames[:, :, : size[1] // 2, 0] = 200
    return frames


@pytest.mark.parametrize("suffix", [".avi", ".mp4"])
def test_video_file_is_decoded_exactly_and_fitted(tmp_path, suffix):
    frames = numbered_frames(20)
    path = write_video(tmp_path / f"clip{suffix}", frames)
    vid = video.read_video_file(path, channels=3)
    np.testing.assert_array_equal(vid.frames, frames)                   # lossless codecs: every pixel back
    assert list(vid.sources) == ["clip" + suffix] * 20 and vid.source == str(path)
    small = video.read_video_file(path, channels=3, image_size=(4, 6), chunk_frames=3)  # chunks of 3, then 2
    np.testing.assert_array_equal(small.frames, video.fit_frames(frames, (4, 6)))
    every_third = video.read_video_file(path, 3, frame_step=3, chunk_frames=4)
    np.testing.assert_array_equal(every_third.frames, frames[::3])
    assert every_third.source == f"{path}, 1 frame in 3"
    grey = video.read_video_file(path, channels=1, image_size=(4, 4))   # 8x12 -> 4x6, centre 4 columns
    assert grey.frames.shape == (20, 4, 4, 1)
    grey_levels = np.broadcast_to((10 * np.arange(20))[:, None, None], (20, 4, 2))
    np.testing.assert_allclose(grey.frames[:, :, 2:, 0], grey_levels, atol=1)  # right half: the frame's grey


def test_video_is_cut_in_time_with_the_end_held_out(tmp_path):
    path = write_video(tmp_path / "walk.avi", numbered_frames(20))
    splits = video.load_splits("auto", str(path), nt=3, image_size=(8, 12), channels=3,
                               val_fraction=0.15, test_fraction=0.25)
    order = [np.rint(s.frames[:, 0, -1, 0] / 10).astype(int).tolist() for s in splits]  # frame numbers
    assert order == [list(range(0, 12)), list(range(12, 15)), list(range(15, 20))]   # 3 and 5 of 20: the end
    assert "final 5 frames" in splits.test.source and all(set(s.sources) == {"walk.avi"} for s in splits)
    write_video(tmp_path / "two" / "b.mp4", numbered_frames(10))      # a folder: each video cut on its own
    write_video(tmp_path / "two" / "a.avi", numbered_frames(10))
    both = video.load_splits("video", str(tmp_path / "two"), nt=2, image_size=(8, 12), channels=3,
                             val_fraction=0.2, test_fraction=0.2)
    assert list(both.test.sources) == ["a.avi"] * 2 + ["b.mp4"] * 2
    np.testing.assert_array_equal(both.test.frames[:, 0, -1, 0], [80, 90, 80, 90])


def test_bad_video_files_name_the_file(tmp_path):
    (tmp_path / "notes.avi").write_text("not a video\n")
    with pytest.raises(DataError, match=r"notes.avi: not a readable video \(.*Invalid data"):
        video.load_splits("auto", str(tmp_path / "notes.avi"), nt=2, image_size=(8, 8), channels=1)
    (tmp_path / "notes.txt").write_text("not a video\n")
    with pytest.raises(DataError, match=r"notes.txt: not a video file \(.avi"):
        video.load_splits("auto", str(tmp_path / "notes.txt"), nt=2, image_size=(8, 8), channels=1)
    short = write_video(tmp_path / "short.mp4", numbered_frames(12))
    with pytest.raises(DataError, match=r"short.mp4: 12 frames: too short for one clip of data.nt=4 frames in "
                                        r"its val part \(1 frames"):
        video.load_splits("auto", str(short), nt=4, image_size=(8, 12), channels=3, val_fraction=0.1)
    import imageio_ffmpeg

    writer = imageio_ffmpeg.write_frames(str(tmp_path / "whole.avi"), (32, 24), fps=10, codec="mjpeg",
                                         pix_fmt_out="yuvj420p", ffmpeg_log_level="error")
    writer.send(None)
    for frame in numbered_frames(40, size=(24, 32)):
        writer.send(frame.tobytes())
    writer.close()
    whole = (tmp_path / "whole.avi").read_bytes()
    assert len(video.read_video_file(tmp_path / "whole.avi").frames) == 40
    (tmp_path / "cut.avi").write_bytes(whole[: len(whole) // 2])  # a download cut short: ffmpeg reads half
    with pytest.raises(DataError, match=r"cut.avi: cut short or damaged: \d+ frames decoded of the \d+ its header"):
        video.read_video_file(tmp_path / "cut.avi")
    with pytest.raises(DataError, match="data.frame_step=0 must be at least 1"):
        video.read_video_file(short, frame_step=0)
    with pytest.raises(DataError, match="data.source=video needs data.dir to be a video file"):
        video.load_splits("video", str(tmp_path / "none"), nt=2, image_size=(8, 8), channels=1)


def test_missing_decoder_says_which_extra_to_install(tmp_path, monkeypatch):
    path = write_video(tmp_path / "clip.avi", numbered_frames(4))
    monkeypatch.setitem(__import__("sys").modules, "imageio_ffmpeg", None)  # import now raises ImportError
    with pytest.raises(DataError, match=r"^reading video files needs a decoder: pip install -e '.\[video\]'"):
        video.read_video_file(path)


@pytest.mark.slow
def test_bad_video_is_one_error_line_and_exit_2(run_launch, tmp_path):
    (tmp_path / "notes.avi").write_text("not a video\n")
    p = run_launch("--config=configs/prednet_video.py", f"--workdir={tmp_path / 'w'}",
                   f"--config.data.dir={tmp_path / 'notes.avi'}")
    lines = p.stderr.strip().splitlines()  # the launcher's banner line, then the error
    assert p.returncode == 2 and len(lines) == 2 and "Traceback" not in p.stderr, p.stderr
    assert lines[-1].startswith(f"error: {tmp_path / 'notes.avi'}: not a readable video (")


@pytest.mark.slow
def test_prednet_trains_on_a_video_file(tmp_path):
    from configs.prednet_video import get_config
    from hwrepro.harness import runner

    frames = np.random.default_rng(0).integers(0, 256, (40, 24, 32, 3), dtype=np.uint8)
    config = get_config()
    config.data.update(dir=str(write_video(tmp_path / "street.mp4", frames)), image_size=(16, 16), nt=4,
                       frame_step=1)
    config.train.num_steps, config.train.batch_size, config.train.log_every = 4, 4, 2
    final = runner.run_here(config, tmp_path / "run", quiet=True)
    assert np.isfinite(final["test_mse"]) and final["test_mse_copy_last"] > 0
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["data_source"] == f"{tmp_path / 'street.mp4'} (first 28 frames)"
    assert record["data_details"]["test"].endswith("(final 8 frames)") and record["data_details"]["test_clips"] == 2
