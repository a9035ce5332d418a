"""stoker.augment.functional: each batch op against an independent per-sample reference (PIL's
ImageOps / ImageEnhance where the op is PIL's, colorsys for hue, numpy for blur and erase, PIL's
rotate / AFFINE transform for the geometry), with per-sample parameters that differ within the
batch, on uint8 and float, contiguous and channels_last.

Tolerances (uint8 levels): PIL rounds where torchvision truncates (grayscale) or rounds the
contrast mean to an integer, so those are within 1 or 2 levels; the sampling of rotate/affine
differs only where a sample point falls exactly between two pixels."""

from __future__ import annotations

import colorsys
import math

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from stoker.augment import functional as F

N, H, W = 6, 32, 48


def make_batch(seed: int = 0, n: int = N, h: int = H, w: int = W) -> torch.Tensor:
    """uint8 [n, 3, h, w] images with structure (smooth blobs plus noise) and a different value
    range per image and channel, so autocontrast and equalize have work to do."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, 4, 6, generator=g)
    smooth = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bilinear")
    noisy = (smooth + 0.15 * torch.rand(n, 3, h, w, generator=g)).clamp(0, 1)
    low = torch.randint(0, 80, (n, 3, 1, 1), generator=g).float()
    high = torch.randint(150, 256, (n, 3, 1, 1), generator=g).float()
    lo, hi = noisy.amin((2, 3), keepdim=True), noisy.amax((2, 3), keepdim=True)
    return (low + (noisy - lo) / (hi - lo) * (high - low)).round().to(torch.uint8)


def pil(image: torch.Tensor) -> Image.Image:
    array = image.permute(1, 2, 0).numpy()
    return Image.fromarray(array[..., 0] if array.shape[2] == 1 else array)


def from_pil(image: Image.Image) -> np.ndarray:
    array = np.asarray(image)
    return (array[None] if array.ndim == 2 else array.transpose(2, 0, 1)).astype(np.int64)


def max_diff(ours: torch.Tensor, reference: np.ndarray) -> int:
    return int(np.abs(ours.numpy().astype(np.int64) - reference).max())


@pytest.fixture(scope="module")
def batch() -> torch.Tensor:
    return make_batch()


FACTORS = torch.tensor([0.0, 0.3, 0.8, 1.0, 1.5, 2.2])


# ---- PIL's enhancers and ImageOps, per sample --------------------------------------------

ENHANCE = [
    (F.adjust_brightness, ImageEnhance.Brightness, 0),  # both truncate x * factor
    (F.adjust_saturation, ImageEnhance.Color, 2),  # PIL's grey is rounded, ours floored
    (F.adjust_contrast, ImageEnhance.Contrast, 2),  # PIL rounds the mean to an integer
    (F.adjust_sharpness, ImageEnhance.Sharpness, 1),
]


@pytest.mark.parametrize(
    "op, enhancer, tolerance", ENHANCE, ids=lambda v: getattr(v, "__name__", "")
)
def test_enhance_matches_pil_per_sample(batch, op, enhancer, tolerance):
    out = op(batch, FACTORS)
    assert out.dtype == torch.uint8 and out.shape == batch.shape
    for k in range(N):
        expected = from_pil(enhancer(pil(batch[k])).enhance(float(FACTORS[k])))
        assert max_diff(out[k], expected) <= tolerance, (op.__name__, k)
    # The factors really act per sample: sample k differs from the first factor applied to it.
    assert not torch.equal(out[1:], op(batch, float(FACTORS[0]))[1:])


# torchvision.transforms.v2.functional's arithmetic, written out (torchvision is not installed
# here): the luma with add(alpha=...), the blend image1.mul(ratio).add_(image2, alpha=1 - ratio)
# with `ratio` a Python float, sharpness's view.add_(blurred - view, alpha=1 - factor).
def torchvision_luma(img: torch.Tensor) -> torch.Tensor:
    r, g, b = img.unbind(dim=-3)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(-3).floor_()


def torchvision_blend(img: torch.Tensor, other: torch.Tensor, ratio: float) -> torch.Tensor:
    return img.mul(ratio).add_(other, alpha=1.0 - ratio).clamp_(0, 255).to(img.dtype)


def torchvision_op(name: str, img: torch.Tensor, factor: float) -> torch.Tensor:
    if name == "adjust_saturation":
        return torchvision_blend(img, torchvision_luma(img), factor)
    if name == "adjust_contrast":
        mean = torch.mean(torchvision_luma(img), dim=(-3, -2, -1), keepdim=True)
        return torchvision_blend(img, mean, factor)
    if name == "adjust_brightness":
        return img.mul(factor).clamp_(0, 255).to(img.dtype)
    a, b = 1.0 / 13.0, 5.0 / 13.0
    kernel = torch.tensor([[a, a, a], [a, b, a], [a, a, a]]).expand(3, 1, 3, 3)
    out = img.to(torch.float32, copy=True)
    blurred = torch.nn.functional.conv2d(out[None], kernel, groups=3)[0].round_()
    view = out[..., 1:-1, 1:-1]
    view.add_(blurred.sub_(view), alpha=1.0 - factor)
    return out.clamp_(0, 255).to(img.dtype)


@pytest.mark.parametrize(
    "name", ["adjust_saturation", "adjust_contrast", "adjust_brightness", "adjust_sharpness"]
)
def test_blends_equal_torchvisions_arithmetic_byte_for_byte(name):
    """With the factor a number, and with a tensor of float32 draws (each sample as
    torchvision given that draw): the same bytes. (A ratio of 1 - factor worked out in float32,
    or the add not fused, differs on 1-5% of the values: what the GPU test saw.)"""
    x = make_batch(seed=4, n=8, h=40, w=56)
    op = getattr(F, name)
    for factor in (1.7, 0.3, 1.3, 2.2):
        mine = op(x, factor)
        theirs = torch.stack([torchvision_op(name, image, factor) for image in x])
        assert torch.equal(mine, theirs), (name, factor)
    draws = torch.rand(8, generator=torch.Generator().manual_seed(1)) * 1.8 + 0.1  # float32
    mine = op(x, draws)
    for k in range(8):
        assert torch.equal(mine[k], torchvision_op(name, x[k], float(draws[k]))), (name, k)


def test_grayscale_matches_pil(batch):
    one, three = F.rgb_to_grayscale(batch), F.rgb_to_grayscale(batch, num_output_channels=3)
    assert one.shape == (N, 1, H, W) and three.shape == (N, 3, H, W)
    for k in range(N):
        assert max_diff(one[k], from_pil(ImageOps.grayscale(pil(batch[k])))) <= 1  # PIL rounds
    assert torch.equal(three, one.expand(-1, 3, -1, -1))
    # torchvision truncates: the exact luma formula in float64, floored.
    r, g, b = batch.double().unbind(1)
    exact = np.floor((0.2989 * r + 0.587 * g + 0.114 * b).numpy() + 1e-9)
    assert max_diff(one[:, 0], exact) <= 1 and (one[:, 0].numpy() == exact).mean() > 0.99


BITS = torch.tensor([1, 2, 3, 5, 7, 8])
THRESHOLDS = torch.tensor([0.0, 40.0, 100.0, 128.0, 200.0, 256.0])


def test_posterize_solarize_invert_match_pil(batch):
    posterized, solarized, inverted = (
        F.posterize(batch, BITS),
        F.solarize(batch, THRESHOLDS),
        F.invert(batch),
    )
    for k in range(N):
        image = pil(batch[k])
        assert max_diff(posterized[k], from_pil(ImageOps.posterize(image, int(BITS[k])))) == 0
        expected = from_pil(ImageOps.solarize(image, int(THRESHOLDS[k])))
        assert max_diff(solarized[k], expected) == 0
        assert max_diff(inverted[k], from_pil(ImageOps.invert(image))) == 0
    assert not torch.equal(posterized[0], F.posterize(batch[:1], 8)[0])


def test_autocontrast_and_equalize_match_pil(batch):
    stretched, equalized = F.autocontrast(batch), F.equalize(batch)
    for k in range(N):
        image = pil(batch[k])
        assert max_diff(stretched[k], from_pil(ImageOps.autocontrast(image))) <= 1
        assert max_diff(equalized[k], from_pil(ImageOps.equalize(image))) == 0
    # Each image and channel is stretched on its own range: every channel now spans 0..255
    # (254 where (max - min) / ((max - min) / 255) truncates to 254, as in torchvision).
    assert (stretched.amin((2, 3)) == 0).all() and (stretched.amax((2, 3)) >= 254).all()


def test_flat_channel_is_kept_by_autocontrast_and_equalize():
    flat = torch.full((2, 3, 8, 8), 77, dtype=torch.uint8)
    assert torch.equal(F.autocontrast(flat), flat)
    assert torch.equal(F.equalize(flat), flat)


# ---- hue through colorsys ----------------------------------------------------------------

HUES = torch.tensor([-0.5, -0.2, 0.0, 0.1, 0.33, 0.5])


def colorsys_hue(image: np.ndarray, factor: float) -> np.ndarray:
    """[3, h, w] floats in [0, 1], hue turned pixel by pixel through colorsys."""
    out = np.empty_like(image, dtype=np.float64)
    for y in range(image.shape[1]):
        for x in range(image.shape[2]):
            h, s, v = colorsys.rgb_to_hsv(*image[:, y, x])
            out[:, y, x] = colorsys.hsv_to_rgb((h + factor) % 1.0, s, v)
    return out


def test_hue_matches_colorsys():
    small = make_batch(seed=3, h=10, w=12)
    floats = small.float() / 255
    out = F.adjust_hue(floats, HUES)
    as_uint8 = F.adjust_hue(small, HUES)
    for k in range(N):
        expected = colorsys_hue(floats[k].double().numpy(), float(HUES[k]))
        assert np.abs(out[k].numpy() - expected).max() < 1e-5
        # uint8 comes back as trunc(x * 255.999): within one level of the float reference.
        assert np.abs(as_uint8[k].numpy() - expected * 255.999).max() <= 1.0 + 1e-3
    assert torch.allclose(F.adjust_hue(floats, 0.0), floats, atol=1e-6)


# ---- blur and erase with numpy -----------------------------------------------------------


def numpy_blur(image: np.ndarray, size: int, sigma: float) -> np.ndarray:
    taps = np.exp(-0.5 * (np.arange(size) - size // 2) ** 2 / sigma**2)
    taps /= taps.sum()
    r = size // 2
    padded = np.pad(image.astype(np.float64), ((0, 0), (r, r), (r, r)), mode="reflect")
    out = np.zeros(image.shape)
    for dy in range(size):
        for dx in range(size):
            window = padded[:, dy : dy + image.shape[1], dx : dx + image.shape[2]]
            out += taps[dy] * taps[dx] * window
    return out


SIGMAS = torch.tensor([0.1, 0.5, 0.9, 1.4, 2.0, 3.0])


def test_gaussian_blur_matches_numpy(batch):
    floats = batch.float() / 255
    out_f = F.gaussian_blur(floats, 5, SIGMAS)
    out_u = F.gaussian_blur(batch, [5, 5], SIGMAS)
    for k in range(N):
        expected = numpy_blur(floats[k].double().numpy(), 5, float(SIGMAS[k]))
        assert np.abs(out_f[k].numpy() - expected).max() < 1e-5
        expected_u = numpy_blur(batch[k].numpy(), 5, float(SIGMAS[k]))
        assert np.abs(out_u[k].numpy() - expected_u).max() <= 0.5 + 1e-3  # rounded
    assert not torch.equal(out_u[1:], F.gaussian_blur(batch, 5, float(SIGMAS[0]))[1:])


def test_gaussian_blur_anisotropic_sizes_and_sigmas(batch):
    sigma = torch.stack([SIGMAS, SIGMAS.flip(0)], dim=1)
    out = F.gaussian_blur(batch.float(), [3, 7], sigma)
    for k in range(2):
        # A 2-D reference with x taps of size 3 / sigma_x and y taps of size 7 / sigma_y.
        tx = np.exp(-0.5 * (np.arange(3) - 1) ** 2 / float(sigma[k, 0]) ** 2)
        ty = np.exp(-0.5 * (np.arange(7) - 3) ** 2 / float(sigma[k, 1]) ** 2)
        tx, ty = tx / tx.sum(), ty / ty.sum()
        padded = np.pad(batch[k].double().numpy(), ((0, 0), (3, 3), (1, 1)), mode="reflect")
        expected = sum(
            ty[dy] * tx[dx] * padded[:, dy : dy + H, dx : dx + W]
            for dy in range(7)
            for dx in range(3)
        )
        assert np.abs(out[k].numpy() - expected).max() < 1e-3


def test_erase_matches_numpy_slicing(batch):
    i, j = torch.tensor([0, 3, 10, 20, 31, 5]), torch.tensor([0, 7, 40, 2, 0, 46])
    h, w = torch.tensor([4, 10, 5, 30, 1, 9]), torch.tensor([6, 3, 20, 8, 48, 9])
    values = torch.tensor([0, 50, 100, 150, 200, 255], dtype=torch.uint8)
    out = F.erase(batch, i, j, h, w, values)
    noise = torch.randint(0, 256, batch.shape, dtype=torch.uint8)
    out_noise = F.erase(batch, i, j, h, w, noise)
    per_channel = F.erase(batch, i, j, h, w, torch.tensor([1, 2, 3]).view(3, 1, 1))
    for k in range(N):
        box = np.s_[:, int(i[k]) : int(i[k] + h[k]), int(j[k]) : int(j[k] + w[k])]
        expected = batch[k].numpy().copy()
        expected[box] = int(values[k])
        assert np.array_equal(out[k].numpy(), expected)
        expected[box] = noise[k].numpy()[box]
        assert np.array_equal(out_noise[k].numpy(), expected)
        expected[box] = np.array([1, 2, 3]).reshape(3, 1, 1)
        assert np.array_equal(per_channel[k].numpy(), expected)
    # On float images, per-sample values ([N]) land in each box and nowhere else.
    floats = batch.float() / 255
    erased = F.erase(floats, i, j, h, w, values.float() / 255)
    assert torch.equal(erased, out.float() / 255)
    kept = batch.clone()
    assert F.erase(kept, i, j, h, w, values, inplace=True) is kept and torch.equal(kept, out)


# ---- geometry against PIL ----------------------------------------------------------------


def inverse_affine(center, angle, translate, scale, shear):
    """torchvision's inverse affine matrix, written out in Python floats (the reference)."""
    rot, sx, sy = (math.radians(v) for v in (angle, *shear))
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -(a * math.tan(sx) + math.sin(rot))
    c = math.sin(rot - sy) / math.cos(sy)
    d = math.cos(rot) - c * math.tan(sx)
    m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
    m[2] += cx - m[0] * (cx + tx) - m[1] * (cy + ty)
    m[5] += cy - m[3] * (cx + tx) - m[4] * (cy + ty)
    return m


