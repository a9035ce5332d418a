"""TimmRandAugment against timm itself: each sample's drawn ops (``op.drawn``), applied one by one
with timm's own ``AugmentOp`` (timm.data.auto_augment, on PIL images, Pillow 13) at the same
level, sign and filter, give stoker's image byte for byte, in the worker form (C++, what a host
loader's threads run) and the batch form (torch ops), bilinear and bicubic.

The bound is 0, for every op: timm's geometry (Rotate, ShearX/Y, TranslateX/YRel with Pillow's
bilinear and bicubic filters) and its Color, Contrast, Sharpness and AutoContrast are Pillow's
own arithmetic in stoker (its affine filters; Image.blend's float32 blend with Pillow's luma,
its luma's mean rounded to a level, its SMOOTH filter, autocontrast's float64 table), and
Brightness, Invert, Equalize, Posterize, Solarize and SolarizeAdd compute Pillow's bytes.

Self-contained: it needs timm, torchvision and Pillow (the reference suite's venv: make
test-reference) and skips without them.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

aa = pytest.importorskip("timm.data.auto_augment")
Image = pytest.importorskip("PIL.Image")

import stoker  # noqa: E402
import stoker.augment as A  # noqa: E402
from stoker.augment.keyed import KeyedDraws  # noqa: E402
from stoker.augment.policies import IMAGENET_MEAN_FILL, TIMM_RAND_OPS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}
TIMM_OPS = {"AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
            "SolarizeAdd", "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY",
            "TranslateXRel", "TranslateYRel"}  # fmt: skip
# ops whose worker form joins a run of table ops, the image they see mapped through the run's
# tables so far (Contrast's mean luma, AutoContrast's range)
POINT_OPS = {"AutoContrast", "Equalize", "Invert", "Posterize", "Solarize", "SolarizeAdd",
             "Contrast", "Brightness"}  # fmt: skip


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The batch form's torch ops on one thread: on a shared 2-core machine torch's own two
    threads wait on each other (7x slower here), and the bytes are the same."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def photos(n: int, size: int = 224) -> np.ndarray:
    """uint8 [n, size, size, 3]: ImageNet photos (../shared/data/imagenet-sample) resized as a
    loader's crop would be, or, without them, smooth synthetic pictures with edges."""
    found = []
    for base in (ROOT.parent / "shared" / "data", Path("/work/shared/data")):
        found = sorted((base / "imagenet-sample").rglob("*.JPEG"))[:n]
        if found:
            break
    if found:
        out = []
        for path in found:
            with Image.open(path) as f:
                out.append(np.asarray(f.convert("RGB").resize((size, size), Image.BILINEAR)))
        return np.stack(out)
    y, x = np.mgrid[:size, :size]
    return np.stack([np.stack([(x * (3 + i) + y) % 256, (y * (5 + i)) % 256,
                               np.where((x - size / 2) ** 2 + (y - size / 3) ** 2 < 900, 230, 20)],
                              axis=-1).astype(np.uint8) for i in range(n)])  # fmt: skip


class _Sign:
    """timm's module-level `random` for one op: _randomly_negate negates where random() > 0.5,
    so 1.0 negates and 0.0 keeps (AugmentOp draws nothing else here: prob=1, no noise, one
    filter)."""

    def __init__(self) -> None:
        self.value = 0.0

    def random(self) -> float:
        return self.value

    def __getattr__(self, name: str) -> Any:
        return getattr(random, name)


def timm_op(img: Any, drawn: Any, monkeypatch: Any) -> Any:
    """timm's AugmentOp for one drawn op: its level, its sign, its filter, the ImageNet mean."""
    hparams = {"img_mean": IMAGENET_MEAN_FILL,
               "interpolation": FILTERS[drawn.interpolation or "bilinear"]}  # fmt: skip
    op = aa.AugmentOp(drawn.name, prob=1.0, magnitude=drawn.level, hparams=hparams)
    sign = _Sign()
    sign.value = 1.0 if drawn.magnitude is not None and drawn.magnitude < 0 else 0.0
    monkeypatch.setattr(aa, "random", sign)
    return op(img)


def timm_image(pixels: np.ndarray, ops: list[Any], monkeypatch: Any) -> np.ndarray:
    img = Image.fromarray(pixels)
    for d in ops:
        if d.applied:
            img = timm_op(img, d, monkeypatch)
    return np.asarray(img)


def stoker_forms(op: Any, images: np.ndarray, draws: Any) -> dict[str, torch.Tensor]:
    """The policy's images [N, H, W, 3] in the worker form and the batch form, for draws()."""
    nchw = torch.from_numpy(images).permute(0, 3, 1, 2)
    host = nchw.contiguous(memory_format=torch.channels_last)  # stoker's layout: the C++ form
    worker = op(host, draws())
    batch = op(nchw.contiguous(), draws())  # NCHW: the torch form
    return {f: t.permute(0, 2, 3, 1).numpy() for f, t in (("worker", worker), ("batch", batch))}


