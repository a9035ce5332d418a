"""A multi-input ("fusion") model fed from one array pack: the field notes' example of a model with
one branch per input, fused before the head (concat, sum, or a low-rank outer product), runnable
with nothing to download.

    .venv/bin/python examples/fusion.py                  # 20,000 + 4,000 samples, 6 epochs
    .venv/bin/python examples/fusion.py --small          # 3,000 + 1,000, a check in seconds
    .venv/bin/python examples/fusion.py --fusion outer

1. Makes a dataset of 6 classes whose samples have four inputs of different shapes and dtypes:
   an image (uint8 32x32x3), a feature vector (float32 [12]), a time series (float16 [64, 2]) and
   categorical ids (int32 [6]), plus a label (uint8). The class is ``3 * a + b``: the image shows
   ``a`` (stripes across or along), the series ``b`` (its frequency); the vector and the ids carry
   weaker, noisy clues to the class. No single input tells the class.
2. Packs every input in one array pack (``stoker.pack_arrays``: one ``.npy`` column per input).
3. Reads it with one ``stoker.Loader``: a dict batch per step, the image through an ``Image`` field
   (RandomCrop(32, padding=4) and flips on the raw pixels, normalised), the others through
   ``Array`` fields (each in its packed dtype and shape), the label through ``Label``; the pack held
   in memory, on the GPU when there is one.
4. Trains the model, evaluates it, and measures what each input is worth: the test accuracy with
   that input shuffled across the batch.

Exits with status 1 if the test accuracy is not above ``--min-accuracy`` (default 80%; chance is
1/6), or if shuffling the image or the series costs under 20 points (the model must use both).
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import reduce
from operator import mul
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import stoker

NUM_CLASSES = 6  # 3 * a + b, a in {0, 1} (the image), b in {0, 1, 2} (the series)
SERIES_LENGTH, VOCAB = 64, 40
INPUTS = ("image", "vector", "series", "ids")
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


# --- 1. the dataset ------------------------------------------------------------------------------


def make_samples(n: int, seed: int) -> dict[str, np.ndarray]:
    """n samples of every input and the label, as columns (numpy arrays, sample first)."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, NUM_CLASSES, n)
    a, b = label // 3, label % 3

    # image: stripes of a random period, phase and pair of colours, across (a=0) or along (a=1),
    # under noise. RandomCrop and horizontal flips keep the stripes' direction, hence the class.
    yy, xx = np.mgrid[0:32, 0:32]
    period = rng.uniform(4, 9, n)[:, None, None]
    phase = rng.uniform(0, 2 * np.pi, n)[:, None, None]
    coordinate = np.where(a[:, None, None] == 0, yy[None], xx[None])
    wave = 0.5 + 0.5 * np.sin(2 * np.pi * coordinate / period + phase)  # [n, 32, 32]
    dark, light = rng.uniform(0, 110, (n, 3)), rng.uniform(140, 255, (n, 3))
    pixels = dark[:, None, None] + wave[..., None] * (light - dark)[:, None, None]
    pixels += rng.normal(0, 40, pixels.shape)
    image = pixels.clip(0, 255).astype(np.uint8)

    # series: channel 0 a sine of 2, 4 or 7 cycles (b) at a random phase, channel 1 a random walk
    # scaled; both noisy. Stored as float16, as a sensor log might be.
    t = np.arange(SERIES_LENGTH) / SERIES_LENGTH
    cycles = np.array([2.0, 4.0, 7.0])[b][:, None]
    sine = np.sin(2 * np.pi * cycles * t[None] + rng.uniform(0, 2 * np.pi, (n, 1)))
    walk = np.cumsum(rng.normal(0, 0.2, (n, SERIES_LENGTH)), axis=1)
    series = np.stack([sine + rng.normal(0, 0.6, sine.shape), walk], axis=-1).astype(np.float16)

    # vector: the class's centre (fixed for the dataset) under as much noise: a weak clue.
    centres = np.random.default_rng(1234).normal(0, 1, (NUM_CLASSES, 12))
    vector = (centres[label] + rng.normal(0, 3.0, (n, 12))).astype(np.float32)

    # ids: each one of the class's 4 ids with probability 0.2, any of the VOCAB ids otherwise.
    own = rng.integers(0, 4, (n, 6)) + 4 * label[:, None]
    ids = np.where(rng.random((n, 6)) < 0.2, own, rng.integers(0, VOCAB, (n, 6))).astype(np.int32)

    return {
        "image": image,
        "vector": vector,
        "series": series,
        "ids": ids,
        "label": label.astype(np.uint8),
    }


