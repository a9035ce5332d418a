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
from stoker.augment import Compose as A_Compose
from stoker.augment import DrawnOp
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


FILTERS = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


def timm_reference(
    img: torch.Tensor, name: str, m: float, interpolation: str = "nearest"
) -> torch.Tensor:
    """timm auto_augment.py's op `name` at magnitude `m` (after its level mapping and sign),
    its geometry resampled with `interpolation`."""
    pil = to_pil(img)
    fill = IMAGENET_MEAN_FILL
    resample = FILTERS[interpolation]
    if name == "AutoContrast":
        out = ImageOps.autocontrast(pil)
    elif name == "Equalize":
        out = ImageOps.equalize(pil)
    elif name == "Invert":
        out = ImageOps.invert(pil)
    elif name == "Rotate":
        out = pil.rotate(m, resample=resample, fillcolor=fill)
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
        out = pil.transform(pil.size, Image.AFFINE, (1, m, 0, 0, 1, 0), resample, fillcolor=fill)
    elif name == "ShearY":
        out = pil.transform(pil.size, Image.AFFINE, (1, 0, 0, m, 1, 0), resample, fillcolor=fill)
    elif name == "TranslateXRel":
        dx = m * pil.size[0]
        out = pil.transform(pil.size, Image.AFFINE, (1, 0, dx, 0, 1, 0), resample, fillcolor=fill)
    elif name == "TranslateYRel":
        dy = m * pil.size[1]
        out = pil.transform(pil.size, Image.AFFINE, (1, 0, 0, 0, 1, dy), resample, fillcolor=fill)
    else:
        raise AssertionError(name)
    return from_pil(out)


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
        else:  # Pillow's bytes: its enhancers are Pillow's arithmetic (stoker.augment.pil)
            assert diff.max().item() == 0, (name, m, i)


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


def test_timm_rand_augment_draws_are_timm_s():
    """Each layer's op (uniform over the 15), its probability, its level N(9, 0.5) clipped, its
    sign and its filter (bilinear or bicubic, as timm's "random"), from the draws' names."""
    n = 4000
    op = TimmRandAugment.from_config("rand-m9-mstd0.5")
    assert (op.magnitude, op.magnitude_std, op.num_layers, op.prob) == (9.0, 0.5, 2, 0.5)
    drawn = op.drawn(keyed(n), 28, 36)
    ref_draws = keyed(n)
    names = list(TIMM_RAND_OPS)
    for r in range(2):
        op_index = ref_draws.integers(f"timm_rand_augment.op{r}", len(names))
        active = ref_draws.bernoulli(f"timm_rand_augment.apply{r}", 0.5)
        u1, u2 = ref_draws.uniform(f"timm_rand_augment.level{r}", size=2).double().unbind(1)
        gauss = torch.sqrt(-2 * torch.log1p(-u1)) * torch.cos(2 * math.pi * u2)
        level = (9 + 0.5 * gauss).clamp(0, 10)
        negate = ref_draws.bernoulli(f"timm_rand_augment.sign{r}", 0.5)
        bicubic = ref_draws.integers(f"timm_rand_augment.filter{r}", 2) == 1
        for i in range(n):
            d, name = drawn[i][r], names[int(op_index[i])]
            m = float(TIMM_RAND_OPS[name][1](level[i : i + 1])[0])
            if TIMM_RAND_OPS[name][2] and negate[i]:
                m = -m
            assert (d.name, d.applied) == (name, bool(active[i]))
            assert d.level == pytest.approx(float(level[i]), abs=1e-12)
            if d.magnitude is not None:
                assert d.magnitude == pytest.approx(m, abs=1e-12)
            geometric = name.startswith(("Rotate", "Shear", "Translate"))
            assert d.interpolation == (("bicubic" if bicubic[i] else "bilinear") if geometric
                                       else None)  # fmt: skip
    filters = [d.interpolation for ops in drawn for d in ops if d.interpolation]
    assert 0.45 < filters.count("bicubic") / len(filters) < 0.55


