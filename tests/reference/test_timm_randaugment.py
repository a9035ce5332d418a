"""TimmRandAugment against timm itself: each sample's drawn ops (``op.drawn``), applied one by one
with timm's own ``AugmentOp`` (timm.data.auto_augment, on PIL images, Pillow 13) at the same
level, sign and filter, give stoker's image, in the worker form (C++, what a host loader's
threads run) and the batch form (torch ops), bilinear and bicubic.

The bound, and why: timm's geometry (Rotate, ShearX/Y, TranslateX/YRel, with Pillow's bilinear
and bicubic filters), Brightness, Invert, Equalize, Posterize, Solarize and SolarizeAdd are
exact: every byte equals timm's. Color, Contrast, Sharpness and AutoContrast follow
torchvision's arithmetic (stoker.augment.functional: truncating float32 blends, the float luma),
where Pillow rounds its luma and its smoothing: each is within 2 levels of timm's on the same
input (docs/AUGMENT.md), checked here op by op on real photos; a threshold op after one of them
(Solarize at 128, Posterize) can turn that level into a large one, so images whose draws hold one
of these four are compared op by op, not whole.

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
EXACT = {"Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel", "Brightness", "Invert",
         "Equalize", "Posterize", "Solarize", "SolarizeAdd"}  # fmt: skip
# Levels by which stoker's torchvision-style enhancers may differ from Pillow's on one input.
ENHANCER_BOUND = {"Color": 2, "Contrast": 2, "Sharpness": 2, "AutoContrast": 1}


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


def stoker_forms(op: Any, images: np.ndarray, indices: torch.Tensor) -> dict[str, torch.Tensor]:
    """The policy's images [N, H, W, 3] in the worker form and the batch form."""
    nchw = torch.from_numpy(images).permute(0, 3, 1, 2)
    host = nchw.contiguous(memory_format=torch.channels_last)  # stoker's layout: the C++ form
    worker = op(host, KeyedDraws(7, 3, indices))
    batch = op(nchw.contiguous(), KeyedDraws(7, 3, indices))  # NCHW: the torch form
    return {f: t.permute(0, 2, 3, 1).numpy() for f, t in (("worker", worker), ("batch", batch))}


@pytest.mark.parametrize("interpolation", ["random", "bicubic"])
def test_images_equal_timm_s_augment_ops_for_the_same_draws(interpolation, monkeypatch):
    """timm.data.auto_augment.AugmentOp, op by op: whole images equal where every drawn op is
    one stoker computes as Pillow does; with a torchvision-style enhancer among them, each op
    on the same input within its bound."""
    images = photos(40)
    op = A.TimmRandAugment.from_config("rand-m9-mstd0.5", prob=0.9, interpolation=interpolation)
    indices = torch.arange(len(images)) * 5 + 11
    forms = stoker_forms(op, images, indices)
    drawn = op.drawn(KeyedDraws(7, 3, indices), 224, 224)
    whole, filters = 0, set()
    for i, ops in enumerate(drawn):
        applied = [d for d in ops if d.applied]
        filters |= {d.interpolation for d in applied if d.interpolation}
        if all(d.name in EXACT for d in applied):
            want = timm_image(images[i], ops, monkeypatch)
            for form, got in forms.items():
                assert np.array_equal(got[i], want), (form, i, [str(d) for d in ops])
            whole += 1
            continue
        # op by op from timm's image before it: stoker's op (the batch form's functional op)
        # on that same input, against timm's
        img = images[i]
        for d in applied:
            want = timm_image(img, [d], monkeypatch)
            x = torch.from_numpy(img.copy()).permute(2, 0, 1)[None].contiguous()
            m = torch.tensor([0.0 if d.magnitude is None else float(d.magnitude)],
                             dtype=torch.float64)  # fmt: skip
            apply = TIMM_RAND_OPS[d.name][0]
            fill = list(IMAGENET_MEAN_FILL)
            out = apply(x, m, fill, d.interpolation) if d.interpolation else apply(x, m, fill)
            got = out[0].permute(1, 2, 0).numpy()
            diff = np.abs(got.astype(int) - want.astype(int)).max()
            assert diff <= ENHANCER_BOUND.get(d.name, 0), (d.name, diff, i)
            img = want
    assert whole >= 12  # a good share of the images compared whole
    want_filters = {"random": {"bilinear", "bicubic"}}.get(interpolation, {interpolation})
    assert filters == want_filters


def test_a_loader_s_images_equal_timm_s_for_the_draws_it_reports(tmp_path, monkeypatch):
    """The whole way: an ImageLoader with augment=[TimmRandAugment] (its C++ workers), against
    the same loader without it and timm's ops on each sample's drawn ops
    (stoker.tools.replay.augment_draws)."""
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
            applied = [d for d in sample["ops"] if d.applied]
            if not all(d.name in EXACT for d in applied):
                continue
            want = timm_image(base[i].permute(1, 2, 0).numpy().copy(), sample["ops"], monkeypatch)
            assert np.array_equal(images[i].permute(1, 2, 0).numpy(), want), sample["ops"]
            compared += 1
    assert compared >= 8
