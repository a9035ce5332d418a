"""A CIFAR-10-shaped array pack through stoker.Loader against torch DataLoader over a
TensorDataset and against FFCV's CIFAR-10 pipeline, in one run (issue 19, item 7); writes its
section of docs/BENCHMARKS.md.

    make bench-arrays                                   # FFCV's venv, then this and tokens.py
    .venv/bin/python benchmarks/arrays.py               # 3 interleaved rounds (about 1.5 min)
    .venv/bin/python benchmarks/arrays.py --rounds 1 --no-write

The data (made once, seeded, under build/bench-arrays/cifar-50000): 50,000 uint8 32x32x3 images
of uniform random pixels and int64 labels 0-9, as images.npy (HWC) and labels.npy. Every loader
delivers uint8 [512, 3, 32, 32] batches (the last one 336) with int64 labels to a loop that
only counts them, after torchvision's CIFAR-10 training augmentation: RandomCrop(32, padding=4)
(zero fill) + RandomHorizontalFlip(0.5):

- stoker: `stoker.pack_arrays({"image": X, "label": y}, pack)` and `stoker.Loader(pack,
  batch_size=512, train=True, threads=N, fields={"image": stoker.Image("image", size=32,
  geometry=stoker.RandomCrop(padding=4), hflip=0.5), "label": stoker.Label("label")})`, with
  N = the cores and N = 1, and with `resident=True` (the pack read into memory once) where the
  installed stoker has it;
- DataLoader: a TensorDataset of the images as a uint8 [N, 3, 32, 32] tensor and the labels,
  each sample padded, cropped and flipped with torch ops in __getitem__; shuffle=True,
  persistent workers, num_workers 0, 1, 2, 4;
- FFCV (benchmarks/peer_runners/ffcv_cifar.py, in its own venv): a .beton of raw pixels,
  SimpleRGBImageDecoder + RandomHorizontalFlip + RandomTranslate(padding=4) + ToTensor +
  ToTorchImage, one numba thread per core.

Each loader makes one warm-up epoch in which every batch is checked (shapes, dtypes, every label
once an epoch, the mean pixel that zero padding of 4 gives; for stoker, 64 images compared with
every crop and flip of their source rows); then --rounds rounds each time one epoch of every
loader in turn. Never a timed test.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_data  # noqa: E402
import interleaved  # noqa: E402
import stoker  # noqa: E402
from interleaved import Contender, PeerProcess  # noqa: E402
from stoker.machine import usable_cores  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "bench-arrays"
BEGIN, END = bench_data.markers("benchmarks/arrays.py")
SAMPLES, SIZE, PADDING, CLASSES = 50_000, 32, 4, 10
BATCH = 512
TARGETS = {"DataLoader": 10.0, "FFCV": 1.5}  # issue 19's "Done when", on 2 cores
warnings.filterwarnings("ignore", message="This DataLoader will create")


def make_data() -> Path:
    """images.npy and labels.npy, written once (seed 0), and stoker's pack of them."""
    folder = WORK / f"cifar-{SAMPLES}"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "labels.npy").exists():
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, size=(SAMPLES, SIZE, SIZE, 3), dtype=np.uint8)
        labels = rng.integers(0, CLASSES, size=SAMPLES).astype(np.int64)
        np.save(folder / "images.partial.npy", images)
        os.replace(folder / "images.partial.npy", folder / "images.npy")
        np.save(folder / "labels.partial.npy", labels)
        os.replace(folder / "labels.partial.npy", folder / "labels.npy")
    pack = folder / "stoker-pack"
    if not pack.exists():
        images, labels = np.load(folder / "images.npy"), np.load(folder / "labels.npy")
        print(stoker.pack_arrays({"image": images, "label": labels}, pack, progress=False))
    return folder


def padded_mean(mean: float) -> float:
    """The mean pixel of random crops of the zero-padded images (the share of a crop inside the
    image, averaged over the uniform offsets, times the images' mean)."""
    offsets = range(2 * PADDING + 1)
    outside = sum(abs(t - PADDING) for t in offsets) / len(offsets)
    return mean * (1 - outside / SIZE) ** 2


