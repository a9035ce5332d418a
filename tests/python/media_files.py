"""Video and audio files for the media tests, made by the ffmpeg command: clips panning over a
real photo of ../shared/data/jpeg-variety (every frame differs), and tones with noise."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from conftest import shared_data

HAVE_FFMPEG = shutil.which("ffmpeg") is not None

VIDEO_CODECS = {
    "h264.mp4": ["-c:v", "libx264", "-bf", "3", "-g", "12", "-crf", "18"],
    "vp9.webm": ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-g", "12"],
    "h264.mkv": ["-c:v", "libx264", "-bf", "2", "-g", "16"],
    "mpeg4.avi": ["-c:v", "mpeg4", "-q:v", "3", "-g", "12"],
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