def make_packs(root: Path, train: int, test: int, seed: int) -> dict[str, Path]:
    packs = {}
    for split, (n, split_seed) in {"train": (train, seed), "test": (test, seed + 1)}.items():
        packs[split] = root / split
        result = stoker.pack_arrays(
            make_samples(n, split_seed),
            packs[split],
            classes=[f"a{c // 3}-b{c % 3}" for c in range(NUM_CLASSES)],
            shard_size="8MB",
            overwrite=True,
            progress=False,
        )
        print(result)
        for field in result.fields:
            print(f"  {field['name']:<7} {field['dtype']:<8} {field['shape']}")
    return packs


# --- 3. the loader -------------------------------------------------------------------------------


def make_loader(
    pack: Path, device: torch.device, *, batch_size: int, train: bool, seed: int = 0
) -> stoker.Loader:
    """Every input of a sample from one pack, in one dict batch on `device`."""
    geometry = stoker.RandomCrop(padding=4) if train else stoker.Resize()  # Resize to 32: a copy
    return stoker.Loader(
        pack,
        batch_size=batch_size,
        fields={
            "image": stoker.Image("image", size=32, geometry=geometry, hflip=0.5 if train else 0),
            "vector": stoker.Array("vector"),  # dtype and shape: the pack's
            "series": stoker.Array("series"),
            "ids": stoker.Array("ids"),
            "label": stoker.Label("label"),  # int64, whatever integer type was packed
        },
        train=train,
        seed=seed,
        resident=True,  # a few MB: held in memory (the GPU's when there is one)
        device=device,  # every tensor moves; the image is also made float32 and normalised
        mean=MEAN,
        std=STD,
    )


def describe(batch: dict[str, torch.Tensor]) -> str:
    return "\n".join(
        f"  {k:<7} {str(v.dtype).replace('torch.', ''):<8} {list(v.shape)} {v.device}"
        for k, v in batch.items()
    )


# --- 4. the model --------------------------------------------------------------------------------


class FusionNet(nn.Module):
    """A branch per input, each to a `hidden`-wide feature, fused as the notes' model fuses them:
    ``concat`` (a linear head over all features), ``sum`` (a linear head over their sum) or
    ``outer`` (low-rank multimodal fusion: each feature, with a 1 appended, through `rank` factors
    per input, multiplied across inputs, summed over the rank with learned weights)."""

    def __init__(self, fusion: str = "concat", hidden: int = 32, rank: int = 4):
        super().__init__()
        self.fusion = fusion
        self.branches = nn.ModuleDict(
            {
                "image": nn.Sequential(
                    nn.Conv2d(3, 16, 3, stride=2, padding=1),
                    nn.ReLU(inplace=True),
                    nn.Conv2d(16, 32, 3, stride=2, padding=1),
                    nn.ReLU(inplace=True),
                    nn.AdaptiveAvgPool2d(1),
                    nn.Flatten(),
                    nn.Linear(32, hidden),
                ),
                "vector": nn.Sequential(
                    nn.Linear(12, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, hidden)
                ),
                "series": nn.Sequential(  # [B, channels, time]
                    nn.Conv1d(2, 16, 5, padding=2),
                    nn.ReLU(inplace=True),
                    nn.Conv1d(16, 32, 5, padding=2, stride=2),
                    nn.ReLU(inplace=True),
                    nn.AdaptiveMaxPool1d(1),
                    nn.Flatten(),
                    nn.Linear(32, hidden),
                ),
                "ids": nn.EmbeddingBag(VOCAB, hidden, mode="mean"),
            }
        )
        if fusion == "concat":
            self.head = nn.Linear(len(INPUTS) * hidden, NUM_CLASSES)
        elif fusion == "sum":
            self.head = nn.Linear(hidden, NUM_CLASSES)
        elif fusion == "outer":
            self.factors = nn.ParameterList(
                [nn.Parameter(torch.randn(rank, hidden + 1, NUM_CLASSES) * 0.1) for _ in INPUTS]
            )
            self.fusion_weights = nn.Parameter(torch.randn(1, rank) * 0.1)
            self.fusion_bias = nn.Parameter(torch.zeros(1, NUM_CLASSES))
        else:
            raise ValueError(f"fusion must be concat, sum or outer, not {fusion!r}")

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        inputs = {
            "image": batch["image"],
            "vector": batch["vector"],
            "series": batch["series"].float().transpose(1, 2),  # float16 [B, T, C] as packed
            "ids": batch["ids"].long(),  # int32 as packed
        }
        features = [F.relu(self.branches[k](inputs[k])) for k in INPUTS]
        if self.fusion == "concat":
            return self.head(torch.cat(features, dim=1))
        if self.fusion == "sum":
            return self.head(torch.stack(features).sum(0))
        ones = features[0].new_ones((len(features[0]), 1))
        # Per input [B, hidden + 1] @ [rank, hidden + 1, classes] -> [rank, B, classes].
        per_input = [torch.cat([f, ones], 1) @ factor for f, factor in zip(features, self.factors)]
        fused = reduce(mul, per_input).permute(1, 0, 2)  # [B, rank, classes]
        return (self.fusion_weights @ fused).squeeze(1) + self.fusion_bias