class EpochCheck:
    """A warm-up epoch's checks: shapes and dtypes of every batch, every label once, and the mean
    pixel of the padded crops."""

    def __init__(self, name: str, labels: np.ndarray, expected_mean: float):
        self.name = name
        self.counts = torch.from_numpy(np.bincount(labels, minlength=CLASSES))
        self.seen = torch.zeros_like(self.counts)
        self.expected_mean = expected_mean
        self.means: list[float] = []

    def batch(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        n = images.shape[0]
        if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, SIZE, SIZE):
            raise AssertionError(f"{self.name}: images {images.dtype} {tuple(images.shape)}")
        if labels.dtype != torch.int64 or tuple(labels.shape) != (n,):
            raise AssertionError(f"{self.name}: labels {labels.dtype} {tuple(labels.shape)}")
        self.seen += torch.bincount(labels, minlength=CLASSES)
        self.means.append(images.float().mean().item())

    def finish(self) -> str:
        if not torch.equal(self.seen, self.counts):
            raise AssertionError(f"{self.name}: the epoch's labels are not the dataset's")
        mean = sum(self.means) / len(self.means)
        if abs(mean - self.expected_mean) > 1.5:
            raise AssertionError(
                f"{self.name}: mean pixel {mean:.1f}, {self.expected_mean:.1f} expected"
            )
        return f"every label once, mean pixel {mean:.1f} ({self.expected_mean:.1f} expected)"


def check_crops(images: np.ndarray, batch: dict, count: int = 64) -> None:
    """Each of `count` output images is one of the 81 windows of its zero-padded source, flipped
    or not: what RandomCrop(32, padding=4) + RandomHorizontalFlip can give, and nothing else."""
    for out, index in zip(batch["image"][:count], batch["index"][:count].tolist(), strict=True):
        source = torch.from_numpy(np.ascontiguousarray(images[index])).permute(2, 0, 1)
        padded = F.pad(source, (PADDING,) * 4)
        windows = padded.unfold(1, SIZE, 1).unfold(2, SIZE, 1).permute(1, 2, 0, 3, 4)
        candidates = torch.cat([windows, windows.flip(-1)], 0).reshape(-1, 3, SIZE, SIZE)
        if not (candidates == out).flatten(1).all(1).any():
            raise AssertionError(f"stoker: sample {index} is no padded crop of its source")


class CropFlipDataset(torch.utils.data.TensorDataset):
    """torchvision's RandomCrop(32, padding=4) + RandomHorizontalFlip, written with torch ops on
    one uint8 CHW sample at a time: pad with zeros, a random 32x32 window, flip half the time."""

    def __getitem__(self, i):
        image, label = super().__getitem__(i)
        image = F.pad(image, (PADDING, PADDING, PADDING, PADDING))
        top, left = torch.randint(0, 2 * PADDING + 1, (2,)).tolist()
        image = image[:, top : top + SIZE, left : left + SIZE]
        if torch.rand(1).item() < 0.5:
            image = image.flip(-1)
        return image, label


def dataloader_contender(dataset, workers: int, labels, expected_mean) -> Contender:
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        prefetch_factor=2 if workers > 0 else None,
    )
    name = f"DataLoader workers={workers}"

    def run(check: bool):
        checker = EpochCheck(name, labels, expected_mean) if check else None
        n = 0
        for images, y in loader:
            n += images.shape[0]
            if checker is not None:
                checker.batch(images, y)
        if n != SAMPLES:
            raise AssertionError(f"{name}: {n} images in an epoch of {SAMPLES}")
        return n, checker.finish() if checker else ""

    return Contender(name, run)


def stoker_fields() -> dict:
    return {
        "image": stoker.Image("image", size=SIZE, geometry=stoker.RandomCrop(padding=PADDING),
                              hflip=0.5),
        "label": stoker.Label("label"),
    }  # fmt: skip


def stoker_contender(name, pack, threads, labels, expected_mean, **options) -> Contender:
    loader = stoker.Loader(pack, batch_size=BATCH, train=True, threads=threads,
                           fields=stoker_fields(), **options)  # fmt: skip

    def run(check: bool):
        checker = EpochCheck(name, labels, expected_mean) if check else None
        n = 0
        for batch in loader:
            n += batch["image"].shape[0]
            if checker is not None:
                checker.batch(batch["image"], batch["label"])
        if n != SAMPLES:
            raise AssertionError(f"{name}: {n} images in an epoch of {SAMPLES}")
        return n, checker.finish() if checker else ""

    c = Contender(name, run, loader.close, loader=loader)
    c.threads = threads
    return c


def show(rate: float) -> str:
    return f"{rate:,.0f}"


