"""stoker.Video and stoker.Audio through the loader (issue 36), against the references users
have: a clip's frames against PyAV's decode of the same frames after PIL's resize (PSNR >= 40 dB),
an audio window against python-soxr's resampling of soundfile's whole file (<= 1e-4); and
the loader's contracts for them: one crop and one flip per clip, exact resume, ranks, batch_at,
short clips, bad files named. The files are made by the ffmpeg command from a real photo (a pan
and zoom, so every frame differs) and from tones with noise; skipped without stoker._media (no
FFmpeg libraries at build time) or the command."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from media_files import (
    HAVE_FFMPEG,
    centre_crop,
    clip_frames,
    ffmpeg,
    noisy_tone,
    pan_video,
    photo,
    psnr,
    pyav_frames,
    source,
)
from PIL import Image

import stoker

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

pytest.importorskip("stoker._media")
av = pytest.importorskip("av")
soundfile = pytest.importorskip("soundfile")
soxr = pytest.importorskip("soxr")
if not HAVE_FFMPEG:
    pytest.skip("no ffmpeg command", allow_module_level=True)

CODECS = ["h264.mp4", "vp9.webm", "h264.mkv", "mpeg4.avi"]


@pytest.fixture(scope="module")
def video_pack(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    """Four 48-frame clips (H.264 with B-frames in mp4 and mkv, VP9, MPEG-4 in avi), two
    classes, each from another point of the pan."""
    tmp = tmp_path_factory.mktemp("videos")
    files = {}
    for i, codec in enumerate(CODECS):
        name, ext = codec.split(".")
        path = pan_video(tmp / "tree" / f"class{i % 2}" / f"clip{i}_{name}.{ext}", codec,
                         start=i * 7)  # fmt: skip
        files[path.stem] = path.read_bytes()
    result = stoker.pack(tmp / "tree", tmp / "pack", progress=False)
    assert result.num_samples == 4
    return tmp / "pack", files


def test_evaluation_clips_are_pyavs_frames_resized_and_centre_cropped(video_pack):
    """start="center", CenterCrop: every frame is PyAV's frame through torchvision's Resize +
    CenterCrop (in PIL), the clip's frames stride apart from the middle of the stream."""
    pack, _ = video_pack
    frames, stride, size = 8, 3, 96
    fields = {"clip": stoker.Video(frames=frames, stride=stride, size=size)}
    loader = stoker.Loader(pack, batch_size=4, shuffle=False, train=False, threads=2,
                           return_index=True, fields=fields)  # fmt: skip
    batch = next(iter(loader))
    assert batch["clip"].shape == (4, frames, 3, size, size) and batch["clip"].dtype == torch.uint8
    assert batch["clip_length"].tolist() == [frames] * 4
    span = (frames - 1) * stride + 1
    first = (48 - span) // 2
    for index, pixels, times in zip(batch["index"].tolist(), clip_frames(batch),
                                    batch["clip_timestamps"], strict=True):  # fmt: skip
        reference = pyav_frames(source(pack, index)[1])
        assert len(reference) == 48
        for t in range(frames):
            want = centre_crop(reference[first + t * stride], size)
            assert psnr(pixels[t], want) >= 40.0, (index, t, psnr(pixels[t], want))
        # 24 fps: the frames are stride / 24 s apart (mkv and webm store milliseconds)
        np.testing.assert_allclose(np.diff(times.numpy()), stride / 24, atol=2e-3)
        assert times[0].item() == pytest.approx(first / 24, abs=2e-3)


