"""stoker.Loader's typed-field pipelines against torch DataLoader, on the same files, in one run;
writes its section of docs/BENCHMARKS.md.

    .venv/bin/python benchmarks/fields.py          # the three pipelines (about 20 min on 2 cores)
    .venv/bin/python benchmarks/fields.py --quick  # 1/10 of each epoch, workers 0 and 2, no write

- detection: Image 640x640 Letterbox + hflip 0.5, Boxes (COCO json) following it; batch 32;
- segmentation: Image 512 RandomResizedCrop + hflip 0.5, Mask (palette PNG) following it; batch 32;
- image-text: Image 224 RandomResizedCrop + hflip, Text caption; batch 256.

The data (benchmarks/field_data.py): the 1,000 imagenet-sample JPEGs, each listed 3 times, with
generated boxes, masks and captions, packed with `stoker.pack(table.jsonl, ...)` defaults; the
DataLoader reads the same JPEGs and masks from their files, as a user's Dataset would.

Method, per pipeline: one warm-up epoch of each loader (the DataLoaders first, with persistent
workers, then stoker's), in which every batch is checked (shapes, box counts and ranges, mask
values, captions) so that a broken pipeline stops the run instead of posting a number; then
--rounds rounds, each timing one epoch of every loader in turn (interleaved, so that a change in
the machine's load falls on all of them); the figure is the median. stoker uses as many threads
as there are cores. Never a timed test.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_data  # noqa: E402
import field_data  # noqa: E402
import stoker  # noqa: E402
from stoker.tools import bench  # noqa: E402
from stoker.machine import usable_cores  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = bench_data.markers("benchmarks/fields.py")
DET_SIZE, SEG_SIZE, CLIP_SIZE = 640, 512, 224
LETTERBOX_FILL = 114
warnings.filterwarnings("ignore", message="This DataLoader will create")


class CheckError(AssertionError):
    pass


def check(condition: bool, what: str) -> None:
    if not condition:
        raise CheckError(what)


# --- the DataLoader side: what a user writes with PIL and numpy ---------------------------------


def _open_rgb(path: str):
    from PIL import Image

    with open(path, "rb") as f:
        img = Image.open(f)
        img.load()
    return img.convert("RGB")


def _to_tensor(img) -> torch.Tensor:
    return torch.from_numpy(np.array(img, copy=True)).permute(2, 0, 1)


class DetectionDataset(torch.utils.data.Dataset):
    """YOLO-style letterbox with PIL: resize (BILINEAR) to fit 640x640, paste centred on a
    114-grey canvas, flip half the time; the COCO xywh boxes become xyxy output pixels with
    numpy (scaled, shifted, clipped, mirrored)."""

    def __init__(self, samples: list[field_data.Sample], size: int = DET_SIZE):
        self.samples, self.size = samples, size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        from PIL import Image

        s = self.samples[i]
        img = _open_rgb(s.jpg)
        w, h = img.size
        scale = min(self.size / w, self.size / h)
        nw = min(max(round(w * scale), 1), self.size)
        nh = min(max(round(h * scale), 1), self.size)
        x0, y0 = (self.size - nw) // 2, (self.size - nh) // 2
        canvas = Image.new("RGB", (self.size, self.size), (LETTERBOX_FILL,) * 3)
        canvas.paste(img.resize((nw, nh), Image.BILINEAR), (x0, y0))
        boxes = np.array([a["bbox"] for a in s.boxes], dtype=np.float32).reshape(-1, 4)
        classes = np.array([a["category_id"] for a in s.boxes], dtype=np.int64)
        boxes[:, 2:] += boxes[:, :2]  # xywh -> xyxy
        boxes *= np.array([nw / w, nh / h, nw / w, nh / h], dtype=np.float32)
        boxes += np.array([x0, y0, x0, y0], dtype=np.float32)
        np.clip(boxes, 0, self.size, out=boxes)
        if torch.rand(1).item() < 0.5:
            canvas = canvas.transpose(Image.FLIP_LEFT_RIGHT)
            boxes[:, [0, 2]] = self.size - boxes[:, [2, 0]]
        return _to_tensor(canvas), torch.from_numpy(boxes), torch.from_numpy(classes)


def detection_collate(batch):
    """Images stacked; boxes of every image in one [N, 6] tensor of (image index, class, x0, y0,
    x1, y1), as YOLO-style training code collates variable box counts."""
    images, boxes, classes = zip(*batch, strict=True)
    targets = torch.cat(
        [
            torch.cat([torch.full((len(b), 1), float(i)), c[:, None].float(), b], 1)
            for i, (b, c) in enumerate(zip(boxes, classes, strict=True))
        ]
    )
    return torch.stack(images), targets


class SegmentationDataset(torch.utils.data.Dataset):
    """torchvision-style RandomResizedCrop parameters drawn in Python (torch's RNG), the same
    crop of image and mask resized with PIL (image BILINEAR, mask NEAREST), both flipped half the
    time; the mask stays uint8 class ids."""

    def __init__(self, samples: list[field_data.Sample], size: int = SEG_SIZE):
        self.samples, self.size = samples, size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        from PIL import Image

        s = self.samples[i]
        img = _open_rgb(s.jpg)
        with open(s.mask, "rb") as f:
            mask = Image.open(f)
            mask.load()
        top, left, h, w = bench.random_resized_crop_params(*img.size)
        box = (left, top, left + w, top + h)
        out = (self.size, self.size)
        img = img.crop(box).resize(out, Image.BILINEAR)
        mask = mask.crop(box).resize(out, Image.NEAREST)
        if torch.rand(1).item() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
            mask = mask.transpose(Image.FLIP_LEFT_RIGHT)
        return _to_tensor(img), torch.from_numpy(np.array(mask, dtype=np.uint8, copy=True))


class ImageTextDataset(torch.utils.data.Dataset):
    """torchvision's RandomResizedCrop(224) + RandomHorizontalFlip on PIL, and the caption."""

    def __init__(self, samples: list[field_data.Sample], size: int = CLIP_SIZE):
        self.samples = samples
        self.transform = bench.TorchvisionTransform(size, train=True)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        s = self.samples[i]
        return self.transform(_open_rgb(s.jpg)), s.caption


# --- checks: a broken pipeline must not post a number -------------------------------------------


def _check_images(images: torch.Tensor, batch: int, size: int) -> None:
    check(images.dtype == torch.uint8, f"images are {images.dtype}")
    check(tuple(images.shape[1:]) == (3, size, size), f"images {tuple(images.shape)}")
    check(images.shape[0] <= batch, f"batch of {images.shape[0]}")
    sub = images[:, :, ::4, ::4].float()  # every 16th pixel: enough to see an empty batch
    check(sub.std().item() > 10, "images are (nearly) constant")


def _check_letterbox(images: torch.Tensor) -> float:
    """The share of images whose top or left edge row is the fill (every landscape or portrait
    image has a bar there)."""
    top = (images[:, :, 0, :] == LETTERBOX_FILL).flatten(1).all(1)
    left = (images[:, :, :, 0] == LETTERBOX_FILL).flatten(1).all(1)
    return (top | left).float().mean().item()


class Checker:
    """Accumulates per-batch checks over an epoch; `finish` checks the epoch's averages."""

    def __init__(self, pipeline: str, image_only: bool = False):
        self.pipeline = pipeline
        self.image_only = image_only
        self.samples = 0
        self.boxes = 0
        self.bars = 0.0
        self.foreground = 0.0

    def stoker(self, batch: dict[str, Any], batch_size: int) -> int:
        images = batch["image"]
        n = images.shape[0]
        if self.image_only:
            size = {"detection": DET_SIZE, "segmentation": SEG_SIZE}.get(self.pipeline, CLIP_SIZE)
            _check_images(images, batch_size, size)
        elif self.pipeline == "detection":
            _check_images(images, batch_size, DET_SIZE)
            b = batch["boxes"]
            count, boxes, classes = b["count"], b["boxes"], b["classes"]
            check(tuple(boxes.shape) == (n, 100, 4), f"boxes {tuple(boxes.shape)}")
            check(int(count.min()) >= 0 and int(count.max()) <= 20, "box counts out of 0..20")
            valid = torch.arange(boxes.shape[1])[None, :] < count[:, None]
            real, cls = boxes[valid], classes[valid]
            check(bool((real >= 0).all() and (real <= DET_SIZE).all()), "boxes outside the image")
            check(
                bool((real[:, 2] >= real[:, 0]).all() and (real[:, 3] >= real[:, 1]).all()),
                "boxes with x1 < x0 or y1 < y0",
            )
            check(
                bool((cls >= 0).all() and (cls < field_data.NUM_BOX_CLASSES).all()),
                "box classes out of range",
            )
            check(bool((classes[~valid] == -1).all()), "classes past the count are not -1")
            self.boxes += int(count.sum())
            self.bars += _check_letterbox(images) * n
        elif self.pipeline == "segmentation":
            _check_images(images, batch_size, SEG_SIZE)
            mask = batch["mask"]
            check(
                mask.dtype == torch.uint8 and tuple(mask.shape) == (n, SEG_SIZE, SEG_SIZE),
                f"mask {mask.dtype} {tuple(mask.shape)}",
            )
            check(int(mask.max()) < field_data.NUM_MASK_CLASSES, f"mask value {int(mask.max())}")
            self.foreground += (mask > 0).float().mean().item() * n
        else:
            _check_images(images, batch_size, CLIP_SIZE)
            self._captions(batch["txt"], n)
        self.samples += n
        return n

    def dataloader(self, batch: Any, batch_size: int) -> int:
        if self.pipeline == "detection":
            images, targets = batch
            n = images.shape[0]
            _check_images(images, batch_size, DET_SIZE)
            check(targets.ndim == 2 and targets.shape[1] == 6, f"targets {tuple(targets.shape)}")
            xyxy = targets[:, 2:]
            check(bool((xyxy >= 0).all() and (xyxy <= DET_SIZE).all()), "boxes outside the image")
            check(bool((targets[:, 0] >= 0).all() and (targets[:, 0] < n).all()), "image index")
            self.boxes += targets.shape[0]
            self.bars += _check_letterbox(images) * n
        elif self.pipeline == "segmentation":
            images, mask = batch
            n = images.shape[0]
            _check_images(images, batch_size, SEG_SIZE)
            check(
                mask.dtype == torch.uint8 and tuple(mask.shape) == (n, SEG_SIZE, SEG_SIZE),
                f"mask {mask.dtype} {tuple(mask.shape)}",
            )
            check(int(mask.max()) < field_data.NUM_MASK_CLASSES, f"mask value {int(mask.max())}")
            self.foreground += (mask > 0).float().mean().item() * n
        else:
            images, captions = batch
            n = images.shape[0]
            _check_images(images, batch_size, CLIP_SIZE)
            self._captions(captions, n)
        self.samples += n
        return n

    def _captions(self, captions: list[str], n: int) -> None:
        check(isinstance(captions, (list, tuple)) and len(captions) == n, "captions per image")
        check(all(isinstance(c, str) and " photo of a " in c for c in captions), "captions")

    def finish(self, expected_samples: int, mean_boxes: float) -> str:
        check(self.samples == expected_samples, f"{self.samples} samples, {expected_samples} due")
        n = max(self.samples, 1)
        if self.image_only:
            return "images ok"
        if self.pipeline == "detection":
            # Letterbox keeps every box: the epoch's average is the data's.
            per = self.boxes / n
            check(
                abs(per - mean_boxes) < 0.15 * mean_boxes,
                f"{per:.2f} boxes a sample, the data has {mean_boxes:.2f}",
            )
            check(self.bars / n > 0.9, f"only {self.bars / n:.0%} of images show letterbox bars")
            return f"{per:.2f} boxes/sample, {self.bars / n:.0%} with bars"
        if self.pipeline == "segmentation":
            fg = self.foreground / n
            check(0.02 < fg < 0.9, f"mask foreground {fg:.1%}")
            return f"mask foreground {fg:.1%}"
        return "captions ok"


# --- loaders ------------------------------------------------------------------------------------


@dataclass
class FieldPipeline:
    name: str
    batch_size: int
    fields: Callable[[], dict[str, stoker.Field]]
    dataset: Callable[[list], torch.utils.data.Dataset]
    collate: Callable | None
    stoker_title: str
    dataloader_title: str


PIPELINES = [
    FieldPipeline(
        "detection",
        32,
        lambda: {
            "image": stoker.Image(
                "jpg", size=(DET_SIZE, DET_SIZE), geometry=stoker.Letterbox(), hflip=0.5
            ),
            "boxes": stoker.Boxes("json", follow="image", max_boxes=100),
        },
        DetectionDataset,
        detection_collate,
        '`Image("jpg", size=(640, 640), geometry=Letterbox(), hflip=0.5)` + '
        '`Boxes("json", follow="image", max_boxes=100)`',
        "PIL: `resize` BILINEAR to fit, `paste` on a 114-grey 640x640 canvas, "
        "`transpose(FLIP_LEFT_RIGHT)` half the time; boxes (COCO xywh from the annotation list "
        "held by the Dataset) to xyxy, scaled, shifted, clipped and mirrored with numpy; "
        "a YOLO-style collate (images stacked, boxes concatenated as [N, 6] with the image index)",
    ),
    FieldPipeline(
        "segmentation",
        32,
        lambda: {
            "image": stoker.Image(
                "jpg", size=SEG_SIZE, geometry=stoker.RandomResizedCrop(), hflip=0.5
            ),
            "mask": stoker.Mask("seg.png", follow="image"),
        },
        SegmentationDataset,
        None,
        '`Image("jpg", size=512, geometry=RandomResizedCrop(), hflip=0.5)` + '
        '`Mask("seg.png", follow="image")`',
        "torchvision's RandomResizedCrop parameters (`get_params`, torch's RNG) in Python; PIL "
        "`crop` + `resize` of the image (BILINEAR) and of the palette mask (NEAREST), both "
        "flipped half the time; the mask as uint8 ids; default collate",
    ),
    FieldPipeline(
        "image-text",
        256,
        lambda: {"image": stoker.Image("jpg", size=CLIP_SIZE), "txt": stoker.Text("txt")},
        ImageTextDataset,
        None,
        '`Image("jpg", size=224)` (train: RandomResizedCrop + hflip 0.5) + `Text("txt")`',
        "torchvision's RandomResizedCrop(224) + RandomHorizontalFlip on PIL (as "
        "`benchmarks/run.py`); the caption string from the Dataset's list; default collate "
        "(a list of strings)",
    ),
]


class Contender:
    """One loader of a pipeline: `epoch(checker)` runs a whole epoch, returns samples seen."""

    def __init__(self, name: str, iterate: Callable[[], Any], count: Callable, loader: Any):
        self.name, self._iterate, self._count, self.loader = name, iterate, count, loader
        self.runs: list[float] = []

    def epoch(self, checker: Checker | None = None, batch_size: int = 0) -> int:
        n = 0
        for batch in self._iterate():
            n += self._count(checker, batch, batch_size)
        return n


def stoker_contender(name, pack, pipeline, fields, threads, subset) -> Contender:
    loader = stoker.Loader(
        pack,
        batch_size=pipeline.batch_size,
        fields=fields,
        train=True,
        seed=0,
        threads=threads,
        rank=0,
        world_size=subset,
    )

    def count(checker, batch, batch_size):
        if checker is not None:
            return checker.stoker(batch, batch_size)
        return batch["image"].shape[0]

    return Contender(name, lambda: loader, count, loader)


def dataloader_contender(samples, pipeline, workers) -> Contender:
    loader = torch.utils.data.DataLoader(
        pipeline.dataset(samples),
        batch_size=pipeline.batch_size,
        shuffle=True,
        num_workers=workers,
        collate_fn=pipeline.collate,
        persistent_workers=workers > 0,
        prefetch_factor=2 if workers > 0 else None,
    )

    def count(checker, batch, batch_size):
        if checker is not None:
            return checker.dataloader(batch, batch_size)
        return batch[0].shape[0]

    return Contender(f"DataLoader workers={workers}", lambda: loader, count, loader)


def ceiling_contender(pack, threads, samples_per_epoch) -> Contender:
    """libjpeg-turbo decoding the pack's JPEGs whole on `threads` threads, nothing else: what
    Letterbox, which needs every pixel, cannot beat."""
    ds = stoker._core.Dataset.open(str(pack))
    blobs = [ds.read(i, "jpg") for i in range(min(samples_per_epoch, len(ds)))]
    run = bench.decode_ceiling_epoch(blobs, threads=threads)

    def iterate():
        return [run()]

    return Contender("full-decode ceiling", iterate, lambda c, n, b: n, None)


@dataclass
class Result:
    pipeline: FieldPipeline
    rates: dict[str, float]  # median img/s by contender
    runs: dict[str, list[float]]
    checks: dict[str, str]
    stage_seconds: dict[str, dict[str, float]]  # stoker contenders: seconds per stage, timed
    samples: int


def measure(pipeline, samples, pack, threads, workers, rounds, subset) -> Result:
    mine = samples[::subset]
    mean_boxes = float(np.mean([len(s.boxes) for s in samples]))
    checks = {}

    def warm_up(c: Contender) -> None:
        """One epoch, every batch checked."""
        t0 = time.perf_counter()
        if c.loader is None:  # the ceiling
            c.epoch()
            checks[c.name] = "-"
        else:
            checker = Checker(pipeline.name, image_only=c.name == "stoker, image field only")
            c.epoch(checker, pipeline.batch_size)
            due = c.loader.num_samples if c.name.startswith("stoker") else len(mine)
            checks[c.name] = checker.finish(due, mean_boxes)
        print(
            f"  [{pipeline.name}] warm-up {c.name}: {time.perf_counter() - t0:.1f} s, "
            f"{checks[c.name]}",
            flush=True,
        )

    # The DataLoaders' workers fork before any stoker loader exists: no stoker buffer is then
    # shared copy-on-write with them (the first pass after a fork would pay a page copy for
    # every page it writes; measured: about a third slower, once).
    dataloaders = [dataloader_contender(mine, pipeline, w) for w in workers]
    for c in dataloaders:
        warm_up(c)
    image_only = {"image": pipeline.fields()["image"]}
    stokers = [
        stoker_contender("stoker", pack, pipeline, pipeline.fields(), threads, subset),
        stoker_contender("stoker, image field only", pack, pipeline, image_only, threads, subset),
    ]
    ceiling = ceiling_contender(pack, threads, len(mine))
    for c in [*stokers, ceiling]:
        warm_up(c)
    contenders = [*stokers, *dataloaders, ceiling]
    expected = stokers[0].loader.num_samples
    before = {c.name: c.loader.stats()["seconds"] for c in contenders[:2]}
    for r in range(rounds):
        for c in contenders:
            t0 = time.perf_counter()
            n = c.epoch()
            c.runs.append(n / (time.perf_counter() - t0))
        print(
            f"  [{pipeline.name}] round {r + 1}: "
            + ", ".join(f"{c.name} {c.runs[-1]:.0f}" for c in contenders),
            flush=True,
        )
    stage_seconds = {}
    for c in contenders[:2]:
        after = c.loader.stats()["seconds"]
        stage_seconds[c.name] = {k: after[k] - before[c.name][k] for k in after}
    for c in stokers:
        c.loader.close()
    for c in dataloaders:  # its persistent workers exit with the loader's iterator
        c.loader = c._iterate = None
    gc.collect()
    return Result(
        pipeline,
        {c.name: statistics.median(c.runs) for c in contenders},
        {c.name: c.runs for c in contenders},
        checks,
        stage_seconds,
        expected,
    )


# --- report -------------------------------------------------------------------------------------


STAGES = ("read", "decode", "transform", "collate")


def stage_line(name: str, seconds: dict[str, float], images: int, elapsed: float) -> str:
    work = {k: seconds[k] for k in STAGES}
    total = sum(work.values())
    shares = ", ".join(
        f"{k} {1e3 * v / images:.2f} ({100 * v / total:.0f}%)"
        for k, v in work.items()
        if k != "collate" or v / total >= 0.005
    )
    return (
        f"{name}: {1e3 * total / images:.2f} ms of worker time an image: {shares}; the training "
        f"loop waited {seconds['wait']:.1f} s of the {elapsed:.1f} s timed"
    )


def _best(res: Result) -> str:
    dl = {k: v for k, v in res.rates.items() if k.startswith("DataLoader")}
    return max(dl, key=dl.get)


def ratio_lines(res: Result) -> list[str]:
    """stoker / best DataLoader, round by round (each round against that round's best
    configuration), against the ceiling, and what the second field costs per stage."""
    best = _best(res)
    dl_runs = [v for k, v in res.runs.items() if k.startswith("DataLoader")]
    per_round = [s / max(r[i] for r in dl_runs) for i, s in enumerate(res.runs["stoker"])]
    n = res.samples * len(res.runs["stoker"])
    full, alone = res.stage_seconds["stoker"], res.stage_seconds["stoker, image field only"]
    extra = {k: 1e3 * (full[k] - alone[k]) / n for k in STAGES[:3]}
    ceiling = res.rates["full-decode ceiling"]
    second = {"detection": "Boxes", "segmentation": "Mask"}.get(res.pipeline.name, "Text")
    return [
        f"- {res.pipeline.name}: stoker / best DataLoader ({best}) "
        f"**{res.rates['stoker'] / res.rates[best]:.2f}x** (round by round "
        + ", ".join(f"{r:.2f}x" for r in per_round)
        + f"); stoker / full-decode ceiling {res.rates['stoker'] / ceiling:.2f}x; "
        f"the {second} field costs {sum(extra.values()):+.2f} ms of worker time an image ("
        + ", ".join(f"{k} {v:+.2f}" for k, v in extra.items())
        + f"), {1 - res.rates['stoker'] / res.rates['stoker, image field only']:.0%} of the "
        "image-only throughput",
    ]


def section(results, machine, command, seconds, threads, rounds, load, mean_boxes) -> str:
    lines = [
        BEGIN,
        "## Typed-field pipelines (stoker.Loader)",
        "",
        "Written by `benchmarks/fields.py` (`make bench-fields`); every number here comes from "
        "the same run.",
        "",
        f"- command: `{command}`",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}; Python "
        f"{machine['python']}, torch {machine['torch']}, libjpeg-turbo {machine['libjpeg-turbo']}; "
        f"load average {load[0]:.2f} at the start, {load[1]:.2f} at the end (the run's own "
        "processes included)",
        f"- date: {time.strftime('%Y-%m-%d')}, run time {seconds / 60:.1f} min",
        "- data (`benchmarks/field_data.py`, under build/bench-fields/): the 1,000 imagenet-sample "
        "JPEGs (mostly 500x375), each listed 3 times (3,000 samples an epoch), with generated, "
        f"seeded annotations: 1-20 COCO xywh boxes a picture (mean {mean_boxes:.2f}, classes "
        "0-79), a palette PNG mask the "
        "picture's size with 1-6 random polygons of class ids 1-20, a one-line caption. One "
        "`stoker.pack(table.jsonl, out)` of the four members (jpg, seg.png, json, txt; default "
        "options: restart markers); each loader reads the members its fields name. The "
        "DataLoaders read the same JPEG and mask files, the boxes and captions from lists in the "
        "Dataset.",
        f"- throughput: images/s over whole epochs, median of {rounds} interleaved rounds (each "
        "round times one epoch of every loader in turn) after a warm-up epoch of each (the "
        "DataLoaders' first, so that their workers fork before stoker's buffers exist) in which "
        "every batch was checked (shapes; box counts, ranges and classes; letterbox bars; mask "
        "values below 21; captions). stoker: `threads=` cores "
        f"({threads}); DataLoader: `shuffle=True`, `persistent_workers=True`, "
        "`prefetch_factor=2`, `num_workers` 0-4.",
        "- `stoker, image field only`: the same loader without its Boxes/Mask/Text field, what "
        "the second field costs. Full-decode ceiling: libjpeg-turbo decoding each JPEG of the "
        "pack whole on the same threads, nothing else.",
        "- images/s follow the machine's speed on the day of the run: compare this section with "
        "the others in this file by its ratios (or through the full-decode ceiling, in both).",
        "",
        "| pipeline | batch | stoker | stoker, image field only | DataLoader workers=0 | 1 | 2 "
        "| 3 | 4 | best DataLoader | stoker / best | full-decode ceiling |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for res in results:
        dl = {k: v for k, v in res.rates.items() if k.startswith("DataLoader")}
        best = _best(res)
        cells = [
            f"{dl[f'DataLoader workers={w}']:.0f}" if f"DataLoader workers={w}" in dl else "-"
            for w in range(5)
        ]
        ratio = res.rates["stoker"] / dl[best]
        lines.append(
            f"| {res.pipeline.name} | {res.pipeline.batch_size} | {res.rates['stoker']:.0f} | "
            f"{res.rates['stoker, image field only']:.0f} | "
            + " | ".join(cells)
            + f" | {dl[best]:.0f} (workers={best.rsplit('=', 1)[1]}) | **{ratio:.2f}x** | "
            f"{res.rates['full-decode ceiling']:.0f} |"
        )
    lines.append("")
    for res in results:
        lines += ratio_lines(res)
    missed = [r.pipeline.name for r in results if r.rates["stoker"] < 3 * r.rates[_best(r)]]
    lines += [
        "",
        f"The bar (at least 3x the best DataLoader on {threads} cores): "
        + (f"**missed by {', '.join(missed)}**." if missed else "met by every pipeline."),
        "",
        "What each pipeline is:",
        "",
    ]
    for res in results:
        p = res.pipeline
        lines.append(f"- {p.name}: stoker {p.stoker_title}; DataLoader: {p.dataloader_title}.")
    lines += [
        "",
        "Where stoker's worker time goes (`loader.stats()['seconds']` over the timed "
        "epochs, summed over threads; ms an image):",
        "",
    ]
    for res in results:
        n = res.samples * len(res.runs["stoker"])
        for name, secs in res.stage_seconds.items():
            elapsed = sum(res.samples / r for r in res.runs[name])
            lines.append(f"- {res.pipeline.name}, {stage_line(name, secs, n, elapsed)}")
    lines += [
        "",
        "Why (from the code and `perf`):",
        "",
        "- detection: Letterbox shows the whole picture, and a 500x375 one is enlarged to "
        "640x480: every pixel is decoded at full scale (no crop for the restart markers to skip, "
        "no DCT scaling), so the image field is the full decode (about the ceiling's time per "
        "image) plus an enlarging resample and the grey bars. The Boxes field reads a second "
        "member and parses a few hundred bytes of JSON: it shows in `read`, hardly elsewhere.",
        "- segmentation: the Mask field inflates the whole PNG (zlib, with its Adler-32 check) "
        "whatever part of it the crop covers (the JPEG beside it decodes only the crop's "
        "restart intervals), then samples 512x512 nearest-neighbour one pixel at a time through "
        "index tables, with a branch per pixel for the edge and the flip. In `perf` of a "
        "segmentation epoch zlib (inflate, adler32) is about 12% of the process's samples.",
        "- image-text: as ImageLoader's training pipeline; the caption is a second member read "
        "and a copy into a Python str.",
    ]
    lines += ["", "Every epoch's figures (img/s, round by round):", ""]
    for res in results:
        runs = "; ".join(f"{k}: {', '.join(f'{v:.0f}' for v in vs)}" for k, vs in res.runs.items())
        lines.append(f"- {res.pipeline.name}: {runs}")
    lines += ["", END]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1/10 of each epoch, workers 0 and 2, 2 rounds, no write",
    )
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--pipelines", default=",".join(p.name for p in PIPELINES))
    parser.add_argument("--workers", default=None, help="DataLoader num_workers, e.g. 0,2,4")
    parser.add_argument(
        "--subset", type=int, default=None, help="time 1/SUBSET of each epoch (development)"
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 3)
    subset = args.subset or (10 if args.quick else 1)
    workers = (
        tuple(int(w) for w in args.workers.split(","))
        if args.workers
        else ((0, 2) if args.quick else (0, 1, 2, 3, 4))
    )
    threads = usable_cores()
    load_start = os.getloadavg()[0]
    t0 = time.time()
    machine = bench_data.machine()
    print(f"machine: {machine}; load average {load_start:.2f}", flush=True)
    samples, pack = field_data.build()
    mean_boxes = float(np.mean([len(s.boxes) for s in samples]))
    print(f"{len(samples)} samples in {pack}; {mean_boxes:.2f} boxes a sample", flush=True)
    chosen = [p for p in PIPELINES if p.name in args.pipelines.split(",")]
    results = []
    for pipeline in chosen:
        res = measure(pipeline, samples, pack, threads, workers, rounds, subset)
        results.append(res)
        dl = {k: v for k, v in res.rates.items() if k.startswith("DataLoader")}
        best = max(dl, key=dl.get)
        print(
            f"{pipeline.name}: "
            + ", ".join(f"{k} {v:.0f}" for k, v in res.rates.items())
            + f"; stoker / best ({best}) = {res.rates['stoker'] / dl[best]:.2f}x",
            flush=True,
        )
        n = res.samples * rounds
        for name, secs in res.stage_seconds.items():
            elapsed = sum(res.samples / r for r in res.runs[name])
            print("  " + stage_line(name, secs, n, elapsed), flush=True)
        for line in ratio_lines(res):
            print("  " + line, flush=True)
    load_end = os.getloadavg()[0]
    command = "python benchmarks/fields.py" + " ".join(
        [""] + [a for a in sys.argv[1:] if a != "--no-write"]
    )
    text = section(
        results,
        machine,
        command,
        time.time() - t0,
        threads,
        rounds,
        (load_start, load_end),
        mean_boxes,
    )
    if args.no_write or args.quick or args.subset or len(chosen) < len(PIPELINES):
        print(text)
    else:
        bench_data.write_section("benchmarks/fields.py", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
