"""Throughput measurements: stoker's pipeline and the peers it is compared with.

Every peer produces the same thing: batches of ``[B, 3, size, size]`` uint8 images and int64
labels, with the same augmentation (RandomResizedCrop + flip for training, Resize + CenterCrop for
evaluation). Each is timed over whole epochs after a warm-up epoch; the median is reported.

The DataLoader peer is torch's DataLoader with torchvision's transforms on PIL images. torchvision
is not installable beside the CPU build of torch used here, so the transforms are torchvision's
own code paths for PIL images written out (RandomResizedCrop.get_params drawing from torch's RNG,
``img.crop(...).resize(..., BILINEAR)``, ``transpose(FLIP_LEFT_RIGHT)``, PILToTensor); they do
the same work as torchvision does.
"""

from __future__ import annotations

import io
import math
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np

if TYPE_CHECKING:
    from ..load.loader import ImageLoader


@dataclass
class Measurement:
    name: str
    images_per_s: float
    runs: list[float]  # images/s of each timed epoch

    def __str__(self) -> str:
        return f"{self.name:<34} {self.images_per_s:9.1f} img/s"


def time_epochs(
    name: str, run_epoch: Callable[[], int], *, epochs: int = 3, warmup: int = 1
) -> Measurement:
    """Median images/s over `epochs` timed calls of `run_epoch` (which returns images seen)."""
    for _ in range(warmup):
        run_epoch()
    runs = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        n = run_epoch()
        runs.append(n / (time.perf_counter() - t0))
    return Measurement(name, statistics.median(runs), runs)


# --- torchvision's PIL transforms, written out -------------------------------------------------


def random_resized_crop_params(
    width: int, height: int, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0)
) -> tuple[int, int, int, int]:
    """torchvision.transforms.RandomResizedCrop.get_params, drawing from torch's RNG."""
    import torch

    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        low, high = float(log_ratio[0]), float(log_ratio[1])
        aspect_ratio = math.exp(torch.empty(1).uniform_(low, high).item())
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,)).item())
            j = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def resize_shorter(width: int, height: int, size: int) -> tuple[int, int]:
    """torchvision Resize(size)'s output (width, height) for a PIL image."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


class TorchvisionTransform:
    """RandomResizedCrop(size) + flip + PILToTensor, or Resize + CenterCrop + PILToTensor."""

    def __init__(self, size: int = 224, train: bool = True, resize_size: int | None = None):
        self.size, self.train = size, train
        self.resize_size = resize_size or int(round(size * 256 / 224))

    def __call__(self, img):
        import torch
        from PIL import Image

        img = img.convert("RGB")
        if self.train:
            i, j, h, w = random_resized_crop_params(*img.size)
            img = img.crop((j, i, j + w, i + h)).resize((self.size, self.size), Image.BILINEAR)
            if torch.rand(1).item() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
        else:
            img = img.resize(resize_shorter(*img.size, self.resize_size), Image.BILINEAR)
            w, h = img.size
            top = int(round((h - self.size) / 2.0))
            left = int(round((w - self.size) / 2.0))
            img = img.crop((left, top, left + self.size, top + self.size))
        arr = np.array(img, copy=True)
        return torch.as_tensor(arr).permute(2, 0, 1)


class FileDataset:
    """torchvision ImageFolder's behaviour: one PIL.Image.open per file."""

    def __init__(self, samples: Sequence[tuple[str, int]], transform):
        self.samples, self.transform = list(samples), transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        from PIL import Image

        path, label = self.samples[i]
        with open(path, "rb") as f:
            img = Image.open(f)
            img.load()
        return self.transform(img), label


class PackDataset:
    """The images of a stoker pack, read from its shards (so both loaders read the same bytes)."""

    def __init__(self, path: str, transform):
        self.path, self.transform = path, transform
        self._ds = None
        from .. import _core

        self._len = len(_core.Dataset.open(path))

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):
        from PIL import Image

        from .. import _core

        if self._ds is None:  # opened lazily: one per worker process
            self._ds = _core.Dataset.open(self.path)
        img = Image.open(io.BytesIO(self._ds.read(i)))
        img.load()
        return self.transform(img), self._ds.record(i)["label"]


def dataloader_epoch(dataset, *, batch_size: int, workers: int) -> Callable[[], int]:
    import torch

    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        prefetch_factor=2 if workers > 0 else None,
    )

    def run() -> int:
        n = 0
        for images, _ in loader:
            n += images.shape[0]
        return n

    return run


def stoker_epoch(
    path,
    *,
    batch_size: int,
    size: int = 224,
    train: bool = True,
    threads: int | None = None,
    **options,
) -> StokerEpoch:
    from ..load.loader import ImageLoader

    return StokerEpoch(
        ImageLoader(path, batch_size=batch_size, size=size, train=train, threads=threads, **options)
    )


class StokerEpoch:
    """One pass of an ImageLoader when called (returns the samples seen); `.loader` for stats."""

    def __init__(self, loader: "ImageLoader"):
        self.loader = loader

    def __call__(self) -> int:
        n = 0
        for images, _ in self.loader:
            n += images.shape[0]
        return n


def decode_ceiling_epoch(images: Iterable[bytes], *, threads: int) -> Callable[[], int]:
    """libjpeg-turbo decoding every image at full size on `threads` threads, nothing else."""
    from .. import _core

    blobs = list(images)

    def run() -> int:
        _core.decode_throughput(blobs, threads, 1)
        return len(blobs)

    return run


def pack_images(path: str) -> list[bytes]:
    from .. import _core

    ds = _core.Dataset.open(path)
    return [ds.read(i) for i in range(len(ds))]
