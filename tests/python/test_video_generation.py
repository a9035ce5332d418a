"""Video for generative models (issue 56). The facts of a pack's videos (videos.npz: frame counts,
durations, rates, keyframes) against PyAV's; stoker.Video(fps=...): clips at a fixed output rate
from videos of other rates, constant and variable, every output frame the source frame whose
presentation time is nearest its own (checked against PyAV's timestamps and pixels), the clip
inside the stream, short videos looped, padded or skipped by time. The files: the media tests'
pans over a real photo, re-timed by the ffmpeg command (25 fps H.264 with B-frames, 29.97 fps,
60 fps VP9) and one written frame by frame with PyAV at irregular times (variable frame rate)."""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from media_files import HAVE_FFMPEG, clip_frames, ffmpeg, pan_video, psnr, source

import stoker

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

pytest.importorskip("stoker._media")
av = pytest.importorskip("av")
if not HAVE_FFMPEG:
    pytest.skip("no ffmpeg command", allow_module_level=True)

SIZE = "160x120"


def retimed(pan: Path, out: Path, rate: str, codec: list[str]) -> Path:
    """The pan at another frame rate (frames dropped or repeated by ffmpeg's fps filter)."""
    return ffmpeg("-i", str(pan), "-vf", f"fps={rate}", *codec, "-pix_fmt", "yuv420p", out=out)


def variable_rate(out: Path, pan: Path) -> Path:
    """The pan's frames written with PyAV at irregular times: 20, 50, 30, 70 ms apart in turn."""
    with av.open(str(pan)) as container:
        images = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    out.parent.mkdir(parents=True, exist_ok=True)
    gaps = [20, 50, 30, 70]
    with av.open(str(out), "w") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height = images[0].shape[1], images[0].shape[0]
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, 1000)
        stream.codec_context.time_base = Fraction(1, 1000)
        stream.options = {"crf": "18", "bf": "2", "g": "10"}
        pts = 0
        for i, image in enumerate(images):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = pts, Fraction(1, 1000)
            container.mux(stream.encode(frame))
            pts += gaps[i % len(gaps)]
        container.mux(stream.encode())
    return out


def pyav_timed_frames(data: bytes) -> tuple[np.ndarray, list[np.ndarray]]:
    """Every frame as PyAV decodes it: its time from the first frame's, and its RGB pixels."""
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(video=0))
    times = np.array([float(f.pts * f.time_base) for f in frames])
    return times - times[0], [f.to_ndarray(format="rgb24") for f in frames]


