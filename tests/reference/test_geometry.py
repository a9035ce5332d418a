"""The training and evaluation geometry of stoker.ImageLoader against torchvision's, on the same
decoded pixels (Pillow's decode of the packed file; the loader with dct_scaling=False decodes
at full size as Pillow does) and the same boxes:

- training: RandomResizedCrop's box is torchvision.transforms.v2.RandomResizedCrop.make_params
  itself, its uniform and randint draws taken from the engine's keyed stream for (seed, epoch,
  sample), and equals the box the engine draws; the pixels are
  torchvision.transforms.v2.functional.resized_crop (bilinear, antialias) then
  horizontal_flip where the next draw says so, on the PIL image: byte for byte. On the image as
  a uint8 tensor torchvision resamples its own way: within 1 level (documented, not checked as
  exact).
- evaluation: torchvision.transforms.v2.functional.resize(round(size * 256 / 224)) then
  center_crop(size), on the PIL image: within 2 levels, on under 3% of the values (stoker
  resamples the crop's box of the source in one step; torchvision rounds the whole resized
  image to 8 bits first).
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import shared_data
from PIL import Image
from torchvision.transforms import InterpolationMode, v2
from torchvision.transforms.v2 import functional as TF

import stoker
from stoker import _core

SIZE = 64
SEED, EPOCH = 5, 3


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    """16 of imagenet-sample's photos, a wide strip and a tall PNG (RandomResizedCrop's central
    fallback), a grey and a progressive JPEG, packed (re-encoded with restart markers)."""
    photos = sorted((shared_data() / "imagenet-sample").glob("*.JPEG"))[::61][:16]
    root = tmp_path_factory.mktemp("photos") / "src"
    for n, path in enumerate(photos):
        (root / f"c{n % 4}").mkdir(parents=True, exist_ok=True)
        shutil.copy(path, root / f"c{n % 4}" / path.name)
    first = Image.open(photos[0]).convert("RGB")
    w, h = first.size
    first.crop((0, h // 2 - 20, w, h // 2 + 20)).save(root / "c0" / "wide.jpg", quality=92)
    first.crop((w // 2 - 15, 0, w // 2 + 15, h)).save(root / "c1" / "tall.png")
    first.convert("L").save(root / "c2" / "grey.jpg", quality=90)
    first.save(root / "c3" / "progressive.jpg", quality=90, progressive=True)
    out = tmp_path_factory.mktemp("photos") / "pack"
    assert stoker.pack(root, out, progress=False).num_samples == 20
    return out


def decoded(pack: Path) -> list[Image.Image]:
    """Each sample's packed file as Pillow decodes it (RGB)."""
    dataset = stoker.load.loader.open_dataset(pack)
    return [Image.open(io.BytesIO(dataset.read(i))).convert("RGB") for i in range(len(dataset))]


def batches(loader) -> dict[int, np.ndarray]:
    out = {}
    for images, _, index in loader:
        for i, pixels in zip(index.tolist(), images.permute(0, 2, 3, 1).numpy(), strict=True):
            out[i] = pixels.copy()
    return out


class _KeyedUniform:
    """What torch.empty(1) is inside make_params: its uniform_(a, b) the engine's draw."""

    def __init__(self, rng: _core.KeyedRandom):
        self.rng = rng

    def uniform_(self, low: float, high: float) -> torch.Tensor:
        return torch.tensor(self.rng.uniform(float(low), float(high)), dtype=torch.float64)


def torchvision_box(transform: v2.RandomResizedCrop, image: Image.Image, rng, monkeypatch):
    """torchvision's RandomResizedCrop.make_params on `image`, its torch.empty(1).uniform_ and
    torch.randint drawing from `rng` (the engine's KeyedRandom): (left, top, right, bottom)."""
    with monkeypatch.context() as m:
        m.setattr(torch, "empty", lambda *a, **k: _KeyedUniform(rng))
        m.setattr(torch, "randint",
                  lambda low, high, size: torch.tensor([low + rng.below(high - low)]))  # fmt: skip
        p = transform.make_params([image])
    return p["left"], p["top"], p["left"] + p["width"], p["top"] + p["height"]


