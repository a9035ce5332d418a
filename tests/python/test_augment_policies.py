"""RandAugment, TrivialAugmentWide and timm's RandAugment on batches: each sample's ops and
magnitudes come from the keyed draws; timm's ops are checked sample by sample against PIL (what
timm itself runs), torchvision's against their magnitude tables written out here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from stoker.augment import functional as F
from stoker.augment.keyed import KeyedDraws
from stoker.augment.policies import (
    IMAGENET_MEAN_FILL,
    TIMM_RAND_OPS,
    TORCHVISION_OPS,
    RandAugment,
    TimmRandAugment,
    TrivialAugmentWide,
)


def photos(n: int, h: int = 28, w: int = 36) -> torch.Tensor:
    """Smooth images with structure (a gradient and a disc), so geometry and colour ops show."""
    y, x = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    out = []
    for i in range(n):
        r = (x * (7 + i) + y * 3) % 256
        g = (y * (5 + 2 * i) + 40 * ((x - w / 2) ** 2 + (y - h / 2) ** 2 < (h / 3) ** 2)) % 256
        b = (x * y + 17 * i) % 256
        out.append(torch.stack([r, g, b]).to(torch.uint8))
    return torch.stack(out)


def keyed(n: int, seed: int = 11) -> KeyedDraws:
    return KeyedDraws(seed, 0, torch.arange(1000, 1000 + n))


def to_pil(img: torch.Tensor) -> Image.Image:
    return Image.fromarray(img.permute(1, 2, 0).numpy())


def from_pil(img: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)


# --- timm's ops, against PIL -------------------------------------------------------------------


def timm_reference(img: torch.Tensor, name: str, m: float) -> torch.Tensor:
    """timm auto_augment.py's op `name` at magnitude `m` (after its level mapping and sign)."""
    pil = to_pil(img)
    fill = IMAGENET_MEAN_FILL
    if name == "AutoContrast":
        out = ImageOps.autocontrast(pil)
    elif name == "Equalize":
        out = ImageOps.equalize(pil)
    elif name == "Invert":
        out = ImageOps.invert(pil)
    elif name == "Rotate":
        out = pil.rotate(m, resample=Image.NEAREST, fillcolor=fill)
    elif name == "Posterize":
        if int(m) == 0:  # Pillow before 11 kept no bit (black); Pillow 13 refuses bits=0
            out = Image.new("RGB", pil.size)
        else:
            out = pil if int(m) >= 8 else ImageOps.posterize(pil, int(m))
    elif name == "Solarize":
        out = ImageOps.solarize(pil, int(m))
    elif name == "SolarizeAdd":
        lut = [min(255, i + int(m)) if i < 128 else i for i in range(256)]
        out = pil.point(lut * 3)
    elif name in ("Color", "Contrast", "Brightness", "Sharpness"):
        out = getattr(ImageEnhance, name)(pil).enhance(m)
    elif name == "ShearX":
        out = pil.transform(
            pil.size, Image.AFFINE, (1, m, 0, 0, 1, 0), Image.NEAREST, fillcolor=fill
        )
    elif name == "ShearY":
        out = pil.transform(
            pil.size, Image.AFFINE, (1, 0, 0, m, 1, 0), Image.NEAREST, fillcolor=fill
        )
    elif name == "TranslateXRel":
        dx = m * pil.size[0]
        out = pil.transform(
            pil.size, Image.AFFINE, (1, 0, dx, 0, 1, 0), Image.NEAREST, fillcolor=fill
        )
    elif name == "TranslateYRel":
        dy = m * pil.size[1]
        out = pil.transform(
            pil.size, Image.AFFINE, (1, 0, 0, 0, 1, dy), Image.NEAREST, fillcolor=fill
        )
    else:
        raise AssertionError(name)
    return from_pil(out)


# Levels (uint8) by which stoker's op may differ from PIL's: PIL's enhancers round where
# torchvision's kernels truncate (stoker.augment.functional follows torchvision).
TIMM_TOLERANCE = {"Color": 2, "Contrast": 2, "Brightness": 1, "Sharpness": 1, "AutoContrast": 1}

