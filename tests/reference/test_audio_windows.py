"""Audio windows against the whole recording resampled: soundfile.read of the whole file (the
channels' mean), soxr.resample (python-soxr, HQ) of all of it, then cut at a whole number of
output samples. stoker's window must equal that cut within 1e-4 at every sample, wherever it
starts: at the start, the centre, the end and at random positions, through
stoker._media.AudioReader and through the loader's Audio field (start="start", "center",
"random").

Debian's real recordings (make's real-media): ALSA's spoken channel names (WAV, 48 kHz),
Sonic Pi's samples (FLAC, 44.1 kHz, mono and stereo, 0.1 to 10 s), freedesktop's sound theme
(Ogg Vorbis .oga, 8 to 48 kHz), and Ogg Vorbis and mp3 made from Sonic Pi's FLAC by the ffmpeg
command (libvorbis, LAME; soundfile decodes mp3 with mpg123, FFmpeg with its own decoder: 3e-6
apart).
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile
import soxr
from conftest import ffmpeg, recorded

import stoker
from stoker import _media

BOUND = 1e-4
SECONDS = 0.5
RATES = (16000, 48000)  # down (and from 8 kHz up), and up from 44.1 kHz or as it is


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> dict[str, Path]:
    """name -> file: the WAVs, every eleventh FLAC, the 35 .oga, and four FLACs as ogg and mp3."""
    tmp = tmp_path_factory.mktemp("made")
    flacs = sorted(recorded("sonic-pi/samples").glob("*.flac"))
    files = {p.name: p for p in sorted(recorded("sounds/alsa").glob("*.wav"))}
    files |= {p.name: p for p in flacs[::11]}
    files |= {p.name: p for p in sorted(recorded("sounds/freedesktop/stereo").glob("*.oga"))}
    for path in (flacs[3], flacs[40], flacs[90], flacs[140]):
        stem = path.stem
        files[f"{stem}.ogg"] = ffmpeg("-i", str(path), "-c:a", "libvorbis", "-q:a", "5",
                                      out=tmp / f"{stem}.ogg")  # fmt: skip
        files[f"{stem}.mp3"] = ffmpeg("-i", str(path), "-c:a", "libmp3lame", "-b:a", "192k",
                                      out=tmp / f"{stem}.mp3")  # fmt: skip
    kinds = {name.rsplit(".", 1)[1] for name in files}
    assert kinds == {"wav", "flac", "oga", "ogg", "mp3"} and len(files) > 50
    return files


def whole_resampled(data: bytes, rate: int) -> tuple[np.ndarray, int]:
    """soundfile's samples of the whole recording, the channels' mean, resampled by soxr; and
    the recording's own frame count."""
    samples, given = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    mono = samples.mean(axis=1, keepdims=True)
    return soxr.resample(mono, given, rate)[:, 0], len(samples)