def evaluate(
    model: nn.Module, loader: stoker.Loader, shuffled: str | None = None, seed: int = 0
) -> float:
    """Test accuracy; with `shuffled`, that input permuted across each batch (so that it no
    longer belongs to its sample) and the others kept."""
    model.eval()
    g = torch.Generator().manual_seed(seed)
    correct = seen = 0
    with torch.inference_mode():
        for batch in loader:
            if shuffled is not None:
                order = torch.randperm(len(batch["label"]), generator=g).to(loader.device)
                batch = dict(batch, **{shuffled: batch[shuffled][order]})
            correct += int((model(batch).argmax(1) == batch["label"]).sum())
            seen += len(batch["label"])
    return correct / seen


def train(packs: dict[str, Path], device: torch.device, args: argparse.Namespace) -> int:
    torch.manual_seed(args.seed)
    train_loader = make_loader(
        packs["train"], device, batch_size=args.batch_size, train=True, seed=args.seed
    )
    test_loader = make_loader(packs["test"], device, batch_size=512, train=False)
    model = FusionNet(args.fusion).to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimiser, max_lr=args.lr, total_steps=args.epochs * len(train_loader)
    )
    header = f"{'epoch':>5} {'train loss':>10} {'test acc':>8} {'samples/s':>9}"
    accuracy = 0.0
    for epoch in range(args.epochs):
        model.train()
        loss_sum = torch.zeros((), device=device)
        seen = 0
        t0 = time.perf_counter()
        for batch in train_loader:
            if epoch == 0 and seen == 0:
                print(f"a batch of {len(batch['label'])} samples (dict):\n{describe(batch)}")
                print(f"\nfusion={args.fusion}\n{header}")
            loss = F.cross_entropy(model(batch), batch["label"])
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            scheduler.step()
            loss_sum += loss.detach() * len(batch["label"])
            seen += len(batch["label"])
        seconds = time.perf_counter() - t0
        accuracy = evaluate(model, test_loader)
        print(
            f"{epoch + 1:>5} {float(loss_sum) / seen:>10.3f} {accuracy:>8.1%} "
            f"{seen / seconds:>9,.0f}",
            flush=True,
        )

    print("\ntest accuracy with one input shuffled across the batch (what that input is worth):")
    drops = {}
    for name in INPUTS:
        shuffled = evaluate(model, test_loader, shuffled=name, seed=args.seed)
        drops[name] = accuracy - shuffled
        print(f"  {name:<7} {shuffled:>6.1%}  ({-drops[name]:+.1%})")
    train_loader.close()
    test_loader.close()

    print(f"\nfinal test accuracy {accuracy:.1%} (chance {1 / NUM_CLASSES:.1%})")
    failed = []
    if accuracy <= args.min_accuracy:
        failed.append(f"test accuracy is not above {args.min_accuracy:.0%}")
    for name in ("image", "series"):  # each decides part of the class
        if drops[name] < 0.2:
            failed.append(f"shuffling the {name} costs {drops[name]:.1%}, under 20 points")
    for reason in failed:
        print(f"FAILED: {reason}", file=sys.stderr)
    return 1 if failed else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path("fusion-data"),
        help="where the packs go (default: ./fusion-data)",
    )
    p.add_argument(
        "--small", action="store_true", help="3,000 + 1,000 samples, 4 epochs: a check in seconds"
    )
    p.add_argument("--train-size", type=int, help="training samples (default 20,000)")
    p.add_argument("--test-size", type=int, help="test samples (default 4,000)")
    p.add_argument("--epochs", type=int, help="default 6 (4 with --small)")
    p.add_argument("--fusion", choices=["concat", "sum", "outer"], default="concat")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="'cuda', 'cpu' or 'auto'")
    p.add_argument(
        "--min-accuracy", type=float, default=0.8, help="exit 1 below this final test accuracy"
    )
    args = p.parse_args(argv)
    defaults = {
        "train_size": 3_000 if args.small else 20_000,
        "test_size": 1_000 if args.small else 4_000,
        "epochs": 4 if args.small else 6,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)

    print("== 1-2. dataset and pack")
    packs = make_packs(args.data_dir, args.train_size, args.test_size, args.seed)
    print(f"\n== 3-4. train on {device}")
    status = train(packs, device, args)
    print(f"total {time.perf_counter() - start:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