TIMM_CASES = [
    ("AutoContrast", 0.0), ("Equalize", 0.0), ("Invert", 0.0), ("Rotate", 25.3),
    ("Rotate", -14.0), ("Posterize", 3.0), ("Posterize", 0.0), ("Solarize", 230.0),
    ("SolarizeAdd", 99.0), ("Color", 1.72), ("Contrast", 0.3), ("Brightness", 1.54),
    ("Sharpness", 1.9), ("ShearX", 0.27), ("ShearY", -0.21), ("TranslateXRel", 0.405),
    ("TranslateYRel", -0.3),
]  # fmt: skip


@pytest.mark.parametrize("name,m", TIMM_CASES)
def test_timm_ops_equal_pil(name, m):
    x = photos(3)
    apply = TIMM_RAND_OPS[name][0]
    out = apply(x, torch.full((3,), m, dtype=torch.float64), list(IMAGENET_MEAN_FILL))
    geometric = name.startswith(("Rotate", "Shear", "Translate"))
    for i in range(3):
        ref = timm_reference(x[i], name, m)
        diff = (out[i].int() - ref.int()).abs()
        if geometric:
            # PIL steps its source coordinates by repeated addition: a pixel whose source lies
            # on a pixel edge can fall on the other side (under 1% of them here).
            assert (diff.amax(0) > 0).float().mean().item() < 0.01, (name, m, i)
        else:
            assert diff.max().item() <= TIMM_TOLERANCE.get(name, 0), (name, m, i)


def test_timm_levels_are_timms():
    level = torch.tensor([0.0, 5.0, 9.0, 10.0], dtype=torch.float64)
    table = {
        "Rotate": [0.0, 15.0, 27.0, 30.0],
        "Posterize": [0, 2, 3, 4],
        "Solarize": [0, 128, 230, 256],
        "SolarizeAdd": [0, 55, 99, 110],
        "Color": [0.1, 1.0, 1.72, 1.9],
        "ShearX": [0.0, 0.15, 0.27, 0.3],
        "TranslateXRel": [0.0, 0.225, 0.405, 0.45],
    }
    for name, want in table.items():
        got = TIMM_RAND_OPS[name][1](level).tolist()
        assert got == pytest.approx(want), name


def test_timm_rand_augment_is_its_drawn_ops_sample_by_sample():
    x = photos(24)
    op = TimmRandAugment.from_config("rand-m9-mstd0.5")
    assert (op.magnitude, op.magnitude_std, op.num_layers, op.prob) == (9.0, 0.5, 2, 0.5)
    out = op(x, keyed(24))
    ref_draws = keyed(24)
    names = list(TIMM_RAND_OPS)
    expected = x.clone()
    applied = 0
    for r in range(2):
        op_index = ref_draws.integers(f"timm_rand_augment.op{r}", len(names))
        active = ref_draws.bernoulli(f"timm_rand_augment.apply{r}", 0.5)
        u1, u2 = ref_draws.uniform(f"timm_rand_augment.level{r}", size=2).double().unbind(1)
        gauss = torch.sqrt(-2 * torch.log1p(-u1)) * torch.cos(2 * math.pi * u2)
        level = (9 + 0.5 * gauss).clamp(0, 10)
        negate = ref_draws.bernoulli(f"timm_rand_augment.sign{r}", 0.5)
        for i in range(24):
            if not active[i]:
                continue
            name = names[int(op_index[i])]
            m = float(TIMM_RAND_OPS[name][1](level[i : i + 1])[0])
            if TIMM_RAND_OPS[name][2] and negate[i]:
                m = -m
            expected[i] = timm_reference(expected[i], name, m)
            applied += 1
    assert 10 < applied < 38  # about half of 48
    diff = (out.int() - expected.int()).abs().flatten(1).max(dim=1).values
    # PIL's enhancers round where stoker's (torchvision's) kernels truncate: a level or two
    assert diff.max().item() <= 2, diff.tolist()


