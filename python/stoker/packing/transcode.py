"""Media members transcoded at pack time, with the ffmpeg command, so that the loader's work per
epoch is smaller:

- ``stoker.pack(video_keyint=K)``: videos re-encoded for cheap random access (H.264, a keyframe
  every K frames, at most ``max_side`` pixels on the longer side). A clip is decoded from the
  keyframe before it: a file as cameras and sites write it (one keyframe every 250 frames, or
  every scene cut) costs a training clip up to 250 decodes, a pack with K = 16 at most K - 1
  more than the clip's own frames.
- ``stoker.pack(video_remux=True)``: videos in a container without an index (an MPEG program or
  transport stream, AVI, a raw stream) copied, not re-encoded, into MP4: the same frames, bit
  for bit, and a reader that lists them from the MP4's tables rather than by parsing the whole
  file (the street scene of the benchmarks: 1.6 against 10.6 ms to open, on a clip's ~45 ms).
- ``stoker.pack(audio_rate=R)``: sounds decoded once and stored as 16-bit PCM WAV at the rate
  the model takes (resampled with soxr at python-soxr's "HQ" precision, channels mixed down to
  ``audio_channels``): a window is then read, not decoded and resampled, every epoch (FLAC and
  MP3 decode at about 1 ms per second of 44.1 kHz stereo: 4 ms of every 4 s window).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import CorruptDataError, UnsupportedFormatError

# How videos are re-encoded: x264 at rate factor 18 (visually lossless: FFCV's JPEG quality 90,
# in kind), tuned for decoding ("fastdecode": no CABAC, no deblocking filter, no weighted
# prediction), which decodes 1.7x as fast at about the same size (measured on the benchmark's
# 340x256 clips: 0.15 against 0.26 ms a frame, 409 against 390 kB for 10 s). The manifest
# records it.
CRF = 18
ENCODING = f"libx264 -preset veryfast -tune fastdecode -crf {CRF}"


def ffmpeg_command() -> str:
    found = shutil.which("ffmpeg")
    if found is None:
        raise UnsupportedFormatError(
            "video_keyint= re-encodes videos with the ffmpeg command, which is not on the PATH "
            "(Debian: apt install ffmpeg)"
        )
    return found


def reencode_video(data: bytes, keyint: int, max_side: int = 0) -> bytes:
    """`data` (any container FFmpeg reads) as an MP4 of H.264 with a keyframe every `keyint`
    frames and no scene-cut keyframes, its frames shrunk to `max_side` on the longer side if
    larger (0: kept), its first audio stream as AAC. H.264 in 4:2:0 needs even sizes: a frame of
    odd width or height kept at its size loses its last column or row (720x405 -> 720x404)."""
    # Cropped, not scaled: the rows kept are the original's, not resampled by a 404/405 scale.
    scale = ["-vf", "crop=w='trunc(iw/2)*2':h='trunc(ih/2)*2':x=0:y=0"]
    if max_side:
        fit = f"min(1,{max_side}/max(iw,ih))"
        scale = ["-vf", f"scale=w='trunc({fit}*iw/2)*2':h='trunc({fit}*ih/2)*2'"]
    with tempfile.TemporaryDirectory(prefix="stoker-video-") as tmp:
        source, out = Path(tmp) / "source", Path(tmp) / "out.mp4"
        source.write_bytes(data)
        command = [ffmpeg_command(), "-nostdin", "-loglevel", "error", "-y", "-i", str(source),
                   "-map", "0:v:0", "-map", "0:a:0?", *scale, "-c:v", "libx264",
                   "-preset", "veryfast", "-tune", "fastdecode", "-crf", str(CRF),
                   "-g", str(keyint),
                   "-keyint_min", str(keyint), "-sc_threshold", "0", "-pix_fmt", "yuv420p",
                   "-c:a", "aac", "-b:a", "128k", "-movflags", "+faststart", str(out)]  # fmt: skip
        return _run(command, out, "re-encode")


def indexed_container(data: bytes) -> bool:
    """Whether `data` is an MP4/MOV (an ``ftyp``, ``moov``, ``mdat``, ``free``, ``skip`` or
    ``wide`` box first) or Matroska/WebM (EBML's magic): containers whose header or tables
    list every frame."""
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return True
    return data[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide")


def remux_video(data: bytes) -> tuple[bytes, str]:
    """`data` copied into MP4 without re-encoding (every stream; Matroska where MP4 cannot hold
    one of them): (bytes, "mp4" or "mkv"). Packets without a presentation time (an MPEG
    program stream's) are given theirs by ffmpeg (``-fflags +genpts``)."""
    with tempfile.TemporaryDirectory(prefix="stoker-video-") as tmp:
        source = Path(tmp) / "source"
        source.write_bytes(data)
        tried = []
        for ext, extra in (("mp4", ["-movflags", "+faststart"]), ("mkv", [])):
            out = Path(tmp) / f"out.{ext}"
            command = [ffmpeg_command(), "-nostdin", "-loglevel", "error", "-y",
                       "-fflags", "+genpts", "-i", str(source), "-map", "0", "-c", "copy",
                       *extra, str(out)]  # fmt: skip
            try:
                return _run(command, out, f"copy it into {ext.upper()}"), ext
            except CorruptDataError as e:
                tried.append(str(e))
        raise CorruptDataError("; ".join(tried))


# How sounds are stored: 16-bit PCM (a quantisation step of 3e-5, below the 1e-4 the tests
# hold to), resampled by soxr at 20 bits of precision (python-soxr's "HQ").
AUDIO_ENCODING = "pcm_s16le, soxr precision 20"


def resample_audio(data: bytes, rate: int, channels: int) -> bytes:
    """`data` (any container FFmpeg reads) as a WAV of 16-bit PCM at `rate` Hz, its first audio
    stream's channels kept, or with `channels=1` their mean (as the Audio field mixes down),
    mixed before resampling."""
    with tempfile.TemporaryDirectory(prefix="stoker-audio-") as tmp:
        source, out = Path(tmp) / "source", Path(tmp) / "out.wav"
        source.write_bytes(data)
        filters = [f"aresample={rate}:resampler=soxr:precision=20"]
        if channels == 1:
            found = _channels(source)
            if found > 1:
                mean = "+".join(f"{1 / found:.17g}*c{k}" for k in range(found))
                filters.insert(0, f"pan=mono|c0={mean}")
        command = [ffmpeg_command(), "-nostdin", "-loglevel", "error", "-y", "-i", str(source),
                   "-map", "0:a:0", "-vn", "-af", ",".join(filters), "-c:a", "pcm_s16le",
                   str(out)]  # fmt: skip
        return _run(command, out, "resample")


def _channels(path: Path) -> int:
    probe = shutil.which("ffprobe") or "ffprobe"
    run = subprocess.run([probe, "-v", "error", "-select_streams", "a:0", "-show_entries",
                          "stream=channels", "-of", "csv=p=0", str(path)],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    try:
        return int(run.stdout.strip().splitlines()[0])
    except (ValueError, IndexError):
        reason = run.stderr.strip()[-300:]
        raise CorruptDataError(f"ffprobe finds no audio stream: {reason}") from None


def _run(command: list[str], out: Path, what: str) -> bytes:
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        raise CorruptDataError(f"ffmpeg took over an hour to {what} it") from None
    if run.returncode != 0 or not out.exists():
        reason = run.stderr.strip().splitlines()[-1:] or [f"exit status {run.returncode}"]
        raise CorruptDataError(f"ffmpeg could not {what} it: {reason[0]:.300}")
    return out.read_bytes()