def positions(length: int, n: int, rng: np.random.Generator) -> dict[str, int]:
    """Where windows of n samples start in `length`: the start, the centre, the end, past the
    end's last full window, and four at random."""
    room = max(0, length - n)
    out = {"start": 0, "centre": room // 2, "end": room, "tail": max(0, length - n // 2)}
    out |= {f"random{k}": int(rng.integers(0, room + 1)) for k in range(4)}
    return out


def test_reader_windows_are_the_whole_recording_resampled(recordings):
    """stoker._media.AudioReader.read(start, seconds, sample_rate, channels=1) against
    soxr.resample of soundfile.read's whole recording, cut at round(start * rate): within 1e-4,
    at 8 positions of every recording, at 16 and 48 kHz; as long as the cut."""
    rng = np.random.default_rng(0)
    worst, windows = 0.0, 0
    for name, path in recordings.items():
        data = path.read_bytes()
        reader = _media.AudioReader(data)
        for rate in RATES:
            whole, _ = whole_resampled(data, rate)
            n = round(SECONDS * rate)
            for where, k in positions(len(whole), n, rng).items():
                got = reader.read(k / rate, n / rate, sample_rate=rate, channels=1)[0]
                want = whole[k : k + n]
                assert len(got) == len(want), (name, rate, where, k, len(got), len(want))
                err = float(np.max(np.abs(got - want))) if len(want) else 0.0
                assert err <= BOUND, (name, rate, where, k, err)
                worst, windows = max(worst, err), windows + 1
    print(f"{windows} windows of {len(recordings)} recordings: at most {worst:.2g} apart")


@pytest.fixture(scope="module")
def pack(recordings, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("pack")
    for i, (name, path) in enumerate(recordings.items()):
        folder = tmp / "tree" / name.rsplit(".", 1)[1]
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / f"{i:03d}.{name.rsplit('.', 1)[1]}")
    return stoker.pack(tmp / "tree", tmp / "pack", progress=False).out


def source(pack: Path, index: int) -> tuple[str, bytes]:
    dataset = stoker.load.loader.open_dataset(pack)
    name = next(m["name"] for m in dataset.record(index)["members"] if m["name"] != "cls")
    return name, dataset.read(index, name)


def stated_length(data: bytes, frames: int, rate: int) -> int:
    """The recording's length at `rate` as the Audio field counts it (round(frames * rate /
    its rate), halves up, as soxr.resample's output): from the frames the container states,
    which for these files are soundfile's (mp3's include the encoder's delay and padding,
    which FFmpeg 5.1 states in the duration: within two mp3 frames more)."""
    info = _media.AudioReader(data).info
    stated = info["frames"]
    if info["codec"].startswith("mp3"):
        assert frames <= stated <= frames + 2 * 1152 + 1105, (stated, frames)
    else:
        assert stated == frames, (stated, frames)
    return (2 * stated * rate + info["sample_rate"]) // (2 * info["sample_rate"])


def where_it_starts(whole: np.ndarray, window: np.ndarray) -> int:
    """The start in `whole` whose samples the window's are (within the bound; the first of
    them where several are, as in silence): found by the window's loudest 64 samples, then
    checked whole; -1 where there is none. A window of fewer samples is a recording shorter
    than a window: from its start."""
    if len(window) < 64:
        return 0
    energy = np.convolve(window.astype(np.float64) ** 2, np.ones(64), "valid")
    at = int(np.argmax(energy))
    stretches = np.lib.stride_tricks.sliding_window_view(whole, 64)
    near = np.max(np.abs(stretches - window[at : at + 64]), axis=1)
    for s in np.flatnonzero(near <= BOUND) - at:
        if 0 <= s and np.max(np.abs(whole[s : s + len(window)] - window)) <= BOUND:
            return int(s)
    return -1


@pytest.mark.parametrize("start", ["start", "center", "random"])
def test_loader_windows_are_the_whole_recording_resampled(pack, start):
    """stoker.Audio(seconds=0.5, sample_rate=16000, start=...) in a Loader against soxr.resample
    of soundfile.read's whole recording, cut at 0, at (L - N) // 2 (L the recording's length at
    16 kHz) or, for a keyed random window, where its first samples are: within 1e-4 at every
    sample, its length given, padded with zeros past the end."""
    rate, n = 16000, 8000
    fields = {"audio": stoker.Audio(seconds=SECONDS, sample_rate=rate, start=start)}
    loader = stoker.Loader(pack, batch_size=16, shuffle=False, seed=6, return_index=True,
                           fields=fields)  # fmt: skip
    seen = inside = 0
    for batch in loader:
        for index, window, length in zip(batch["index"].tolist(), batch["audio"][:, 0].numpy(),
                                         batch["audio_length"].tolist(), strict=True):  # fmt: skip
            name, data = source(pack, index)
            whole, frames = whole_resampled(data, rate)
            if start == "start":
                k = 0
            elif start == "center":
                k = max(0, (stated_length(data, frames, rate) - n) // 2)
            else:
                k = where_it_starts(whole, window[:length])
            assert k >= 0, (start, name, index, "the window is no cut of the recording")
            want = whole[k : k + n]
            assert length == len(want), (name, index, k, length, len(want))
            err = float(np.max(np.abs(window[:length] - want))) if length else 0.0
            assert err <= BOUND, (start, name, index, k, err)
            assert not window[length:].any()
            seen += 1
            inside += 0 < k < len(whole) - n
    assert seen == len(stoker.load.loader.open_dataset(pack))
    if start != "start":
        assert inside > 20, inside
