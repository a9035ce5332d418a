"""Aspect-ratio buckets: stoker against what users run today (a torch DataLoader with an
aspect-ratio batch sampler and PIL resize + crop, as kohya's and diffusers' bucketing trainers
do), the same buckets on the same machine, and against stoker's own square paths at the same
pixels a batch; writes its section of docs/BENCHMARKS.md.

    .venv/bin/python benchmarks/buckets.py            # about 10 min on 2 shared cores
    .venv/bin/python benchmarks/buckets.py --quick    # 2 rounds, workers 0 and 2, no write

Data: the 1,000 imagenet-sample JPEGs (mostly 500x375 and 375x500) and the 8-bit photos of
jpeg-variety from 48 px to 1.5 megapixels, packed once with `stoker.pack` defaults under
build/bench-buckets; the DataLoader reads the same files. Buckets:
`AspectBuckets(area=256 * 256, step=32, max_ratio=2.0, batch_pixels=32 * 256 * 256)`: each
batch about 32 images of 256 x 256's pixels.

Method: a warm-up epoch of every loader (the DataLoaders first, so that their workers fork
before stoker's buffers exist), in which every batch is checked (one shape, from the bucket set,
its batch size the bucket's); then --rounds rounds, each timing one epoch of every loader in
turn (interleaved: a change in the machine's load falls on all of them). Per epoch: images/s
(wall clock) and the CPU time of the whole job (the process and its DataLoader workers, from
/proc), per image and per output pixel; the figures are medians over the rounds. The machine is
shared with other work: CPU time per output pixel is the steadier figure, and the one the square
paths are compared by. Never a timed test.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import time
import warnings
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
AREA, STEP, MAX_RATIO, BATCH = 256, 32, 2.0, 32
warnings.filterwarnings("ignore", message="This DataLoader will create")


def photos() -> list[Path]:
    """imagenet-sample, then the decodable 8-bit photos of jpeg-variety (48 px to 1.5 Mpx)."""
    out = sorted((SHARED / "imagenet-sample").iterdir())
    for line in (SHARED / "MANIFEST.tsv").read_text().splitlines()[1:]:
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


class BucketDataset(torch.utils.data.Dataset):
    """kohya's and diffusers' bucketing: each image resized (PIL BILINEAR, antialiased) so that
    it covers its bucket, then cropped to it at a random place and flipped half the time, and
    made the tensor their models take: ToTensor + Normalize([0.5], [0.5]) (float32 in [-1, 1])."""

    def __init__(self, files: list[Path], bucket_of: list[tuple[int, int]]):
        self.files, self.bucket_of = files, bucket_of

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        from PIL import Image

        with Image.open(self.files[i]) as im:
            im = im.convert("RGB")
        bh, bw = self.bucket_of[i]
        scale = max(bw / im.width, bh / im.height)
        nw, nh = max(bw, round(im.width * scale)), max(bh, round(im.height * scale))
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


def dataloader(files, buckets, batch_sizes, assigned, workers: int):
    dataset = BucketDataset(files, [buckets.sizes[b] for b in assigned])
    sampler = AspectRatioBatchSampler(list(assigned), batch_sizes)
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, num_workers=workers, persistent_workers=workers > 0,
        prefetch_factor=2 if workers else None,
    )  # fmt: skip


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


class DecodeFloor:
    """libjpeg-turbo decoding each photo whole through PIL (`open` + `load`), nothing else: what
    any loader that keeps most of each photo pays at least, since no crop skips its pixels and
    no DCT scale applies to photos under twice the bucket's size."""

    def __init__(self, files: list[Path]):
        self.data = [f.read_bytes() for f in files]

    def __iter__(self):
        import io

        from PIL import Image

        for d in self.data:
            with Image.open(io.BytesIO(d)) as im:
                im.load()
                yield torch.empty(1, 3, im.height, im.width, dtype=torch.uint8)