# Nearest sampling picks a different pixel only where a sample point lies (within float
# error) on a pixel boundary: PIL floors the coordinate, grid_sample rounds half to even.
GEOMETRY_MISMATCH = 0.005  # none seen on these batches

ANGLES = torch.tensor([0.0, 12.5, -30.0, 90.0, 181.0, 300.0])


def test_rotate_matches_pil_nearest(batch):
    out = F.rotate(batch, ANGLES)
    for k in range(N):
        expected = from_pil(pil(batch[k]).rotate(float(ANGLES[k]), resample=Image.NEAREST))
        differ = (out[k].numpy() != expected).any(axis=0).mean()
        assert differ <= GEOMETRY_MISMATCH, (k, differ)
    assert torch.equal(out[0], batch[0])


def test_rotate_expand_holds_the_whole_image(batch):
    out = F.rotate(batch[:1], 90.0, expand=True)
    assert out.shape == (1, 3, W, H)
    assert torch.equal(out[0], torch.rot90(batch[0], 1, dims=(1, 2)))
    mixed = F.rotate(batch[:2], torch.tensor([0.0, 90.0]), expand=True)
    assert mixed.shape == (2, 3, W, W)  # the largest of 32x48 and 48x32


AFFINE = {
    "angle": torch.tensor([0.0, 10.0, -25.0, 0.0, 0.0, 45.0]),
    "translate": torch.tensor(
        [[0.0, 0.0], [3.0, -2.0], [0.0, 0.0], [-7.0, 5.0], [0.0, 0.0], [2, 2]]
    ),
    "scale": torch.tensor([1.0, 1.0, 0.8, 1.0, 1.2, 0.9]),
    "shear": torch.tensor([[0.0, 0.0], [0.0, 0.0], [15.0, 0.0], [0.0, -20.0], [10.0, 5.0], [5, 0]]),
}