@pytest.fixture(scope="module")
def rates_pack(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("rates")
    pan = pan_video(tmp / "pan.mp4", frames=96, size=SIZE)  # 4 s at 24 fps
    x264 = ["-c:v", "libx264", "-bf", "3", "-g", "12", "-crf", "18"]
    retimed(pan, tmp / "tree" / "a" / "r25.mp4", "25", x264)
    retimed(pan, tmp / "tree" / "a" / "r2997.mp4", "30000/1001", x264)
    retimed(pan, tmp / "tree" / "b" / "r60.webm", "60",
            ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-g", "30"])  # fmt: skip
    variable_rate(tmp / "tree" / "b" / "vfr.mp4", pan)
    result = stoker.pack(tmp / "tree", tmp / "pack", progress=False)
    assert result.num_samples == 4
    return tmp / "pack"


def nearest(times: np.ndarray, t: float) -> int:
    """The frame nearest time t, the earlier on a tie (within a nanosecond: rounding)."""
    after = int(np.searchsorted(times, t))
    if after == 0:
        return 0
    if after == len(times):
        return len(times) - 1
    return after - 1 if t - times[after - 1] <= times[after] - t + 1e-9 else after


@pytest.mark.slow("decodes four 4-second videos whole with PyAV for each of three epochs: 5 s")
def test_each_frame_is_the_source_frame_nearest_its_time(rates_pack):
    frames, fps = 16, 8.0
    fields = {"clip": stoker.Video(frames=frames, fps=fps, size=(120, 160),
                                   geometry=stoker.Resize())}  # fmt: skip
    loader = stoker.Loader(rates_pack, batch_size=4, shuffle=False, seed=1, threads=2,
                           return_index=True, fields=fields)  # fmt: skip
    starts = set()
    for epoch in range(3):
        loader.set_epoch(epoch)
        [batch] = list(loader)
        assert batch["clip"].shape == (4, frames, 3, 120, 160)
        assert batch["clip_length"].tolist() == [frames] * 4
        rows = zip(batch["index"].tolist(), clip_frames(batch), batch["clip_timestamps"].numpy(),
                   strict=True)  # fmt: skip
        for index, pixels, stamps in rows:
            times, images = pyav_timed_frames(source(rates_pack, index)[1])
            # The clip's times: 1/fps apart from a start (unknown: keyed) that fits the stream.
            picked = [int(np.argmin(np.abs(times - s))) for s in stamps]
            np.testing.assert_allclose(stamps, times[picked], atol=1e-6)
            # Some start s gives every pick: frame p is nearest s + t / fps for s in the span
            # between its midpoints with its neighbours, shifted by t / fps; the spans meet.
            low, high = -np.inf, np.inf
            for t, p in enumerate(picked):
                if p > 0:
                    low = max(low, (times[p - 1] + times[p]) / 2 - t / fps)
                if p < len(times) - 1:
                    high = min(high, (times[p] + times[p + 1]) / 2 - t / fps)
            assert low <= high + 1e-6, (index, picked)
            start = stamps[0]
            for t in range(frames):
                assert psnr(pixels[t], images[picked[t]]) >= 40.0, (index, t)
            assert stamps[-1] <= times[-1] + 1e-9  # the clip fits
            starts.add(round(float(start), 3))
    assert len(starts) > 4  # random starts, keyed by epoch


def test_clip_times_follow_the_output_rate_whatever_the_source(rates_pack):
    """start="start": output time t / fps exactly, so each frame is the nearest to it; at 60 fps
    every output frame is 1/8 s after the last; variable rate: the frame nearest each time."""
    frames = 12
    for fps in (8.0, 10.0):  # at 10 fps from 25, every other time falls between two frames
        fields = {"clip": stoker.Video(frames=frames, fps=fps, size=(60, 80), start="start",
                                       geometry=stoker.Resize())}  # fmt: skip
        loader = stoker.Loader(rates_pack, batch_size=4, shuffle=False, train=False, threads=2,
                               return_index=True, fields=fields)  # fmt: skip
        [batch] = list(loader)
        for index, stamps in zip(batch["index"].tolist(), batch["clip_timestamps"].numpy(),
                                 strict=True):  # fmt: skip
            name, data = source(rates_pack, index)
            times, _ = pyav_timed_frames(data)
            want = [times[nearest(times, t / fps)] for t in range(frames)]
            np.testing.assert_allclose(stamps, want, atol=1e-6, err_msg=f"{name} at {fps}")


def test_a_low_rate_clip_reads_from_each_keyframe_not_through_the_stream(rates_pack):
    """1 fps from 25 fps H.264 with a keyframe every 12 frames: each output frame is decoded from
    the keyframe before it (a run of its own), not through the 25 frames between: within
    max_decoded_frames=20, and each frame PyAV's nearest, pixel for pixel (near lossless)."""
    dataset = stoker.load.loader.open_dataset(rates_pack)
    # r25.mp4: the one of 100 frames (4 s at 25 fps)
    index = next(i for i in range(len(dataset))
                 if len(pyav_timed_frames(source(rates_pack, i)[1])[0]) == 100)  # fmt: skip
    times, images = pyav_timed_frames(source(rates_pack, index)[1])
    reader = stoker._media.VideoReader(source(rates_pack, index)[1])
    assert len(reader.keyframes) >= 8
    wanted = [nearest(times, float(t)) for t in range(4)]
    got = reader.read_list(wanted)
    for t, k in enumerate(wanted):
        assert psnr(got[t], images[k]) >= 50.0, t
    fields = {"clip": stoker.Video(frames=4, fps=1.0, size=(120, 160), start="start",
                                   geometry=stoker.Resize(), max_decoded_frames=20)}  # fmt: skip
    loader = stoker.Loader(rates_pack, batch_size=1, shuffle=False, train=False, threads=1,
                           return_index=True, fields=fields)  # fmt: skip
    batch = loader.batch_at(0, index)
    assert int(batch["index"][0]) == index
    np.testing.assert_allclose(batch["clip_timestamps"][0].numpy(), times[wanted], atol=1e-6)


def test_a_clip_at_a_keyframe_decodes_from_that_keyframe(rates_pack):
    """MP4 (25 fps H.264, 3 B-frames, a keyframe every 12 frames): a read from a keyframe seeks
    to it, not to the one before (an mp4 indexes by decode time less the edit list's first
    presentation time, below which the keyframe's decode time falls): the keyframe alone, then
    the keyframe's GOP, each within a few frames decoded, PyAV's pixels."""
    dataset = stoker.load.loader.open_dataset(rates_pack)
    index = next(i for i in range(len(dataset))
                 if len(pyav_timed_frames(source(rates_pack, i)[1])[0]) == 100)  # fmt: skip
    data = source(rates_pack, index)[1]
    _, images = pyav_timed_frames(data)
    keyframes = stoker._media.VideoReader(data).keyframes
    assert len(keyframes) >= 4
    for k in keyframes[1:4]:
        got = stoker._media.VideoReader(data, max_decoded_frames=4).read_list([k])
        assert psnr(got[0], images[k]) >= 50.0, k
        stoker._media.VideoReader(data, max_decoded_frames=12).read_list([k, k + 5, k + 11])


def r25(pack: Path) -> bytes:
    """The 25 fps H.264 mp4 (3 B-frames, a keyframe every 12 frames: 100 frames)."""
    dataset = stoker.load.loader.open_dataset(pack)
    index = next(i for i in range(len(dataset))
                 if source(pack, i)[0] == "mp4"
                 and len(pyav_timed_frames(source(pack, i)[1])[0]) == 100)  # fmt: skip
    return source(pack, index)[1]


def decode_order(data: bytes) -> list[tuple[int, bool]]:
    """The video stream's packets as the container stores them: (pts, discarded by an edit list)."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        return [(p.pts, p.is_discard) for p in container.demux(stream) if p.size > 0]


def test_a_read_hands_the_decoder_no_packet_after_its_last_frames(rates_pack):
    """The decoder is drained after the last wanted frame's packet instead of given the ones
    after it, which its reordering delay would ask for (x264's B-frames: 2) and decode: a read of
    any frame hands it the packets from its keyframe's to its own, no more."""
    data = r25(rates_pack)
    order = decode_order(data)
    position = {pts: k for k, (pts, discard) in enumerate(order) if not discard}
    shown = sorted(position)
    reader = stoker._media.VideoReader(data)
    keyframes = reader.keyframes
    _, images = pyav_timed_frames(data)
    for frame in range(len(shown)):
        got = reader.read_list([frame])
        assert psnr(got[0], images[frame]) >= 50.0, frame
        keyframe = max(k for k in keyframes if k <= frame)
        wanted = position[shown[frame]] - position[shown[keyframe]] + 1
        assert reader.packets_read == wanted, (frame, keyframe)


def test_a_last_frame_the_stream_never_shows_takes_the_next(tmp_path):
    """An MPEG-4 Part 2 mp4 whose frame 30 is a VOP "not coded" (the decoder shows nothing for
    it, as PyAV finds): drained after that packet, the decoder gives no frame for it; the read
    goes on from the same keyframe with every packet, and the frame shown after it stands in, as
    for a frame missing mid-clip."""
    pan = pan_video(tmp_path / "pan.mp4", frames=100, size=SIZE)
    path = retimed(pan, tmp_path / "m4.mp4", "25", ["-c:v", "mpeg4", "-bf", "0", "-g", "12",
                                                  "-q:v", "2"])  # fmt: skip
    data = bytearray(path.read_bytes())
    with av.open(io.BytesIO(bytes(data))) as container:
        stream = container.streams.video[0]
        packets = [(p.pos, p.size) for p in container.demux(stream) if p.size > 0]
    frame = 30
    pos, size = packets[frame]
    assert data[pos : pos + 4] == b"\0\0\1\xb6", "a VOP"
    # vop_coding_type P, modulo_time_base 0, marker, vop_time_increment (5 bits at 25 fps),
    # marker, vop_coded 0; stuffing to the byte; the packet's other bytes zero.
    bits = "01" + "0" + "1" + format(frame % 25, "05b") + "1" + "0"
    bits += "0" + "1" * (-(len(bits) + 1) % 8)
    vop = b"\0\0\1\xb6" + int(bits, 2).to_bytes(len(bits) // 8, "big")
    data[pos : pos + size] = vop + bytes(size - len(vop))
    with av.open(io.BytesIO(bytes(data))) as container:
        shown = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(shown) == len(packets) - 1, "PyAV shows no frame for the VOP"
    reader = stoker._media.VideoReader(bytes(data))
    got = reader.read_list([frame - 2, frame])
    assert psnr(got[0], shown[frame - 2]) >= 40.0
    assert psnr(got[1], shown[frame]) >= 40.0, "frame 31 (PyAV's 30th) for the frame not shown"
    assert reader.packets_read == (frame - 24 + 1) + (frame + 1 - 24 + 1), "7 packets, then 8"


def test_short_videos_loop_pad_or_skip_by_time(tmp_path):
    """A 1 s video (24 frames) for a 2 s clip at 8 fps: loop wraps at its duration, pad ends
    after its last frame's time, skip leaves it out."""
    pan_video(tmp_path / "tree" / "x" / "short.mp4", frames=24, size="64x48")
    pan_video(tmp_path / "tree" / "x" / "long.mp4", frames=72, size="64x48")
    stoker.pack(tmp_path / "tree", tmp_path / "pack", progress=False)

    def load(short):
        loader = stoker.Loader(tmp_path / "pack", batch_size=2, shuffle=False, train=False,
                               threads=1, return_index=True, fields={"clip": stoker.Video(
                                   frames=16, fps=8, size=32, short=short, start="start",
                                   geometry=stoker.Resize())})  # fmt: skip
        return loader, list(loader)

    def short_row(batch):  # the row of the 24-frame video
        lengths = [len(pyav_timed_frames(source(tmp_path / "pack", i)[1])[0])
                   for i in batch["index"].tolist()]  # fmt: skip
        assert sorted(lengths) == [24, 72]
        return lengths.index(24)

    _, [batch] = load("loop")  # 0, 1/8, ..., 7/8 s, then again from 0
    row = short_row(batch)
    stamps = batch["clip_timestamps"][row].numpy()
    np.testing.assert_allclose(stamps[:8], np.arange(8) / 8, atol=1e-3)
    np.testing.assert_allclose(stamps[8:], stamps[:8], atol=1e-9)
    clip = clip_frames(batch)[row]
    np.testing.assert_array_equal(clip[8], clip[0])

    _, [batch] = load("pad")  # frames up to its last one's time (23/24 s): 0 .. 7/8 s
    row = short_row(batch)
    assert batch["clip_length"].tolist()[row] == 8
    assert batch["clip_timestamps"][row, 8:].tolist() == [-1.0] * 8
    assert clip_frames(batch)[row][8:].max() == 0

    loader, batches = load("skip")
    assert sum(len(b["clip"]) for b in batches) == 1
    assert loader.stats()["missing"] == 1


def test_fps_is_checked_before_anything_starts(rates_pack):
    for bad in (0, -8, 1e6, "8", True):
        with pytest.raises(stoker.InvalidArgumentError, match="fps"):
            stoker.Loader(rates_pack, batch_size=2, fields={"clip": stoker.Video(fps=bad)})
    with pytest.raises(stoker.InvalidArgumentError, match="stride"):
        stoker.Loader(rates_pack, batch_size=2, fields={"clip": stoker.Video(fps=8, stride=2)})


def test_pack_records_each_videos_facts_as_pyav_finds_them(rates_pack):
    """videos.npz, written by stoker.pack: frame counts equal PyAV's decoded frames, keyframe
    times its key frames', the rate and whether it varies, the size and the codec."""
    import stoker.packing.videos as videos

    assert (rates_pack / videos.VIDEOS_FILE).is_file()
    facts = videos.video_facts(rates_pack, progress=False)
    assert len(facts) == 4
    rates = {}
    for i in range(4):
        name, data = source(rates_pack, i)
        with av.open(io.BytesIO(data)) as container:
            frames = list(container.decode(video=0))
        times = np.array([float(f.pts * f.time_base) for f in frames])
        times -= times[0]
        assert facts.frames[i] == len(frames), name
        np.testing.assert_allclose(facts.keyframes(i), times[[f.key_frame for f in frames]],
                                   atol=1e-6)  # fmt: skip
        assert (facts.height[i], facts.width[i]) == (120, 160)
        # to the last frame's end (where the container gives its duration: not PyAV's muxer)
        assert times[-1] <= facts.seconds[i] <= times[-1] + 0.05, name
        rates[round(float(facts.fps[i]), 2), bool(facts.variable[i])] = facts.codecs[facts.codec[i]]
    assert rates.pop((25.0, False)) == "h264"
    assert rates.pop((29.97, False)) == "h264"
    assert rates.pop((60.0, False)) == "vp9"
    [(rate, variable)] = rates  # the variable-rate file: 96 frames in 4 s
    assert variable and 23 < rate < 24.5


def test_older_packs_get_their_facts_once(rates_pack, tmp_path, monkeypatch):
    """A pack without videos.npz (made before it was written) gets it on first use, then reads
    it; one left by another pack's manifest is made anew; a read-only pack is read each time."""
    import shutil

    import stoker.packing.videos as videos

    pack = tmp_path / "pack"
    shutil.copytree(rates_pack, pack)
    (pack / videos.VIDEOS_FILE).unlink()
    first = videos.video_facts(pack, progress=False)
    assert (pack / videos.VIDEOS_FILE).is_file()
    probe = videos.probe
    monkeypatch.setattr(videos, "probe", lambda data: pytest.fail("read the videos again"))
    again = videos.video_facts(pack, progress=False)
    np.testing.assert_array_equal(again.keyframe_seconds, first.keyframe_seconds)
    assert again.codecs == first.codecs
    manifest = pack / "manifest.json"
    manifest.write_text(manifest.read_text() + " ")  # another manifest: the file is stale
    calls = []
    monkeypatch.setattr(videos, "probe", lambda data: calls.append(1) or probe(data))
    videos.video_facts(pack, progress=False)
    assert len(calls) == 4
    (pack / videos.VIDEOS_FILE).unlink()

    def read_only(*args):
        raise PermissionError("read-only")

    monkeypatch.setattr(videos, "_save", read_only)  # a read-only folder (CI runs as root)
    assert videos.video_facts(pack, progress=False).codecs == first.codecs
    assert not (pack / videos.VIDEOS_FILE).exists()


def test_inspect_shows_the_videos_distributions(rates_pack):
    info = stoker.inspect(rates_pack)
    v = info["videos"]
    assert v["videos"] == 4 and v["without"] == 0 and v["variable_rate"] == 1
    assert v["sizes"] == [[[120, 160], 4]]
    assert v["codecs"] == {"h264": 3, "vp9": 1}
    assert 3.9 < v["seconds"]["median"] < 4.1
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "stoker", "inspect", str(rates_pack)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "videos      4 (" in out and "1 of variable frame rate" in out, out
    assert "160x120 (4)" in out and "h264 (3), vp9 (1)" in out, out


def test_a_damaged_or_foreign_facts_file_is_made_anew(rates_pack, tmp_path):
    import shutil

    import stoker.packing.videos as videos

    pack = tmp_path / "pack"
    shutil.copytree(rates_pack, pack)
    good = videos.video_facts(pack, progress=False)
    path = pack / videos.VIDEOS_FILE
    whole = path.read_bytes()
    for damaged in (b"", whole[: len(whole) // 2], b"PK" + whole[2:100]):
        path.write_bytes(damaged)
        assert videos._load(path, videos._manifest_crc(pack), 4) is None
        again = videos.video_facts(pack, progress=False)
        np.testing.assert_array_equal(again.frames, good.frames)
    # A file whose arrays claim another shape, or a codec past the names: refused.
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    for name, value in (("frames", np.zeros(5, dtype=np.int64)),
                        ("codec", np.full(4, 9, dtype=np.uint16)),
                        ("keyframe_ptr", arrays["keyframe_ptr"][::-1].copy()),
                        ("frames", np.full(4, -7, dtype=np.int64))):  # fmt: skip
        np.savez(path, **{**arrays, name: value})
        assert videos._load(path, videos._manifest_crc(pack), 4) is None, name


def test_a_video_that_does_not_open_is_listed_not_fatal(tmp_path, monkeypatch):
    """A stored video that is cut short, under a member name of its own: the others get their
    facts, it gets frames -1 and is listed with its key and reason. Without stoker._media,
    packing warns and writes none."""
    import stoker.packing.videos as videos

    tree = tmp_path / "tree" / "x"
    pan_video(tree / "a.mp4", frames=24, size="64x48")
    cut = pan_video(tmp_path / "b.mp4", frames=24, size="64x48").read_bytes()
    (tree / "b.mp4").write_bytes(cut[: len(cut) // 3])
    stoker.pack(tmp_path / "tree", tmp_path / "pack", progress=False, on_error="skip")
    facts = videos.video_facts(tmp_path / "pack", progress=False)
    assert sorted(facts.frames.tolist()) == [-1, 24]
    [bad] = facts.unreadable
    assert facts.unreadable_count == 1 and bad["reason"] and bad["member"] == "mp4"
    assert facts.summary()["unreadable"] == 1

    monkeypatch.setitem(__import__("sys").modules, "stoker._media", None)  # not installed
    monkeypatch.delattr(stoker, "_media", raising=False)
    with pytest.warns(stoker.StokerWarning, match="no video facts"):
        stoker.pack(tmp_path / "tree", tmp_path / "pack2", progress=False, on_error="skip")
    assert not (tmp_path / "pack2" / videos.VIDEOS_FILE).exists()
    assert "unavailable" in stoker.inspect(tmp_path / "pack2")["videos"]


@pytest.mark.slow("encodes a 1280x720 video, decodes it twice: 2-4 s")
def test_frame_threads_give_the_same_clips(tmp_path):
    """decoder_threads (FFmpeg's frame threads, for frames of 1280x720 and more): the same
    frames, timestamps and all, as one thread, with frames skipped where nothing refers to them."""
    pan_video(tmp_path / "tree" / "x" / "hd.mp4", frames=48, size="1280x720")
    stoker.pack(tmp_path / "tree", tmp_path / "pack", progress=False)

    def clips(threads):
        fields = {"clip": stoker.Video(frames=6, fps=7.0, size=(72, 128), start="start",
                                       geometry=stoker.Resize(), decoder_threads=threads)}
        loader = stoker.Loader(tmp_path / "pack", batch_size=1, shuffle=False, train=False,
                               threads=1, fields=fields)  # fmt: skip
        [batch] = list(loader)
        return batch["clip"].numpy(), batch["clip_timestamps"].numpy()

    one, times_one = clips(1)
    four, times_four = clips(4)
    np.testing.assert_array_equal(times_one, times_four)
    np.testing.assert_array_equal(one, four)
    with pytest.raises(stoker.InvalidArgumentError, match="decoder_threads"):
        stoker.Video(decoder_threads=0)