def test_timm_config_errors():
    with pytest.raises(ValueError, match="starts with 'rand'"):
        TimmRandAugment.from_config("augmix-m5")
    with pytest.raises(ValueError, match="'x3'"):
        TimmRandAugment.from_config("rand-m9-x3")


# --- torchvision's policies --------------------------------------------------------------------


def test_rand_augment_magnitudes_at_bin_9_of_31():
    """torchvision's _augmentation_space at magnitude 9 of 31 bins, written out."""
    h, w = 28, 36
    want = {
        "ShearX": 0.3 * 9 / 30, "TranslateX": 150 / 331 * w * 9 / 30,
        "TranslateY": 150 / 331 * h * 9 / 30,
        "Rotate": 9.0, "Brightness": 0.27, "Color": 0.27, "Contrast": 0.27, "Sharpness": 0.27,
        "Posterize": 8 - round(9 / 7.5), "Solarize": 1 - 9 / 30,
    }  # fmt: skip
    for name, value in want.items():
        space = TORCHVISION_OPS[name][1](31, h, w)
        assert space is not None and float(space[9]) == pytest.approx(value, abs=1e-5), name


def tv_reference(img: torch.Tensor, name: str, m: float) -> torch.Tensor:
    """torchvision.transforms.v2's _apply_image_or_video_transform for one op."""
    if name in ("Brightness", "Color", "Contrast", "Sharpness"):
        fn = {"Brightness": F.adjust_brightness, "Color": F.adjust_saturation,
              "Contrast": F.adjust_contrast, "Sharpness": F.adjust_sharpness}[name]  # fmt: skip
        return fn(img, 1 + m)
    if name == "Identity":
        return img
    if name == "Rotate":
        return F.rotate(img, m)
    if name == "Posterize":
        return F.posterize(img, int(m))
    if name == "Solarize":
        return F.solarize(img, 255.0 * m)
    if name == "AutoContrast":
        return F.autocontrast(img)
    if name == "Equalize":
        return F.equalize(img)
    if name == "TranslateX":
        return F.affine(img, 0.0, [int(m), 0], 1.0, [0.0, 0.0])
    if name == "TranslateY":
        return F.affine(img, 0.0, [0, int(m)], 1.0, [0.0, 0.0])
    shear = math.degrees(math.atan(m))
    pair = [shear, 0.0] if name == "ShearX" else [0.0, shear]
    return F.affine(img, 0.0, [0, 0], 1.0, pair, center=[0, 0])


@pytest.mark.parametrize("policy", [RandAugment(2, 9), TrivialAugmentWide()])
def test_policies_are_keyed_per_sample(policy):
    x = photos(16)
    out = policy(x, keyed(16))
    assert out.shape == x.shape and out.dtype == x.dtype
    changed = (out != x).flatten(1).any(dim=1)
    assert changed.sum() >= 10  # most samples drew an op that changes them
    order = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    again = policy(x[order], KeyedDraws(11, 0, torch.arange(1000, 1016)[order]))
    assert torch.equal(again, out[order])
    floats = policy(x.float() / 255, keyed(16))
    assert floats.dtype == torch.float32 and floats.min() >= 0 and floats.max() <= 1


def test_rand_augment_one_op_is_the_functional_op():
    """With one op and magnitude 0 drawn as given, RandAugment's Rotate/Brightness... equal the
    functional ops with torchvision's magnitudes: checked on the drawn ops of a batch."""
    x = photos(32)
    policy = RandAugment(num_ops=1, magnitude=9)
    out = policy(x, keyed(32))
    d = keyed(32)
    names = list(TORCHVISION_OPS)
    op_index = d.integers("rand_augment.op0", len(names))
    negate = d.bernoulli("rand_augment.sign0", 0.5)
    assert len(set(op_index.tolist())) >= 8  # the ops really vary by sample
    for i in range(32):
        name = names[int(op_index[i])]
        space = TORCHVISION_OPS[name][1](31, 28, 36)
        m = 0.0 if space is None else float(space[9])
        if TORCHVISION_OPS[name][2] and negate[i]:
            m = -m
        expected = tv_reference(x[i : i + 1], name, m)
        assert torch.equal(out[i : i + 1], expected), name
