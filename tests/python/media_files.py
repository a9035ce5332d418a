"""Video and audio files for the media tests, made by the ffmpeg command: clips panning over a
real photo of ../shared/data/jpeg-variety (every frame differs), and tones with noise; the real
recordings make fetches from Debian's packages (build/real-media); and the references the
loader's clips are checked against (PyAV's frames, resized with PIL as torchvision does)."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_data
from PIL import Image

import stoker

HAVE_FFMPEG = shutil.which("ffmpeg") is not None
REAL_MEDIA = Path(__file__).resolve().parents[2] / "build" / "real-media" / "root" / "usr" / "share"

VIDEO_CODECS = {
    "h264.mp4": ["-c:v", "libx264", "-bf", "3", "-g", "12", "-crf", "18"],
    "vp9.webm": ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-g", "12"],
    "h264.mkv": ["-c:v", "libx264", "-bf", "2", "-g", "16"],
    "mpeg4.avi": ["-c:v", "mpeg4", "-q:v", "3", "-g", "12"],
    "mpeg2.mpg": ["-c:v", "mpeg2video", "-bf", "2", "-q:v", "3", "-g", "12"],  # MPEG-PS
}


def ffmpeg(*args: str, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y", *args, str(out)],
                   check=True, timeout=300)  # fmt: skip
    return out


def photo() -> Path:
    """A real photo of middling size from jpeg-variety."""
    photos = sorted((shared_data() / "jpeg-variety").rglob("*.jpg"))
    sizes = [(p.stat().st_size, p) for p in photos
             if 200_000 < p.stat().st_size < 3_000_000 and "gray" not in p.name]  # fmt: skip
    assert sizes, "no photo of a usable size in jpeg-variety"
    return sorted(sizes)[len(sizes) // 2][1]


def pan_video(out: Path, codec: str = "h264.mp4", frames: int = 48, size: str = "320x240",
              start: int = 0) -> Path:  # fmt: skip
    """`frames` frames at 24 fps panning over the photo (from pan position `start`)."""
    pan = ["-loop", "1", "-i", str(photo()), "-vf",
           f"scale=960:-2,zoompan=z='1.2+0.004*(on+{start})':x='(on+{start})*6':"
           f"y='(on+{start})*2':d={frames}:s={size}:fps=24",
           "-frames:v", str(frames)]  # fmt: skip
    return ffmpeg(*pan, *VIDEO_CODECS[codec], "-pix_fmt", "yuv420p", out=out)


def noisy_tone(out: Path, seconds: float = 3.0, hz: int = 330, rate: int = 44100,
               codec: list[str] | None = None) -> Path:  # fmt: skip
    """A tone and pink noise, stereo."""
    src = ["-f", "lavfi", "-i", f"sine=frequency={hz}:sample_rate={rate}:duration={seconds}",
           "-f", "lavfi", "-i",
           f"anoisesrc=color=pink:amplitude=0.3:sample_rate={rate}:duration={seconds}:seed=7",
           "-filter_complex", "[0][1]amerge=inputs=2,volume=0.8"]  # fmt: skip
    return ffmpeg(*src, *(codec or []), out=out)


def recorded(path: str) -> Path:
    """A file of the real recordings (`make build/.stamps/real-media`, which make test runs)."""
    found = REAL_MEDIA / path
    if not found.exists():
        pytest.skip(f"{found} not found: make build/.stamps/real-media fetches it")
    return found


def pyav_frames(data: bytes) -> list[Image.Image]:
    """Every frame of a video, as PyAV decodes it, in presentation order."""
    import av

    with av.open(io.BytesIO(data)) as container:
        return [f.to_image() for f in container.decode(video=0)]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b) ** 2)
    return 99.0 if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def source(pack: Path, index: int) -> tuple[str, bytes]:
    """A sample's media member as packed: its name (the extension) and its bytes."""
    dataset = stoker.load.loader.open_dataset(pack)
    name = next(m["name"] for m in dataset.record(index)["members"] if m["name"] != "cls")
    return name, dataset.read(index, name)


def clip_frames(batch, name="clip"):
    """[B, T, 3, H, W] -> per sample, per frame HxWx3 numpy arrays."""
    return batch[name].permute(0, 1, 3, 4, 2).numpy()


def centre_crop(image: Image.Image, size: int) -> np.ndarray:
    """torchvision's Resize(round(size * 256 / 224)) + CenterCrop(size), on PIL."""
    resize = int(round(size * 256 / 224))
    w, h = image.size
    new_w, new_h = (int(resize * w / h), resize) if w > h else (resize, int(resize * h / w))
    image = image.resize((new_w, new_h), Image.Resampling.BILINEAR)
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    return np.asarray(image.crop((left, top, left + size, top + size)))
