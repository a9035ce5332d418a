"""The Hugging Face user's images: `datasets` in the best DataLoader against stoker reading the pack
it made of the same dataset, the same crop and flip, in one run (issue 20, item 6); writes its
section of docs/BENCHMARKS.md.

    make bench-formats                                  # pack_sources.py and this
    .venv/bin/python benchmarks/hf_datasets.py          # 3 interleaved rounds (about 5 min)
    .venv/bin/python benchmarks/hf_datasets.py --rounds 1 --no-write

The dataset: ../shared/data/imagenet-sample (1,000 ImageNet validation JPEGs) as a Hugging Face
dataset with an `Image` and a `ClassLabel` feature, the JPEG bytes embedded (as `load_dataset`
leaves a hub dataset in its cache), saved with `save_to_disk` under build/bench-hf/ (made once).

- `datasets` + DataLoader: `load_from_disk`, then HF's own recipe for image classification
  (`set_transform`, as transformers' run_image_classification.py): each image decoded by PIL,
  torchvision's RandomResizedCrop(224) + horizontal flip written out in PIL (there is no CPU
  torchvision here; benchmarks/peer_runners/_dataloader.py), uint8 CHW tensors; a
  `torch.utils.data.DataLoader(batch_size=256, shuffle=True, num_workers=N, persistent_workers)`
  for N in 1, 2 and 4: the best of them is the DataLoader's figure.
- stoker: `stoker.pack(the save_to_disk folder, out)` (timed once, as the user would run it), then
  `stoker.ImageLoader(out, batch_size=256, train=True, size=224)`: the same crop and flip.

A pass is 2 epochs (2,000 images). Each loader makes one checked warm-up pass (shapes, dtypes,
every label once an epoch); then --rounds rounds each time one pass of every loader in turn.
Never a timed test.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
# Hugging Face's `datasets` is imported with this folder off sys.path (no script here may shadow
# it), then bench_data.py is loaded from its file.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
import datasets as hf_datasets  # noqa: E402

sys.path += [str(HERE), str(HERE / "peer_runners")]
_spec = importlib.util.spec_from_file_location("bench_data", HERE / "bench_data.py")
assert _spec is not None and _spec.loader is not None
bench_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_data)

import interleaved  # noqa: E402
import stoker  # noqa: E402
from _dataloader import random_resized_crop_params  # noqa: E402
from interleaved import Contender  # noqa: E402
from stoker.machine import usable_cores  # noqa: E402

ROOT = HERE.parent
WORK = ROOT / "build" / "bench-hf"
BEGIN, END = bench_data.markers("benchmarks/hf_datasets.py")
BATCH, SIZE = 256, 224
EPOCHS_A_PASS = 2
WORKERS = (1, 2, 4)
TARGET = 3.0  # issue 20's "Done when": stoker >= 3x the best DataLoader over the same dataset


def make_dataset() -> Path:
    """imagenet-sample as a save_to_disk folder: Image (bytes embedded) + ClassLabel."""
    folder = WORK / "dataset"
    if (folder / "dataset_info.json").exists():
        return folder
    samples = bench_data.imagenet_sample()
    names = [f"class_{i:04d}" for i in range(len(samples))]
    features = hf_datasets.Features(
        {"image": hf_datasets.Image(), "label": hf_datasets.ClassLabel(names=names)}
    )
    rows = {
        "image": [{"bytes": Path(p).read_bytes(), "path": Path(p).name} for p, _ in samples],
        "label": [label for _, label in samples],
    }
    ds = hf_datasets.Dataset.from_dict(rows, features=features)
    WORK.mkdir(parents=True, exist_ok=True)
    ds.save_to_disk(str(folder))
    return folder


class CropFlip:
    """HF's set_transform: a batch dict of PIL images -> uint8 CHW tensors, RandomResizedCrop +
    flip as torchvision draws them."""

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        from PIL import Image

        out = []
        for img in batch["image"]:
            img = img.convert("RGB")
            width, height = img.size
            i, j, h, w = random_resized_crop_params(width, height)
            img = img.crop((j, i, j + w, i + h)).resize((SIZE, SIZE), Image.BILINEAR)
            if torch.rand(1).item() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
            out.append(torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1))
        return {"image": out, "label": batch["label"]}


def collate(batch: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([b["image"] for b in batch]), torch.tensor([b["label"] for b in batch])


def checked_pass(name: str, batches: Any, labels: np.ndarray, check: bool) -> tuple[int, str]:
    counts = np.bincount(labels, minlength=len(labels))
    n = 0
    for _ in range(EPOCHS_A_PASS):
        seen = np.zeros_like(counts)
        for images, targets in batches():
            n += images.shape[0]
            if check:
                if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, SIZE, SIZE):
                    raise AssertionError(f"{name}: {images.dtype} {tuple(images.shape)}")
                seen += np.bincount(targets.numpy(), minlength=len(labels))
        if check and not np.array_equal(seen, counts):
            raise AssertionError(f"{name}: an epoch's labels are not the dataset's")
    if n != EPOCHS_A_PASS * len(labels):
        raise AssertionError(f"{name}: {n} images in {EPOCHS_A_PASS} epochs")
    return n, f"{EPOCHS_A_PASS} epochs, every label once an epoch"


def dataloader(folder: Path, workers: int, labels: np.ndarray) -> Contender:
    ds = hf_datasets.load_from_disk(str(folder))
    ds.set_transform(CropFlip())
    torch.set_num_threads(1)  # the main process only collates; the workers do the work
    loader = torch.utils.data.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=workers, persistent_workers=True,
        prefetch_factor=2, collate_fn=collate,
    )  # fmt: skip
    name = f"datasets + DataLoader, {workers} workers"

    def run(check: bool) -> tuple[int, str]:
        return checked_pass(name, lambda: iter(loader), labels, check)

    c = Contender(name, run, lambda: None)
    c.version = f"datasets {hf_datasets.__version__}, torch {torch.__version__}"
    return c


def stoker_contender(pack: Path, threads: int, labels: np.ndarray) -> Contender:
    loader = stoker.ImageLoader(pack, batch_size=BATCH, train=True, size=SIZE, threads=threads)
    epoch = [0]

    def batches() -> Any:
        loader.set_epoch(epoch[0])
        epoch[0] += 1
        return iter(loader)

    def run(check: bool) -> tuple[int, str]:
        return checked_pass("stoker", batches, labels, check)

    c = Contender(f"stoker.ImageLoader, {threads} threads", run, loader.close, loader=loader)
    c.threads = threads
    c.version = f"stoker {stoker.__version__}"
    return c


def show(rate: float) -> str:
    return f"{rate:,.0f}"


def section(contenders, machine, command, seconds, rounds, load, packing, versions):
    mine = next(c for c in contenders if c.name.startswith("stoker"))
    theirs = [c for c in contenders if c is not mine]
    best = max(theirs, key=lambda c: c.median or 0)
    ratio = mine.median / best.median
    rounds_text = ", ".join(f"{r:.2f}x" for r in interleaved.per_round_ratios(mine, theirs))
    lines = [
        BEGIN,
        "## Hugging Face `datasets`: the best DataLoader against stoker reading its pack",
        "",
        "Written by `benchmarks/hf_datasets.py` (`make bench-formats`); every number here comes "
        "from the same run.",
        "",
        f"- command: `{command}`",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}; Python "
        f"{machine['python']}, {versions}; load average {load[0]:.2f} at the start, "
        f"{load[1]:.2f} at the end",
        f"- date: {time.strftime('%Y-%m-%d')}, run time {seconds / 60:.1f} min",
        "- data: ../shared/data/imagenet-sample (1,000 ImageNet validation JPEGs) as a Hugging "
        "Face dataset (`Image` with the bytes embedded + `ClassLabel`), `save_to_disk`.",
        f"- DataLoader: `load_from_disk` + `set_transform` (PIL decode, RandomResizedCrop({SIZE}) "
        f"+ flip as torchvision draws them), batch {BATCH}, shuffled, persistent workers; "
        f"stoker: `stoker.pack(folder, out)` then `stoker.ImageLoader(out, batch_size={BATCH}, "
        f"train=True, size={SIZE})`, the same crop and flip.",
        f"- throughput: images/s over passes of {EPOCHS_A_PASS} epochs, median of {rounds} "
        "interleaved rounds after a checked warm-up pass of each.",
        "",
        *interleaved.table(contenders, show, "images/s"),
        "",
        f"- stoker / the best DataLoader ({best.name}): **{ratio:.2f}x** (round by round, "
        f"against the best of that round: {rounds_text}); {interleaved.verdict(ratio, TARGET)}",
        f"- packing the dataset once: {packing}",
        *(f"- {c.name}: {c.note}" for c in contenders),
        "",
        END,
    ]
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
    folder = make_dataset()
    labels = np.array([label for _, label in bench_data.imagenet_sample()])
    pack = WORK / "pack"
    t = time.perf_counter()
    result = stoker.pack(folder, pack, overwrite=True, progress=False)
    took = time.perf_counter() - t
    packing = (
        f"{result.num_samples:,} images in {took:.1f} s ({result.num_samples / took:,.0f} "
        f"images/s, {threads} threads; restart markers added losslessly, the default)"
    )
    print(f"  packed: {packing}", flush=True)
    contenders = [dataloader(folder, w, labels) for w in WORKERS]
    contenders.append(stoker_contender(pack, threads, labels))
    contenders = interleaved.warm_up(contenders)
    try:
        interleaved.run_rounds(contenders, args.rounds, show)
    finally:
        for c in contenders:
            c.close()
    load = (load_start, os.getloadavg()[0])
    command = "python benchmarks/hf_datasets.py" + " ".join(
        [""] + [a for a in sys.argv[1:] if a != "--no-write"]
    )
    versions = f"{contenders[0].version}, {contenders[-1].version}"
    text = section([c for c in contenders if c.runs], machine, command, time.time() - t0,
                   args.rounds, load, packing, versions)  # fmt: skip
    print(text)
    if not args.no_write:
        bench_data.write_section("benchmarks/hf_datasets.py", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