@pytest.mark.parametrize("interpolation", ["random", "bilinear", "bicubic"])
def test_images_equal_timm_s_augment_ops_for_the_same_draws(interpolation, monkeypatch):
    """timm.data.auto_augment.AugmentOp, op by op on each sample's drawn ops: every image equals
    timm's whole, in both forms, whatever it drew (all 15 ops among the draws, runs of table
    ops ending in Contrast or AutoContrast among them)."""
    images = photos(64)
    op = A.TimmRandAugment.from_config("rand-m9-mstd0.5", prob=0.9, interpolation=interpolation)
    # each filter choice its own seed: three sets of draws, as many ops again
    seed = {"random": 7, "bilinear": 8, "bicubic": 9}[interpolation]
    draws = lambda: KeyedDraws(seed, 3, torch.arange(len(images)) * 5 + 11)  # noqa: E731
    forms = stoker_forms(op, images, draws)
    drawn = op.drawn(draws(), 224, 224)
    names, filters, runs = set(), set(), 0
    for i, ops in enumerate(drawn):
        applied = [d for d in ops if d.applied]
        names |= {d.name for d in applied}
        filters |= {d.interpolation for d in applied if d.interpolation}
        runs += any(a.name in POINT_OPS and b.name in ("Contrast", "AutoContrast")
                    for a, b in zip(applied, applied[1:]))  # fmt: skip
        want = timm_image(images[i], ops, monkeypatch)
        for form, got in forms.items():
            diff = np.abs(got[i].astype(int) - want.astype(int))
            assert diff.max() == 0, (form, i, [str(d) for d in ops], diff.max(),
                                     int((diff > 0).sum()))  # fmt: skip
    assert names == TIMM_OPS, TIMM_OPS - names
    assert runs >= 2
    want_filters = {"random": {"bilinear", "bicubic"}}.get(interpolation, {interpolation})
    assert filters == want_filters


@pytest.mark.parametrize("name", ["Color", "Contrast", "Sharpness", "AutoContrast"])
def test_each_enhancer_equals_timm_s_at_every_level(name, monkeypatch):
    """Pillow's enhancers as timm calls them, level by level from 0 to 10 (factors 0.1 to 1.9),
    one photo a level: TIMM_RAND_OPS's batch form and the worker form (_core.augment_op), each
    equal to timm's AugmentOp on the same image."""
    from stoker import _core

    levels = [k / 2 for k in range(21)]
    images = photos(len(levels))
    apply, level_to_arg, _ = TIMM_RAND_OPS[name]
    x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    factors = level_to_arg(torch.tensor(levels, dtype=torch.float64))
    batch = apply(x, factors, list(IMAGENET_MEAN_FILL)).permute(0, 2, 3, 1).numpy()
    for i, level in enumerate(levels):
        factor = float(factors[i])
        want = timm_image(images[i], [A.DrawnOp(name, factor, True, level)], monkeypatch)
        work = images[i : i + 1].copy()
        _core.augment_op(work, f"pil_{name.lower()}", factor, IMAGENET_MEAN_FILL)
        assert np.array_equal(batch[i], want), (name, level, "batch")
        assert np.array_equal(work[0], want), (name, level, "worker")


def test_a_loader_s_images_equal_timm_s_for_the_draws_it_reports(tmp_path, monkeypatch):
    """The whole way: an ImageLoader with augment=[TimmRandAugment] (its C++ workers), against
    the same loader without it and timm's ops on each sample's drawn ops
    (stoker.tools.replay.augment_draws): every sample equal."""
    from stoker.tools.replay import augment_draws

    folder = tmp_path / "photos" / "class0"
    folder.mkdir(parents=True)
    for k, pixels in enumerate(photos(24, 96)):
        Image.fromarray(pixels).save(folder / f"{k:03d}.png")
    pack = tmp_path / "pack"
    stoker.pack(tmp_path / "photos", pack, progress=False)
    policy = A.TimmRandAugment.from_config("rand-m9-mstd0.5", prob=1.0)
    make = lambda augment: stoker.ImageLoader(  # noqa: E731
        pack, batch_size=8, size=64, seed=2, augment=augment, return_index=True)  # fmt: skip
    loader, plain = make([policy]), make(None)
    compared = 0
    for step in range(3):
        images, _, index = loader.batch_at(0, step)
        base, _, base_index = plain.batch_at(0, step)
        assert torch.equal(index, base_index)
        for i, sample in enumerate(augment_draws(loader, 0, step)):
            want = timm_image(base[i].permute(1, 2, 0).numpy().copy(), sample["ops"], monkeypatch)
            assert np.array_equal(images[i].permute(1, 2, 0).numpy(), want), sample["ops"]
            compared += 1
    assert compared == 24
