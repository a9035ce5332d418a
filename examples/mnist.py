"""The field notes' MNIST experiment, runnable with nothing to download: their ``num_workers``
sweep, done with ``stoker.sweep`` beside stoker's own loader, then a CNN trained from an array pack
held in memory (on the GPU when there is one).

    .venv/bin/python examples/mnist.py              # 60,000 + 10,000 images, 3 epochs
    .venv/bin/python examples/mnist.py --small      # 6,000 + 1,000, 2 epochs (the tests run this)

1. Draws an MNIST-shaped dataset: 28x28 uint8 handwritten-looking digits (ten stroke templates,
   each image bent by a random affine map and an elastic distortion, with noise), from a fixed seed.
2. Packs it with ``stoker.pack_arrays`` (one ``.npy`` column per field: what ``np.load`` reads).
3. The notes' sweep (../shared/seeds): a torch DataLoader over a Dataset written as torchvision's
   MNIST is (a PIL image per sample, then ToTensor and Normalize), batch 64, shuffled, for each
   ``num_workers``; then the same batches (float32, normalised) from ``stoker.Loader`` for each
   ``threads``. Prints both tables, the best setting of each and their ratio; plots both.
4. Trains a small CNN fed by ``stoker.Loader(..., resident=True)`` (RandomCrop(28, padding=2)
   done by the loader) and evaluates it on the test pack after each epoch.

Exits with status 1 if the final test accuracy is not above ``--min-accuracy`` (default 90%;
chance is 10%), so a run checks that the data, the loader and the training really work.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image, ImageDraw

import stoker

# The normalisation the notes use (transforms.Normalize((0.1307,), (0.3081,))): real MNIST's.
MEAN, STD = 0.1307, 0.3081
CLASSES = [str(d) for d in range(10)]

# --- 1. the dataset ------------------------------------------------------------------------------

# Each digit as strokes (polylines) in a unit box, x to the right, y down.


def _arc(cx: float, cy: float, rx: float, ry: float, a0: float, a1: float, n: int = 24):
    """Points of an elliptic arc from angle a0 to a1 (degrees, clockwise on screen from +x)."""
    t = np.radians(np.linspace(a0, a1, n))
    return list(zip(cx + rx * np.cos(t), cy + ry * np.sin(t)))


STROKES: list[list[list[tuple[float, float]]]] = [
    [_arc(0.5, 0.5, 0.27, 0.4, 0, 360, 40)],
    [[(0.33, 0.27), (0.52, 0.1), (0.52, 0.9)]],
    [_arc(0.5, 0.33, 0.24, 0.22, 190, 380) + [(0.25, 0.9), (0.78, 0.9)]],
    [_arc(0.48, 0.3, 0.22, 0.2, 200, 450) + _arc(0.48, 0.7, 0.25, 0.2, 270, 500)],
    [[(0.62, 0.9), (0.62, 0.1), (0.2, 0.65), (0.8, 0.65)]],
    [[(0.75, 0.1), (0.32, 0.1), (0.28, 0.45)] + _arc(0.5, 0.66, 0.25, 0.24, 230, 485)],
    [[(0.68, 0.1), (0.4, 0.35)] + _arc(0.5, 0.68, 0.23, 0.22, 200, 560)],
    [[(0.2, 0.1), (0.8, 0.1), (0.4, 0.9)]],
    [_arc(0.5, 0.3, 0.19, 0.19, 90, 450), _arc(0.5, 0.7, 0.24, 0.2, -90, 270)],
    [_arc(0.48, 0.32, 0.22, 0.21, 0, 360), [(0.7, 0.32), (0.62, 0.9)]],
]
WIDTHS = (0.07, 0.1, 0.13)  # stroke widths, relative to the box


def templates() -> torch.Tensor:
    """float32 [10, len(WIDTHS), 28, 28] in [0, 1]: each digit drawn at each stroke width in the
    central 20x20 pixels, as MNIST's digits are, antialiased (drawn at 4x, then reduced)."""
    scale, box, at = 4, 20, 4  # drawn at 112x112; the unit box is pixels 4..24 of 28
    out = np.zeros((len(STROKES), len(WIDTHS), 28, 28), np.float32)
    for d, strokes in enumerate(STROKES):
        for w, width in enumerate(WIDTHS):
            img = Image.new("L", (28 * scale, 28 * scale))
            draw = ImageDraw.Draw(img)
            for line in strokes:
                xy = [((at + x * box) * scale, (at + y * box) * scale) for x, y in line]
                draw.line(xy, fill=255, width=round(width * box * scale), joint="curve")
            small = img.reduce(scale)
            out[d, w] = np.asarray(small, np.float32) / 255
    return torch.from_numpy(out)