@pytest.mark.parametrize("form", ["batch", "worker"])
@pytest.mark.parametrize("interpolation", ["random", "bicubic", "nearest"])
def test_timm_rand_augment_is_its_drawn_ops_sample_by_sample(interpolation, form):
    """Each sample's image is its drawn ops applied one by one with PIL (what timm runs): byte
    for byte with Pillow's filters, in the batch form (torch ops) and the worker form (C++, on
    channels_last bytes)."""
    x = photos(24)
    op = TimmRandAugment.from_config("rand-m9-mstd0.5", prob=0.8, interpolation=interpolation)
    given = x.contiguous(memory_format=torch.channels_last) if form == "worker" else x
    out = op(given, keyed(24))
    expected = x.clone()
    applied = 0
    for i, ops in enumerate(op.drawn(keyed(24), 28, 36)):
        for d in ops:
            if d.applied:
                expected[i] = timm_reference(expected[i], d.name, d.magnitude or 0.0,
                                             d.interpolation or "nearest")  # fmt: skip
                applied += 1
    assert 25 < applied < 45  # about 0.8 of 48
    diff = (out.int() - expected.int()).abs()
    if interpolation == "nearest":  # pixels whose source lies on a pixel edge (PIL's stepping)
        assert ((diff.amax(1) > 2).float().mean() < 0.01).item()
        return
    worst = diff.flatten(1).max(dim=1).values
    assert worst.max().item() == 0, worst.tolist()


# Sizes and images for Pillow's enhancers: noise, a narrow range (autocontrast stretches it),
# smooth pictures, sizes down to 1 x 1 and under Sharpness's 3 x 3.
def enhancer_images() -> list[torch.Tensor]:
    rng = np.random.default_rng(8)
    out = []
    for h, w in [(28, 36), (57, 43), (3, 3), (2, 7), (1, 1), (64, 64)]:
        out.append(torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)))
        out.append(torch.from_numpy(rng.integers(40, 181, (3, h, w), dtype=np.uint8)))
        out.append(photos(1, h, w)[0])
    return out


PIL_ENHANCERS = {
    "color": lambda im, f: ImageEnhance.Color(im).enhance(f),
    "contrast": lambda im, f: ImageEnhance.Contrast(im).enhance(f),
    "sharpness": lambda im, f: ImageEnhance.Sharpness(im).enhance(f),
    "autocontrast": lambda im, f: ImageOps.autocontrast(im),
}


@pytest.mark.parametrize("name", list(PIL_ENHANCERS))
def test_pillow_enhancers_equal_pillow_byte_for_byte(name):
    """timm's Color, Contrast, Sharpness and AutoContrast (Pillow's ImageEnhance and
    ImageOps.autocontrast), in the worker form (C++: its portable and SIMD forms are checked
    against each other and against Pillow's bytes in augment_test) and the batch form
    (stoker.augment.pil, torch ops): Pillow 13's bytes, at factors across timm's range (0.1 to
    1.9) and beyond it either way, on noise, narrow ranges and pictures of odd sizes."""
    from stoker import _core
    from stoker.augment import pil

    factors = [0.0, 0.1, 0.46, 1.0, 1.37, 1.72, 1.9, 3.1] if name != "autocontrast" else [0.0]
    batch_op = getattr(pil, name)
    for x in enhancer_images():
        for f in factors:
            want = from_pil(PIL_ENHANCERS[name](to_pil(x), f))
            got = batch_op(x[None], f) if name != "autocontrast" else batch_op(x[None])
            assert torch.equal(got[0], want), (name, f, tuple(x.shape), "batch")
            work = x.permute(1, 2, 0).contiguous().numpy()[None].copy()
            _core.augment_op(work, f"pil_{name}", f, (0, 0, 0))
            assert torch.equal(torch.from_numpy(work[0]).permute(2, 0, 1), want), (
                name, f, tuple(x.shape), "worker")  # fmt: skip


