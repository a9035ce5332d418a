"""FFCV's CIFAR-10 pipeline (benchmarks/arrays.py) on the benchmark's arrays, as FFCV's own
example (examples/cifar/write_datasets.py and train_cifar.py) sets it up, ending in uint8 host
tensors: no ToDevice, Convert or Normalize, and no Cutout (not part of the compared pipeline).

Writer: DatasetWriter with {"image": RGBImageField(write_mode="raw"), "label": IntField()}, fed
the HWC uint8 rows of --data/images.npy and the labels of --data/labels.npy (a .beton of raw
pixels: no decoding). Loader: SimpleRGBImageDecoder, RandomHorizontalFlip(),
RandomTranslate(padding=4) (fill 0: what torchvision's RandomCrop(32, padding=4) does),
ToTensor(), ToTorchImage() (NCHW view of the NHWC batch, no copy); labels IntDecoder, ToTensor,
Squeeze; order RANDOM, num_workers = cores (numba threads), drop_last=False (every sample once
an epoch, like the other loaders; the example drops the last train batch), the example's other
defaults (os_cache=False: the .beton read into the process's memory).
"""

from __future__ import annotations

import _serve

# The same venv as the ImageNet benchmark's FFCV (ffcv_beton.py): ffcv 1.0.2, numba, numpy 1.26.
ENV = {"venv": "ffcv_beton"}

PADDING = 4


class _Arrays:
    """(HWC uint8 image, int label) per sample, from the benchmark's .npy files."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i])


def padded_mean(mean: float, h: int, w: int, padding: int) -> float:
    """The mean pixel of random crops of the zero-padded images: the share of each crop inside
    the image, averaged over the uniform offsets, times the images' mean."""
    offsets = range(2 * padding + 1)
    outside = sum(abs(t - padding) for t in offsets) / len(offsets)
    return mean * (1 - outside / h) * (1 - outside / w)


def _load(job: _serve.Job):
    import numpy as np

    return (np.load(job.data / "images.npy", mmap_mode="r"),
            np.load(job.data / "labels.npy", mmap_mode="r"))  # fmt: skip


def prepare(job: _serve.Job):
    """The .beton, written once under job.work."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    images, labels = _load(job)
    out = job.work / f"cifar-{len(labels)}-raw.beton"
    if out.exists():
        return out
    partial = out.with_suffix(".partial")
    writer = DatasetWriter(
        str(partial),
        {"image": RGBImageField(write_mode="raw"), "label": IntField()},
        num_workers=job.threads,
    )
    writer.from_indexed_dataset(_Arrays(images, labels))
    partial.rename(out)
    return out


def make_epoch(job: _serve.Job):
    import numpy as np
    import torch
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import SimpleRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import (
        RandomHorizontalFlip,
        RandomTranslate,
        Squeeze,
        ToTensor,
        ToTorchImage,
    )

    beton = prepare(job)
    images, labels = _load(job)
    counts = torch.from_numpy(np.bincount(labels, minlength=10))
    n, h, w, _ = images.shape
    expected_mean = padded_mean(float(images.mean()), h, w, PADDING)
    loader = Loader(
        str(beton),
        batch_size=job.batch_size,
        num_workers=job.threads,
        order=OrderOption.RANDOM,
        drop_last=False,
        pipelines={
            "image": [
                SimpleRGBImageDecoder(),
                RandomHorizontalFlip(),
                RandomTranslate(padding=PADDING),
                ToTensor(),
                ToTorchImage(),
            ],
            "label": [IntDecoder(), ToTensor(), Squeeze()],
        },  # fmt: skip
    )

    def epoch(check: bool):
        seen = 0
        seen_labels = torch.zeros_like(counts)
        means = []
        for x, y in loader:
            seen += x.shape[0]
            if check:
                if tuple(x.shape[1:]) != (3, h, w) or x.dtype != torch.uint8:
                    raise SystemExit(f"FFCV: images {x.dtype} {tuple(x.shape)}")
                seen_labels += torch.bincount(y.long(), minlength=len(counts))
                means.append(x.float().mean().item())
        if seen != n:
            raise SystemExit(f"FFCV: {seen} images in an epoch of {n}")
        if not check:
            return seen, ""
        if not torch.equal(seen_labels, counts):
            raise SystemExit("FFCV: the epoch's labels are not the dataset's")
        mean = sum(means) / len(means)
        if abs(mean - expected_mean) > 1.5:
            raise SystemExit(f"FFCV: mean pixel {mean:.1f}, {expected_mean:.1f} expected")
        return seen, f"every label once, mean pixel {mean:.1f} ({expected_mean:.1f} expected)"

    return epoch


def version() -> str:
    from importlib.metadata import version as v

    return f"ffcv {v('ffcv')}, numba {v('numba')}, numpy {v('numpy')}, torch {v('torch')}"


if __name__ == "__main__":
    raise SystemExit(_serve.serve("FFCV", make_epoch, version=version))