def main() -> None:
    global AREA
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds, workers 0 and 2, no write")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--workers", default=None, help="DataLoader num_workers, e.g. 0,2,4")
    parser.add_argument("--area", type=int, default=256, help="buckets of about AREA x AREA")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    AREA = args.area
    rounds = args.rounds or (2 if args.quick else 5)
    workers = (tuple(int(w) for w in args.workers.split(",")) if args.workers
               else (0, 2) if args.quick else (0, 1, 2, 3, 4))  # fmt: skip
    threads = usable_cores()
    load_start = os.getloadavg()[0]
    t0 = time.time()
    machine = bench_data.machine()
    print(f"machine: {machine}; load average {load_start:.2f}", flush=True)
    files, pack = build()
    buckets = stoker.AspectBuckets(area=AREA * AREA, step=STEP, max_ratio=MAX_RATIO,
                                   batch_pixels=BATCH * AREA * AREA)  # fmt: skip
    batch_sizes = buckets.batch_sizes(BATCH)
    kinds = dict(batch_size=BATCH, threads=threads, seed=0)
    loaders: dict[str, Any] = {}
    ds = stoker.load.loader.open_dataset(pack)
    hw = np.concatenate([ds.image_sizes(s, ["jpg"])[0] for s in range(ds.num_shards)])
    for w in workers:  # first: their workers fork before stoker's threads and buffers exist
        loaders[f"DataLoader workers={w}"] = dataloader(files, buckets, batch_sizes,
                                                        buckets.assign(hw), w)  # fmt: skip
    loaders["stoker buckets, float32 [-1, 1]"] = stoker.Loader(
        pack, buckets=buckets, fields={"image": stoker.Image()}, device="cpu",
        dtype=torch.float32, mean=(0.5,) * 3, std=(0.5,) * 3, **kinds)  # fmt: skip
    loaders["stoker buckets"] = stoker.Loader(pack, buckets=buckets, fields={
        "image": stoker.Image()}, **kinds)  # fmt: skip
    square = {"square CoverCrop": stoker.CoverCrop(), "square Resize": stoker.Resize(),
              "square RandomResizedCrop": stoker.RandomResizedCrop()}  # fmt: skip
    for name, geometry in square.items():
        loaders[f"stoker {name}"] = stoker.Loader(pack, fields={"image": stoker.Image(
            size=AREA, geometry=geometry, hflip=0.5)}, **kinds)  # fmt: skip
    loaders["decode floor (PIL open + load, one thread)"] = DecodeFloor(files)

    def check_bucketed(images: torch.Tensor) -> None:
        size = tuple(images.shape[2:])
        assert size in buckets.sizes, size
        assert images.shape[0] == batch_sizes[buckets.sizes.index(size)], images.shape
        assert images.dtype in (torch.uint8, torch.float32) and images.shape[1] == 3
        if images.dtype == torch.float32:
            assert -1.0 <= float(images.min()) and float(images.max()) <= 1.0

    runs: dict[str, list[tuple[int, int, float, float]]] = {k: [] for k in loaders}
    for name, loader in loaders.items():  # warm-up, checked
        if name.startswith("decode floor"):
            n, *_ = epoch(loader)
            continue
        square_check = None if "buckets" in name or "DataLoader" in name else (
            lambda x: None if tuple(x.shape[1:]) == (3, AREA, AREA) else 1 / 0)  # fmt: skip
        n, *_ = epoch(loader, check_bucketed if square_check is None else square_check)
        print(f"warm-up {name}: {n} images", flush=True)
    for r in range(rounds):
        for name, loader in loaders.items():
            runs[name].append(epoch(loader))
        print(f"round {r + 1}: " + ", ".join(
            f"{k} {v[-1][0] / v[-1][2]:.0f}" for k, v in runs.items()), flush=True)  # fmt: skip
    stats = loaders["stoker buckets"].stats()
    for loader in loaders.values():
        if isinstance(loader, stoker.Loader):
            loader.close()
    load_end = os.getloadavg()[0]
    text = section(runs, machine, threads, rounds, (load_start, load_end), time.time() - t0,
                   buckets, batch_sizes, hw, stats, args)  # fmt: skip
    print(text)
    if not args.no_write and not args.quick:
        bench_data.write_section("benchmarks/buckets.py", text)


