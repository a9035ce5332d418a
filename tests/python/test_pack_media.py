"""Video and audio files pack as members like images (issue 36, under way): stored as they are,
named by their extension, their kind in the manifest, read back byte for byte; from an
ImageFolder-style tree (UCF101, ESC-50), a path,label CSV and WebDataset shards. A file whose
first bytes are no video or audio container (an HTML error page saved as .mp4) is a counted
failure naming it. The files are made by the ffmpeg command (skipped without it)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from media_files import HAVE_FFMPEG, ffmpeg

import stoker

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

if not HAVE_FFMPEG:
    pytest.skip("no ffmpeg command", allow_module_level=True)


def clip(out: Path, seed: int) -> bytes:
    codec = {
        ".mp4": ["-c:v", "libx264"],
        ".webm": ["-c:v", "libvpx-vp9", "-deadline", "realtime"],
        ".avi": ["-c:v", "mpeg4"],
    }
    return ffmpeg("-f", "lavfi", "-i", f"testsrc2=size=48x32:rate=10,hue=h={seed * 40}",
                  "-frames:v", "6", *codec[out.suffix], "-pix_fmt", "yuv420p",
                  out=out).read_bytes()  # fmt: skip


def tone(out: Path, hz: int) -> bytes:
    codec = {".wav": [], ".flac": ["-c:a", "flac"], ".mp3": ["-c:a", "libmp3lame"],
             ".ogg": ["-c:a", "libopus"]}  # fmt: skip
    return ffmpeg("-f", "lavfi", "-i", f"sine=frequency={hz}:sample_rate=16000:duration=0.3",
                  *codec[out.suffix], out=out).read_bytes()  # fmt: skip


def read_back(pack: Path, member: str) -> list[tuple[bytes, int]]:
    loader = stoker.Loader(pack, batch_size=64, shuffle=False, fields={
        "data": stoker.Bytes(member, optional=True), "label": stoker.Label()})  # fmt: skip
    batch = next(iter(loader))
    return list(zip(batch["data"], batch["label"].tolist(), strict=True))


def manifest_kinds(pack: Path) -> dict[str, str]:
    manifest = json.loads((pack / "manifest.json").read_text())
    return {f["name"]: f["kind"] for f in manifest["fields"]}


def test_a_tree_of_videos_packs_them_as_they_are(tmp_path):
    root = tmp_path / "ucf"
    files = {}
    for c, action in enumerate(["jump", "run", "swim"]):
        for i, ext in enumerate([".mp4", ".webm", ".avi"][: c + 1]):
            path = root / action / f"v{i}{ext}"
            files[path] = (clip(path, c * 3 + i), c)
    (root / "run" / "broken.mp4").write_text("<html>404 Not Found</html>")
    result = stoker.pack(root, tmp_path / "pack", progress=False)
    assert result.num_samples == 6 and len(result.failed) == 1
    assert "broken.mp4" in result.failed[0][0] and "not a video file" in result.failed[0][1]
    kinds = manifest_kinds(tmp_path / "pack")
    assert kinds == {"mp4": "video", "webm": "video", "avi": "video", "cls": "label"}
    for ext in ("mp4", "webm", "avi"):
        want = sorted((data, label) for p, (data, label) in files.items() if p.suffix[1:] == ext)
        got = [(data, label) for data, label in read_back(tmp_path / "pack", ext) if data]
        assert sorted(got) == want, ext


def test_sounds_from_a_csv_pack_as_they_are(tmp_path):
    rows, want = ["path,label"], {}
    for i, ext in enumerate([".wav", ".flac", ".mp3", ".ogg"]):
        path = tmp_path / "sounds" / f"s{i}{ext}"
        want[ext[1:]] = tone(path, 300 + 100 * i)
        rows.append(f"sounds/{path.name},{['dog', 'cat'][i % 2]}")
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    result = stoker.pack(tmp_path / "list.csv", tmp_path / "pack", progress=False)
    assert result.num_samples == 4 and not result.failed
    kinds = {"wav": "audio", "flac": "audio", "mp3": "audio", "ogg": "audio", "cls": "label"}
    assert manifest_kinds(tmp_path / "pack") == kinds
    for ext, data in want.items():
        assert [d for d, _ in read_back(tmp_path / "pack", ext) if d] == [data]


def test_webdataset_shards_with_clips_repack_byte_for_byte(tmp_path):
    shard = tmp_path / "shard-000000.tar"
    want = {}
    with tarfile.open(shard, "w") as tar:
        for i in range(3):
            members = {"mp4": clip(tmp_path / f"c{i}.mp4", i), "wav": tone(tmp_path / f"t{i}.wav",
                       200 + 50 * i), "cls": str(i).encode()}  # fmt: skip
            want[f"sample{i:03d}"] = members
            for name, data in members.items():
                info = tarfile.TarInfo(f"sample{i:03d}.{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    result = stoker.pack(shard, tmp_path / "pack", progress=False)
    assert result.num_samples == 3 and not result.failed
    assert manifest_kinds(tmp_path / "pack") == {"mp4": "video", "wav": "audio", "cls": "label"}
    for name in ("mp4", "wav"):
        got = read_back(tmp_path / "pack", name)
        assert [d for d, _ in got] == [want[k][name] for k in sorted(want)]
        assert [label for _, label in got] == [0, 1, 2]


def test_table_columns_named_as_media_pack_as_those_members(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    clips = [clip(tmp_path / f"c{i}.mp4", i) for i in range(2)]
    sounds = [tone(tmp_path / f"t{i}.flac", 250 + 100 * i) for i in range(2)]
    table = pa.table({"mp4": clips, "speech.flac": sounds, "label": [1, 0]})
    pq.write_table(table, tmp_path / "rows.parquet")
    result = stoker.pack(tmp_path / "rows.parquet", tmp_path / "pack", progress=False)
    assert result.num_samples == 2 and not result.failed
    kinds = manifest_kinds(tmp_path / "pack")
    assert kinds["mp4"] == "video" and kinds["speech.flac"] == "audio"
    assert read_back(tmp_path / "pack", "mp4") == [(clips[0], 1), (clips[1], 0)]
    assert [d for d, _ in read_back(tmp_path / "pack", "speech.flac")] == sounds


def test_video_keyint_reencodes_for_random_access(tmp_path):
    """--video-keyint 8 --max-side 160: every video becomes an H.264 MP4 with a keyframe every 8
    frames (none elsewhere), at most 160 pixels on its longer side, with all its frames; the
    manifest and `stoker inspect` say so, and the pack's clips read back through stoker.Video."""
    av = pytest.importorskip("av")
    from media_files import pan_video

    for i, codec in enumerate(["h264.mp4", "vp9.webm", "mpeg4.avi"]):
        pan_video(tmp_path / "tree" / "x" / f"v{i}.{codec.split('.')[1]}", codec, frames=30)
    out = tmp_path / "pack"
    main = [sys.executable, "-m", "stoker", "pack", str(tmp_path / "tree"), str(out), "--quiet",
            "--video-keyint", "8", "--max-side", "160"]  # fmt: skip
    subprocess.run(main, check=True, timeout=600)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["video_keyint"] == 8 and manifest_kinds(out) == {"mp4": "video", "cls": "label"}
    videos = [data for data, _ in read_back(out, "mp4")]
    assert len(videos) == 3
    for data in videos:
        assert data[4:8] == b"ftyp"
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == "h264"
            assert (stream.codec_context.width, stream.codec_context.height) == (160, 120)
            keys = [k for k, packet in enumerate(p for p in container.demux(stream) if p.size)
                    if packet.is_keyframe]  # fmt: skip
        assert keys == [0, 8, 16, 24]
    shown = subprocess.run([sys.executable, "-m", "stoker", "inspect", str(out)], check=True,
                           capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    assert "keyframe every 8 frames" in shown
    with pytest.raises(stoker.InvalidArgumentError, match="video_keyint"):
        stoker.pack(tmp_path / "tree", tmp_path / "other", video_keyint=0, progress=False)


@pytest.mark.parametrize("codec", ["mpeg2.mpg", "mpeg4.avi"])
def test_video_remux_copies_unindexed_containers_into_mp4_with_the_same_frames(tmp_path, codec):
    """--video-remux: an MPEG program stream (with B-frames) or an AVI becomes an MP4 of the same
    packets, not re-encoded: every clip, training and evaluation, is the untouched pack's bit for
    bit, timestamps included; an MP4 beside them is stored as it is; the manifest and `stoker
    inspect` say so."""
    pytest.importorskip("stoker._media")  # the clips are read through stoker.Video
    import torch
    from media_files import pan_video

    ext = codec.split(".")[1]
    for i in range(2):
        pan_video(tmp_path / "tree" / "x" / f"v{i}.{ext}", codec, frames=40, start=7 * i)
    plain = stoker.pack(tmp_path / "tree", tmp_path / "plain", progress=False).out
    kept = pan_video(tmp_path / "tree" / "x" / "v2.mp4", "h264.mp4", frames=40).read_bytes()
    main = [sys.executable, "-m", "stoker", "pack", str(tmp_path / "tree"),
            str(tmp_path / "remux"), "--quiet", "--video-remux"]  # fmt: skip
    subprocess.run(main, check=True, timeout=600)
    remux = tmp_path / "remux"
    assert json.loads((remux / "manifest.json").read_text())["video_remux"] is True
    assert manifest_kinds(remux) == {"mp4": "video", "cls": "label"}
    videos = [data for data, _ in read_back(remux, "mp4")]
    assert len(videos) == 3 and all(data[4:8] == b"ftyp" for data in videos)
    assert kept in videos  # already indexed: untouched
    shown = subprocess.run([sys.executable, "-m", "stoker", "inspect", str(remux)], check=True,
                           capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    assert "copied into MP4" in shown

    def clips(pack: Path, member: str, geometry) -> list[dict]:
        video = stoker.Video(member, frames=8, stride=2, size=32, geometry=geometry)
        return list(stoker.Loader(pack, batch_size=1, shuffle=False, fields={"clip": video}))

    for geometry in (stoker.RandomResizedCrop(), stoker.CenterCrop()):
        for _ in range(2):
            before = clips(plain, ext, geometry)  # v0, v1
            after = clips(remux, "mp4", geometry)[:2]  # v0, v1 (samples 0 and 1 there too)
            assert len(before) == 2
            for a, b in zip(before, after, strict=True):
                assert torch.equal(a["clip"], b["clip"])
                assert torch.equal(a["clip_timestamps"], b["clip_timestamps"])
    with pytest.raises(stoker.InvalidArgumentError, match="video_remux"):
        stoker.pack(tmp_path / "tree", tmp_path / "other", video_remux=1, progress=False)


def test_audio_rate_decodes_and_resamples_once(tmp_path):
    """--audio-rate 16000 --audio-channels 1: every sound becomes a 16-bit mono WAV at 16 kHz,
    python-soxr's resampling of the mean of soundfile's channels (within 1e-4 plus the 16-bit
    step); the manifest and `stoker inspect` say so; an Audio field at that rate reads it."""
    soundfile = pytest.importorskip("soundfile")
    soxr = pytest.importorskip("soxr")
    import numpy as np
    from media_files import noisy_tone

    sources = {}
    for i, (ext, codec) in enumerate([("flac", ["-c:a", "flac"]), ("wav", [])]):
        sources[ext] = noisy_tone(tmp_path / "tree" / "x" / f"s{i}.{ext}", seconds=2.0,
                                  codec=codec)  # fmt: skip
    out = tmp_path / "pack"
    main = [sys.executable, "-m", "stoker", "pack", str(tmp_path / "tree"), str(out), "--quiet",
            "--audio-rate", "16000", "--audio-channels", "1"]  # fmt: skip
    subprocess.run(main, check=True, timeout=600)
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["audio_rate"], manifest["audio_channels"]) == (16000, 1)
    assert manifest_kinds(out) == {"wav": "audio", "cls": "label"}
    dataset = stoker.load.loader.open_dataset(out)
    for i in range(len(dataset)):
        packed, rate = soundfile.read(io.BytesIO(dataset.read(i, "wav")), dtype="float32")
        assert rate == 16000 and packed.ndim == 1
        source = sources["flac" if i == 0 else "wav"]
        reference, source_rate = soundfile.read(source, dtype="float32", always_2d=True)
        want = soxr.resample(reference.mean(axis=1), source_rate, 16000)
        assert abs(len(packed) - len(want)) <= 1
        n = min(len(packed), len(want))
        assert np.max(np.abs(packed[:n] - want[:n])) <= 1e-4 + 2**-15
    shown = subprocess.run([sys.executable, "-m", "stoker", "inspect", str(out)], check=True,
                           capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    assert "16000 Hz, mono" in shown
    with pytest.raises(stoker.InvalidArgumentError, match="audio_channels"):
        stoker.pack(tmp_path / "tree", tmp_path / "other", audio_channels=1, progress=False)