def test_affine_matches_pil_transform_nearest(batch):
    out = F.affine(batch, **AFFINE)
    for k in range(N):
        params = {name: value[k].tolist() for name, value in AFFINE.items()}
        matrix = inverse_affine((W * 0.5, H * 0.5), **params)
        image = pil(batch[k]).transform((W, H), Image.AFFINE, matrix, resample=Image.NEAREST)
        differ = (out[k].numpy() != from_pil(image)).any(axis=0).mean()
        assert differ <= GEOMETRY_MISMATCH, (k, differ)
    # RandAugment's TranslateX by a whole number of pixels is an exact shift.
    shifted = F.affine(batch, 0.0, [5, 0], 1.0, 0.0)
    assert torch.equal(shifted[..., 5:], batch[..., :-5]) and (shifted[..., :5] == 0).all()


def test_affine_fill_and_bilinear(batch):
    out = F.affine(batch, 0.0, [5, 0], 1.0, 0.0, fill=[10, 20, 30])
    assert (out[:, :, :, :5] == torch.tensor([10, 20, 30]).view(1, 3, 1, 1)).all()
    floats = batch.float() / 255
    # A half-pixel shift with bilinear is the mean of neighbouring columns, away from the edge.
    half = F.affine(floats, 0.0, [0.5, 0], 1.0, 0.0, interpolation="bilinear")
    expected = (floats[..., 1:-1] + floats[..., :-2]) / 2
    assert torch.allclose(half[..., 1:-1], expected, atol=1e-5)


