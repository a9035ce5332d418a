"""stoker end to end, with nothing to download: make a dataset, pack it, train on it, compare.

    .venv/bin/python examples/demo.py            # or: make demo
    .venv/bin/python examples/demo.py --data-dir /tmp/shapes --per-class 800 --size 96

1. Draws a small image dataset of coloured shapes on noisy backgrounds (ImageFolder layout).
2. Packs the train and val folders with ``stoker.pack``.
3. Trains a small CNN on the CPU, fed by ``stoker.ImageLoader``, and evaluates it on the val pack.
4. Times stoker beside torch's DataLoader (torchvision-style transforms) on the same images.

Exits with status 1 if the final val accuracy is not above twice chance, so ``make demo`` checks
that the whole pipeline really works.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image, ImageDraw
from tqdm import tqdm

import stoker
from stoker.tools import bench
from stoker.packing.sources.folder import list_image_folder

SHAPES = ("circle", "cross", "ring", "square", "stripes", "triangle")
SPLITS = {"train": 1.0, "val": 0.25}  # images per class in each split, relative to --per-class
# ImageNet's statistics: any roughly right per-channel mean/std will do for this data.
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


# --- 1. the dataset ----------------------------------------------------------------------------


def polygon(cx: float, cy: float, points: list[tuple[float, float]], angle: float):
    """`points` (relative to the centre) rotated by `angle` and moved to (cx, cy)."""
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in points]


def draw_image(seed: int, split: int, label: int, index: int) -> Image.Image:
    """One image of class SHAPES[label]: a shape at a random place, size, angle and colour."""
    rng = np.random.default_rng([seed, split, label, index])
    width, height = (int(v) for v in rng.integers(160, 321, size=2))

    # Background: a random colour, a gentle gradient and per-pixel noise.
    background = rng.uniform(0, 255, size=3)
    ramp = np.linspace(-1, 1, width)[None, :, None] * rng.uniform(-40, 40, size=3)
    noise = rng.normal(0, 18, size=(height, width, 3))
    pixels = np.clip(background + ramp + noise, 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels)

    # Foreground: a colour far enough from the background to be seen.
    colour = rng.uniform(0, 255, size=3)
    while np.abs(colour - background).sum() < 180:
        colour = rng.uniform(0, 255, size=3)
    fill = tuple(int(v) for v in colour)

    r = rng.uniform(0.2, 0.32) * min(width, height)  # half the shape's extent
    cx = rng.uniform(0.5 * width - 0.5 * r, 0.5 * width + 0.5 * r)
    cy = rng.uniform(0.5 * height - 0.5 * r, 0.5 * height + 0.5 * r)
    angle = rng.uniform(0, 2 * math.pi)
    draw = ImageDraw.Draw(img)
    box = (cx - r, cy - r, cx + r, cy + r)
    name = SHAPES[label]
    if name == "circle":
        draw.ellipse(box, fill=fill)
    elif name == "ring":
        draw.ellipse(box, outline=fill, width=max(3, int(r * 0.25)))
    elif name == "square":
        k = r / math.sqrt(2)
        draw.polygon(polygon(cx, cy, [(-k, -k), (k, -k), (k, k), (-k, k)], angle), fill=fill)
    elif name == "triangle":
        draw.polygon(
            polygon(
                cx,
                cy,
                [(r * math.cos(a), r * math.sin(a)) for a in (0, 2 * math.pi / 3, 4 * math.pi / 3)],
                angle,
            ),
            fill=fill,
        )
    elif name == "cross":
        t = r * 0.3
        for w, h in ((r, t), (t, r)):
            draw.polygon(polygon(cx, cy, [(-w, -h), (w, -h), (w, h), (-w, h)], angle), fill=fill)
    elif name == "stripes":
        t = 2 * r / 9  # five bars and four gaps of equal width
        for i in range(5):
            x0 = -r + 2 * i * t
            draw.polygon(
                polygon(cx, cy, [(x0, -r), (x0 + t, -r), (x0 + t, r), (x0, r)], angle), fill=fill
            )
    return img


def write_image(job: tuple[int, int, int, int, str]) -> None:
    """Draw one image and save it as a JPEG (a multiprocessing worker)."""
    seed, split, label, index, path = job
    draw_image(seed, split, label, index).save(path, quality=90)


def make_dataset(root: Path, per_class: int, seed: int) -> dict[str, Path]:
    """Write root/{train,val}/CLASS/NNNNN.jpg, unless a folder already holds the right count."""
    folders = {}
    for split_id, (split, share) in enumerate(SPLITS.items()):
        folder = root / split
        folders[split] = folder
        count = max(1, int(per_class * share))
        if folder.is_dir() and sum(1 for _ in folder.glob("*/*.jpg")) == count * len(SHAPES):
            print(f"{folder}: {count * len(SHAPES)} images already there")
            continue
        shutil.rmtree(folder, ignore_errors=True)
        jobs = []
        for label, name in enumerate(SHAPES):
            (folder / name).mkdir(parents=True)
            jobs += [
                (seed, split_id, label, i, str(folder / name / f"{i:05d}.jpg"))
                for i in range(count)
            ]
        with multiprocessing.Pool() as pool:
            for _ in tqdm(
                pool.imap_unordered(write_image, jobs, chunksize=16),
                total=len(jobs),
                desc=f"drawing {split}",
                unit="img",
            ):
                pass
    return folders


# --- 3. the model and the training loop ---------------------------------------------------------


def conv_block(cin: int, cout: int) -> nn.Sequential:
    """3x3 conv, batch norm, ReLU, then halve the resolution."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
    )


