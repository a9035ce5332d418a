"""Decoded pixels against JPEG: `stoker pack --codec raw --max-side 256` against the JPEG pack of
the same images, through the training pipeline, in one run (issue 19, item 7); writes its section
of docs/BENCHMARKS.md.

    make bench-arrays                                   # arrays.py, tokens.py and this
    .venv/bin/python benchmarks/raw_codec.py            # 3 interleaved rounds (about 2 min)
    .venv/bin/python benchmarks/raw_codec.py --rounds 1 --no-write

The images: ../shared/data/imagenet-sample (1,000 ImageNet validation JPEGs), packed three ways
under build/bench-raw/ (made once): as they are; `--max-side 256` (each re-encoded as a JPEG,
quality 90, its longer side 256); and `--codec raw --max-side 256` (the same resized pixels,
stored as PPM, read without decoding). Each is read by
`stoker.ImageLoader(pack, batch_size=256, train=True, threads=N)`: RandomResizedCrop(224) +
horizontal flip, uint8 [256, 3, 224, 224] batches to a loop that only counts them.

A pass is 10 epochs (10,000 images). Each loader makes one checked warm-up pass (shapes, dtypes,
every label once an epoch); before that the raw pack's pixels are compared with the 256-px JPEG
pack's, image by image, through the eval pipeline, so that both hold the same images. Then
--rounds rounds each time one pass of every loader in turn. Never a timed test.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_data  # noqa: E402
import interleaved  # noqa: E402
import stoker  # noqa: E402
from interleaved import Contender  # noqa: E402
from stoker.machine import usable_cores  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "bench-raw"
BEGIN, END = bench_data.markers("benchmarks/raw_codec.py")
BATCH, SIZE, SIDE = 256, 224, 256
EPOCHS_A_PASS = 10
TARGET = 2.0  # issue 19's "Done when": raw at max_side 256 >= 2x the JPEG pack of the same images
WAYS = {
    "JPEG, as collected": {},
    f"JPEG, max_side {SIDE}": {"max_side": SIDE},
    f"raw, max_side {SIDE}": {"max_side": SIDE, "codec": "raw"},
}


def make_packs() -> dict[str, Path]:
    """The three packs of imagenet-sample (each made once)."""
    samples = bench_data.imagenet_sample()
    WORK.mkdir(parents=True, exist_ok=True)
    listing = WORK / "imagenet-sample.csv"
    text = "".join(f"{Path(p).resolve()},{label}\n" for p, label in samples)
    if not listing.exists() or listing.read_text() != text:
        listing.write_text(text)
    packs = {}
    for i, (name, options) in enumerate(WAYS.items()):
        out = WORK / f"pack-{i}"
        if not (out / "manifest.json").exists():
            print(f"packing {name} -> {out}", flush=True)
            stoker.pack(listing, out, overwrite=True, progress=False, **options)
        packs[name] = out
    return packs


def disk_bytes(pack: Path) -> int:
    return sum(f.stat().st_size for f in pack.iterdir() if f.is_file())


def same_images(jpeg: Path, raw: Path) -> str:
    """The raw pack's pixels against the 256-px JPEG pack's, image by image, through the eval
    pipeline (each resampled alike): they differ only by JPEG's loss at quality 90."""
    options = dict(batch_size=BATCH, train=False, shuffle=False, resize_size=SIZE, threads=2)
    worst, total, n = 0.0, 0.0, 0
    with stoker.ImageLoader(jpeg, **options) as a, stoker.ImageLoader(raw, **options) as b:
        for (x, xl), (y, yl) in zip(a, b, strict=True):
            if not torch.equal(xl, yl):
                raise AssertionError("the raw and JPEG packs order their samples differently")
            error = (x.float() - y.float()).abs().flatten(1).mean(1)
            worst = max(worst, error.max().item())
            total += error.sum().item()
            n += len(error)
    # JPEG's loss is a few levels (more in fine, colourful detail: 4:2:0 chroma); another image
    # would be tens of levels off.
    if total / n > 4 or worst > 20:
        raise AssertionError(
            f"the raw pack's images are {total / n:.1f} levels off their JPEGs (worst {worst:.1f})"
        )
    return (
        f"raw against JPEG (256 px), eval pipeline, all {n:,} images: mean absolute difference "
        f"{total / n:.2f} levels, worst image {worst:.2f}"
    )


def contender(name: str, pack: Path, threads: int, labels: np.ndarray, **options) -> Contender:
    loader = stoker.ImageLoader(pack, batch_size=BATCH, train=True, threads=threads, **options)
    counts = np.bincount(labels, minlength=1000)
    epoch = [0]

    def run(check: bool) -> tuple[int, str]:
        n = 0
        for _ in range(EPOCHS_A_PASS):
            loader.set_epoch(epoch[0])
            epoch[0] += 1
            seen = np.zeros_like(counts)
            for images, targets in loader:
                n += images.shape[0]
                if check:
                    if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, SIZE, SIZE):
                        raise AssertionError(f"{name}: {images.dtype} {tuple(images.shape)}")
                    seen += np.bincount(targets.numpy(), minlength=1000)
            if check and not np.array_equal(seen, counts):
                raise AssertionError(f"{name}: an epoch's labels are not the dataset's")
        if n != EPOCHS_A_PASS * len(labels):
            raise AssertionError(f"{name}: {n} images in {EPOCHS_A_PASS} epochs")
        return n, f"{EPOCHS_A_PASS} epochs, every label once an epoch"

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
    shares = ", ".join(f"{k} {1e6 * v / images:.1f}" for k, v in work.items())
    return (
        f"{c.name}: {1e6 * total / images:.1f} us of worker time an image ({shares}); the loop "
        f"waited {1e6 * spent['wait'] / images:.1f} us an image"
    )