# ---- contracts shared by every op --------------------------------------------------------

PER_SAMPLE = [
    ("adjust_brightness", lambda x, p: F.adjust_brightness(x, p), FACTORS),
    ("adjust_contrast", lambda x, p: F.adjust_contrast(x, p), FACTORS),
    ("adjust_saturation", lambda x, p: F.adjust_saturation(x, p), FACTORS),
    ("adjust_sharpness", lambda x, p: F.adjust_sharpness(x, p), FACTORS),
    ("adjust_hue", lambda x, p: F.adjust_hue(x, p), HUES),
    ("posterize", lambda x, p: F.posterize(x, p), BITS),
    ("solarize", lambda x, p: F.solarize(x, p if x.dtype == torch.uint8 else p / 255), THRESHOLDS),
    ("gaussian_blur", lambda x, p: F.gaussian_blur(x, 5, p), SIGMAS),
    ("rotate", lambda x, p: F.rotate(x, p, "bilinear"), ANGLES),
    ("affine", lambda x, p: F.affine(x, p, [1.5, -2], 0.9, p / 3), ANGLES),
    (
        "erase",
        lambda x, p: F.erase(x, torch.as_tensor(p).long() % 7, 3, 9, p % 11 + 5, 0.5),
        ANGLES.abs(),
    ),
]
PLAIN = [
    ("rgb_to_grayscale", F.rgb_to_grayscale),
    ("autocontrast", F.autocontrast),
    ("equalize", F.equalize),
    ("invert", F.invert),
]


