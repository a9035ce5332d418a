"""Video for generative models (issue 56): clips at a fixed frame rate, decoded and bucketed.

    make bench-video-generation     # the peers' venv (torchcodec, PyAV), then this script

Two measurements, on clips panned over ImageNet photos and encoded by the ffmpeg command
(x264's and x265's defaults but for the rate, the size and B-frames: a keyframe every 250
frames, as most web video is cut):

1. *A clip, like for like* (the issue's "done when"): random clips of 16 frames at 8 fps from
   12-second 25 fps H.264 videos with 3 B-frames, 640x360, a keyframe every 250 frames (x264's
   default) and every 50 (2 s); the same (video, start) for every
   reader, each output frame the source frame nearest its time; one thread, the CPU time of the
   call (`time.thread_time`), from the file's bytes to RGB frames of the source's size:
   - stoker: `stoker._media.VideoReader(data).read_list(frames)` (what a Video field with
     `fps` runs: from the keyframe before the clip, the frames no output needs skipped where
     nothing refers to them);
   - PyAV: open, seek to the keyframe before the clip, decode to its last frame, the wanted
     ones to RGB (`to_ndarray(format="rgb24")`), one decoder thread;
   - torchcodec (CPU): `VideoDecoder(data, seek_mode="exact", num_ffmpeg_threads=1,
     dimension_order="NHWC").get_frames_played_at(times)`;
   - the decoder's floor: `ffmpeg -benchmark -threads 1 -ss KEYFRAME -i FILE -frames:v N -f
     null -` (its user time less that of the same command for one frame: every frame from
     the keyframe before the clip to its last decoded, none converted; with the process's
     start too in a row of its own).
   Interleaved clip by clip, every clip's frames checked alike across the readers (PSNR);
   medians over the clips, per reader.
2. *Bucketed training batches*: `VideoBuckets` over a mix of rates (24, 25, 29.97, 30, 60 fps),
   sizes (640x360, 360x640, 480x480, 854x480) and codecs (H.264 with and without B-frames,
   H.265), 16 or 8 frames at 8 fps, against a DataLoader (2 workers) with the same batches
   (stoker's, by index: each reader decodes exactly the same clips' videos) whose workers read
   the clip with PyAV, or with torchcodec's time-based sampler
   (`clips_at_random_timestamps(..., seconds_between_frames=1/8)`), then resize and crop to the
   bucket with torch (antialiased bilinear). Clips per second over epochs after a warm-up,
   medians of interleaved rounds.

Prints the figures of docs/BENCHMARKS.md's "Video for generative models", with the CPU and the
date. Never a timed test.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "bench-video-generation"
FPS, FRAMES = 8.0, 16
# The clips a trainer gets (a VAE's input sizes): (height, width, frames).
BUCKETS = [(176, 320, 16), (320, 176, 16), (240, 240, 16), (176, 320, 8), (240, 240, 8)]


def ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-nostdin", "-loglevel", "error", "-y", *args], check=True,
                   timeout=900)  # fmt: skip


def pan(photo: str, out: Path, size: str, rate: str, seconds: float, codec: list[str]) -> None:
    frames = int(round(seconds * 60))  # made at 60 fps, re-timed by the fps filter
    ffmpeg("-loop", "1", "-i", photo, "-vf",
           "scale=1920:1440:force_original_aspect_ratio=increase,crop=1920:1440,"
           f"zoompan=z='1.1+0.001*on':x='on*1.5':y='on*0.7':d={frames}:s={size}:fps=60,"
           f"fps={rate}", "-frames:v", str(int(seconds * Fraction(rate))),
           *codec, "-pix_fmt", "yuv420p", str(out))  # fmt: skip


X264_B3 = ["-c:v", "libx264", "-bf", "3", "-crf", "23"]
X264_NOB = ["-c:v", "libx264", "-bf", "0", "-crf", "23"]
X265 = ["-c:v", "libx265", "-crf", "28", "-x265-params", "log-level=error"]


def like_for_like_videos(n: int, keyint: int) -> list[Path]:
    folder = WORK / ("h264-25fps" if keyint == 250 else f"h264-25fps-g{keyint}")
    folder.mkdir(parents=True, exist_ok=True)
    photos = [p for p, _ in bench_data.imagenet_sample()]
    out = []
    for i in range(n):
        f = folder / f"v{i:02d}.mp4"
        if not f.exists():
            pan(photos[i], f, "640x360", "25", 12.0, [*X264_B3, "-g", str(keyint)])
        out.append(f)
    return out


def mixed_videos(n: int) -> Path:
    folder = WORK / "mixed" / "v"
    folder.mkdir(parents=True, exist_ok=True)
    photos = [p for p, _ in bench_data.imagenet_sample()][100:]
    kinds = [("640x360", "25", X264_B3), ("360x640", "30000/1001", X264_B3),
             ("480x480", "24", X264_NOB), ("854x480", "60", X265), ("640x360", "30", X265),
             ("360x640", "25", X264_NOB)]  # fmt: skip
    for i in range(n):
        size, rate, codec = kinds[i % len(kinds)]
        f = folder / f"m{i:03d}.mp4"
        if not f.exists():
            pan(photos[i], f, size, rate, 1.5 + (i * 7) % 9, codec)
    return folder.parent


# --- 1. a clip, like for like ---------------------------------------------------------------


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b) ** 2))
    return 99.0 if mse == 0 else 10 * math.log10(255.0**2 / mse)


def nearest_frames(times: np.ndarray, start: float) -> list[int]:
    out = []
    for t in range(FRAMES):
        at = start + t / FPS
        k = int(np.searchsorted(times, at))
        if k == len(times) or (k > 0 and at - times[k - 1] <= times[k] - at + 1e-9):
            k -= 1
        out.append(k)
    return out


def stoker_clip(data: bytes, frames: list[int]) -> np.ndarray:
    from stoker import _media

    return _media.VideoReader(data).read_list(frames)


def pyav_clip(data: bytes, wanted_pts: list[int], keyframe_pts: int) -> list[np.ndarray]:
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "NONE"
        stream.codec_context.thread_count = 1
        container.seek(keyframe_pts, stream=stream, backward=True, any_frame=False)
        wanted = sorted(set(wanted_pts))
        got, last = [], wanted[-1]
        for frame in container.decode(stream):
            if frame.pts in wanted:
                got.append(frame.to_ndarray(format="rgb24"))
            if frame.pts >= last:
                break
        return got


def torchcodec_clip(data: bytes, times: list[float]) -> object:
    from torchcodec.decoders import VideoDecoder

    decoder = VideoDecoder(data, seek_mode="exact", num_ffmpeg_threads=1,
                           dimension_order="NHWC")  # fmt: skip
    return decoder.get_frames_played_at(times).data


def ffmpeg_user_seconds(path: Path, start: float, frames: int) -> float:
    """ffmpeg's own user time decoding `frames` frames from `start` (one thread, no output)."""
    command = ["ffmpeg", "-nostdin", "-hide_banner", "-benchmark", "-threads", "1", "-ss",
               f"{start:.6f}", "-i", str(path), "-frames:v", str(frames), "-f", "null", "-"]
    run = subprocess.run(command, capture_output=True, text=True, check=True)
    match = re.search(r"bench: utime=([\d.]+)s", run.stderr)
    assert match, run.stderr[-400:]
    return float(match.group(1))