def test_pillow_s_color_of_every_colour():
    """ImageEnhance.Color on all 2^24 colours (a 4096 x 4096 image), at a factor within [0, 1]
    and one above (Pillow's two branches): the worker form gives Pillow's bytes at both, the
    batch form (1.6 s a factor here) at the one above."""
    from stoker import _core
    from stoker.augment import pil

    k = np.arange(1 << 24, dtype=np.uint32)
    every = np.stack([k >> 16, (k >> 8) & 255, k & 255], axis=-1).astype(np.uint8)
    every = every.reshape(4096, 4096, 3)
    for f in (0.46, 1.72):
        want = np.asarray(ImageEnhance.Color(Image.fromarray(every)).enhance(f))
        work = every[None].copy()
        _core.augment_op(work, "pil_color", f, (0, 0, 0))
        assert np.array_equal(work[0], want), f
        if f < 1:
            continue
        got = pil.color(torch.from_numpy(every).permute(2, 0, 1)[None], f)[0]
        assert np.array_equal(got.permute(1, 2, 0).numpy(), want), f


def test_pillow_s_enhancers_after_table_ops_see_the_image_those_made():
    """The worker form runs timm's table ops (Brightness, Posterize, Solarize, ..., Contrast,
    AutoContrast) as one fused table: Contrast's mean luma and AutoContrast's range are taken
    of the image as the ops before them left it. Samples whose draws run a table op into
    Contrast or AutoContrast equal PIL's ops one by one."""
    n = 400
    x = photos(n, 12, 16)
    op = TimmRandAugment.from_config("rand-m9-mstd0.5", prob=1.0)
    draws = lambda: KeyedDraws(3, 0, torch.arange(n))  # noqa: E731
    out = op(x.contiguous(memory_format=torch.channels_last), draws())
    table_ops = {"AutoContrast", "Equalize", "Invert", "Posterize", "Solarize", "SolarizeAdd",
                 "Contrast", "Brightness"}  # fmt: skip
    fused = 0
    for i, ops in enumerate(op.drawn(draws(), 12, 16)):
        if not (ops[0].name in table_ops and ops[1].name in ("Contrast", "AutoContrast")):
            continue
        want = x[i]
        for d in ops:
            want = timm_reference(want, d.name, d.magnitude or 0.0)
        assert torch.equal(out[i], want), (i, [str(d) for d in ops])
        fused += 1
    assert fused >= 10


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


# --- what each sample drew ----------------------------------------------------------------------


def replay_drawn(policy, image: torch.Tensor, ops) -> torch.Tensor:
    """One image [1, C, H, W] through the ops a sample drew, one by one (the functional ops)."""
    table = TIMM_RAND_OPS if isinstance(policy, TimmRandAugment) else TORCHVISION_OPS
    for d in ops:
        if not d.applied:
            continue
        m = torch.tensor([0.0 if d.magnitude is None else float(d.magnitude)], dtype=torch.float64)
        apply = table[d.name][0]
        image = apply(image, m, policy.fill, d.interpolation) if d.interpolation else apply(
            image, m, policy.fill)  # fmt: skip
    return image


@pytest.mark.parametrize(
    "policy",
    [
        RandAugment(2, 9),
        TrivialAugmentWide(),
        TimmRandAugment.from_config("rand-m9-mstd0.5", prob=0.8),
    ],  # fmt: skip
    ids=lambda p: type(p).__name__,
)
def test_drawn_ops_rebuild_each_sample_the_workers_made(policy):
    """drawn() is what the worker form (C++) applies: each sample's listed ops, applied one by
    one, give its image (torchvision's geometry within its float32 grid's rounding)."""
    from stoker import _core

    n, indices = 48, torch.arange(48) * 7 + 3
    x = photos(n)
    nhwc = x.permute(0, 2, 3, 1).contiguous()
    _core.augment_images([policy._engine_step("ops/0/", 28, 36)], nhwc, indices, 5, 2)
    got = nhwc.permute(0, 3, 1, 2)
    drawn = policy.drawn(KeyedDraws(5, 2, indices).scoped("ops").scoped("0"), 28, 36)
    assert len(drawn) == n and all(ops for ops in drawn)
    names = set()
    for i in range(n):
        want = replay_drawn(policy, x[i : i + 1], drawn[i])[0]
        differ = (got[i] != want).any(0).float().mean().item()
        assert differ <= (0 if isinstance(policy, TimmRandAugment) else 2e-3), (i, drawn[i])
        names |= {d.name for d in drawn[i] if d.applied}
    assert len(names) >= 8  # many ops, geometric ones among them
    assert names & {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateXRel", "TranslateY",
                    "TranslateYRel"}  # fmt: skip