def draw_digits(n: int, seed: int, chunk: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [n, 28, 28], labels int64 [n]): each a template bent by a random affine map
    and a smooth elastic field, its ink contrast varied, plus noise. Batched tensor operations:
    60,000 images take about 2 s on 2 cores."""
    g = torch.Generator().manual_seed(seed)
    shapes = templates()
    labels = torch.randint(0, 10, (n,), generator=g)
    images = torch.empty((n, 28, 28), dtype=torch.uint8)
    for start in range(0, n, chunk):
        y = labels[start : start + chunk]
        b = len(y)
        src = shapes[y, torch.randint(0, len(WIDTHS), (b,), generator=g)][:, None]

        def uniform(lo: float, hi: float, b: int = b) -> torch.Tensor:
            return lo + (hi - lo) * torch.rand(b, generator=g)

        angle = uniform(-0.3, 0.3)  # radians, about +-17 degrees
        sx, sy = uniform(0.8, 1.15), uniform(0.8, 1.15)
        shear = uniform(-0.3, 0.3)
        c, s = torch.cos(angle), torch.sin(angle)
        theta = torch.stack(
            [
                torch.stack([c / sx, (-s + shear) / sx, uniform(-0.12, 0.12)], 1),
                torch.stack([s / sy, c / sy, uniform(-0.12, 0.12)], 1),
            ],
            1,
        )  # output -> input coordinates, in [-1, 1] units
        grid = F.affine_grid(theta, [b, 1, 28, 28], align_corners=False)
        # Elastic distortion: a coarse random displacement, smoothly upsampled.
        bend = torch.randn((b, 2, 4, 4), generator=g) * 0.08
        grid = grid + F.interpolate(bend, size=(28, 28), mode="bicubic").permute(0, 2, 3, 1)
        ink = F.grid_sample(src, grid, mode="bilinear", align_corners=False)[:, 0]
        ink = ink * uniform(0.6, 1.0)[:, None, None]
        noise = torch.randn((b, 28, 28), generator=g) * 0.08
        images[start : start + b] = ((ink + noise).clamp(0, 1) * 255).round().to(torch.uint8)
    return images.numpy(), labels.numpy()


def make_packs(root: Path, train: int, test: int, seed: int) -> dict[str, Path]:
    """root/train and root/test: array packs of image (uint8 [28, 28]) and label (int64)."""
    packs = {}
    for split, (n, split_seed) in {"train": (train, seed), "test": (test, seed + 1)}.items():
        t0 = time.perf_counter()
        images, labels = draw_digits(n, split_seed)
        print(f"drew {n:,} {split} digits in {time.perf_counter() - t0:.1f} s")
        packs[split] = root / split
        result = stoker.pack_arrays(
            {"image": images, "label": labels},
            packs[split],
            classes=CLASSES,
            shard_size="16MB",
            overwrite=True,
            progress=False,
        )
        print(result)
    return packs


# --- 3. the notes' num_workers sweep -------------------------------------------------------------


class MNIST(torch.utils.data.Dataset):
    """What torchvision.datasets.MNIST is over its files: uint8 [N, 28, 28] and labels in memory,
    each sample made a PIL image, then given to the transform. (Here over the pack's columns.)"""

    def __init__(self, pack: Path, transform: Callable[[Image.Image], torch.Tensor]):
        self.data = torch.from_numpy(np.concatenate([np.load(f) for f in _columns(pack, "image")]))
        self.targets = torch.from_numpy(
            np.concatenate([np.load(f) for f in _columns(pack, "label")])
        )
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        img, target = self.data[index], int(self.targets[index])
        return self.transform(Image.fromarray(img.numpy(), mode="L")), target


def _columns(pack: Path, field: str) -> list[Path]:
    return sorted(pack.glob(f"shard-*.{field}.npy"))


def to_tensor_normalize(img: Image.Image) -> torch.Tensor:
    """transforms.Compose([ToTensor(), Normalize((0.1307,), (0.3081,))]), as torchvision does it
    on a grey PIL image (written out: torchvision is not a dependency of stoker)."""
    x = torch.from_numpy(np.array(img, np.uint8)).view(1, 28, 28).float().div(255)
    return x.sub_(MEAN).div_(STD)


def stoker_loader(
    pack: Path,
    device: torch.device,
    *,
    batch_size: int,
    augment: bool,
    shuffle: bool,
    seed: int = 0,
    threads: int | str = "auto",
) -> stoker.Loader:
    """The pack held in memory (`device`'s: the GPU's, or the host's), float32 images normalised
    as the notes normalise them; RandomCrop(28, padding=2) with `augment`."""
    geometry = stoker.RandomCrop(padding=2) if augment else stoker.Resize()  # to 28: a copy
    return stoker.Loader(
        pack,
        batch_size=batch_size,
        fields={
            "image": stoker.Image("image", size=28, channels=1, geometry=geometry),
            "label": stoker.Label("label"),
        },
        train=augment,
        shuffle=shuffle,
        seed=seed,
        threads=threads,
        resident=True,
        device=device,
        mean=(MEAN,),
        std=(STD,),
    )


def sweep(packs: dict[str, Path], device: torch.device, args: argparse.Namespace) -> None:
    """The notes' loop over num_workers, and stoker's over threads, with stoker.sweep."""
    dataset = MNIST(packs["train"], to_tensor_normalize)
    # Like the notes, the sweep goes past the machine's cores on purpose: torch's warning about it
    # would be printed for every such setting.
    warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
    # The notes pass num_workers only when CUDA is there (kwargs = {} otherwise), so on a machine
    # without a GPU their sweep timed num_workers=0 every time; here it is always passed.
    print(
        f"\nDataLoader over the notes' Dataset (PIL image, ToTensor, Normalize per sample), batch "
        f"{args.sweep_batch_size}, shuffled; {args.sweep_batches} batches after a warm-up each"
        + (
            ", its batches left on the host, as the notes time them"
            if device.type == "cuda"
            else ""
        )
    )
    dataloader = stoker.sweep(
        lambda num_workers: torch.utils.data.DataLoader(
            dataset,
            batch_size=args.sweep_batch_size,
            shuffle=True,
            num_workers=num_workers,
            pin_memory=False,  # what the notes found faster for a dataset as small as MNIST
        ),
        "num_workers",
        args.workers,
        batches=args.sweep_batches,
        plot=args.data_dir / "sweep-dataloader.png",
    )
    print(dataloader, flush=True)

    where = "GPU" if device.type == "cuda" else "host memory"
    threads = sorted({max(1, w) for w in args.workers})
    print(
        f"\nstoker.Loader over the array pack, resident in {where}, the same float32 normalised "
        f"batches, batch {args.sweep_batch_size}, shuffled"
    )
    ours = stoker.sweep(
        lambda threads: stoker_loader(
            packs["train"],
            device,
            batch_size=args.sweep_batch_size,
            augment=False,
            shuffle=True,
            threads=threads,
        ),
        "threads",
        threads,
        batches=args.sweep_batches,
        plot=args.data_dir / "sweep-stoker.png",
    )
    print(ours, flush=True)
    best_dl = max(dataloader.samples_per_second)
    best_ours = max(ours.samples_per_second)
    print(
        f"\nbest: DataLoader num_workers={dataloader.best}: {best_dl:,.0f} samples/s; "
        f"stoker threads={ours.best}: {best_ours:,.0f} samples/s ({best_ours / best_dl:.1f}x)"
    )
    print(f"plots: {args.data_dir / 'sweep-dataloader.png'}, {args.data_dir / 'sweep-stoker.png'}")


# --- 4. training ---------------------------------------------------------------------------------


def make_model() -> nn.Module:
    """Two conv blocks and a small classifier: enough for these digits."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),  # 14x14
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),  # 7x7
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 64),
        nn.ReLU(inplace=True),
        nn.Linear(64, 10),
    )


def evaluate(model: nn.Module, loader: stoker.Loader) -> float:
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=loader.device)
    seen = 0
    with torch.inference_mode():
        for batch in loader:
            logits = model(batch["image"])
            correct += (logits.argmax(1) == batch["label"]).sum()
            seen += len(batch["label"])
    return int(correct) / seen


def train(packs: dict[str, Path], device: torch.device, args: argparse.Namespace) -> float:
    torch.manual_seed(args.seed)
    train_loader = stoker_loader(
        packs["train"],
        device,
        batch_size=args.batch_size,
        augment=True,
        shuffle=True,
        seed=args.seed,
    )
    test_loader = stoker_loader(packs["test"], device, batch_size=512, augment=False, shuffle=False)
    print(train_loader)
    model = make_model().to(device)
    optimiser = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimiser, max_lr=args.lr, total_steps=args.epochs * len(train_loader)
    )
    print(f"\n{'epoch':>5} {'train loss':>10} {'test acc':>8} {'img/s':>7}")
    accuracy = 0.0
    for epoch in range(args.epochs):
        model.train()
        loss_sum = torch.zeros((), device=device)
        seen = 0
        t0 = time.perf_counter()
        for batch in train_loader:
            images, labels = batch["image"], batch["label"]
            loss = F.cross_entropy(model(images), labels)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            scheduler.step()
            loss_sum += loss.detach() * len(labels)  # no .item() per step: no sync per step
            seen += len(labels)
        seconds = time.perf_counter() - t0
        accuracy = evaluate(model, test_loader)
        print(
            f"{epoch + 1:>5} {float(loss_sum) / seen:>10.3f} {accuracy:>8.1%} "
            f"{seen / seconds:>7,.0f}",
            flush=True,
        )
    train_loader.close()
    test_loader.close()
    return accuracy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path("mnist-data"),
        help="where the packs and plots go (default: ./mnist-data)",
    )
    p.add_argument(
        "--small",
        action="store_true",
        help="6,000 + 1,000 images, 2 epochs, a shorter sweep: a check in seconds",
    )
    p.add_argument("--train-size", type=int, help="training images (default 60,000)")
    p.add_argument("--test-size", type=int, help="test images (default 10,000)")
    p.add_argument("--epochs", type=int, help="default 3 (2 with --small)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="'cuda', 'cpu' or 'auto'")
    p.add_argument(
        "--workers",
        type=int,
        nargs="+",
        help="num_workers to sweep (default 0 1 2 4 8; stoker sweeps threads over the "
        "same values, at least 1)",
    )
    p.add_argument("--sweep-batch-size", type=int, default=64, help="the notes' batch size")
    p.add_argument(
        "--sweep-batches", type=int, help="timed batches per setting (default: an epoch's worth)"
    )
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument(
        "--min-accuracy", type=float, default=0.9, help="exit 1 below this final test accuracy"
    )
    args = p.parse_args(argv)
    small = args.small
    defaults = {
        "train_size": 6_000 if small else 60_000,
        "test_size": 1_000 if small else 10_000,
        "epochs": 2 if small else 3,
        "workers": [0, 1, 2] if small else [0, 1, 2, 4, 8],
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.sweep_batches is None:
        args.sweep_batches = max(1, args.train_size // args.sweep_batch_size)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    args.data_dir.mkdir(parents=True, exist_ok=True)

    print("== 1-2. dataset and packs")
    packs = make_packs(args.data_dir, args.train_size, args.test_size, args.seed)

    if not args.skip_sweep:
        print("\n== 3. the notes' num_workers sweep")
        sweep(packs, device, args)

    print(f"\n== 4. train on {device}")
    accuracy = train(packs, device, args)
    print(
        f"\nfinal test accuracy {accuracy:.1%} (chance 10.0%); "
        f"total {time.perf_counter() - start:.0f} s"
    )
    if accuracy <= args.min_accuracy:
        print(f"FAILED: test accuracy is not above {args.min_accuracy:.0%}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