def like_for_like(clips: int, seed: int, keyint: int) -> list[str]:
    import av

    files = like_for_like_videos(8, keyint)
    rng = random.Random(seed)
    rows: dict[str, list[float]] = {k: [] for k in
                                   ("stoker", "PyAV", "torchcodec", "floor", "floor1")}  # fmt: skip
    have_tc = True
    try:
        import torchcodec  # noqa: F401
    except ImportError:
        have_tc = False
    info = {}
    for f in files:
        data = f.read_bytes()
        from stoker import _media

        r = _media.VideoReader(data)
        with av.open(io.BytesIO(data)) as c:
            s = c.streams.video[0]
            pts = sorted(p.pts for p in c.demux(s) if p.pts is not None and not p.is_discard)
            tb = float(s.time_base)
        assert len(pts) == r.info["frames"], (f, len(pts), r.info["frames"])
        info[f] = (data, np.asarray(r.frame_times()), list(r.keyframes), pts, tb)
    checked = 0
    for n in range(clips + 2):  # the first two: a warm-up
        f = files[rng.randrange(len(files))]
        data, times, keys, pts, tb = info[f]
        start = rng.uniform(0, times[-1] - (FRAMES - 1) / FPS)
        frames = nearest_frames(times, start)
        key = max(k for k in keys if k <= frames[0])
        order = ["stoker", "PyAV", "torchcodec"]
        rng.shuffle(order)
        results = {}
        for name in order:
            t0 = time.thread_time()
            if name == "stoker":
                results[name] = stoker_clip(data, frames)
            elif name == "PyAV":
                results[name] = pyav_clip(data, [pts[i] for i in frames], pts[key])
            elif have_tc:  # each wanted frame's own presentation time
                results[name] = torchcodec_clip(data, [pts[i] * tb for i in frames])
            else:
                continue
            if n >= 2:
                rows[name].append(time.thread_time() - t0)
        # The same frames from each reader (all libavcodec; RGB converted each its own way:
        # 33-37 dB apart here, against at most 29 between a frame and its neighbours).
        a = results["stoker"]
        by_pts = dict(zip(sorted(set(pts[i] for i in frames)), results["PyAV"], strict=True))
        for t, i in enumerate(frames):
            assert psnr(a[t], by_pts[pts[i]]) > 31, ("PyAV", f, t)
            if have_tc:
                assert psnr(a[t], np.asarray(results["torchcodec"][t])) > 31, ("torchcodec", f, t)
        checked += 1
        if n >= 2:
            span = frames[-1] - key + 1
            whole = ffmpeg_user_seconds(f, float(times[key]), span)
            one = ffmpeg_user_seconds(f, float(times[key]), 1)
            rows["floor"].append(whole)
            rows["floor1"].append(whole - one)
    assert checked == clips + 2
    ms = {k: 1000 * statistics.median(v) for k, v in rows.items() if v}
    cpu = _cpu()
    lines = [f"Clips of {FRAMES} frames at {FPS:g} fps from 12 s 25 fps 640x360 H.264 (3 B-frames, "
             f"a keyframe every {keyint} frames), {clips} random clips, one thread, CPU ms a clip "
             f"(median); {cpu}, {time.strftime('%Y-%m-%d')}:", "",
             "| reader | ms a clip | stoker is |", "|---|---:|---:|"]  # fmt: skip
    # Clip by clip (the readers timed on the same clip, interleaved): the median of the ratios.
    def paired(name: str) -> float:
        return statistics.median(x / y for x, y in zip(rows[name], rows["stoker"], strict=True))

    lines[-2:] = ["| reader | ms a clip | stoker is (of the medians; clip by clip) |",
                  "|---|---:|---:|"]  # fmt: skip
    for name in ("stoker", "PyAV", "torchcodec"):
        if name in ms:
            ratio = ("" if name == "stoker" else
                     f"{ms[name] / ms['stoker']:.2f}x faster; {paired(name):.2f}x")  # fmt: skip
            lines.append(f"| {name} | {ms[name]:.1f} | {ratio} |")
    floor = statistics.median(y / x for x, y in zip(rows["floor1"], rows["stoker"], strict=True))
    lines.append(f"| `ffmpeg -benchmark` decoding the keyframe-to-last-frame run (the floor, "
                 f"less one frame's start-up) | {ms['floor1']:.1f} | "
                 f"{ms['stoker'] / ms['floor1']:.2f}x the floor; {floor:.2f}x |")
    lines.append(f"| the same, the process's start included | {ms['floor']:.1f} | |")
    return lines