def stage_line(c: Contender, before: dict, images: int) -> str:
    after = c.loader.stats()["seconds"]
    spent = {k: after[k] - before[k] for k in after}
    work = {k: spent[k] for k in ("read", "decode", "transform", "collate")}
    total = sum(work.values())
    shares = ", ".join(f"{k} {1e6 * v / images:.2f}" for k, v in work.items())
    return (
        f"{c.name}: {1e6 * total / images:.2f} us of worker time an image ({shares}); the loop "
        f"waited {1e6 * spent['wait'] / images:.2f} us an image"
    )


def section(contenders, failed, machine, command, seconds, threads, rounds, load, stages) -> str:
    by_name = {c.name: c for c in contenders}
    dataloaders = [c for c in contenders if c.name.startswith("DataLoader") and c.runs]
    lines = [
        BEGIN,
        "## Arrays: a CIFAR-10-shaped array pack (stoker.pack_arrays + Loader)",
        "",
        "Written by `benchmarks/arrays.py` (`make bench-arrays`); every number here comes from "
        "the same run.",
        "",
        f"- command: `{command}`",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}; Python "
        f"{machine['python']}, torch {machine['torch']}; load average {load[0]:.2f} at the "
        f"start, {load[1]:.2f} at the end (the run's own processes included)",
        f"- date: {time.strftime('%Y-%m-%d')}, run time {seconds / 60:.1f} min",
        f"- data: {SAMPLES:,} uint8 32x32x3 images of seeded uniform random pixels and int64 "
        "labels 0-9 (build/bench-arrays/), the same arrays for every loader; batch 512; "
        "RandomCrop(32, padding=4) with zero fill + horizontal flip 0.5; uint8 [B, 3, 32, 32] "
        "batches and int64 labels to a loop that only counts them.",
        f"- throughput: images/s over whole epochs, median of {rounds} interleaved rounds (each "
        "times one epoch of every loader in turn) after a warm-up epoch of each in which every "
        "batch was checked (shapes, dtypes, every label once an epoch, the mean pixel that zero "
        "padding gives; stoker's crops compared with every window and flip of their sources).",
        "",
        *interleaved.table(contenders, show, "images/s"),
        "",
    ]
    ffcv = by_name.get("FFCV")
    for mine in (c for c in contenders if c.name.startswith("stoker") and c.threads == threads):
        if dataloaders:
            best = max(dataloaders, key=lambda c: c.median)
            ratio = mine.median / best.median
            lines.append(
                f"- {mine.name} / best DataLoader ({best.name}): **{ratio:.2f}x** (round by "
                "round, against that round's best: "
                + ", ".join(f"{r:.2f}x" for r in interleaved.per_round_ratios(mine, dataloaders))
                + f"); {interleaved.verdict(ratio, TARGETS['DataLoader'])}"
            )
        if ffcv is not None and ffcv.runs:
            ratio = mine.median / ffcv.median
            lines.append(
                f"- {mine.name} / FFCV: **{ratio:.2f}x** (round by round: "
                + ", ".join(f"{r:.2f}x" for r in interleaved.per_round_ratios(mine, [ffcv]))
                + f"); {interleaved.verdict(ratio, TARGETS['FFCV'])}"
            )
    for c in failed:
        lines.append(f"- **{c.name}: not measured**: {c.error}")
    lines += ["", "The loaders:", ""]
    lines += [
        "- stoker: `stoker.pack_arrays({'image': X, 'label': y}, pack)` (one shard, a .npy per "
        "field); `stoker.Loader(pack, batch_size=512, train=True, threads=N, fields={'image': "
        "stoker.Image('image', size=32, geometry=stoker.RandomCrop(padding=4), hflip=0.5), "
        "'label': stoker.Label('label')})`; `resident`: the same with `resident=True` (the "
        "pack's files read into host memory once, each batch gathered from there).",
        "- DataLoader: `TensorDataset(images as uint8 [N, 3, 32, 32], labels)` whose "
        "`__getitem__` pads with `F.pad(image, (4, 4, 4, 4))`, slices a window at "
        "`torch.randint` offsets and flips with `image.flip(-1)` when `torch.rand(1) < 0.5`; "
        "`shuffle=True`, `persistent_workers=True`, `prefetch_factor=2`, default collate.",
    ]
    if ffcv is not None and not ffcv.error:
        lines.append(
            f"- FFCV ({ffcv.version}; `benchmarks/peer_runners/ffcv_cifar.py` in its own venv, "
            "pinned to the same cores): its CIFAR-10 example's writer and loader, "
            "`RGBImageField(write_mode='raw')`, `SimpleRGBImageDecoder(), "
            "RandomHorizontalFlip(), RandomTranslate(padding=4), ToTensor(), ToTorchImage()` "
            "(no Cutout, no device, no normalisation), order RANDOM, `num_workers` = cores, "
            "drop_last=False."
        )
    lines += ["", "What each warm-up epoch's checks found:", ""]
    lines += [f"- {c.name}: {c.note}" for c in contenders]
    if stages:
        lines += ["", "Where stoker's worker time goes (`loader.stats()['seconds']` over the "
                  "timed epochs, summed over threads):", ""]  # fmt: skip
        lines += [f"- {s}" for s in stages]
    lines += ["", END]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="0,1,2,4", help="DataLoader num_workers")
    parser.add_argument("--no-ffcv", action="store_true", help="leave FFCV out (development)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    t0 = time.time()
    threads = usable_cores()
    load_start = os.getloadavg()[0]
    machine = bench_data.machine()
    print(f"machine: {machine}; load average {load_start:.2f}", flush=True)
    folder = make_data()
    images_np, labels_np = np.load(folder / "images.npy"), np.load(folder / "labels.npy")
    expected_mean = padded_mean(float(images_np.mean()))

    # FFCV first: its .beton and numba's compilation take a while, in its own process.
    ffcv = PeerProcess("FFCV", "ffcv_cifar", data=folder, work=WORK / "ffcv", threads=threads,
                       batch_size=BATCH)  # fmt: skip
    if args.no_ffcv:
        ffcv.close()
        ffcv.error = "left out (--no-ffcv)"
    # The DataLoaders' workers fork before any stoker loader exists (as benchmarks/fields.py).
    tensors = torch.from_numpy(images_np).permute(0, 3, 1, 2).contiguous()
    dataset = CropFlipDataset(tensors, torch.from_numpy(labels_np))
    workers = [int(w) for w in args.workers.split(",")]
    dataloaders = [dataloader_contender(dataset, w, labels_np, expected_mean) for w in workers]
    interleaved.warm_up(dataloaders)
    pack = folder / "stoker-pack"
    stokers = [
        stoker_contender(f"stoker, threads={n}", pack, n, labels_np, expected_mean)
        for n in dict.fromkeys([threads, 1])
    ]
    if "resident" in inspect.signature(stoker.Loader).parameters:  # issue 19, item 4
        name = f"stoker, resident, threads={threads}"
        try:
            stokers.append(stoker_contender(name, pack, threads, labels_np, expected_mean,
                                            resident=True))  # fmt: skip
        except Exception as e:  # reported with the results
            stokers.append(Contender(name))
            stokers[-1].error = f"{type(e).__name__}: {e}"
    held = any("resident" in c.name and not c.error for c in stokers)
    for options in [{}] + ([{"resident": True}] if held else []):
        with stoker.Loader(
            pack,
            batch_size=BATCH,
            train=True,
            threads=threads,
            fields=stoker_fields(),
            return_index=True,
            **options,
        ) as probe:
            check_crops(images_np, next(iter(probe)))  # fmt: skip
    interleaved.warm_up([*stokers, ffcv])
    everyone = [*stokers, *dataloaders, ffcv]
    contenders = [c for c in everyone if not c.error]
    before = {c.name: c.loader.stats()["seconds"] for c in stokers if not c.error}
    try:
        interleaved.run_rounds(contenders, args.rounds, show)
        stages = [stage_line(c, before[c.name], SAMPLES * len(c.runs)) for c in stokers
                  if c.name in before and c.runs]  # fmt: skip
    finally:
        for c in contenders:
            c.close()
    for line in stages:
        print("  " + line, flush=True)
    load_end = os.getloadavg()[0]
    command = "python benchmarks/arrays.py" + " ".join(
        [""] + [a for a in sys.argv[1:] if a != "--no-write"]
    )
    failed = [c for c in everyone if c.error]
    load = (load_start, load_end)
    text = section([c for c in contenders if c.runs], failed, machine, command,
                   time.time() - t0, threads, args.rounds, load, stages)  # fmt: skip
    print(text)
    if not args.no_write:
        bench_data.write_section("benchmarks/arrays.py", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