def section(contenders, disk, machine, command, seconds, threads, rounds, load, stages, fidelity):
    by_name = {c.name: c for c in contenders}
    raw = by_name.get(f"raw, max_side {SIDE}")
    resident = by_name.get(f"raw, max_side {SIDE}, resident")
    lines = [
        BEGIN,
        "## Decoded pixels: `--codec raw` against JPEG, the training pipeline",
        "",
        "Written by `benchmarks/raw_codec.py` (`make bench-arrays`); every number here comes "
        "from the same run.",
        "",
        f"- command: `{command}`",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}; Python "
        f"{machine['python']}, torch {machine['torch']}, libjpeg-turbo "
        f"{machine['libjpeg-turbo']}; load average {load[0]:.2f} at the start, {load[1]:.2f} at "
        "the end",
        f"- date: {time.strftime('%Y-%m-%d')}, run time {seconds / 60:.1f} min",
        "- data: ../shared/data/imagenet-sample (1,000 ImageNet validation JPEGs, mostly 500x375) "
        "packed three ways (the raw pack also read with `resident=True`); "
        f"`stoker.ImageLoader(pack, batch_size={BATCH}, train=True, "
        f"threads={threads})`: RandomResizedCrop({SIZE}) + flip, uint8 batches to a loop that "
        "only counts them.",
        f"- throughput: images/s over passes of {EPOCHS_A_PASS} epochs, median of {rounds} "
        "interleaved rounds after a checked warm-up pass of each.",
        "",
        *interleaved.table(contenders, show, "images/s"),
        "",
        "| pack | on disk | per image |",
        "|---|---:|---:|",
        *(f"| {n} | {b / 2**20:,.1f} MiB | {b / 1000 / 1024:,.1f} KiB |" for n, b in disk.items()),
        "",
    ]
    if raw is not None and raw.runs:
        for other in contenders:
            if other is raw or other is resident or not other.runs:
                continue
            ratio = raw.median / other.median
            rounds_text = ", ".join(f"{r:.2f}x" for r in interleaved.per_round_ratios(raw, [other]))
            target = (
                f"; {interleaved.verdict(ratio, TARGET)}" if other.name.endswith(str(SIDE)) else ""
            )
            lines.append(
                f"- {raw.name} / {other.name}: **{ratio:.2f}x** (round by round: "
                f"{rounds_text}){target}"
            )
        raw_disk = disk[raw.name] / disk[f"JPEG, max_side {SIDE}"]
        lines.append(
            f"- the raw pack costs {raw_disk:.1f}x the disk of the JPEG pack at the same size "
            f"({disk[raw.name] / disk['JPEG, as collected']:.1f}x the images as collected): "
            "disk traded for decoding, what `stoker doctor` weighs when it recommends it."
        )
    if resident is not None and resident.runs and raw is not None and raw.runs:
        lines.append(
            f"- resident (`resident=True`: the pack read into host memory once, each image's "
            f"pixels resampled where they lie, no copy): {resident.median / raw.median:.2f}x "
            "the raw pack read from its file: the copy's time mostly moves into the resample, "
            "which now takes the pixels from memory not yet in cache (stages below)"
        )
    lines += ["", f"- checks: {fidelity}"]
    lines += [f"- {c.name}: {c.note}" for c in contenders]
    if stages:
        lines += ["", "Where the worker time goes (`loader.stats()['seconds']` over the timed "
                  "passes, summed over threads):", ""]  # fmt: skip
        lines += [f"- {s}" for s in stages]
    lines += ["", END]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    t0 = time.time()
    threads = usable_cores()
    load_start = os.getloadavg()[0]
    machine = bench_data.machine()
    print(f"machine: {machine}; load average {load_start:.2f}", flush=True)
    packs = make_packs()
    disk = {name: disk_bytes(p) for name, p in packs.items()}
    fidelity = same_images(packs[f"JPEG, max_side {SIDE}"], packs[f"raw, max_side {SIDE}"])
    print(f"  {fidelity}", flush=True)
    labels = np.array([label for _, label in bench_data.imagenet_sample()])
    contenders = [contender(name, p, threads, labels) for name, p in packs.items()]
    raw = f"raw, max_side {SIDE}"
    contenders.append(contender(f"{raw}, resident", packs[raw], threads, labels, resident=True))
    contenders = interleaved.warm_up(contenders)
    before = {c.name: c.loader.stats()["seconds"] for c in contenders}
    try:
        interleaved.run_rounds(contenders, args.rounds, show)
        stages = [
            stage_line(c, before[c.name], EPOCHS_A_PASS * len(labels) * len(c.runs))
            for c in contenders
            if c.runs
        ]
    finally:
        for c in contenders:
            c.close()
    for line in stages:
        print("  " + line, flush=True)
    load = (load_start, os.getloadavg()[0])
    command = "python benchmarks/raw_codec.py" + " ".join(
        [""] + [a for a in sys.argv[1:] if a != "--no-write"]
    )
    text = section([c for c in contenders if c.runs], disk, machine, command,
                   time.time() - t0, threads, args.rounds, load, stages, fidelity)  # fmt: skip
    print(text)
    if not args.no_write:
        bench_data.write_section("benchmarks/raw_codec.py", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