# --- 2. bucketed batches ------------------------------------------------------------------------


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return platform.processor()


def cover_crop(clip, h: int, w: int):
    """[T, H, W, 3] uint8 -> [T, 3, h, w]: resized to cover (antialiased bilinear), centred."""
    import torch
    import torch.nn.functional as F

    x = clip.permute(0, 3, 1, 2).float()
    H, W = x.shape[2:]
    scale = max(h / H, w / W)
    size = (max(h, round(H * scale)), max(w, round(W * scale)))
    x = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
    top, left = (size[0] - h) // 2, (size[1] - w) // 2
    return x[:, :, top:top + h, left:left + w].round().clamp(0, 255).to(torch.uint8)


class ClipSet:
    """The videos of a pack by index; a clip of bucket k's shape by PyAV or torchcodec."""

    def __init__(self, files: list[str], buckets: list[tuple[int, int, int]], reader: str):
        self.files, self.buckets, self.reader = files, buckets, reader

    def __getitem__(self, item):
        import torch

        index, bucket = item
        h, w, t = self.buckets[bucket]
        data = Path(self.files[index]).read_bytes()
        rng = random.Random(index * 1009 + bucket)
        if self.reader == "torchcodec":
            from torchcodec.decoders import VideoDecoder
            from torchcodec.samplers import clips_at_random_timestamps

            d = VideoDecoder(data, seek_mode="exact", num_ffmpeg_threads=1,
                             dimension_order="NHWC")  # fmt: skip
            clip = clips_at_random_timestamps(d, num_clips=1, num_frames_per_clip=t,
                                              seconds_between_frames=1 / FPS).data[0]
        else:
            import av

            with av.open(io.BytesIO(data)) as c:
                s = c.streams.video[0]
                s.thread_type = "NONE"
                tb = float(s.time_base)
                pts = sorted(p.pts for p in c.demux(s) if p.pts is not None)
                times = (np.asarray(pts) - pts[0]) * tb
                start = rng.uniform(0, max(0.0, times[-1] - (t - 1) / FPS))
                frames = nearest_frames(times, start)[:t]
                c.seek(pts[frames[0]], stream=s, backward=True, any_frame=False)
                wanted = [pts[i] for i in frames]
                got = {}
                for frame in c.decode(s):
                    if frame.pts in wanted:
                        got[frame.pts] = frame.to_ndarray(format="rgb24")
                    if frame.pts >= wanted[-1]:
                        break
                clip = torch.from_numpy(np.stack([got[p] for p in wanted]))
        return cover_crop(clip, h, w)


