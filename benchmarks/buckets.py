"""Aspect-ratio buckets: stoker against what users run today (a torch DataLoader with an
aspect-ratio batch sampler and PIL resize + crop, as kohya's and diffusers' bucketing trainers
do), the same buckets on the same machine, and against stoker's own square paths at the same
pixels a batch; writes its section of docs/BENCHMARKS.md.

    .venv/bin/python benchmarks/buckets.py            # about 20 min on 2 shared cores
    .venv/bin/python benchmarks/buckets.py --quick    # 2 rounds, workers 0 and 2, no write

Data: the 1,000 imagenet-sample JPEGs (mostly 500x375 and 375x500) and the 8-bit photos of
jpeg-variety from 48 px to 1.5 megapixels, packed once with `stoker.pack` defaults under
build/bench-buckets; the DataLoader reads the same files. Two configurations of buckets, run in
the same invocation, their loaders interleaved:

- "near": `AspectBuckets(area=256 * 256, step=32, max_ratio=2.0)`: the photos are under twice
  the buckets' sides, so no DCT scale applies and every loader decodes every pixel;
- "half": `AspectBuckets(area=160 * 160, step=16, max_ratio=2.0)`: the buckets' sides are at
  most half most photos', as 512 x 512 or 1024 x 1024 buckets are to the 1-4 megapixel photos
  of LAION-style sets; what decides a decode's cost is the ratio of photo to bucket, and at 2x
  and more stoker's decoder renders each photo at 1/2 (1/4, 1/8) scale.

Each with `batch_pixels` of 32 images at the area: about 32 images a batch. Where torch sees a
GPU (and nvImageCodec is installed), one more stoker loader: `decode="gpu"` with float32 [-1, 1]
batches on the GPU, whose host CPU an image is then reading, planning and the stage thread's
launches (tests/gpu/run_decode_check.sh buckets).

Method: a warm-up epoch of every loader (the DataLoaders first, so that their workers fork
before stoker's buffers exist), in which every batch is checked (one shape, from the bucket set,
its batch size the bucket's; the square paths' one square), and stoker's count of the DCT
scales it decoded at (`stats()["dct_scales"]`) is read; then --rounds rounds, each timing one
epoch of every loader of both configurations in turn (interleaved: a change in the machine's
load falls on all of them). Per epoch: images/s (wall clock) and the CPU time of the whole job
(the process and its DataLoader workers, from /proc), per image and per output pixel; the
figures are medians over the rounds. The machine is shared with other work: CPU time is the
steadier figure, and the one the ratios and the square paths are compared by. Never a timed
test.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_data  # noqa: E402
import stoker  # noqa: E402
from stoker.machine import usable_cores  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
WORK = ROOT / "build" / "bench-buckets"
BEGIN, END = bench_data.markers("benchmarks/buckets.py")
MAX_RATIO, BATCH = 2.0, 32
FLOOR = "decode floor (PIL, one thread)"
GPU = "stoker buckets, decode='gpu', float32 [-1, 1] on cuda"  # where torch sees a GPU
warnings.filterwarnings("ignore", message="This DataLoader will create")


@dataclass
class Config:
    key: str
    title: str
    area: int  # buckets of about area x area
    step: int
    buckets: Any = None
    batch_sizes: list[int] = field(default_factory=list)
    assigned: Any = None  # each photo's bucket (pack order)
    loaders: dict[str, Any] = field(default_factory=dict)
    scales: dict[int, int] = field(default_factory=dict)  # stoker buckets' warm-up epoch


CONFIGS = [
    Config("near", "photos under twice the buckets' sides", 256, 32),
    Config("half", "buckets at most half the photos' sides", 160, 16),
]


def photos() -> list[Path]:
    """imagenet-sample, then the decodable 8-bit photos of jpeg-variety (48 px to 1.5 Mpx)."""
    out = sorted((SHARED / "imagenet-sample").iterdir())
    manifest = SHARED / "MANIFEST.tsv"  # absent on a GPU machine's kit: imagenet-sample alone
    for line in manifest.read_text().splitlines()[1:] if manifest.exists() else []:
        f = line.split("\t")
        if not f[0].startswith("jpeg-variety/") or f[2] not in ("baseline", "progressive-huff"):
            continue
        w, h = (int(v) for v in f[4].split("x"))
        if f[3] == "8" and f[11] == "0" and min(w, h) >= 48 and w * h <= 1_500_000:
            out.append(SHARED / f[0])
    return out


def build() -> tuple[list[Path], Path]:
    """The photos (copied into one class folder, as the pack reads them) and their pack."""
    src = WORK / "src" / "photos"
    pack = WORK / "pack"
    files = photos()
    if not (pack / "manifest.json").exists():
        shutil.rmtree(WORK, ignore_errors=True)
        src.mkdir(parents=True)
        for i, p in enumerate(files):
            shutil.copy(p, src / f"{i:05d}.jpg")
        stoker.pack(WORK / "src", pack, progress=False)
    return sorted(src.iterdir()), pack


# --- the DataLoader side: what a bucketing trainer writes with PIL -------------------------------


def covering(width: int, height: int, bucket: tuple[int, int]) -> tuple[int, int]:
    """The size a photo is resized to so that it covers its bucket, aspect kept (kohya's)."""
    bh, bw = bucket
    scale = max(bw / width, bh / height)
    return max(bw, round(width * scale)), max(bh, round(height * scale))


class BucketDataset(torch.utils.data.Dataset):
    """kohya's and diffusers' bucketing: each image resized (PIL BILINEAR, antialiased) so that
    it covers its bucket, then cropped to it at a random place and flipped half the time, and
    made the tensor their models take: ToTensor + Normalize([0.5], [0.5]) (float32 in [-1, 1]).
    With `draft`, PIL's `draft('RGB', covering size)` first: libjpeg's DCT scaling, the largest
    of 1/2, 1/4, 1/8 that keeps the covering size (one line neither trainer has)."""

    def __init__(self, files: list[Path], bucket_of: list[tuple[int, int]], draft: bool = False):
        self.files, self.bucket_of, self.draft = files, bucket_of, draft

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        from PIL import Image

        bh, bw = self.bucket_of[i]
        with Image.open(self.files[i]) as im:
            if self.draft:
                im.draft("RGB", covering(im.width, im.height, (bh, bw)))
            im = im.convert("RGB")
        nw, nh = covering(im.width, im.height, (bh, bw))
        im = im.resize((nw, nh), Image.BILINEAR)
        left, top = random.randint(0, nw - bw), random.randint(0, nh - bh)
        im = im.crop((left, top, left + bw, top + bh))
        if random.random() < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float().div(255)
        return x.sub_(0.5).div_(0.5)


class AspectRatioBatchSampler(torch.utils.data.Sampler):
    """Batches of one bucket each: indices shuffled every epoch, each into its bucket's list, a
    batch emitted when a bucket's list holds its batch size; the buckets' last partial batches
    are dropped (kohya keeps fewer; either way they never mix shapes)."""

    def __init__(self, bucket: list[int], batch_sizes: list[int], seed: int = 0):
        self.bucket, self.batch_sizes, self.epoch, self.seed = bucket, batch_sizes, 0, seed

    def __iter__(self):
        order = list(range(len(self.bucket)))
        random.Random(self.seed + self.epoch).shuffle(order)
        self.epoch += 1
        open_: dict[int, list[int]] = {}
        for i in order:
            b = self.bucket[i]
            open_.setdefault(b, []).append(i)
            if len(open_[b]) == self.batch_sizes[b]:
                yield open_.pop(b)

    def __len__(self) -> int:
        return sum(self.bucket.count(b) // n for b, n in enumerate(self.batch_sizes))


def dataloader(files, config: Config, workers: int, draft: bool = False):
    dataset = BucketDataset(files, [config.buckets.sizes[b] for b in config.assigned], draft)
    sampler = AspectRatioBatchSampler(list(config.assigned), config.batch_sizes)
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, num_workers=workers, persistent_workers=workers > 0,
        prefetch_factor=2 if workers else None,
    )  # fmt: skip


class DecodeFloor:
    """libjpeg-turbo decoding each photo through PIL (`open` + `load`), nothing else: what any
    loader pays at least to decode what it keeps. Whole (`buckets=None`): no crop skips a
    bucket's pixels and no DCT scale applies to photos under twice its sides. With the buckets,
    `draft` first, to the photo's covering size of its bucket: at the DCT scale stoker decodes
    at; `scales` counts the photos decoded at each."""

    def __init__(self, files: list[Path], config: Config | None = None):
        self.data = [f.read_bytes() for f in files]
        self.sizes = None if config is None else [config.buckets.sizes[b] for b in config.assigned]
        self.scales: dict[int, int] = {}

    def __iter__(self):
        from PIL import Image

        self.scales = {1: 0, 2: 0, 4: 0, 8: 0}
        for i, d in enumerate(self.data):
            with Image.open(io.BytesIO(d)) as im:
                width = im.width
                if self.sizes is not None:
                    im.draft("RGB", covering(im.width, im.height, self.sizes[i]))
                im.load()
                scale = round(width / im.width)
                self.scales[scale] = self.scales.get(scale, 0) + 1
                yield torch.empty(1, 3, im.height, im.width, dtype=torch.uint8)


# --- measuring ----------------------------------------------------------------------------------


def job_cpu() -> float:
    """CPU seconds of this process and its children alive now (DataLoader workers)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def images_of(batch: Any) -> torch.Tensor:
    return batch["image"] if isinstance(batch, dict) else batch


def epoch(loader: Any, check: Any = None) -> tuple[int, int, float, float]:
    """(images, output pixels, wall seconds, CPU seconds) of one epoch."""
    n = pixels = 0
    c0, t0 = job_cpu(), time.perf_counter()
    for batch in loader:
        images = images_of(batch)
        if check is not None:
            check(images)
        n += images.shape[0]
        pixels += images.shape[0] * images.shape[2] * images.shape[3]
    return n, pixels, time.perf_counter() - t0, job_cpu() - c0


def checker(config: Config, name: str):
    """The warm-up's check of every batch: one shape, from the bucket set, the bucket's batch
    size (the square paths: one square of the area), float32 in [-1, 1] where converted."""
    if name == FLOOR:
        return None
    square = "square" in name

    def check(images: torch.Tensor) -> None:
        size = tuple(images.shape[2:])
        if square:
            assert size == (config.area, config.area) and images.shape[0] <= BATCH, images.shape
        else:
            assert size in config.buckets.sizes, size
            bucket = config.buckets.sizes.index(size)
            assert images.shape[0] == config.batch_sizes[bucket], images.shape
        assert images.dtype in (torch.uint8, torch.float32) and images.shape[1] == 3
        if images.dtype == torch.float32:
            assert -1.0 <= float(images.min()) and float(images.max()) <= 1.0

    return check


def make_loaders(config: Config, files: list[Path], hw: np.ndarray, workers: tuple[int, ...]):
    area = config.area * config.area
    config.buckets = stoker.AspectBuckets(area=area, step=config.step, max_ratio=MAX_RATIO,
                                          batch_pixels=BATCH * area)  # fmt: skip
    config.batch_sizes = config.buckets.batch_sizes(BATCH)
    config.assigned = config.buckets.assign(hw)
    for w in workers:  # first: their workers fork before stoker's threads and buffers exist
        config.loaders[f"DataLoader workers={w}"] = dataloader(files, config, w)
    draft_workers = min(2, max(workers))
    config.loaders[f"DataLoader workers={draft_workers} + PIL draft"] = dataloader(
        files, config, draft_workers, draft=True)  # fmt: skip


def make_stoker_loaders(config: Config, files: list[Path], pack: Path, threads: int) -> None:
    kinds = dict(batch_size=BATCH, threads=threads, seed=0)
    config.loaders["stoker buckets, float32 [-1, 1]"] = stoker.Loader(
        pack, buckets=config.buckets, fields={"image": stoker.Image()}, device="cpu",
        dtype=torch.float32, mean=(0.5,) * 3, std=(0.5,) * 3, **kinds)  # fmt: skip
    config.loaders["stoker buckets"] = stoker.Loader(pack, buckets=config.buckets, fields={
        "image": stoker.Image()}, **kinds)  # fmt: skip
    if torch.cuda.is_available():  # the decode on the GPU: the host only reads and plans
        try:
            config.loaders[GPU] = stoker.Loader(
                pack, buckets=config.buckets, fields={"image": stoker.Image(decode="gpu")},
                device="cuda", dtype=torch.float32, mean=(0.5,) * 3, std=(0.5,) * 3,
                **kinds)  # fmt: skip
        except stoker.DeviceUnavailableError as e:  # no nvImageCodec
            print(f"no decode='gpu' row: {e}", flush=True)
    square = {"square CoverCrop": stoker.CoverCrop(), "square Resize": stoker.Resize(),
              "square RandomResizedCrop": stoker.RandomResizedCrop()}  # fmt: skip
    for name, geometry in square.items():
        config.loaders[f"stoker {name}"] = stoker.Loader(pack, fields={"image": stoker.Image(
            size=config.area, geometry=geometry, hflip=0.5)}, **kinds)  # fmt: skip
    config.loaders[FLOOR] = DecodeFloor(files, None if config.key == "near" else config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds, workers 0 and 2, no write")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--workers", default=None, help="DataLoader num_workers, e.g. 0,2,4")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 5)
    workers = (tuple(int(w) for w in args.workers.split(",")) if args.workers
               else (0, 2) if args.quick else (0, 1, 2, 4))  # fmt: skip
    threads = usable_cores()
    load_start = os.getloadavg()[0]
    t0 = time.time()
    machine = bench_data.machine()
    print(f"machine: {machine}; load average {load_start:.2f}", flush=True)
    files, pack = build()
    ds = stoker.load.loader.open_dataset(pack)
    hw = np.concatenate([ds.image_sizes(s, ["jpg"])[0] for s in range(ds.num_shards)])
    assert len(hw) == len(files), (len(hw), len(files))
    for config in CONFIGS:  # every DataLoader (and its workers) before any stoker loader
        make_loaders(config, files, hw, workers)
    for config in CONFIGS:
        make_stoker_loaders(config, files, pack, threads)

    runs: dict[tuple[str, str], list[tuple[int, int, float, float]]] = {
        (c.key, k): [] for c in CONFIGS for k in c.loaders}  # fmt: skip
    for config in CONFIGS:  # warm-up, checked
        for name, loader in config.loaders.items():
            n, *_ = epoch(loader, checker(config, name))
            print(f"warm-up {config.key} {name}: {n} images", flush=True)
        config.scales = dict(config.loaders["stoker buckets"].stats()["dct_scales"])
        print(f"{config.key}: stoker buckets decoded at DCT scales {config.scales}, the floor "
              f"at {config.loaders[FLOOR].scales}", flush=True)  # fmt: skip
    half = next(c for c in CONFIGS if c.key == "half")
    scaled = sum(v for k, v in half.scales.items() if k > 1)
    assert scaled > sum(half.scales.values()) // 2, f"DCT scaling did not apply: {half.scales}"
    for r in range(rounds):
        for config in CONFIGS:
            for name, loader in config.loaders.items():
                runs[(config.key, name)].append(epoch(loader))
        rates = (f"{c} {k} {v[-1][0] / v[-1][2]:.0f}" for (c, k), v in runs.items())
        print(f"round {r + 1}: " + ", ".join(rates), flush=True)
    stats = {c.key: c.loaders["stoker buckets"].stats() for c in CONFIGS}
    for config in CONFIGS:
        for loader in config.loaders.values():
            if isinstance(loader, stoker.Loader):
                loader.close()
    load_end = os.getloadavg()[0]
    text = section(runs, machine, threads, rounds, (load_start, load_end), time.time() - t0, hw,
                   stats, workers)  # fmt: skip
    print(text)
    if not args.no_write and not args.quick:
        bench_data.write_section("benchmarks/buckets.py", text)


# --- the section --------------------------------------------------------------------------------


def medians(v: list[tuple[int, int, float, float]]) -> dict[str, float]:
    return {"rate": statistics.median(n / w for n, _, w, _ in v),
            "cpu_img": statistics.median(c / n * 1e3 for n, _, _, c in v),
            "cpu_px": statistics.median(c / p * 1e9 for _, p, _, c in v),
            "px_img": statistics.median(p / n for n, p, _, _ in v)}  # fmt: skip


def scale_text(scales: dict[int, int]) -> str:
    total = max(1, sum(scales.values()))
    return ", ".join(f"1/{k}: {v} ({100 * v / total:.0f}%)" for k, v in sorted(scales.items()) if v)


def config_lines(config: Config, med: dict[str, dict[str, float]], stats: dict[str, Any],
                 near_floor: dict[str, float]) -> list[str]:  # fmt: skip
    sizes = ", ".join(f"{h}x{w} (batch {b})" for (h, w), b in
                      zip(config.buckets.sizes, config.batch_sizes, strict=True))  # fmt: skip
    area = config.area
    floor_text = "each photo whole" if config.key == "near" else (
        "with PIL draft to the covering size: "
        + scale_text(config.loaders[FLOOR].scales))  # fmt: skip
    lines = [
        f"### {config.title} (`{config.key}`)",
        "",
        f"`AspectBuckets(area={area} * {area}, step={config.step}, max_ratio={MAX_RATIO}, "
        f"batch_pixels={BATCH} * {area} * {area})`: {sizes}. The square paths: {BATCH} images "
        f"of {area}x{area}. stoker's bucketed epoch decoded the photos at DCT scale "
        f"{scale_text(config.scales)} (`stats()['dct_scales']`, the warm-up epoch); the floor "
        f"below decodes {floor_text}.",
        "",
        "| loader | images/s | CPU ms an image | output pixels an image | CPU ns an output pixel |",
        "|---|---:|---:|---:|---:|",
    ]
    for k, m in med.items():
        lines.append(f"| {k} | {m['rate']:.0f} | {m['cpu_img']:.2f} | {m['px_img']:.0f} | "
                     f"{m['cpu_px']:.1f} |")  # fmt: skip
    dls = [k for k in med if k.startswith("DataLoader") and "draft" not in k]
    draft = next(k for k in med if "draft" in k)
    cheapest = min(dls, key=lambda k: med[k]["cpu_img"])
    fastest = max(dls, key=lambda k: med[k]["rate"])
    ours, same = med["stoker buckets"], med["stoker buckets, float32 [-1, 1]"]
    floor, dl = med[FLOOR], med[cheapest]
    sq = {k.removeprefix("stoker square "): m for k, m in med.items() if "square" in k}
    per = {k: v / stats["samples"] * 1e3 for k, v in stats["seconds"].items()}
    lines += [
        "",
        f"- the whole job's CPU an image, the DataLoader's cheapest ({cheapest}, "
        f"{dl['cpu_img']:.2f} ms) over stoker's: **{dl['cpu_img'] / ours['cpu_img']:.2f}x** "
        f"for its uint8 batches, **{dl['cpu_img'] / same['cpu_img']:.2f}x** converted "
        f"to float32 [-1, 1] on the host (the DataLoader's very tensors); with PIL draft "
        f"({draft}, {med[draft]['cpu_img']:.2f} ms) {med[draft]['cpu_img'] / ours['cpu_img']:.2f}x "
        f"and {med[draft]['cpu_img'] / same['cpu_img']:.2f}x.",
        f"- images/s, stoker's float32 batches over the DataLoader's fastest ({fastest}): "
        f"{same['rate'] / med[fastest]['rate']:.2f}x ({ours['rate'] / med[fastest]['rate']:.2f}x "
        "for uint8); wall-clock rates swing with the shared machine's load.",
        f"- the decode floor: {floor['cpu_img']:.2f} ms an image"
        + ("" if config.key == "near" else
           f" (decoding each photo whole: {near_floor['cpu_img']:.2f} ms)")
        + f"; stoker's bucketed batches cost {ours['cpu_img'] / floor['cpu_img']:.2f}x it, the "
        f"DataLoader's cheapest {med[cheapest]['cpu_img'] / near_floor['cpu_img']:.2f}x the whole "
        "decode.",
        *([f"- with `decode='gpu'` (float32 on the GPU, nvImageCodec): the whole job's CPU an "
           f"image {med[GPU]['cpu_img']:.2f} ms, the DataLoader's cheapest over it "
           f"**{dl['cpu_img'] / med[GPU]['cpu_img']:.2f}x**; {med[GPU]['rate']:.0f} images/s."]
          if GPU in med else []),
        "- stoker buckets' CPU an output pixel over its square paths': " + ", ".join(
            f"{name} **{ours['cpu_px'] / m['cpu_px']:.2f}x**" for name, m in sq.items()) + ".",
        f"- stoker's worker time an image (wall, summed over threads, on the shared machine): "
        f"read {per['read']:.2f} ms, decode {per['decode']:.2f} ms, transform "
        f"{per['transform']:.2f} ms, collate {per['collate']:.2f} ms; leftovers carried to the "
        f"next epoch over the run: {stats['leftovers']['carried']} samples.",
        "",
    ]  # fmt: skip
    return lines


def section(runs, machine, threads, rounds, load, seconds, hw, stats, workers) -> str:
    ratio = hw[:, 1] / np.maximum(hw[:, 0], 1)
    command = "python benchmarks/buckets.py" + "".join(
        f" {a}" for a in sys.argv[1:] if a != "--no-write")  # fmt: skip
    lines = [
        BEGIN,
        "## Aspect-ratio buckets (stoker.AspectBuckets)",
        "",
        "Written by `benchmarks/buckets.py`; every number here comes from the same run, both "
        "configurations' loaders interleaved in every round.",
        "",
        f"- command: `{command}`",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}, shared with "
        "other engineers' builds and tests while it ran (hence interleaved rounds, medians, and "
        f"CPU time); Python {machine['python']}, torch {machine['torch']}, libjpeg-turbo "
        f"{machine['libjpeg-turbo']}, Pillow {__import__('PIL').__version__}; load average "
        f"{load[0]:.2f} at the start, {load[1]:.2f} at the end",
        f"- date: {time.strftime('%Y-%m-%d')}, run time {seconds / 60:.1f} min",
        f"- data: {len(hw)} real photos: the 1,000 of imagenet-sample (mostly 500x375 and "
        "375x500) and the 8-bit photos of jpeg-variety (48 px to 1.5 megapixels); width / height "
        f"from {ratio.min():.2f} to {ratio.max():.2f}, {int((ratio < 0.95).sum())} portrait, "
        f"{int((ratio > 1.05).sum())} landscape. stoker reads their pack (`stoker.pack` "
        "defaults: restart markers), the DataLoader the same JPEG files.",
        "- two configurations of buckets over the same photos: `near`, buckets of 256 x 256's "
        "area, under twice the photos' sides, where no DCT scale applies; `half`, buckets of "
        "160 x 160's area, at most half most photos' sides, as 512 x 512 or 1024 x 1024 "
        "buckets are to LAION-style photos of 1-4 megapixels. The decode's cost follows the "
        "ratio of photo to bucket, not their absolute sizes: libjpeg's DCT scaling renders a "
        "photo at 1/2, 1/4 or 1/8 of its sides only where the output is at most that, and a "
        "4:3 photo of 2048x1536 into 1024 x 1024's buckets decodes at 1/2 as a 500x375 one "
        "into 160 x 160's does. Each photo to the bucket nearest its aspect; training crops "
        "(random along the slack) and flips.",
        "- DataLoader: what kohya's and diffusers' bucketing trainers run: an aspect-ratio batch "
        "sampler (indices shuffled, one list per bucket, a batch when a list holds its bucket's "
        "batch size) and, per image, PIL `open`, `convert('RGB')`, `resize` BILINEAR to cover "
        "the bucket, a random `crop` to it, a flip half the time, and ToTensor + "
        "Normalize([0.5], [0.5]) as both do (float32 in [-1, 1]); `persistent_workers=True`, "
        f"`num_workers` {', '.join(str(w) for w in workers)}. `+ PIL draft` adds "
        "`im.draft('RGB', covering size)` before `convert`: libjpeg's DCT scaling in PIL, one "
        "line neither trainer has. stoker: `Loader(pack, buckets=..., fields={'image': "
        f"stoker.Image()}})`, `threads={threads}`; `stoker buckets, float32 [-1, 1]` adds "
        "`device='cpu', dtype=torch.float32, mean=(0.5,) * 3, std=(0.5,) * 3` (the same tensors "
        "the DataLoader gives, converted on the host; with `device='cuda'` the conversion runs "
        "on the GPU instead), `stoker buckets` hands out its uint8 batches.",
        "- stoker's square paths, the same pack at the same pixels a batch: `CoverCrop` (the "
        "bucket's crop at aspect 1: the photo's centre square, at a random place along the "
        "slack: a quarter less of a 4:3 photo decoded), `Resize` (the whole photo squeezed to a "
        "square: the same source pixels decoded as a bucket's crop, at the same DCT scale) and "
        "`RandomResizedCrop` (ImageLoader's training crop: 8-100% of the photo's area).",
        f"- figures: medians of {rounds} interleaved rounds after a checked warm-up epoch of "
        "every loader; CPU is the whole job's (this process and the DataLoader's workers).",
        "",
    ]
    near_floor = medians(runs[("near", FLOOR)])
    for config in CONFIGS:
        med = {k: medians(v) for (c, k), v in runs.items() if c == config.key}
        lines += config_lines(config, med, stats[config.key], near_floor)
    lines += ["Every epoch's figures (images/s, CPU ns an output pixel):", ""]
    for (c, k), v in runs.items():
        lines.append(f"- {c}, {k}: " + ", ".join(
            f"{n / w:.0f} ({cpu / p * 1e9:.1f})" for n, p, w, cpu in v))  # fmt: skip
    lines += ["", END]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
