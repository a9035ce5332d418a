"""Video buckets (issue 56, part 3): clips of (height, width, frames) per bucket at a fixed fps,
each video in the largest bucket it fills (nearest aspect first, from the pack's video facts),
the rest left out; every batch of one bucket, its clips that bucket's shape and their frames the
source frames nearest their times; keep probabilities, batch sizes by bucket or by a token
budget; resume mid-epoch equal to the uninterrupted run; 2 ranks with equal steps and, with
same_shape_across_ranks, one shape a step. The videos: one pan over a real photo, cut by ffmpeg
to several sizes, lengths and rates."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from media_files import HAVE_FFMPEG, ffmpeg, pan_video, source

import stoker

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

pytest.importorskip("stoker._media")
av = pytest.importorskip("av")
if not HAVE_FFMPEG:
    pytest.skip("no ffmpeg command", allow_module_level=True)

FPS = 8.0
BUCKETS = [(64, 96, 8), (96, 64, 8), (64, 64, 8), (64, 96, 16), (48, 48, 16)]
# name: (height, width, seconds, rate) and the bucket it goes to (None: left out). 16 frames at
# 8 fps take 1.875 s between the first and the last, 8 take 0.875 s.
VIDEOS = {
    "land_long": (144, 192, 3.0, "25", (64, 96, 16)),  # nearest aspect 3:2, the largest
    "land_mid": (144, 192, 1.5, "30000/1001", (64, 96, 8)),  # too short for 16 frames
    "land_short": (144, 192, 0.5, "25", None),  # too short for any bucket
    "port_long": (192, 144, 3.0, "25", (96, 64, 8)),  # the only portrait bucket
    "port_mid": (192, 144, 1.5, "24", (96, 64, 8)),
    "square_long": (128, 128, 3.0, "25", (48, 48, 16)),  # 48*48*16 > 64*64*8
    "square_mid": (128, 128, 1.2, "25", (64, 64, 8)),
    "tiny": (40, 40, 3.0, "25", None),  # fewer pixels than any bucket
    "land_long2": (150, 200, 2.5, "60", (64, 96, 16)),
    "port_long2": (160, 120, 2.5, "25", (96, 64, 8)),
}


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("video-buckets")
    pan = pan_video(tmp / "pan.mp4", frames=80, size="256x256")  # 3.3 s at 24 fps
    x264 = ["-c:v", "libx264", "-bf", "2", "-g", "12", "-crf", "20", "-pix_fmt", "yuv420p"]
    for name, (h, w, seconds, rate, _) in VIDEOS.items():
        ffmpeg("-i", str(pan), "-t", str(seconds), "-vf", f"fps={rate},scale={w}:{h}", *x264,
               out=tmp / "tree" / "v" / f"{name}.mp4")  # fmt: skip
    result = stoker.pack(tmp / "tree", tmp / "pack", progress=False)
    assert result.num_samples == len(VIDEOS)
    return tmp / "pack"


def expected_bucket(pack: Path) -> dict[int, tuple[int, int, int] | None]:
    """Each sample's bucket: the pack numbers the folder's files in name order."""
    dataset = stoker.load.loader.open_dataset(pack)
    names = sorted(f"{name}.mp4" for name in VIDEOS)
    return {i: VIDEOS[names[int(dataset.record(i)["key"])][:-4]][4] for i in range(len(dataset))}


def facts(pack):
    return stoker.video_facts(pack, progress=False)


def loader(pack, buckets=None, **kw):
    options = dict(batch_size=2, seed=3, threads=2, return_index=True, train=True,
                   fields={"video": stoker.Video(frames=4, size=32)})  # fmt: skip
    options.update(kw)
    return stoker.Loader(pack, buckets=buckets or stoker.VideoBuckets(BUCKETS, fps=FPS),
                         **options)  # fmt: skip


def run(ld) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    return [(b["video"].clone(), b["video_timestamps"].clone(), b["index"].clone()) for b in ld]


def test_each_video_goes_to_the_largest_bucket_it_fills(pack):
    expected = expected_bucket(pack)
    ld = loader(pack, leftovers="partial")
    assert ld.groups_excluded == sum(b is None for b in expected.values()) == 2
    assert {tuple(g["key"]): g["samples"] for g in ld.groups} == {
        b: sum(e == b for e in expected.values()) for b in BUCKETS}  # fmt: skip
    seen = set()
    for clips, stamps, index in run(ld):
        b, t, c, h, w = clips.shape
        assert c == 3 and (h, w, t) in BUCKETS
        for row, i in enumerate(index.tolist()):
            assert expected[i] == (h, w, t), i
            seen.add(i)
            real = stamps[row].numpy()
            # 1/fps apart, each rounded to a source frame (rates >= 24 fps)
            np.testing.assert_allclose(np.diff(real), 1 / FPS, atol=1 / 24 + 1e-6)
            # Each time is a source frame's, the one nearest the clip's time.
            times = np.array(stoker._media.VideoReader(source(pack, i)[1]).frame_times())
            times -= times[0]
            assert np.abs(times[None, :] - real[:, None]).min(axis=1).max() < 1e-6
    assert seen == {i for i, e in expected.items() if e is not None}


def test_frames_are_the_source_frames_cover_cropped(pack):
    """Evaluation's centred crop, against PyAV's frame resized with PIL (the field's own path)."""
    from PIL import Image

    ld = loader(pack, train=False, leftovers="partial")
    [clips, stamps, index] = next((c, s, i) for c, s, i in run(ld) if c.shape[1] == 16)
    i = int(index[0])
    with av.open(__import__("io").BytesIO(source(pack, i)[1])) as container:
        frames = list(container.decode(video=0))
    t0 = float(frames[0].pts * frames[0].time_base)
    by_time = {round(float(f.pts * f.time_base) - t0, 6): f for f in frames}
    h, w = clips.shape[3:]
    for t in (0, 7, 15):
        frame = by_time[round(float(stamps[0, t]), 6)].to_image()
        scale = max(w / frame.width, h / frame.height)
        size = (max(w, round(frame.width * scale)), max(h, round(frame.height * scale)))
        left, top = (size[0] - w) // 2, (size[1] - h) // 2
        want = np.asarray(frame.resize(size, Image.Resampling.BILINEAR))[top:top + h,
                                                                         left:left + w]
        got = clips[0, t].permute(1, 2, 0).numpy().astype(np.float64)
        assert np.abs(got - want).mean() < 4.0, t


def test_keep_sends_a_video_to_its_next_bucket_or_out(pack):
    expected = expected_bucket(pack)
    dropped = stoker.VideoBuckets(BUCKETS, fps=FPS, keep={(64, 96, 16): 0.0, (96, 64, 8): 0})
    ld = loader(pack, buckets=dropped, leftovers="partial")
    got = {int(i): (c.shape[3], c.shape[4], c.shape[1]) for c, _, idx in run(ld) for i in idx}
    span = facts(pack).span
    for i, e in expected.items():
        if e == (64, 96, 16):
            assert got[i] == (64, 96, 8)  # the next of its aspect
        elif e == (96, 64, 8):
            # Portrait, its bucket not kept: the nearer aspect next (square, not landscape),
            # the largest of it the clip fills.
            long = span[i] + 1e-9 >= 15 / FPS
            assert got[i] == ((48, 48, 16) if long else (64, 64, 8)), i
        elif e is not None:
            assert got[i] == e
    # A probability keeps about that share, the same draws every time (keyed by seed).
    keep_facts = SimpleNamespace(frames=np.full(4000, 100), fps=np.full(4000, 25.0),
                            height=np.full(4000, 720), width=np.full(4000, 1280))
    half = stoker.VideoBuckets([(64, 96, 16)], fps=FPS, keep=0.5, seed=9)
    got_a = half.assign(keep_facts)
    assert 0.45 < (got_a == 0).mean() < 0.55 and set(np.unique(got_a)) == {-1, 0}
    np.testing.assert_array_equal(got_a, half.assign(keep_facts))
    other = stoker.VideoBuckets([(64, 96, 16)], fps=FPS, keep=0.5, seed=10).assign(keep_facts)
    assert not np.array_equal(got_a, other)


def test_rules_on_given_facts():
    buckets = stoker.VideoBuckets(
        [(480, 848, 16), (480, 848, 32), (848, 480, 32), (512, 512, 64), (240, 424, 64)],
        fps=8)  # fmt: skip
    rows = [  # (height, width, frames, fps) -> bucket
        ((720, 1280, 300, 30.0), (480, 848, 32)),  # nearest aspect, then larger than 16 frames
        ((720, 1280, 100, 30.0), (480, 848, 16)),  # 3.3 s: short of 32 frames (3.875 s)
        ((720, 1280, 300, 60.0), (480, 848, 32)),  # 5 s: 64 frames need 7.875 s
        ((1080, 1920, 600, 30.0), (480, 848, 32)),  # 20 s: 480x848x32 > 240x424x64
        ((1280, 720, 300, 30.0), (848, 480, 32)),
        ((600, 600, 600, 30.0), (512, 512, 64)),
        ((400, 400, 600, 30.0), (240, 424, 64)),  # fewer pixels than all the others
        ((300, 300, 600, 30.0), None),  # fewer pixels than every bucket
        ((720, 1280, -1, 0.0), None),  # did not open
    ]
    given = SimpleNamespace(frames=np.array([r[0][2] for r in rows]),
                            fps=np.array([r[0][3] for r in rows]),
                            height=np.array([r[0][0] for r in rows]),
                            width=np.array([r[0][1] for r in rows]))  # fmt: skip
    got = buckets.assign(given)
    want = [-1 if b is None else buckets.buckets.index(b) for _, b in rows]
    assert got.tolist() == want
    # The span between the first and last frames decides: exactly 15 / 8 s fills 16 frames at
    # 8 fps; a microsecond less does not. Chunks change nothing (the keep draws included).
    spans = SimpleNamespace(frames=np.array([100, 100]), span=np.array([15 / 8, 15 / 8 - 1e-6]),
                            height=np.array([720, 720]), width=np.array([1280, 1280]))
    assert buckets.assign(spans).tolist() == [0, -1]
    many = SimpleNamespace(frames=np.full(1000, 300), fps=np.full(1000, 30.0),
                           height=np.full(1000, 720), width=np.full(1000, 1280))
    half = stoker.VideoBuckets(buckets.buckets, fps=8, keep=0.5, seed=2)
    whole = half.assign(many)
    half._CHUNK = 7
    np.testing.assert_array_equal(half.assign(many), whole)
    # Batch sizes: one, by bucket (the loader's where not given), or a token budget.
    assert stoker.VideoBuckets(BUCKETS, fps=8, batch_size={(64, 96, 16): 3}).batch_sizes(5) == [
        5, 5, 5, 3, 5]  # fmt: skip
    tokens = stoker.VideoBuckets(BUCKETS, fps=8, max_tokens=1000, patch=(2, 8, 8))
    # (64, 96, 8): 4 * 8 * 12 = 384 tokens -> 2 clips; (48, 48, 16): 8 * 6 * 6 = 288 -> 3.
    assert tokens.batch_sizes(99) == [2, 2, 3, 1, 3]


def test_resume_mid_epoch_equals_the_uninterrupted_run(pack):
    whole = loader(pack, batch_size=1)
    whole.set_epoch(1)
    expected = run(whole)
    assert len(expected) >= 6
    first = loader(pack, batch_size=1)
    first.set_epoch(1)
    it = iter(first)
    head = [(c.clone(), s.clone(), i.clone()) for c, s, i in
            ((b["video"], b["video_timestamps"], b["index"]) for b in (next(it) for _ in range(3)))]
    state = first.state_dict()
    second = loader(pack, batch_size=1, threads=1)
    second.load_state_dict(state)
    got = head + run(second)
    assert len(got) == len(expected)
    for (c, s, i), (ec, es, ei) in zip(got, expected, strict=True):
        assert torch.equal(i, ei) and torch.equal(s, es) and torch.equal(c, ec)
    other = loader(pack, batch_size=1, buckets=stoker.VideoBuckets(BUCKETS[:3], fps=FPS))
    with pytest.raises(stoker.InvalidArgumentError, match="grouping"):
        other.load_state_dict(state)


@pytest.mark.parametrize("same_shape", [False, True])
def test_two_ranks_get_equal_steps_and_shapes(pack, same_shape):
    ranks = [run(loader(pack, batch_size=1, rank=r, world_size=2, leftovers="partial",
                        same_shape_across_ranks=same_shape)) for r in range(2)]  # fmt: skip
    assert len(ranks[0]) == len(ranks[1]) > 0
    if same_shape:
        for a, b in zip(*ranks, strict=True):
            assert a[0].shape == b[0].shape


def test_misuse_is_named_before_anything_starts(pack):
    with pytest.raises(stoker.InvalidArgumentError, match="height, width, frames"):
        stoker.VideoBuckets([(64, 96)], fps=8)
    with pytest.raises(stoker.InvalidArgumentError, match="twice"):
        stoker.VideoBuckets([(64, 96, 8), (64, 96, 8)], fps=8)
    with pytest.raises(stoker.InvalidArgumentError, match="not a bucket"):
        stoker.VideoBuckets(BUCKETS, fps=8, keep={(1, 2, 3): 0.5})
    with pytest.raises(stoker.InvalidArgumentError, match="keep"):
        stoker.VideoBuckets(BUCKETS, fps=8, keep=1.5)
    with pytest.raises(stoker.InvalidArgumentError, match="not both"):
        stoker.VideoBuckets(BUCKETS, fps=8, batch_size=2, max_tokens=100)
    with pytest.raises(stoker.InvalidArgumentError, match="fps"):
        loader(pack, fields={"video": stoker.Video(fps=4)})
    with pytest.raises(stoker.InvalidArgumentError, match="stride"):
        loader(pack, fields={"video": stoker.Video(stride=2)})
    with pytest.raises(stoker.InvalidArgumentError, match="Video field"):
        loader(pack, fields={"a": stoker.Video(), "b": stoker.Video()})


def test_a_pack_at_a_url_buckets_by_its_uploaded_facts(pack, tmp_path):
    import shutil
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from servers.nginx import NGINX, Nginx

    if not Path(NGINX).exists():
        pytest.skip("nginx is not installed")
    facts(pack)  # videos.npz beside the manifest: uploaded with the pack
    shutil.copytree(pack, tmp_path / "www" / "pack")
    local = {tuple(g["key"]): g["samples"] for g in loader(pack).groups}
    with Nginx(tmp_path / "www", tmp_path / "nginx") as server:
        ld = loader(f"{server.url}/pack", cache_dir=tmp_path / "cache", leftovers="partial")
        assert {tuple(g["key"]): g["samples"] for g in ld.groups} == local
        shapes = {(c.shape[3], c.shape[4], c.shape[1]) for c, _, _ in run(ld)}
        ld.close()  # before the server stops
        assert shapes and shapes <= set(BUCKETS)
        (tmp_path / "www" / "pack" / "videos.npz").unlink()
        with pytest.raises(stoker.InvalidArgumentError, match="videos.npz"):
            loader(f"{server.url}/pack", cache_dir=tmp_path / "cache2")