def bucketed(rounds: int, videos: int) -> list[str]:
    import torch

    import stoker

    src = mixed_videos(videos)
    pack = WORK / "mixed-pack"
    if not (pack / "manifest.json").exists():
        stoker.pack(src, pack, progress=False)
    stoker.video_facts(pack, progress=False)
    ds = stoker.load.loader.open_dataset(pack)
    files = []
    extracted = WORK / "mixed-files"
    extracted.mkdir(exist_ok=True)
    for i in range(len(ds)):
        f = extracted / f"{i:04d}.mp4"
        if not f.exists():
            f.write_bytes(ds.read(i, "mp4"))
        files.append(str(f))
    buckets = stoker.VideoBuckets(BUCKETS, fps=FPS, batch_size=4)
    # Every clip of the pack an epoch (the last batch of a bucket may be smaller).
    loader = stoker.Loader(pack, batch_size=4, buckets=buckets, threads=2, seed=0,
                           leftovers="partial", return_index=True,
                           fields={"video": stoker.Video()})  # fmt: skip
    plan = [(b["index"].tolist(), (b["video"].shape[3], b["video"].shape[4], b["video"].shape[1]))
            for b in loader]  # fmt: skip
    group = {tuple(g["key"]): k for k, g in enumerate(loader.groups)}
    batches = [[(i, group[shape]) for i in idx] for idx, shape in plan]
    clips = sum(len(b) for b in batches)

    def stoker_epoch() -> float:
        t0 = time.perf_counter()
        n = sum(len(b["video"]) for b in loader)
        return n / (time.perf_counter() - t0)

    def dataloader_epoch(reader: str):
        dl = torch.utils.data.DataLoader(ClipSet(files, list(buckets.buckets), reader),
                                         batch_sampler=batches, num_workers=2,
                                         persistent_workers=True, prefetch_factor=2,
                                         collate_fn=torch.stack)  # fmt: skip

        def epoch() -> float:
            t0 = time.perf_counter()
            n = sum(len(b) for b in dl)
            return n / (time.perf_counter() - t0)

        return epoch

    runners = {"stoker Loader + VideoBuckets (2 threads)": stoker_epoch,
               "DataLoader + PyAV (2 workers)": dataloader_epoch("pyav")}  # fmt: skip
    try:
        import torchcodec  # noqa: F401

        runners["DataLoader + torchcodec samplers (2 workers)"] = dataloader_epoch("torchcodec")
    except ImportError:
        pass
    for run in runners.values():
        run()  # warm-up: workers started, files in the page cache
    rates: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            rates[name].append(run())
    best = statistics.median(rates["stoker Loader + VideoBuckets (2 threads)"])
    lines = [f"{len(ds)} videos (24, 25, 29.97, 30, 60 fps; 640x360, 360x640, 480x480, 854x480; "
             f"H.264 with and without B-frames, H.265), {clips} clips an epoch in "
             f"{len(batches)} bucketed batches ({loader.groups_excluded} videos fill no bucket), "
             f"clips per second (median of {rounds} rounds); "
             f"{_cpu()}, {time.strftime('%Y-%m-%d')}:", "",
             "| loader | clips/s | stoker is |", "|---|---:|---:|"]  # fmt: skip
    for name, r in rates.items():
        m = statistics.median(r)
        ratio = "" if m == best else f"{best / m:.2f}x faster"
        lines.append(f"| {name} | {m:.1f} | {ratio} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--videos", type=int, default=48)
    parser.add_argument("--only", choices=["clip", "buckets"])
    args = parser.parse_args()
    tempfile.tempdir = str(WORK)
    WORK.mkdir(parents=True, exist_ok=True)
    if args.only != "buckets":
        for keyint in (250, 50):  # x264's default; 2 s, as many training sets are cut
            print("\n".join(like_for_like(args.clips, seed=0, keyint=keyint)), flush=True)
            print()
    if args.only != "clip":
        print("\n".join(bucketed(args.rounds, args.videos)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
