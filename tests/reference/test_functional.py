"""stoker.augment.functional against torchvision.transforms.v2.functional, op by op: a batch of
real photos (uint8, and the same as float32 in [0, 1]), each sample with its own parameter,
against torchvision's function of the same name applied to that sample alone with that
parameter (as a Python number, as torchvision takes it).

uint8: every op equal to torchvision's byte for byte (stoker follows its tensor kernels step by
step: blends truncate, convolutions and resampling round), but gaussian_blur, whose two 1-D
passes round apart from torchvision's 2-D kernel at a .5: one level, on at most 1 value in
10,000. float32: equal, but where the two sum or interpolate in another order: contrast's mean
(within 1e-7), gaussian_blur (1e-6), bilinear affine and rotate (grid_sample on stoker's grid
against torchvision's: 3e-6). docs/RELIABILITY.md lists the bounds; each check's id names the
function it compares against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from stoker.augment import functional as SF

# float32 results where the two compute in another order: the largest difference allowed (on
# values in [0, 1]); every other op is exact.
FLOAT_BOUNDS = {"adjust_contrast": 1e-7, "gaussian_blur": 1e-6, "affine-bilinear": 3e-6,
                "rotate-bilinear": 3e-6}  # fmt: skip
# uint8 results allowed to differ: (levels, the fraction of values that may); every other op is
# exact. Measured: 3 to 24 values of 442,368 (5e-5) one level apart, kernels 5x5 to 23x23.
UINT8_BOUNDS = {"gaussian_blur": (1, 1e-4)}

N = 16  # twelve photos and four images of the edge cases


@pytest.fixture(scope="module")
def batch(photos) -> torch.Tensor:
    """uint8 [16, 3, 96, 128]: the photos, then a flat grey, a saturated image with one flat
    channel, a black one and a two-level one (the edge cases of autocontrast, equalize,
    solarize and hue)."""
    images = torch.from_numpy(np.stack(photos)).permute(0, 3, 1, 2)
    flat = torch.full((1, 3, 96, 128), 128, dtype=torch.uint8)
    saturated = images[:1].clone()
    saturated[:, 0] = 255
    saturated[:, 2] = saturated[:, 2] // 2
    black = torch.zeros_like(flat)
    two = torch.where(torch.arange(128) < 64, 40, 200).to(torch.uint8).expand(1, 3, 96, 128)
    out = torch.cat([images, flat, saturated, black, two.clone()]).contiguous()
    assert out.shape == (N, 3, 96, 128)
    return out


def as_dtype(batch: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return batch if dtype == torch.uint8 else batch.to(dtype) / 255.0


def spread(low: float, high: float) -> list[float]:
    """N parameters from `low` to `high`, the ends included."""
    return [float(v) for v in np.linspace(low, high, N)]


def per_sample(values: list[float]) -> torch.Tensor:
    """One value per sample, as stoker takes it: float64, so that each is the Python float
    torchvision gets."""
    return torch.tensor(values, dtype=torch.float64)


def bound_of(name: str) -> str:
    """The op a case checks (its name before any variant), with -bilinear for that filter."""
    op = name.split("-")[0]
    return op + "-bilinear" if "bilinear" in name else op


def compare(got: torch.Tensor, want: torch.Tensor, bound_key: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    if got.dtype == torch.uint8:
        levels, fraction = UINT8_BOUNDS.get(bound_key, (0, 0.0))
        diff = (got.int() - want.int()).abs()
        where = diff.nonzero()[:3].tolist()
        assert diff.max().item() <= levels, f"{diff.max().item()} levels apart at {where}"
        apart = (diff > 0).double().mean().item()
        assert apart <= fraction, f"{apart:.2g} of the values apart, at {where}"
    else:
        bound = FLOAT_BOUNDS.get(bound_key, 0.0)
        err = (got.double() - want.double()).abs().max().item()
        assert err <= bound, f"{err:.3g} > {bound:.3g}"


# name -> (stoker on the batch with per-sample params, torchvision on one image with one param,
# the params): each `want` is torchvision's function named in the id.
Op = Callable[[torch.Tensor, Any], torch.Tensor]
Case = tuple[Op, Op, Callable[[torch.dtype], list[Any]]]


def _bits(dtype: torch.dtype) -> list[Any]:
    return [int(b) for b in np.arange(N) % 9]


def _threshold(dtype: torch.dtype) -> list[Any]:
    return spread(0.0, 255.0) if dtype == torch.uint8 else spread(0.0, 1.0)


def _fill(dtype: torch.dtype) -> list[float]:
    return [10.0, 200.0, 30.0] if dtype == torch.uint8 else [0.1, 0.8, 0.3]


def _boxes(dtype: torch.dtype) -> list[Any]:
    """(top, left, height, width): inside, at the corners, running past the edges, empty, the
    whole image."""
    rng = np.random.default_rng(4)
    boxes = [(0, 0, 96, 128), (95, 127, 1, 1), (0, 0, 0, 0), (60, 100, 50, 50)]
    while len(boxes) < N:
        h, w = int(rng.integers(1, 60)), int(rng.integers(1, 80))
        boxes.append((int(rng.integers(0, 96 - h)), int(rng.integers(0, 128 - w)), h, w))
    return boxes


def _erase_stoker(x: torch.Tensor, boxes: list[Any]) -> torch.Tensor:
    i, j, h, w = (torch.tensor(v) for v in zip(*boxes, strict=True))
    return SF.erase(x, i, j, h, w, 77 if x.dtype == torch.uint8 else 0.3)


def _erase_torchvision(x: torch.Tensor, box: Any) -> torch.Tensor:
    value = torch.tensor(77 if x.dtype == torch.uint8 else 0.3, dtype=x.dtype)
    return TF.erase(x, *box, value)


def _affine_params(dtype: torch.dtype) -> list[Any]:
    """(angle, (tx, ty), scale, (shear x, shear y)): the identity, pure shifts and shears,
    multiples of 90 degrees, and mixes of all four."""
    rng = np.random.default_rng(7)
    params = [(0.0, (0.0, 0.0), 1.0, (0.0, 0.0)), (0.0, (7.0, -3.0), 1.0, (0.0, 0.0)),
              (0.0, (0.0, 0.0), 1.0, (16.7, 0.0)), (0.0, (0.0, 0.0), 1.0, (0.0, -16.7)),
              (90.0, (0.0, 0.0), 1.0, (0.0, 0.0)),
              (-180.0, (2.0, 2.0), 1.0, (0.0, 0.0))]  # fmt: skip
    while len(params) < N:
        params.append((float(rng.uniform(-45, 45)), (float(rng.integers(-20, 20)),
                       float(rng.integers(-20, 20))), float(rng.uniform(0.7, 1.4)),
                       (float(rng.uniform(-20, 20)), float(rng.uniform(-20, 20)))))  # fmt: skip
    return params


def _affine_stoker(mode: str, fill: bool, center: bool) -> Callable[[torch.Tensor, Any], Any]:
    def run(x: torch.Tensor, params: list[Any]) -> torch.Tensor:
        angle = per_sample([p[0] for p in params])
        translate = torch.tensor([p[1] for p in params], dtype=torch.float64)
        scale = per_sample([p[2] for p in params])
        shear = torch.tensor([p[3] for p in params], dtype=torch.float64)
        return SF.affine(x, angle, translate, scale, shear, interpolation=mode,
                         fill=_fill(x.dtype) if fill else None,
                         center=[20.0, 30.0] if center else None)  # fmt: skip

    return run


def _affine_torchvision(mode: str, fill: bool, center: bool) -> Callable[[torch.Tensor, Any], Any]:
    def run(x: torch.Tensor, p: Any) -> torch.Tensor:
        return TF.affine(x, angle=p[0], translate=list(p[1]), scale=p[2], shear=list(p[3]),
                         interpolation=InterpolationMode(mode),
                         fill=_fill(x.dtype) if fill else None,
                         center=[20.0, 30.0] if center else None)  # fmt: skip

    return run


def _angles(dtype: torch.dtype) -> list[Any]:
    return [0.0, 90.0, -90.0, 180.0, 270.0, 45.0, -30.5] + spread(-170.0, 170.0)[: N - 7]


CASES: dict[str, Case] = {
    "rgb_to_grayscale": (lambda x, _: SF.rgb_to_grayscale(x),
                         lambda x, _: TF.rgb_to_grayscale(x), lambda d: [None] * N),
    "rgb_to_grayscale-3": (lambda x, _: SF.rgb_to_grayscale(x, 3),
                           lambda x, _: TF.rgb_to_grayscale(x, 3), lambda d: [None] * N),
    "adjust_brightness": (lambda x, p: SF.adjust_brightness(x, per_sample(p)),
                          TF.adjust_brightness, lambda d: spread(0.0, 2.5)),
    "adjust_contrast": (lambda x, p: SF.adjust_contrast(x, per_sample(p)),
                        TF.adjust_contrast, lambda d: spread(0.0, 2.5)),
    "adjust_saturation": (lambda x, p: SF.adjust_saturation(x, per_sample(p)),
                          TF.adjust_saturation, lambda d: spread(0.0, 2.5)),
    "adjust_hue": (lambda x, p: SF.adjust_hue(x, per_sample(p)), TF.adjust_hue,
                   lambda d: spread(-0.5, 0.5)),
    "adjust_sharpness": (lambda x, p: SF.adjust_sharpness(x, per_sample(p)),
                         TF.adjust_sharpness, lambda d: spread(0.0, 3.0)),
    "posterize": (lambda x, p: SF.posterize(x, torch.tensor(p)), TF.posterize, _bits),
    "solarize": (lambda x, p: SF.solarize(x, per_sample(p)), TF.solarize, _threshold),
    "invert": (lambda x, _: SF.invert(x), lambda x, _: TF.invert(x), lambda d: [None] * N),
    "autocontrast": (lambda x, _: SF.autocontrast(x), lambda x, _: TF.autocontrast(x),
                     lambda d: [None] * N),
    "equalize": (lambda x, _: SF.equalize(x), lambda x, _: TF.equalize(x), lambda d: [None] * N),
    "erase": (_erase_stoker, _erase_torchvision, _boxes),
    "gaussian_blur-5x5": (lambda x, p: SF.gaussian_blur(x, [5, 5], per_sample(p)),
                          lambda x, p: TF.gaussian_blur(x, [5, 5], [p, p]),
                          lambda d: spread(0.1, 4.0)),
    "gaussian_blur-3x9": (lambda x, p: SF.gaussian_blur(x, [3, 9], torch.tensor(p)),
                          lambda x, p: TF.gaussian_blur(x, [3, 9], list(p)),
                          lambda d: [(0.2 + 0.3 * k, 2.5 - 0.1 * k) for k in range(N)]),
    "affine-nearest": (_affine_stoker("nearest", False, False),
                       _affine_torchvision("nearest", False, False), _affine_params),
    "affine-nearest-fill-center": (_affine_stoker("nearest", True, True),
                                   _affine_torchvision("nearest", True, True), _affine_params),
    "affine-bilinear": (_affine_stoker("bilinear", False, False),
                        _affine_torchvision("bilinear", False, False), _affine_params),
    "affine-bilinear-fill": (_affine_stoker("bilinear", True, False),
                             _affine_torchvision("bilinear", True, False), _affine_params),
    "rotate-nearest": (lambda x, p: SF.rotate(x, per_sample(p)),
                       lambda x, p: TF.rotate(x, p), _angles),
    "rotate-nearest-fill-center": (
        lambda x, p: SF.rotate(x, per_sample(p), center=[10.0, 70.0], fill=_fill(x.dtype)),
        lambda x, p: TF.rotate(x, p, center=[10.0, 70.0], fill=_fill(x.dtype)), _angles),
    "rotate-bilinear": (
        lambda x, p: SF.rotate(x, per_sample(p), interpolation="bilinear"),
        lambda x, p: TF.rotate(x, p, interpolation=InterpolationMode.BILINEAR), _angles),
}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32], ids=["uint8", "float32"])
@pytest.mark.parametrize("name", list(CASES))
def test_each_op_is_torchvisions(batch, name, dtype):
    """stoker.augment.functional.<op> on the batch, each sample with its own parameter, against
    torchvision.transforms.v2.functional.<op> on each sample alone."""
    stoker_op, torchvision_op, params_of = CASES[name]
    x = as_dtype(batch, dtype)
    params = params_of(dtype)
    got = stoker_op(x, params)
    want = torch.stack([torchvision_op(x[k], params[k]) for k in range(N)])
    compare(got, want, bound_of(name))


@pytest.mark.parametrize("angle", [0.0, 30.0, 90.0, -137.5])
def test_rotate_with_expand_is_torchvisions(batch, angle):
    """rotate(expand=True), one angle for the batch (with per-sample angles stoker gives the
    largest sample's size): torchvision.transforms.v2.functional.rotate(expand=True), exact."""
    got = SF.rotate(batch, angle, expand=True, fill=[1.0, 2.0, 3.0])
    want = torch.stack([TF.rotate(image, angle, expand=True, fill=[1.0, 2.0, 3.0])
                        for image in batch])  # fmt: skip
    compare(got, want, "rotate")


def test_the_checks_see_one_level(batch):
    """What the exact checks would see of an op one level off: brightness with one pixel's
    value raised by one fails the comparison with torchvision's adjust_brightness."""
    want = torch.stack([TF.adjust_brightness(image, 1.3) for image in batch])
    broken = SF.adjust_brightness(batch, 1.3).clone()
    broken[3, 1, 40, 50] += 1
    with pytest.raises(AssertionError, match="1 levels apart"):
        compare(broken, want, "adjust_brightness")
    # the bounds are all far below one level: a blur one level off everywhere fails too
    blurred = torch.stack([TF.gaussian_blur(image, [5, 5], [1.5, 1.5]) for image in batch[:4]])
    with pytest.raises(AssertionError, match="of the values apart"):
        compare(blurred.clamp(max=254) + 1, blurred, "gaussian_blur")
    assert max(FLOAT_BOUNDS.values()) < 1 / 255 / 1000
