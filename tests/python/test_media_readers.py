"""The media readers (issue 36, under way: cpp/src/media through stoker._media) against the
references users have: a clip's frames against PyAV's decode of the same frames (PSNR >= 40 dB, the
same times), audio against soundfile's samples (max error <= 1e-4) and, resampled, against
python-soxr's resampling of the whole file, cut where the window starts (<= 1e-4). The files are
made here by the ffmpeg command from real photos of ../shared/data/jpeg-variety (a slow pan and
zoom, so that every frame differs) and from a mix of tones and noise. Skipped where stoker._media
was not built (no FFmpeg libraries) or there is no ffmpeg command."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from media_files import HAVE_FFMPEG, noisy_tone, pan_video

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

media = pytest.importorskip("stoker._media")
av = pytest.importorskip("av")
soundfile = pytest.importorskip("soundfile")
soxr = pytest.importorskip("soxr")
if not HAVE_FFMPEG:
    pytest.skip("no ffmpeg command", allow_module_level=True)


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, bytes]:
    """48 frames of 320x240 at 24 fps panning over a photo, in three codecs and containers."""
    tmp = tmp_path_factory.mktemp("videos")
    return {name: pan_video(tmp / name, name).read_bytes()
            for name in ("h264.mp4", "vp9.webm", "h264.mkv")}  # fmt: skip


def pyav_frames(data: bytes) -> tuple[list[np.ndarray], list[float]]:
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(video=0))
    first = frames[0].time
    return [f.to_ndarray(format="rgb24") for f in frames], [f.time - first for f in frames]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b) ** 2)
    return 99.0 if mse == 0 else float(10 * np.log10(255.0**2 / mse))


@pytest.mark.parametrize("name", ["h264.mp4", "vp9.webm", "h264.mkv"])
def test_clips_are_pyavs_frames(videos, name):
    data = videos[name]
    reference, times = pyav_frames(data)
    reader = media.VideoReader(data)
    assert reader.info["frames"] == len(reference) == 48
    assert (reader.info["width"], reader.info["height"]) == (320, 240)
    for first, count, stride in [(0, 16, 1), (5, 8, 3), (30, 4, 4), (47, 1, 1), (13, 12, 2)]:
        clip = reader.read_frames(first, count, stride)
        assert clip.shape == (count, 240, 320, 3)
        for k in range(count):
            index = first + k * stride
            assert psnr(clip[k], reference[index]) >= 40.0, (name, index)
            assert reader.frame_seconds(index) == pytest.approx(times[index], abs=1e-6)
    # and each frame is its own: the nearest PyAV frame to a clip's frame is that frame
    clip = reader.read_frames(20, 3, 1)
    for k in range(3):
        scores = [psnr(clip[k], r) for r in reference[17:26]]
        assert int(np.argmax(scores)) + 17 == 20 + k


@pytest.fixture(scope="module")
def sounds(tmp_path_factory) -> dict[str, Path]:
    """3 s of a tone and pink noise, 44.1 kHz stereo, as wav (float and 16-bit) and flac."""
    tmp = tmp_path_factory.mktemp("sounds")
    return {name: noisy_tone(tmp / name, codec=["-c:a", codec])
            for name, codec in [("f32.wav", "pcm_f32le"), ("s16.wav", "pcm_s16le"),
                                ("s16.flac", "flac")]}  # fmt: skip


@pytest.mark.parametrize("name", ["f32.wav", "s16.wav", "s16.flac"])
def test_audio_is_soundfiles_samples_and_soxrs_when_resampled(sounds, name):
    reference, rate = soundfile.read(sounds[name], dtype="float32", always_2d=True)
    reader = media.AudioReader(sounds[name].read_bytes())
    assert (reader.info["sample_rate"], reader.info["channels"]) == (rate, 2)
    whole = reader.read()
    assert whole.shape == (2, len(reference))
    assert np.max(np.abs(whole - reference.T)) <= 1e-4
    start, seconds = 0.75, 1.5
    window = reader.read(start, seconds)
    first = round(start * rate)
    assert np.max(np.abs(window - reference[first : first + round(seconds * rate)].T)) <= 1e-4
    # Resampled: the whole file resampled (the channels' mean first, with channels=1), then cut
    # from round(start * to) for round(seconds * to) samples, wherever the window starts (the
    # grids of 44.1 kHz and 22.05 kHz meet every other input sample, 16 kHz's every 441st).
    for to, channels in [(16000, 0), (22050, 1), (48000, 0)]:
        whole_piece = reference.mean(axis=1, keepdims=True) if channels == 1 else reference
        expected_whole = soxr.resample(whole_piece, rate, to).T  # python-soxr's default, HQ
        for start in (0.0, 0.75, 1.0 + 1 / 3, len(reference) / rate - seconds):
            got = reader.read(start, seconds, sample_rate=to, channels=channels)
            k = round(start * to)
            expected = expected_whole[:, k : k + round(seconds * to)]
            assert got.shape == expected.shape, (to, channels, start)
            assert np.max(np.abs(got - expected)) <= 1e-4, (to, channels, start)


def test_bad_media_is_a_clear_error():
    import stoker

    with pytest.raises(stoker.CorruptDataError, match="not a media container"):
        media.VideoReader(b"\x00" * 4096)
    with pytest.raises(stoker.CorruptDataError, match="not a media container"):
        media.AudioReader(b"RIFF" + b"\x00" * 100)


@pytest.mark.parametrize("codec", ["pcm_u8", "pcm_s16le", "pcm_s24le", "pcm_s32le", "pcm_f32le",
                                   "pcm_f64le"])  # fmt: skip
def test_pcm_wav_is_read_as_soundfile_reads_it(tmp_path, codec):
    """A PCM WAV is read without FFmpeg (media/wav.h): the same samples as soundfile's, every
    sample size; four channels (a WAVE_FORMAT_EXTENSIBLE header) too."""
    path = noisy_tone(tmp_path / "s.wav", seconds=0.5, codec=["-c:a", codec])
    quad = tmp_path / "quad.wav"
    import subprocess

    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-i", str(path), "-af",
                    "pan=4c|c0=c0|c1=c1|c2=c0|c3=c1", "-c:a", codec, str(quad)], check=True,
                   timeout=120)  # fmt: skip
    for wav in (path, quad):
        data = wav.read_bytes()
        reference, rate = soundfile.read(wav, dtype="float32", always_2d=True)
        reader = media.AudioReader(data)
        assert reader.info["codec"] == codec and reader.info["sample_rate"] == rate
        assert reader.info["channels"] == reference.shape[1]
        step = 1 / 128 if codec == "pcm_u8" else 1e-4
        assert np.max(np.abs(reader.read() - reference.T)) <= step
        window = reader.read(0.1, 0.2)
        first = round(0.1 * rate)
        assert np.max(np.abs(window - reference[first : first + round(0.2 * rate)].T)) <= step
