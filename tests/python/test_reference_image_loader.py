"""ImageLoader batches against PIL doing what torchvision does, with parameters drawn here:
RandomResizedCrop.get_params (test_reference_random_resized_crop.py) and the flip fed by the
engine's keyed generator, KeyedRandom(seed, epoch, sample), never by the loader's report of what
it did. Photos from imagenet-sample, a wide strip (the central fallback), a tall PNG, a grey and
a progressive JPEG."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest
from conftest import shared_data
from PIL import Image
from test_reference_random_resized_crop import get_params, keyed

import stoker
from stoker import _core

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

SIZE = 48


@pytest.fixture(scope="module")
def photos_pack(tmp_path_factory):
    photos = sorted((shared_data() / "imagenet-sample").glob("*.JPEG"))[::125]
    assert len(photos) == 8
    root = tmp_path_factory.mktemp("photos") / "src"
    for n, path in enumerate(photos):
        (root / f"c{n % 3}").mkdir(parents=True, exist_ok=True)
        shutil.copy(path, root / f"c{n % 3}" / path.name)
    first = Image.open(photos[0]).convert("RGB")
    w, h = first.size
    first.crop((0, h // 2 - 20, w, h // 2 + 20)).save(root / "c0" / "wide.jpg", quality=92)
    first.crop((w // 2 - 15, 0, w // 2 + 15, h)).save(root / "c1" / "tall.png")
    first.convert("L").save(root / "c2" / "grey.jpg", quality=90)
    first.save(root / "c2" / "progressive.jpg", quality=90, progressive=True)
    out = tmp_path_factory.mktemp("photos") / "pack"
    result = stoker.pack(root, out, progress=False)  # restart markers: crops cut through them
    assert result.num_samples == 12 and result.reencoded >= 8
    return out


def torchvision_train(image: Image.Image, seed, epoch, index, size=SIZE, scale=(0.08, 1.0),
                      ratio=(3.0 / 4.0, 4.0 / 3.0), flip=0.5) -> np.ndarray:  # fmt: skip
    """RandomResizedCrop(size, scale, ratio) + RandomHorizontalFlip(flip) on a PIL image, drawn
    from the engine's generator for (seed, epoch, sample): the crop's draws, then the flip's."""
    rng = _core.KeyedRandom(seed, epoch, index)
    left, top, right, bottom = get_params(*image.size, scale, ratio, *keyed(rng))
    out = image.crop((left, top, right, bottom)).resize((size, size), Image.Resampling.BILINEAR)
    if rng.uniform(0.0, 1.0) < flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out)


def torchvision_eval(image: Image.Image, size=SIZE, one_step=False) -> np.ndarray:
    """Resize(round(size * 256 / 224)) + CenterCrop(size): torchvision's rules, on PIL. In two
    steps as torchvision takes them, or (`one_step`) as one resample of the crop's box of the
    source: the same filter positions, without the 8-bit rounding of the whole resized image."""
    resize = int(round(size * 256 / 224))
    w, h = image.size
    short, long = min(w, h), max(w, h)
    new_long = int(resize * long / short)
    new_w, new_h = (resize, new_long) if w <= h else (new_long, resize)
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    if one_step:
        sx, sy = w / new_w, h / new_h
        box = (left * sx, top * sy, (left + size) * sx, (top + size) * sy)
        return np.asarray(image.resize((size, size), Image.Resampling.BILINEAR, box=box))
    image = image.resize((new_w, new_h), Image.Resampling.BILINEAR)
    return np.asarray(image.crop((left, top, left + size, top + size)))


def source_images(pack):
    dataset = stoker.load.loader.open_dataset(pack)
    return [Image.open(io.BytesIO(dataset.read(i))).convert("RGB") for i in range(len(dataset))]


def pairs(loader):
    """(index, HxWx3 pixels) of every sample of one pass."""
    out = []
    for images, _, index in loader:
        out += zip(index.tolist(), images.permute(0, 2, 3, 1).numpy().copy(), strict=True)
    return out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


@pytest.mark.parametrize(
    "options",
    [{}, {"scale": (0.25, 0.5), "ratio": (0.5, 2.0), "flip_probability": 0.8}],
    ids=["defaults", "scale-ratio-flip"],
)
def test_training_batches_are_pils_crops_of_independently_drawn_parameters(photos_pack, options):
    """dct_scaling=False: byte for byte (libjpeg's pixels, Pillow's resampler), whatever the
    crop, every sample of a pass at epoch 3."""
    sources = source_images(photos_pack)
    loader = stoker.ImageLoader(photos_pack, batch_size=5, size=SIZE, seed=5, threads=2,
                                return_index=True, dct_scaling=False, **options)  # fmt: skip
    loader.set_epoch(3)
    got = pairs(loader)
    assert sorted(i for i, _ in got) == list(range(len(sources)))
    scale, ratio = options.get("scale", (0.08, 1.0)), options.get("ratio", (3.0 / 4.0, 4.0 / 3.0))
    flip = options.get("flip_probability", 0.5)
    flipped = fell_back = 0
    for index, pixels in got:
        want = torchvision_train(sources[index], 5, 3, index, scale=scale, ratio=ratio, flip=flip)
        np.testing.assert_array_equal(pixels, want, err_msg=f"sample {index}")
        unflipped = torchvision_train(sources[index], 5, 3, index, scale=scale, ratio=ratio, flip=0)
        flipped += not np.array_equal(pixels, unflipped)
        size = sources[index].size
        drawn = get_params(*size, scale, ratio, *keyed(_core.KeyedRandom(5, 3, index)))
        fell_back += drawn == get_params(*size, scale, ratio, None, None, rule="fallback_only")
    # Both sides of the flip were drawn and checked, and the strips fell back to the centre.
    assert 0 < flipped < len(sources) and fell_back > 0


def test_training_batches_at_dct_scales_are_close_to_the_full_size_reference(photos_pack):
    """The default decodes at 1/2, 1/4, 1/8 where the crop allows (docs/ARCHITECTURE.md: 40-45
    dB from the full-size path); the crop and the flip are still the reference's."""
    sources = source_images(photos_pack)
    loader = stoker.ImageLoader(photos_pack, batch_size=6, size=SIZE, seed=8, threads=2,
                                return_index=True)  # fmt: skip
    got = pairs(loader)
    assert len(got) == len(sources)
    for index, pixels in got:
        want = torchvision_train(sources[index], 8, 0, index)
        assert psnr(pixels, want) > 30, index


def test_evaluation_batches_are_pils_resize_then_centre_crop(photos_pack):
    """Resize + CenterCrop by torchvision's rules: byte for byte the crop's box resampled in one
    step by PIL; within 2 of PIL's two steps (Pillow rounds the whole resized image to 8 bits
    first: up to 2 apart on an upscaled strip, on up to a fifth of the values, PIL against
    PIL)."""
    sources = source_images(photos_pack)
    loader = stoker.ImageLoader(photos_pack, batch_size=5, size=SIZE, train=False, threads=2,
                                return_index=True, dct_scaling=False)  # fmt: skip
    got = pairs(loader)
    assert [i for i, _ in got] == list(range(len(sources)))  # evaluation keeps pack order
    for index, pixels in got:
        want = torchvision_eval(sources[index], one_step=True)
        np.testing.assert_array_equal(pixels, want, err_msg=f"sample {index}")
        diff = np.abs(pixels.astype(int) - torchvision_eval(sources[index]))
        assert diff.max() <= 2, (index, diff.max())