def test_training_clips_start_at_keyed_random_frames_and_flip_as_a_whole(video_pack):
    """start="random" with Resize and hflip=1: each clip is PyAV's frames (found by their times)
    resized and mirrored; starts differ between epochs and repeat for the same seed."""
    pack, _ = video_pack
    fields = {"clip": stoker.Video(frames=4, stride=2, size=(60, 80), geometry=stoker.Resize(),
                                   hflip=1.0)}  # fmt: skip
    loader = stoker.Loader(pack, batch_size=4, shuffle=False, seed=5, threads=2,
                           return_index=True, fields=fields)  # fmt: skip
    starts = {}
    for epoch in range(3):
        loader.set_epoch(epoch)
        batch = next(iter(loader))
        for key, pixels, times in zip(batch["index"].tolist(), clip_frames(batch),
                                      batch["clip_timestamps"], strict=True):  # fmt: skip
            reference = pyav_frames(source(pack, key)[1])
            indices = [round(float(t) * 24) for t in times]
            assert np.diff(indices).tolist() == [2, 2, 2]
            starts[(epoch, key)] = indices[0]
            for t, index in enumerate(indices):
                want = reference[index].resize((80, 60), Image.Resampling.BILINEAR)
                want = np.asarray(want.transpose(Image.Transpose.FLIP_LEFT_RIGHT))
                assert psnr(pixels[t], want) >= 40.0, (key, t)
    assert len({starts[(e, k)] for (e, k) in starts}) > 4  # not one start for all
    again = stoker.Loader(pack, batch_size=4, shuffle=False, seed=5, threads=1,
                          return_index=True, fields=fields)  # fmt: skip
    again.set_epoch(2)
    batch = next(iter(again))
    assert [round(float(t[0]) * 24) for t in batch["clip_timestamps"]] == [
        starts[(2, k)] for k in batch["index"].tolist()
    ]


def test_one_crop_per_clip(tmp_path):
    """A still video (every frame the same photo, coded losslessly): under RandomResizedCrop
    every frame of a clip is the same, while clips of other samples and epochs differ."""
    still = ["-loop", "1", "-i", str(photo()), "-vf", "scale=320:240", "-frames:v", "12"]
    for i in range(3):
        ffmpeg(*still, "-c:v", "libx264", "-qp", "0", "-g", "4", "-pix_fmt", "yuv420p",
               out=tmp_path / "tree" / "x" / f"still{i}.mp4")  # fmt: skip
    stoker.pack(tmp_path / "tree", tmp_path / "pack", progress=False)
    loader = stoker.Loader(tmp_path / "pack", batch_size=3, seed=1, threads=2,
                           fields={"clip": stoker.Video(frames=6, size=64)})  # fmt: skip
    clips = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        for clip in clip_frames(next(iter(loader))):
            for t in range(1, 6):  # the same crop of the same picture: the same bytes
                np.testing.assert_array_equal(clip[t], clip[0])
            clips.append(clip[0])
    assert len({c.tobytes() for c in clips}) == len(clips)


def test_short_videos_loop_pad_or_skip(tmp_path):
    for i, frames in enumerate([5, 30]):
        pan_video(tmp_path / "tree" / "x" / f"v{i}.mp4", frames=frames, size="64x48")
    stoker.pack(tmp_path / "tree", tmp_path / "pack", progress=False)

    def load(short):
        loader = stoker.Loader(tmp_path / "pack", batch_size=2, shuffle=False, train=False,
                               threads=1, fields={"clip": stoker.Video(
                                   frames=8, stride=2, size=32, short=short,
                                   geometry=stoker.Resize())})  # fmt: skip
        return loader, list(loader)

    _, [batch] = load("loop")  # the 5-frame video: frames 0 2 4 1 3 0 2 4
    assert batch["clip_length"].tolist() == [8, 8]
    indices = [round(float(t) * 24) for t in batch["clip_timestamps"][0]]
    assert indices == [0, 2, 4, 1, 3, 0, 2, 4]
    clip = clip_frames(batch)[0]
    np.testing.assert_array_equal(clip[5], clip[0])
    assert not np.array_equal(clip[1], clip[0])

    _, [batch] = load("pad")  # frames 0 2 4, then zeros
    assert batch["clip_length"].tolist() == [3, 8]
    assert batch["clip_timestamps"][0, 3:].tolist() == [-1.0] * 5
    clip = clip_frames(batch)[0]
    assert clip[3:].max() == 0 and clip[:3].max(axis=(1, 2, 3)).min() > 0

    loader, batches = load("skip")  # left out and counted
    assert sum(len(b["clip"]) for b in batches) == 1
    assert loader.stats()["missing"] == 1