class SmallCNN(nn.Module):
    """Four conv blocks (16-32-64-64 channels), global average pooling and a linear classifier."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.features = nn.Sequential(
            conv_block(3, 16), conv_block(16, 32), conv_block(32, 64), conv_block(64, 64)
        )
        self.classifier = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean(dim=(2, 3)))


def normalise(images: torch.Tensor) -> torch.Tensor:
    """uint8 NCHW (channels_last) from the loader to normalised float, keeping the layout."""
    return (images.float() - MEAN) / STD


def train_epoch(model, loader, optimiser, scheduler) -> dict[str, float]:
    """One pass over the training pack; loss, accuracy, images/s and the loader's wait share."""
    model.train()
    wait0 = loader.stats()["seconds"]["wait"]
    t0 = time.perf_counter()
    loss_sum, correct, seen = 0.0, 0, 0
    for images, labels in loader:
        logits = model(normalise(images))
        loss = F.cross_entropy(logits, labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        scheduler.step()
        loss_sum += loss.item() * len(labels)
        correct += (logits.argmax(1) == labels).sum().item()
        seen += len(labels)
    seconds = time.perf_counter() - t0
    wait = loader.stats()["seconds"]["wait"] - wait0
    return {
        "loss": loss_sum / seen,
        "accuracy": correct / seen,
        "images_per_s": seen / seconds,
        "wait": wait / seconds,
    }


@torch.no_grad()
def evaluate(model, loader) -> float:
    """Accuracy over one pass of an evaluation loader."""
    model.eval()
    correct = seen = 0
    for images, labels in loader:
        correct += (model(normalise(images)).argmax(1) == labels).sum().item()
        seen += len(labels)
    return correct / seen


def train(packs: dict[str, Path], args) -> float:
    """Train SmallCNN on the train pack for args.epochs epochs; returns the final val accuracy."""
    torch.manual_seed(args.seed)
    # Random crops keep at least 30% of the image here: smaller ones would often miss the shape.
    train_loader = stoker.ImageLoader(
        packs["train"],
        batch_size=args.batch_size,
        size=args.size,
        train=True,
        seed=args.seed,
        scale=(0.3, 1.0),
    )
    val_loader = stoker.ImageLoader(
        packs["val"], batch_size=args.batch_size, size=args.size, train=False
    )
    print(train_loader)
    print(val_loader)
    model = SmallCNN(len(train_loader.classes)).to(memory_format=torch.channels_last)
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimiser, max_lr=args.lr, total_steps=args.epochs * len(train_loader)
    )

    print(
        f"\n{'epoch':>5} {'train loss':>10} {'train acc':>9} {'val acc':>8} "
        f"{'img/s':>7} {'loader wait':>11}"
    )
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        stats = train_epoch(model, train_loader, optimiser, scheduler)
        accuracy = evaluate(model, val_loader)
        print(
            f"{epoch:>5} {stats['loss']:>10.3f} {stats['accuracy']:>9.1%} {accuracy:>8.1%} "
            f"{stats['images_per_s']:>7.0f} {stats['wait']:>11.1%}",
            flush=True,
        )
    train_loader.close()
    val_loader.close()
    return accuracy


# --- 4. stoker beside torch's DataLoader --------------------------------------------------------


def compare_loaders(folder: Path, pack: Path, args) -> None:
    """Images/s of stoker and of DataLoader (0 and 2 workers) over the same training images."""
    samples, _ = list_image_folder(folder)
    transform = bench.TorchvisionTransform(args.size, train=True)
    # Each maker builds its loader only when its turn comes, so one loader runs at a time.
    makers = {
        "stoker.ImageLoader": lambda: bench.stoker_epoch(
            str(pack), batch_size=args.batch_size, size=args.size, train=True
        ),
        "DataLoader num_workers=0": lambda: bench.dataloader_epoch(
            bench.FileDataset(samples, transform), batch_size=args.batch_size, workers=0
        ),
        "DataLoader num_workers=2": lambda: bench.dataloader_epoch(
            bench.FileDataset(samples, transform), batch_size=args.batch_size, workers=2
        ),
    }
    print(
        f"loading only, {len(samples)} images -> {args.size}x{args.size}, batch "
        f"{args.batch_size}, RandomResizedCrop + flip (median of 2 epochs after a warm-up)"
    )
    results = {}
    for name, make in makers.items():
        results[name] = bench.time_epochs(name, make(), epochs=2).images_per_s
        print(f"  {name:<26} {results[name]:>8.0f} img/s", flush=True)
    ours = results["stoker.ImageLoader"]
    for name, value in results.items():
        if name.startswith("DataLoader"):
            print(f"  stoker / {name}: {ours / value:.1f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path("demo-data"),
        help="where the images and packs go (default: ./demo-data)",
    )
    parser.add_argument(
        "--per-class",
        type=int,
        default=500,
        help="training images per class; val gets a quarter as many",
    )
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument(
        "--size", type=int, default=64, help="side of the square images the loaders make"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-bench", action="store_true", help="skip the loader comparison")
    args = parser.parse_args()
    start = time.perf_counter()

    print("== 1. dataset")
    folders = make_dataset(args.data_dir / "images", args.per_class, args.seed)

    print("\n== 2. pack")
    packs = {}
    for split, folder in folders.items():
        packs[split] = args.data_dir / "pack" / split
        print(stoker.pack(folder, packs[split], overwrite=True))

    print("\n== 3. train")
    accuracy = train(packs, args)

    if not args.skip_bench:
        print("\n== 4. stoker vs torch DataLoader")
        compare_loaders(folders["train"], packs["train"], args)

    threshold = 2 / len(SHAPES)
    print(
        f"\nfinal val accuracy {accuracy:.1%} (chance {1 / len(SHAPES):.1%}); "
        f"total {time.perf_counter() - start:.0f} s"
    )
    if accuracy <= threshold:
        print(f"FAILED: val accuracy is not above {threshold:.1%}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