def section(runs, machine, threads, rounds, load, seconds, buckets, batch_sizes, hw, stats,
            args) -> str:  # fmt: skip
    med = {k: {"rate": statistics.median(n / w for n, _, w, _ in v),
               "cpu_img": statistics.median(c / n * 1e3 for n, _, _, c in v),
               "cpu_px": statistics.median(c / p * 1e9 for _, p, _, c in v),
               "px_img": statistics.median(p / n for n, p, _, _ in v)}
           for k, v in runs.items()}  # fmt: skip
    dls = [k for k in med if k.startswith("DataLoader")]
    best = max(dls, key=lambda k: med[k]["rate"])
    cheapest = min(dls, key=lambda k: med[k]["cpu_img"])
    ours, same = med["stoker buckets"], med["stoker buckets, float32 [-1, 1]"]
    per_round = [a[0] / a[2] / (b[0] / b[2]) for a, b in
                 zip(runs["stoker buckets, float32 [-1, 1]"], runs[best], strict=True)]  # fmt: skip
    ratio = (hw[:, 1] / np.maximum(hw[:, 0], 1))
    command = "python benchmarks/buckets.py" + "".join(
        f" {a}" for a in sys.argv[1:] if a != "--no-write")  # fmt: skip
    lines = [
        BEGIN,
        "## Aspect-ratio buckets (stoker.AspectBuckets)",
        "",
        "Written by `benchmarks/buckets.py`; every number here comes from the same run.",
        "",
        f"- command: `{command}`",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}, shared with "
        "other engineers' builds and tests while it ran (hence interleaved rounds, medians, and "
        f"CPU time); Python {machine['python']}, torch {machine['torch']}, libjpeg-turbo "
        f"{machine['libjpeg-turbo']}, Pillow {__import__('PIL').__version__}; load average "
        f"{load[0]:.2f} at the start, {load[1]:.2f} at the end",
        f"- date: {time.strftime('%Y-%m-%d')}, run time {seconds / 60:.1f} min",
        f"- data: {len(hw)} real photos: the 1,000 of imagenet-sample and the 8-bit photos of "
        f"jpeg-variety (48 px to 1.5 megapixels); width / height from {ratio.min():.2f} to "
        f"{ratio.max():.2f}, {int((ratio < 0.95).sum())} portrait, "
        f"{int((ratio > 1.05).sum())} landscape. stoker reads their pack (`stoker.pack` "
        "defaults: restart markers), the DataLoader the same JPEG files.",
        f"- buckets: `AspectBuckets(area={AREA} * {AREA}, step={STEP}, max_ratio={MAX_RATIO}, "
        f"batch_pixels={BATCH} * {AREA} * {AREA})`: " + ", ".join(
            f"{h}x{w} (batch {b})" for (h, w), b in zip(buckets.sizes, batch_sizes, strict=True))
        + "; each photo to the bucket nearest its aspect, training crops (random along the "
        "slack) and flips.",
        "- DataLoader: what kohya's and diffusers' bucketing trainers run: an aspect-ratio batch "
        "sampler (indices shuffled, one list per bucket, a batch when a list holds its bucket's "
        "batch size) and, per image, PIL `open`, `convert('RGB')`, `resize` BILINEAR to cover "
        "the bucket, a random `crop` to it, a flip half the time, and ToTensor + "
        "Normalize([0.5], [0.5]) as both do (float32 in [-1, 1]); `persistent_workers=True`, "
        f"`num_workers` {', '.join(str(int(k.split('=')[1])) for k in dls)}. stoker: "
        f"`Loader(pack, buckets=..., fields={{'image': stoker.Image()}})`, `threads={threads}`; "
        "`stoker buckets, float32 [-1, 1]` adds `device='cpu', dtype=torch.float32, "
        "mean=(0.5,) * 3, std=(0.5,) * 3` (the same tensors the DataLoader gives, converted on "
        "the host; with `device='cuda'` the conversion runs on the GPU instead), `stoker "
        "buckets` hands out its uint8 batches.",
        "- stoker's square paths, the same pack at the same pixels a batch (32 images of "
        f"{AREA}x{AREA}): `CoverCrop` (the bucket's crop at aspect 1: the photo's centre square, "
        "at a random place along the slack), `Resize` (the whole photo squeezed to a square: the "
        "same pixels decoded as a bucket's crop) and `RandomResizedCrop` (ImageLoader's training "
        "crop).",
        f"- figures: medians of {rounds} interleaved rounds after a checked warm-up epoch of "
        "every loader; CPU is the whole job's (this process and the DataLoader's workers).",
        "",
        "| loader | images/s | CPU ms an image | output pixels an image | CPU ns an output pixel |",
        "|---|---:|---:|---:|---:|",
    ]
    for k, m in med.items():
        lines.append(f"| {k} | {m['rate']:.0f} | {m['cpu_img']:.2f} | {m['px_img']:.0f} | "
                     f"{m['cpu_px']:.1f} |")  # fmt: skip
    sq = {k.removeprefix("stoker square "): m for k, m in med.items() if "square" in k}
    floor = next(m for k, m in med.items() if k.startswith("decode floor"))
    lines += [
        "",
        f"- stoker buckets, float32 [-1, 1] / best DataLoader ({best}): "
        f"**{same['rate'] / med[best]['rate']:.2f}x** images/s (round by round "
        + ", ".join(f"{r:.2f}x" for r in per_round) + "); the whole job's CPU an image: "
        f"**{med[cheapest]['cpu_img'] / same['cpu_img']:.2f}x** less than the DataLoader's "
        f"cheapest ({cheapest}), {med[cheapest]['cpu_img'] / ours['cpu_img']:.2f}x less for "
        "stoker's uint8 batches.",
        f"- the decode floor: decoding each photo whole costs {floor['cpu_img']:.2f} ms of CPU an "
        f"image; stoker's bucketed batches cost {ours['cpu_img']:.2f} ms "
        f"({ours['cpu_img'] / floor['cpu_img']:.2f}x the floor), the DataLoader's cheapest "
        f"{med[cheapest]['cpu_img']:.2f} ms ({med[cheapest]['cpu_img'] / floor['cpu_img']:.2f}x)"
        ": with photos under twice the bucket's size no loader can be more than "
        f"{med[cheapest]['cpu_img'] / floor['cpu_img']:.1f}x the DataLoader's CPU here.",
    ]
    for name, m in sq.items():
        lines.append(f"- stoker buckets' CPU an output pixel / square {name}'s: "
                     f"**{ours['cpu_px'] / m['cpu_px']:.2f}x**")  # fmt: skip
    per = {k: v / stats["samples"] * 1e3 for k, v in stats["seconds"].items()}
    lines += [
        f"- leftovers carried to the next epoch over the run: {stats['leftovers']['carried']} "
        f"samples; stoker's worker time an image (wall, on the shared machine): read "
        f"{per['read']:.2f} ms, decode {per['decode']:.2f} ms, transform "
        f"{per['transform']:.2f} ms.",
        "",
        "Every epoch's figures (images/s, CPU ns an output pixel):",
        "",
    ]
    for k, v in runs.items():
        lines.append(f"- {k}: " + ", ".join(f"{n / w:.0f} ({c / p * 1e9:.1f})" for n, p, w, c in v))
    lines += ["", END]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