def test_resume_ranks_and_batch_at_give_the_same_clips(video_pack):
    pack, _ = video_pack

    def make(**kw):
        fields = {"clip": stoker.Video(frames=4, stride=3, size=48)}
        return stoker.Loader(pack, batch_size=1, seed=3, threads=2, return_index=True,
                             fields=fields, **kw)  # fmt: skip

    whole = [(b["index"].item(), b["clip"].clone()) for b in make()]
    assert sorted(i for i, _ in whole) == [0, 1, 2, 3]
    loader = make()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = [(b["index"].item(), b["clip"]) for b in resumed]
    assert [i for i, _ in rest] == [i for i, _ in whole[1:]]
    for (_, a), (_, b) in zip(rest, whole[1:], strict=True):
        assert torch.equal(a, b)
    again = make().batch_at(0, 2)
    assert torch.equal(again["clip"], whole[2][1])
    shares = [[b["index"].item() for b in make(rank=r, world_size=2)] for r in range(2)]
    assert sorted(shares[0] + shares[1]) == [0, 1, 2, 3] and len(shares[0]) == 2


def test_a_broken_video_is_named_with_ffmpegs_reason(video_pack, tmp_path):
    """A truncated mp4 (its index cut off) and a clip whose bytes were overwritten: raised with
    the shard, the key, the member and FFmpeg's reason; skipped and counted with
    on_error="skip"."""
    _, files = video_pack
    good = files[next(iter(files))]
    with tarfile.open(tmp_path / "shard-000000.tar", "w") as tar:
        for key, data in [("good", good), ("cut", good[: len(good) // 3]),
                          ("noise", good[:64] + bytes(range(256)) * 40)]:  # fmt: skip
            info = tarfile.TarInfo(f"{key}.mp4")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    fields = {"clip": stoker.Video(frames=4, size=32)}
    loader = stoker.Loader(tmp_path / "shard-000000.tar", batch_size=3, shuffle=False,
                           threads=1, fields=fields)  # fmt: skip
    with pytest.raises(stoker.StokerError) as raised:
        next(iter(loader))
    error = raised.value
    assert error.key in ("cut", "noise") and error.member == "mp4"
    assert "shard-000000.tar" in str(error) and error.reason
    loader = stoker.Loader(tmp_path / "shard-000000.tar", batch_size=3, shuffle=False,
                           threads=1, fields=fields, on_error="skip")  # fmt: skip
    [batch] = list(loader)
    assert len(batch["clip"]) == 1 and loader.stats()["skipped"] == 2


def test_limits_refuse_a_video_before_decoding_it(video_pack, tmp_path):
    pack, _ = video_pack
    loader = stoker.Loader(pack, batch_size=4, threads=1, fields={
        "clip": stoker.Video(frames=4, size=32, max_pixels=320 * 200)})  # fmt: skip
    with pytest.raises(stoker.ResourceLimitError, match="max_pixels|pixels"):
        next(iter(loader))
    with pytest.raises(stoker.InvalidArgumentError, match="max_decoded_frames"):
        stoker.Loader(pack, batch_size=4, fields={
            "clip": stoker.Video(frames=64, stride=4, max_decoded_frames=100)})  # fmt: skip


@pytest.fixture(scope="module")
def audio_pack(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """3 s of tone and noise at 44.1 kHz stereo as flac, 16-bit wav and mp3; 0.4 s as flac."""
    tmp = tmp_path_factory.mktemp("sounds")
    files = {
        "long_flac": noisy_tone(tmp / "tree" / "a" / "long_flac.flac", codec=["-c:a", "flac"]),
        "long_wav": noisy_tone(
            tmp / "tree" / "a" / "long_wav.wav", hz=440, codec=["-c:a", "pcm_s16le"]
        ),
        "long_mp3": noisy_tone(
            tmp / "tree" / "b" / "long_mp3.mp3",
            hz=500,
            codec=["-c:a", "libmp3lame", "-b:a", "192k"],
        ),
        "short_flac": noisy_tone(
            tmp / "tree" / "b" / "short_flac.flac", seconds=0.4, codec=["-c:a", "flac"]
        ),
    }
    stoker.pack(tmp / "tree", tmp / "pack", progress=False)
    return tmp / "pack", files


def test_audio_windows_are_soundfiles_samples_resampled_by_soxr(audio_pack):
    """start="start" and "center": a second of the channels' mean at 16 kHz, python-soxr's
    resampling of soundfile's whole file cut from sample 0 or (L - 16000) // 2 (L the file's
    length at 16 kHz) (<= 1e-4); the 0.4 s file padded with zeros, its length given."""
    pack, _ = audio_pack
    for start in ("start", "center"):
        fields = {"audio": stoker.Audio(seconds=1.0, sample_rate=16000, start=start)}
        loader = stoker.Loader(pack, batch_size=4, shuffle=False, train=False,
                               return_index=True, fields=fields)  # fmt: skip
        batch = next(iter(loader))
        assert batch["audio"].shape == (4, 1, 16000) and batch["audio"].dtype == torch.float32
        seen = 0
        for index, samples, length in zip(batch["index"].tolist(), batch["audio"],
                                          batch["audio_length"], strict=True):  # fmt: skip
            name, data = source(pack, index)
            if name == "mp3":  # libsndfile decodes mp3 with another decoder than FFmpeg's
                continue
            seen += 1
            reference, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
            whole = soxr.resample(reference.mean(axis=1, keepdims=True), rate, 16000)[:, 0]
            k = 0 if start == "start" else max(0, (len(whole) - 16000) // 2)
            want = whole[k : k + 16000]
            n = len(want)
            assert length.item() == n, (start, index, name)
            assert np.max(np.abs(samples[0, :n].numpy() - want)) <= 1e-4, (start, index, name)
            if n < 16000:  # the 0.4 s file: zeros after its end
                assert samples[0, n:].abs().max().item() == 0 and n == pytest.approx(6400, abs=2)
        assert seen == 3


def test_random_audio_windows_are_slices_of_the_file(audio_pack):
    """At the file's own rate, stereo: each training window is soundfile's samples from some
    start (<= 1e-4), the starts keyed by (seed, epoch, sample) and differing between epochs."""
    pack, files = audio_pack
    fields = {"audio": stoker.Audio("wav", seconds=0.5, sample_rate=44100, channels=2,
                                    optional=True)}  # fmt: skip
    reference, rate = soundfile.read(files["long_wav"], dtype="float32", always_2d=True)
    starts = []
    for epoch in range(3):
        loader = stoker.Loader(pack, batch_size=4, shuffle=False, seed=9, return_index=True,
                               fields=fields)  # fmt: skip
        loader.set_epoch(epoch)
        batch = next(iter(loader))
        row = [source(pack, i)[0] for i in batch["index"].tolist()].index("wav")
        got = batch["audio"][row].numpy()
        assert batch["audio_length"][row].item() == 22050
        # where the window starts: the offset whose noise (the second channel) matches
        errors = [np.max(np.abs(reference[s : s + 64, 1] - got[1, :64]))
                  for s in range(0, len(reference) - 22050)]  # fmt: skip
        start = int(np.argmin(errors))
        assert np.max(np.abs(reference[start : start + 22050].T - got)) <= 1e-4
        starts.append(start)
    assert len(set(starts)) == 3


def test_audio_ops_run_on_the_audio_field_keyed_by_sample(audio_pack):
    """augment= with audio ops transforms the Audio field: log-mel spectrograms with masks, the
    same for the same (seed, epoch, sample) whatever the threads, and resumed alike."""
    from stoker.augment import FrequencyMasking, GainNoise, MelSpectrogram, TimeMasking

    pack, _ = audio_pack
    ops = [GainNoise(p=1.0), MelSpectrogram(16000, n_mels=64, log=True), FrequencyMasking(8),
           TimeMasking(20)]  # fmt: skip

    fields = {"audio": stoker.Audio(seconds=1.0), "label": stoker.Label()}

    def make(threads):
        return stoker.Loader(pack, batch_size=2, seed=4, threads=threads, augment=ops,
                             return_index=True, fields=fields)  # fmt: skip

    first = [(b["index"].tolist(), b["audio"]) for b in make(2)]
    assert first[0][1].shape == (2, 1, 64, 81)  # hop 200 and first[0][1].dtype == torch.float32
    assert (first[0][1] == 0).any()  # masked bands (log-mel of sound is never exactly 0)
    again = make(1)
    for (indices, audio), batch in zip(first, again, strict=True):
        assert batch["index"].tolist() == indices and torch.equal(batch["audio"], audio)
    with pytest.raises(stoker.InvalidArgumentError, match="Audio field"):
        stoker.Loader(pack, batch_size=2, augment=[TimeMasking(3)],
                      fields={"label": stoker.Label()})  # fmt: skip


def test_audio_channels_other_than_the_files_are_refused(audio_pack):
    pack, _ = audio_pack
    loader = stoker.Loader(pack, batch_size=4, fields={
        "audio": stoker.Audio(seconds=0.5, channels=3)})  # fmt: skip
    with pytest.raises(stoker.UnsupportedFormatError, match="2 channels read as 3"):
        next(iter(loader))


def test_without_the_media_module_a_clear_error_names_what_to_install(video_pack):
    pack, _ = video_pack
    code = f"""
import sys
sys.modules["stoker._media"] = None  # as on a machine where it was not built
import stoker
try:
    stoker.Loader({str(pack)!r}, batch_size=2, fields={{"clip": stoker.Video()}})
except stoker.UnsupportedFormatError as e:
    print(e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout  # fmt: skip
    assert "stoker._media" in out and "libavformat" in out


def _pictures(page: Path) -> list:
    import base64
    import re

    found = re.findall(r'src="data:image/png;base64,([^"]+)"', page.read_text())
    return [Image.open(io.BytesIO(base64.b64decode(b))) for b in found]


def test_show_draws_clips_as_strips_and_sounds_as_plots(video_pack, audio_pack, tmp_path):
    """`stoker show` on a pack of videos: one strip per clip, its frames side by side, the first
    frame the batch's own; on sounds, a waveform and a spectrogram per sample."""
    pack, _ = video_pack
    page = tmp_path / "clips.html"
    subprocess.run([sys.executable, "-m", "stoker", "show", str(pack), "--step", "0",
                    "--batch-size", "4", "--size", "64", "--html", str(page)], check=True,
                   timeout=300)  # fmt: skip
    strips = _pictures(page)
    assert len(strips) == 4 and all(s.size == (16 * 112, 112 + 14) for s in strips)
    loader = stoker.Loader(pack, batch_size=4, threads=1, fields={
        "video": stoker.Video("mp4;webm;mkv;avi", size=64), "label": stoker.Label()})  # fmt: skip
    first = loader.batch_at(0, 0)["video"][0, 0].permute(1, 2, 0).numpy()
    want = np.asarray(Image.fromarray(first).resize((112, 112)))
    assert psnr(np.asarray(strips[0].convert("RGB"))[:112, :112], want) > 40
    sounds, _ = audio_pack
    page = stoker.show(stoker.Loader(sounds, batch_size=3, fields={
        "audio": stoker.Audio(seconds=1.0)}), 0, 0, tmp_path / "sounds.html")  # fmt: skip
    plots = _pictures(page)
    assert len(plots) == 3 and all(p.size[0] > 400 and p.size[1] > 150 for p in plots)