def as_dtype(images: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return images if dtype == torch.uint8 else images.to(dtype) / 255


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("name, op, params", PER_SAMPLE, ids=[p[0] for p in PER_SAMPLE])
def test_batch_equals_samples_stacked(batch, dtype, name, op, params):
    images = as_dtype(batch, dtype)
    out = op(images, params)
    assert out.dtype == dtype and out.shape == images.shape
    alone = torch.cat([op(images[k : k + 1], params[k : k + 1]) for k in range(N)])
    assert torch.equal(out, alone)
    # A number and a tensor of that value for every sample give the same output.
    for k in (1, 4):
        value = params[k].item()
        assert torch.equal(op(images, value), op(images, torch.full((N,), value)))
    # channels_last input gives the same values.
    assert torch.equal(op(images.contiguous(memory_format=torch.channels_last), params), out)
    # A single [C, H, W] image is a batch of one.
    single = op(images[2], params[2].item())
    assert single.shape == images.shape[1:] and torch.equal(single, alone[2])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
@pytest.mark.parametrize("name, op", PLAIN, ids=[p[0] for p in PLAIN])
def test_plain_ops_per_image_dtype_and_layout(batch, dtype, name, op):
    images = as_dtype(batch, dtype)
    out = op(images)
    assert out.dtype == dtype
    alone = torch.cat([op(images[k : k + 1]) for k in range(N)])
    assert torch.equal(out, alone)
    assert torch.equal(op(images.contiguous(memory_format=torch.channels_last)), out)
    assert torch.equal(op(images[3]), out[3])


@pytest.mark.parametrize(
    "op, tolerance",
    [
        (lambda x: F.adjust_brightness(x, FACTORS), 1.5),
        (lambda x: F.adjust_contrast(x, FACTORS), 2.5),
        (lambda x: F.adjust_saturation(x, FACTORS), 2.5),
        (lambda x: F.adjust_sharpness(x, FACTORS), 2.5),
        (lambda x: F.adjust_hue(x, HUES), 1.5),
        (lambda x: F.posterize(x, BITS), 1.0),  # floor(x 2^bits) / 2^bits vs a bit mask
        (F.autocontrast, 1.5),
        (F.equalize, 1e-3),
        (F.invert, 1e-3),
        (F.rgb_to_grayscale, 1.5),
        (lambda x: F.gaussian_blur(x, 5, SIGMAS), 1.0),
        (lambda x: F.rotate(x, ANGLES, "bilinear"), 1.0),
    ],
)
def test_float_path_agrees_with_uint8_path(batch, op, tolerance):
    """Float in [0, 1] is the same op: x 255 it is within the uint8 path's rounding."""
    as_float = op(batch.float() / 255) * 255
    assert (as_float - op(batch).float()).abs().max() <= tolerance
    assert as_float.min() >= 0 and as_float.max() <= 255 + 1e-3


def test_numbers_are_checked():
    images = make_batch(n=2, h=8, w=8)
    with pytest.raises(ValueError):
        F.adjust_hue(images, 0.7)
    with pytest.raises(ValueError):
        F.adjust_brightness(images, -1.0)
    with pytest.raises(ValueError):
        F.posterize(images, 9)
    with pytest.raises(ValueError):
        F.adjust_contrast(images, torch.ones(3))  # three values for two samples
    with pytest.raises(ValueError):
        F.gaussian_blur(images, 4, 1.0)
    with pytest.raises(ValueError):
        F.rotate(images, 10.0, interpolation="bicubic")
    with pytest.raises(TypeError):
        F.invert(images.to(torch.int32))