@pytest.mark.parametrize(
    "options",
    [{}, {"scale": (0.25, 0.5), "ratio": (0.5, 2.0), "flip_probability": 0.8}],
    ids=["defaults", "scale-ratio-flip"],
)
def test_training_crops_are_torchvisions_resized_crop_on_its_own_boxes(pack, options, monkeypatch):
    """ImageLoader(train=True) against torchvision's RandomResizedCrop.make_params and
    functional.resized_crop + horizontal_flip on the PIL image: byte for byte."""
    scale = options.get("scale", (0.08, 1.0))
    ratio = options.get("ratio", (3.0 / 4.0, 4.0 / 3.0))
    flip = options.get("flip_probability", 0.5)
    loader = stoker.ImageLoader(pack, batch_size=6, size=SIZE, seed=SEED, threads=2,
                                return_index=True, dct_scaling=False, **options)  # fmt: skip
    loader.set_epoch(EPOCH)
    got = batches(loader)
    sources = decoded(pack)
    assert sorted(got) == list(range(len(sources)))
    transform = v2.RandomResizedCrop(SIZE, scale=scale, ratio=ratio)
    # the central fallback: make_params when none of its ten tries fits (an area ten times the
    # image's never does)
    never_fits = v2.RandomResizedCrop(SIZE, scale=(10.0, 10.0), ratio=ratio)
    flipped = fell_back = tensor_worst = 0
    for index, pixels in got.items():
        image = sources[index]
        rng = _core.KeyedRandom(SEED, EPOCH, index)
        box = torchvision_box(transform, image, rng, monkeypatch)
        engine = _core.random_resized_crop(*image.size, _core.KeyedRandom(SEED, EPOCH, index),
                                           *scale, *ratio)  # fmt: skip
        assert box == tuple(engine), (index, box, engine)
        fallback = torchvision_box(never_fits, image, _core.KeyedRandom(0, 0, 0), monkeypatch)
        fell_back += box == fallback
        left, top, right, bottom = box
        crop = (top, left, bottom - top, right - left, [SIZE, SIZE])
        want = TF.resized_crop(image, *crop, interpolation=InterpolationMode.BILINEAR,
                               antialias=True)  # fmt: skip
        on_tensor = TF.resized_crop(TF.pil_to_tensor(image), *crop, antialias=True)
        if rng.uniform(0.0, 1.0) < flip:  # RandomHorizontalFlip: torch.rand(1) < p
            want, on_tensor = TF.horizontal_flip(want), TF.horizontal_flip(on_tensor)
            flipped += 1
        np.testing.assert_array_equal(pixels, np.asarray(want), err_msg=f"sample {index}")
        diff = np.abs(on_tensor.permute(1, 2, 0).numpy().astype(int) - pixels.astype(int))
        tensor_worst = max(tensor_worst, int(diff.max()))
    # both sides of the flip were drawn, and the strips fell back to torchvision's central box
    assert 0 < flipped < len(got) and fell_back > 0, (flipped, fell_back)
    assert tensor_worst <= 1, tensor_worst


def test_evaluation_crops_are_torchvisions_resize_then_center_crop(pack):
    """ImageLoader(train=False) against torchvision.transforms.v2.functional.resize(round(size
    * 256 / 224)) + center_crop(size) on the PIL image: within 2 levels, under 3% of the values
    apart."""
    loader = stoker.ImageLoader(pack, batch_size=7, size=SIZE, train=False, threads=2,
                                return_index=True, dct_scaling=False)  # fmt: skip
    got = batches(loader)
    sources = decoded(pack)
    assert sorted(got) == list(range(len(sources)))
    apart = total = 0
    for index, pixels in got.items():
        resized = TF.resize(sources[index], round(SIZE * 256 / 224),
                            interpolation=InterpolationMode.BILINEAR, antialias=True)  # fmt: skip
        want = np.asarray(TF.center_crop(resized, [SIZE, SIZE]))
        diff = np.abs(pixels.astype(int) - want.astype(int))
        assert diff.max() <= 2, (index, diff.max())
        apart += int((diff > 0).sum())
        total += diff.size
    assert apart / total < 0.03, apart / total