def test_drawn_ops_of_a_compose_follow_each_op_s_place():
    draws = lambda: KeyedDraws(3, 1, torch.arange(10))  # noqa: E731
    first, second = TimmRandAugment(num_layers=1), RandAugment(1, 9)
    both = A_Compose([first, second]).drawn(draws(), 28, 36)
    assert [ops[0] for ops in both] == [
        ops[0] for ops in first.drawn(draws().scoped("0"), 28, 36)]  # fmt: skip
    assert [ops[1] for ops in both] == [
        ops[0] for ops in second.drawn(draws().scoped("1"), 28, 36)]  # fmt: skip
    assert str(DrawnOp("Rotate", -12.25, True, 4.1, "bicubic")) == "Rotate(-12.25, bicubic)"
    assert str(DrawnOp("Equalize", applied=False)) == "Equalize skipped"


# --- PIL's bilinear and bicubic geometry ---------------------------------------------------------


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize(
    "name", ["Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"]
)  # fmt: skip
def test_timm_geometry_equals_pillow_byte_for_byte(name, interpolation):
    """Each geometric op of timm's, with Pillow's filters, in the worker form (C++: its portable,
    AVX2 and AVX-512 forms are checked against each other in augment_test) and the batch form
    (torch float64 ops): Pillow 13's Image.transform / rotate bytes, on noise and photos-like
    images of odd sizes, at magnitudes either way."""
    from stoker import _core

    rng = np.random.default_rng(3)
    apply, level_of, _ = TIMM_RAND_OPS[name]
    op = {"Rotate": "pil_rotate", "ShearX": "pil_shear_x", "ShearY": "pil_shear_y",
          "TranslateXRel": "pil_translate_x", "TranslateYRel": "pil_translate_y"}[name]  # fmt: skip
    for k, (h, w) in enumerate([(28, 36), (57, 43), (3, 5), (64, 64)]):
        x = photos(2, h, w)
        x[1] = torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8))
        for level in (2.5, 9.7):
            m = float(level_of(torch.tensor([level], dtype=torch.float64))[0]) * (-1) ** k
            batch = apply(x, torch.full((2,), m, dtype=torch.float64), list(IMAGENET_MEAN_FILL),
                          interpolation)  # fmt: skip
            for i in range(2):
                want = timm_reference(x[i], name, m, interpolation)
                assert torch.equal(batch[i], want), (name, interpolation, h, w, m, "torch")
                work = x[i].permute(1, 2, 0).contiguous().numpy()[None].copy()
                size = w if name == "TranslateXRel" else h
                magnitude = m * size if name.startswith("Translate") else m
                _core.augment_op(work, f"{op}_{interpolation}", magnitude, IMAGENET_MEAN_FILL)
                got = torch.from_numpy(work[0]).permute(2, 0, 1)
                assert torch.equal(got, want), (name, interpolation, h, w, m, "C++")


def test_timm_interpolation_choices():
    assert TimmRandAugment()._filters == ("bilinear", "bicubic")  # timm's "random"
    assert TimmRandAugment(interpolation="bicubic")._filters == ("bicubic",)
    assert TimmRandAugment(interpolation=["nearest", "bicubic"])._filters == ("nearest", "bicubic")
    for bad in ("lanczos", [], ["bilinear", "box"]):
        with pytest.raises(ValueError, match="Pillow's transform"):
            TimmRandAugment(interpolation=bad)
    # a fixed filter draws nothing else: the other draws (ops, levels) are the same
    one, other = TimmRandAugment(interpolation="bilinear"), TimmRandAugment(interpolation="random")
    a, b = one.drawn(keyed(50), 8, 8), other.drawn(keyed(50), 8, 8)
    assert [[(d.name, d.level) for d in ops] for ops in a] == [
        [(d.name, d.level) for d in ops] for ops in b]  # fmt: skip
    assert {d.interpolation for ops in a for d in ops} <= {"bilinear", None}
