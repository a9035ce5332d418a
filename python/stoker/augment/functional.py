"""Batch versions of torchvision.transforms.v2.functional's image ops, one function per op.

Each function takes an image batch ``img`` [N, C, H, W] (a single [C, H, W] image is taken as
N=1 and returned as [C, H, W]), uint8 or floating point with values in [0, 1] (torchvision's
convention), contiguous or channels_last, on any device, and returns a new batch of the same
dtype. Each parameter is a number (one value for the batch) or a tensor of one value per sample
([N], broadcast over C, H and W); a number and a tensor of equal values give the same output,
because a number is turned into such a tensor. The whole batch is processed by tensor ops,
never by a Python loop over samples, so an op costs about the same on 1 or 256 samples.

The arithmetic follows torchvision's tensor kernels step by step, including how uint8 results
are made: blends (brightness, contrast, saturation, grayscale, autocontrast) truncate, as
torchvision's ``.to(uint8)`` does; convolutions and resampling (sharpness, blur, affine) round.
Where an op differs from torchvision its docstring says so. Numbers are checked as torchvision
checks them; tensors are not, because a check of a tensor's values would wait for the device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as tnf
from torch import Tensor

Param = float | Tensor
"""A number for the whole batch, or a tensor of one value per sample ([N])."""

# ITU-R 601-2 luma, as torchvision's rgb_to_grayscale (PIL's 'L' uses 299/587/114 and rounds).
_LUMA = (0.2989, 0.587, 0.114)


def _as_batch(img: Tensor) -> tuple[Tensor, bool]:
    """The batch as [N, C, H, W], and whether it came as a single [C, H, W] image."""
    if img.dim() == 3:
        return img.unsqueeze(0), True
    if img.dim() != 4:
        raise ValueError(f"an image batch is [N, C, H, W] or [C, H, W], not {tuple(img.shape)}")
    if not img.is_floating_point() and img.dtype != torch.uint8:
        raise TypeError(f"images are uint8 or floating point, not {img.dtype}")
    return img, False


def _unbatch(out: Tensor, single: bool) -> Tensor:
    return out.squeeze(0) if single else out


def _work_dtype(img: Tensor) -> torch.dtype:
    """The dtype arithmetic runs in: the image's own if float, else float32 (as torchvision)."""
    return img.dtype if img.is_floating_point() else torch.float32


def _bound(img: Tensor) -> float:
    return 1.0 if img.is_floating_point() else 255.0


def _per_sample(value: Param, img: Tensor, name: str, dtype: torch.dtype | None = None) -> Tensor:
    """`value` as a [N, 1, 1, 1] tensor on the batch's device (in the work dtype unless told)."""
    n = img.shape[0]
    t = torch.as_tensor(value, dtype=dtype or _work_dtype(img), device=img.device)
    if t.dim() == 0:
        t = t.expand(n)
    elif tuple(t.shape) != (n,):
        raise ValueError(f"{name} is a number or one value per sample [{n}], not {tuple(t.shape)}")
    return t.view(n, 1, 1, 1)


def _check(value: Param, name: str, low: float, high: float = math.inf) -> None:
    if not isinstance(value, Tensor) and not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], not {value}")


def _check_rgb(img: Tensor, op: str, gray_ok: bool = True) -> int:
    channels = img.shape[1]
    if channels != 3 and not (gray_ok and channels == 1):
        raise TypeError(f"{op} takes 1 or 3 channels, not {channels}")
    return channels


def _add_scaled(base: Tensor, other: Tensor, alpha: Tensor) -> Tensor:
    """``base.add_(other, alpha=a)`` per sample, as torch computes it for a number ``a``: `alpha`
    (float64 [N, 1, 1, 1]) rounded once to the work dtype, then base + alpha * other with one
    rounding (a fused multiply-add: torch's vectorised CPU kernels and its CUDA kernel both
    fuse it), here in float64, where the product and, for these magnitudes, the sum are exact."""
    if base.dtype in (torch.float16, torch.bfloat16, torch.float32):
        a = alpha.to(base.dtype).to(torch.float64)  # torch's alpha, in its opmath (float32)
        fused = base.to(torch.float64) + a * other.to(torch.float64)
        return fused.to(torch.float32).to(base.dtype)
    return base + other * alpha.to(base.dtype)


def _blend(img: Tensor, other: Tensor | None, ratio: Tensor) -> Tensor:
    """img * ratio + other * (1 - ratio), clamped, truncated to uint8: torchvision's _blend,
    ``image1.mul(ratio).add_(image2, alpha=1.0 - ratio)`` with its rounding (`ratio` float64
    [N, 1, 1, 1]: 1 - ratio is worked out in double, as torchvision's Python float is)."""
    out = img * ratio.to(_work_dtype(img))
    if other is not None:
        out = _add_scaled(out, other, 1.0 - ratio)
    out = out.clamp_(0, _bound(img))
    return out if img.is_floating_point() else out.to(img.dtype)


def _gray(img: Tensor) -> Tensor:
    """Luma [N, 1, H, W] in the work dtype, floored for uint8 input (as torchvision's contrast
    and saturation take it)."""
    r, g, b = img.unbind(dim=1)
    luma = r.mul(_LUMA[0]).add_(g, alpha=_LUMA[1]).add_(b, alpha=_LUMA[2]).unsqueeze(1)
    return luma if img.is_floating_point() else luma.floor_()


def rgb_to_grayscale(img: Tensor, num_output_channels: int = 1) -> Tensor:
    """Luma 0.2989 R + 0.587 G + 0.114 B, truncated for uint8 as torchvision (PIL rounds: they
    differ by at most one level); 1 or 3 equal output channels. A 1-channel input is copied."""
    if num_output_channels not in (1, 3):
        raise ValueError(f"num_output_channels must be 1 or 3, not {num_output_channels}")
    x, single = _as_batch(img)
    if _check_rgb(x, "rgb_to_grayscale") == 1:
        out = x.repeat(1, num_output_channels, 1, 1)
    else:
        out = _gray(x).to(x.dtype)  # floor then cast equals torchvision's truncating cast
        if num_output_channels == 3:
            out = out.expand(-1, 3, -1, -1).contiguous()
    return _unbatch(out, single)


def adjust_brightness(img: Tensor, brightness_factor: Param) -> Tensor:
    """img * brightness_factor, clamped (0 is black, 1 the image itself)."""
    _check(brightness_factor, "brightness_factor", 0.0)
    x, single = _as_batch(img)
    factor = _per_sample(brightness_factor, x, "brightness_factor", torch.float64)
    return _unbatch(_blend(x, None, factor), single)


def adjust_contrast(img: Tensor, contrast_factor: Param) -> Tensor:
    """A blend with each image's mean luma (0 is flat grey, 1 the image). PIL's ImageEnhance
    rounds that mean to an integer first: the two differ by up to about |1 - factor| / 2 + 1
    levels on uint8."""
    _check(contrast_factor, "contrast_factor", 0.0)
    x, single = _as_batch(img)
    if _check_rgb(x, "adjust_contrast") == 3:
        gray = _gray(x)
    else:
        gray = x.to(_work_dtype(x))
    mean = gray.mean(dim=(1, 2, 3), keepdim=True)
    factor = _per_sample(contrast_factor, x, "contrast_factor", torch.float64)
    return _unbatch(_blend(x, mean, factor), single)


def adjust_saturation(img: Tensor, saturation_factor: Param) -> Tensor:
    """A blend with the image's own luma (0 is grey, 1 the image, 2 twice as saturated); a
    1-channel image is returned as it is."""
    _check(saturation_factor, "saturation_factor", 0.0)
    x, single = _as_batch(img)
    if _check_rgb(x, "adjust_saturation") == 1:
        return img.clone()
    ratio = _per_sample(saturation_factor, x, "saturation_factor", torch.float64)
    return _unbatch(_blend(x, _gray(x), ratio), single)


def _rgb_to_hsv(rgb: Tensor) -> Tensor:
    """torchvision's _rgb_to_hsv (after PIL's Convert.c), on [N, 3, H, W] floats in [0, 1]."""
    r, g, _ = rgb.unbind(dim=1)
    minc, maxc = torch.aminmax(rgb, dim=1)
    eqc = maxc == minc
    spread = maxc - minc
    ones = torch.ones_like(maxc)
    s = spread / torch.where(eqc, ones, maxc)
    divisor = torch.where(eqc, ones, spread).unsqueeze(1)
    rc, gc, bc = ((maxc.unsqueeze(1) - rgb) / divisor).unbind(dim=1)
    max_not_r = maxc != r
    max_is_g = maxc == g
    hg = (rc + 2.0 - bc) * (max_is_g & max_not_r)
    hr = (bc - gc) * ~max_not_r
    hb = (gc + 4.0 - rc) * (max_not_r & ~max_is_g)
    h = ((hr + hg + hb) * (1.0 / 6.0) + 1.0).fmod(1.0)
    return torch.stack((h, s, maxc), dim=1)


def _hsv_to_rgb(hsv: Tensor) -> Tensor:
    """torchvision's _hsv_to_rgb: the sextant of the hue picks (v, p, q, t) per channel."""
    h, s, v = hsv.unbind(dim=1)
    h6 = h * 6.0
    sextant = torch.floor(h6)
    f = h6 - sextant
    sextant = sextant.to(torch.int64).remainder_(6)
    sxf = s * f
    one_minus_s = 1.0 - s
    q = ((1.0 - sxf) * v).clamp_(0.0, 1.0)
    t = ((sxf + one_minus_s) * v).clamp_(0.0, 1.0)
    p = (one_minus_s * v).clamp_(0.0, 1.0)
    vpqt = torch.stack((v, p, q, t), dim=1)
    pick = torch.tensor(
        [[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]], device=hsv.device
    )
    select = pick[:, sextant].movedim(0, 1)  # [N, 3, H, W]: which of v, p, q, t per channel
    return vpqt.gather(1, select)


def adjust_hue(img: Tensor, hue_factor: Param) -> Tensor:
    """Hue turned by hue_factor (in [-0.5, 0.5], a fraction of the colour wheel) through HSV,
    as torchvision's tensor kernel: uint8 goes to float as x / 255 and back as
    trunc(x * 255.999); a 1-channel image is returned as it is."""
    _check(hue_factor, "hue_factor", -0.5, 0.5)
    x, single = _as_batch(img)
    if _check_rgb(x, "adjust_hue") == 1:
        return img.clone()
    rgb = x if x.is_floating_point() else x.to(torch.float32).mul_(1.0 / 255.0)
    h, s, v = _rgb_to_hsv(rgb).unbind(dim=1)
    h = (h + _per_sample(hue_factor, rgb, "hue_factor").squeeze(1)).remainder_(1.0)
    out = _hsv_to_rgb(torch.stack((h, s, v), dim=1))
    if not x.is_floating_point():
        out = out.mul_(256.0 - 1e-3).to(x.dtype)
    return _unbatch(out, single)


def adjust_sharpness(img: Tensor, sharpness_factor: Param) -> Tensor:
    """A blend with the image smoothed by [[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13 (rounded for
    uint8), the border pixels kept as they are: PIL's ImageEnhance.Sharpness, as torchvision.
    0 is smoothed, 1 the image, above 1 sharper."""
    _check(sharpness_factor, "sharpness_factor", 0.0)
    x, single = _as_batch(img)
    channels, height, width = x.shape[1:]
    _check_rgb(x, "adjust_sharpness")
    if x.numel() == 0 or height <= 2 or width <= 2:
        return img.clone()
    dtype = _work_dtype(x)
    kernel = torch.ones(3, 3, dtype=dtype, device=x.device)
    kernel[1, 1] = 5.0
    kernel = (kernel / 13.0).expand(channels, 1, 3, 3)
    out = x.to(dtype=dtype, copy=True)
    smooth = tnf.conv2d(out, kernel, groups=channels)
    if not x.is_floating_point():
        smooth = smooth.round_()
    inner = out[..., 1:-1, 1:-1]
    # torchvision: inner.add_(smooth - inner, alpha=1.0 - sharpness_factor)
    alpha = 1.0 - _per_sample(sharpness_factor, x, "sharpness_factor", torch.float64)
    inner.copy_(_add_scaled(inner, smooth - inner, alpha))
    out = out.clamp_(0, _bound(x))
    return _unbatch(out if x.is_floating_point() else out.to(x.dtype), single)


def posterize(img: Tensor, bits: int | Tensor) -> Tensor:
    """Keep the `bits` high bits of each value (0..8). A float image is quantised to 2**bits
    levels, floor(x * 2**bits) / 2**bits, as torchvision."""
    _check(bits, "bits", 0, 8)
    x, single = _as_batch(img)
    b = _per_sample(bits, x, "bits", dtype=torch.int64)
    if x.is_floating_point():
        levels = torch.pow(2.0, b.to(x.dtype))
        out = (x * levels).floor_().clamp_(min=0).minimum(levels - 1) / levels
    else:
        mask = ((1 << b) - 1) << (8 - b)  # the top `bits` of a byte
        out = x & mask.to(torch.uint8)
    return _unbatch(out, single)


def invert(img: Tensor) -> Tensor:
    """255 - x for uint8, 1 - x for float."""
    x, single = _as_batch(img)
    out = x.bitwise_not() if x.dtype == torch.uint8 else 1.0 - x
    return _unbatch(out, single)


def solarize(img: Tensor, threshold: Param) -> Tensor:
    """Values at or above `threshold` inverted (threshold on the image's scale: 0..255 for
    uint8, 0..1 for float)."""
    x, single = _as_batch(img)
    _check(threshold, "threshold", -math.inf, _bound(x))
    limit = _per_sample(threshold, x, "threshold", dtype=torch.float32)
    return _unbatch(torch.where(x >= limit, invert(x), x), single)


def autocontrast(img: Tensor) -> Tensor:
    """Each image's channels stretched from their own [min, max] to the full range (a flat
    channel is kept); uint8 truncated, as torchvision (PIL truncates too, so within 1)."""
    x, single = _as_batch(img)
    _check_rgb(x, "autocontrast")
    bound = _bound(x)
    values = x.to(_work_dtype(x))
    low = values.amin(dim=(2, 3), keepdim=True)
    high = values.amax(dim=(2, 3), keepdim=True)
    flat = high == low
    inv_scale = torch.where(flat, torch.ones_like(low), (high - low) * (1.0 / bound))
    low = torch.where(flat, torch.zeros_like(low), low)
    out = ((values - low) / inv_scale).clamp_(0, bound).to(x.dtype)
    return _unbatch(out, single)


def equalize(img: Tensor) -> Tensor:
    """Histogram equalisation per image and channel with PIL's look-up table (ImageOps.equalize):
    lut[k] = (cumhist[k - 1] + step // 2) // step, step = (pixels not of the top value) // 255;
    a channel with step 0 is kept. A float image is equalised on its uint8 levels
    (trunc(x * 255.999)) and returned as level / 255, as torchvision."""
    x, single = _as_batch(img)
    n, channels, height, width = x.shape
    if x.numel() == 0:
        return img.clone()
    levels = x if x.dtype == torch.uint8 else x.clamp(0, 1).mul(256.0 - 1e-3).to(torch.uint8)
    flat = levels.reshape(n * channels, height * width).to(torch.int64)
    # One histogram of 256 bins per (image, channel), all counted in one bincount.
    offsets = torch.arange(n * channels, device=x.device).unsqueeze(1) * 256
    hist = torch.bincount((flat + offsets).flatten(), minlength=n * channels * 256)
    hist = hist.view(n * channels, 256)
    cum = hist.cumsum(dim=1)
    top = cum.argmax(dim=1, keepdim=True)  # the first bin reaching the total: the top value
    step = (height * width - hist.gather(1, top)).div(255, rounding_mode="floor")
    lut = (cum[:, :-1] + step // 2).div(step.clamp(min=1), rounding_mode="floor").clamp_(0, 255)
    lut = torch.cat([torch.zeros_like(lut[:, :1]), lut], dim=1).to(torch.uint8)
    equalized = torch.where(step != 0, lut.gather(1, flat), flat.to(torch.uint8))
    out = equalized.view(n, channels, height, width)
    if x.is_floating_point():
        out = out.to(x.dtype).mul_(1.0 / 255.0)
    return _unbatch(out, single)


def erase(
    img: Tensor, i: Param, j: Param, h: Param, w: Param, v: Param, inplace: bool = False
) -> Tensor:
    """Each sample's box of rows [i, i + h) and columns [j, j + w) set to `v`; a box that runs
    past the image is cut at its edge, as torchvision's slicing. `v` is a number, a tensor of
    one value per sample ([N]), or a tensor that broadcasts to the batch [N, C, H, W] (per
    channel [C, 1, 1], noise of the image's size [N, C, H, W] or [C, H, W]: only the values
    inside each box are used). torchvision's v has the box's own size; with boxes of
    different sizes in one batch, a value of the image's size takes its place. Values are
    cast to the image's dtype (truncated for uint8, as torchvision's assignment)."""
    x, single = _as_batch(img)
    n, _, height, width = x.shape
    top, left, tall, wide = (
        _per_sample(p, x, name, dtype=torch.int64).view(n, 1)
        for p, name in ((i, "i"), (j, "j"), (h, "h"), (w, "w"))
    )
    rows = torch.arange(height, device=x.device)
    cols = torch.arange(width, device=x.device)
    in_rows = (rows >= top) & (rows < top + tall)  # [N, H]
    in_cols = (cols >= left) & (cols < left + wide)  # [N, W]
    box = in_rows[:, None, :, None] & in_cols[:, None, None, :]
    value = torch.as_tensor(v, device=x.device)
    if value.dim() == 1 and value.shape[0] == n:
        value = value.view(n, 1, 1, 1)
    value = value.to(x.dtype)
    out = torch.where(box, value, x)
    if inplace:
        x.copy_(out)
        return img
    return _unbatch(out, single)


def _gaussian_kernels(size: int, sigma: Tensor) -> Tensor:
    """[N, size] normalised Gaussian taps, one row per sample's sigma (torchvision's formula:
    a softmax of -x^2 / (2 sigma^2) over x = -(size - 1) / 2 .. (size - 1) / 2)."""
    lim = (size - 1) / (2.0 * math.sqrt(2.0))
    x2 = torch.linspace(-lim, lim, steps=size, dtype=sigma.dtype, device=sigma.device).pow(2)
    return torch.softmax(-x2 / sigma.unsqueeze(1).pow(2), dim=1)


def gaussian_blur(
    img: Tensor,
    kernel_size: int | Sequence[int],
    sigma: float | Sequence[float] | Tensor | None = None,
) -> Tensor:
    """Gaussian blur with one kernel size ([width, height] or one odd number) for the batch and
    sigma per sample: a number, a pair (x, y), a tensor [N] or [N, 2]; None is torchvision's
    default 0.3 * ((k - 1) * 0.5 - 1) + 0.8 per axis. Reflect padding as torchvision. The 2-D
    kernel is applied as two 1-D passes (a depthwise conv over N * C planes): equal to
    torchvision's 2-D kernel up to float rounding (uint8 may differ by one level at a .5)."""
    sizes = [kernel_size, kernel_size] if isinstance(kernel_size, int) else list(kernel_size)
    if len(sizes) != 2 or any(k <= 0 or k % 2 == 0 for k in sizes):
        raise ValueError(f"kernel_size must be odd and positive, not {kernel_size}")
    x, single = _as_batch(img)
    n, channels, height, width = x.shape
    dtype = _work_dtype(x)
    if sigma is None:
        sigma = [k * 0.15 + 0.35 for k in sizes]
    if isinstance(sigma, Tensor):
        s = sigma.to(device=x.device, dtype=dtype)
        s = s.view(n, 1).expand(n, 2) if s.dim() <= 1 and s.numel() == n else s.expand(n, 2)
    else:
        pair = [float(sigma)] * 2 if isinstance(sigma, (int, float)) else [float(v) for v in sigma]
        if len(pair) == 1:
            pair = pair * 2
        if len(pair) != 2 or min(pair) <= 0:
            raise ValueError(f"sigma must be positive, one or two numbers, not {sigma}")
        s = torch.tensor(pair, dtype=dtype, device=x.device).expand(n, 2)
    if x.numel() == 0:
        return img.clone()
    kx = _gaussian_kernels(sizes[0], s[:, 0]).repeat_interleave(channels, dim=0)
    ky = _gaussian_kernels(sizes[1], s[:, 1]).repeat_interleave(channels, dim=0)
    planes = x.to(dtype).reshape(1, n * channels, height, width)
    pad = [sizes[0] // 2, sizes[0] // 2, sizes[1] // 2, sizes[1] // 2]
    planes = tnf.pad(planes, pad, mode="reflect")
    planes = tnf.conv2d(planes, kx.view(n * channels, 1, 1, sizes[0]), groups=n * channels)
    planes = tnf.conv2d(planes, ky.view(n * channels, 1, sizes[1], 1), groups=n * channels)
    out = planes.view(n, channels, height, width)
    if not x.is_floating_point():
        out = out.round_().to(x.dtype)
    return _unbatch(out, single)


def _pair(value: Param | Sequence[float], img: Tensor, name: str) -> tuple[Tensor, Tensor]:
    """A per-sample pair: a number (y = 0, as torchvision's shear), a pair of numbers, a
    tensor [N] (y = 0), [2] or [N, 2]; returned as two float64 tensors [N]."""
    n = img.shape[0]
    if isinstance(value, Tensor):
        t = value.to(device=img.device, dtype=torch.float64)
        if t.dim() == 0 or tuple(t.shape) == (n,):
            t = torch.stack([t.expand(n), torch.zeros(n, dtype=t.dtype, device=t.device)], 1)
        elif tuple(t.shape) in ((2,), (n, 2)):
            t = t.expand(n, 2)
        else:
            raise ValueError(f"{name} is a pair or one pair per sample [{n}, 2], not {t.shape}")
    else:
        pair = [float(value), 0.0] if isinstance(value, (int, float)) else list(value)
        if len(pair) != 2:
            raise ValueError(f"{name} is one number or a pair, not {value}")
        t = torch.tensor(pair, dtype=torch.float64, device=img.device).expand(n, 2)
    return t[:, 0], t[:, 1]


def _inverse_affine_matrix(
    center: tuple[float, float],
    angle: Tensor,
    translate: tuple[Tensor, Tensor],
    scale: Tensor,
    shear: tuple[Tensor, Tensor],
) -> Tensor:
    """torchvision's _get_inverse_affine_matrix, per sample: the [N, 2, 3] map from an output
    pixel to the input pixel it samples, M^-1 = C RSS^-1 C^-1 T^-1 (RSS: rotation, scale and
    shear about `center`, T: translation)."""
    rot, sx, sy = torch.deg2rad(angle), torch.deg2rad(shear[0]), torch.deg2rad(shear[1])
    cx, cy = center
    tx, ty = translate
    a = torch.cos(rot - sy) / torch.cos(sy)
    b = -(a * torch.tan(sx) + torch.sin(rot))
    c = torch.sin(rot - sy) / torch.cos(sy)
    d = torch.cos(rot) - c * torch.tan(sx)
    m0, m1, m3, m4 = d / scale, -b / scale, -c / scale, a / scale
    m2 = cx - m0 * (cx + tx) - m1 * (cy + ty)
    m5 = cy - m3 * (cx + tx) - m4 * (cy + ty)
    return torch.stack([m0, m1, m2, m3, m4, m5], dim=1).view(-1, 2, 3)


def _resample(
    x: Tensor,
    matrix: Tensor,
    size: tuple[int, int],
    interpolation: object,
    fill: float | Sequence[float] | None,
) -> Tensor:
    """Sample each image at its matrix's grid (torchvision's _affine_grid, an output of `size`
    (width, height) centred on the input's centre) with one grid_sample over the batch;
    pixels from outside the image are zero, or `fill` through torchvision's mask channel."""
    mode = str(getattr(interpolation, "value", interpolation)).lower()
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"interpolation is 'nearest' or 'bilinear', not {interpolation!r}")
    n, channels, height, width = x.shape
    out_w, out_h = size
    dtype = _work_dtype(x)
    theta = matrix.to(dtype)
    xs = torch.linspace((1.0 - out_w) * 0.5, (out_w - 1.0) * 0.5, out_w, device=x.device)
    ys = torch.linspace((1.0 - out_h) * 0.5, (out_h - 1.0) * 0.5, out_h, device=x.device)
    base = torch.ones(out_h, out_w, 3, dtype=dtype, device=x.device)
    base[..., 0] = xs
    base[..., 1] = ys.unsqueeze(1)
    scale = torch.tensor([0.5 * width, 0.5 * height], dtype=dtype, device=x.device)
    grid = torch.matmul(base.view(1, out_h * out_w, 3), theta.transpose(1, 2) / scale)
    values = x.to(dtype)
    if fill is not None:
        values = torch.cat([values, torch.ones_like(values[:, :1])], dim=1)
    grid = grid.view(n, out_h, out_w, 2)
    out = tnf.grid_sample(values, grid, mode=mode, padding_mode="zeros", align_corners=False)
    if fill is not None:
        out, mask = out[:, :-1], out[:, -1:]
        fills = [float(fill)] if isinstance(fill, (int, float)) else [float(f) for f in fill]
        if len(fills) not in (1, channels):
            raise ValueError(f"fill has {len(fills)} values, the images {channels} channels")
        color = torch.tensor(fills, dtype=dtype, device=x.device).view(1, -1, 1, 1)
        if mode == "nearest":
            out = torch.where(mask < 0.5, color, out)
        else:
            out = (out - color) * mask + color
    if not x.is_floating_point():
        out = out.round_().to(x.dtype)
    return out


def affine(
    img: Tensor,
    angle: Param,
    translate: Sequence[float] | Tensor,
    scale: Param,
    shear: Param | Sequence[float],
    interpolation: object = "nearest",
    fill: float | Sequence[float] | None = None,
    center: Sequence[float] | None = None,
) -> Tensor:
    """torchvision's affine, per sample: rotation by `angle` degrees (clockwise on screen, as
    torchvision), `translate` in pixels ((tx, ty), or [N, 2]), `scale`, `shear` in degrees
    (a number is an x shear; (sx, sy) or [N, 2]), about `center` (pixels; default the
    image's centre, one for the batch). `interpolation` is "nearest" or "bilinear" (or
    torchvision's InterpolationMode). fill=None leaves outside pixels zero without a mask,
    as torchvision; a fill (a number or one per channel) goes through torchvision's mask
    channel, which with bilinear also blends the edge pixels towards the fill."""
    x, single = _as_batch(img)
    n, _, height, width = x.shape
    _check(scale, "scale", 1e-12)
    centre = (0.0, 0.0) if center is None else (center[0] - width * 0.5, center[1] - height * 0.5)
    matrix = _inverse_affine_matrix(
        centre,
        _per_sample(angle, x, "angle", dtype=torch.float64).flatten(),
        _pair(translate, x, "translate"),
        _per_sample(scale, x, "scale", dtype=torch.float64).flatten(),
        _pair(shear, x, "shear"),
    )
    return _unbatch(_resample(x, matrix, (width, height), interpolation, fill), single)


def _expanded_size(matrix: Tensor, width: int, height: int) -> tuple[int, int]:
    """The (width, height) holding every sample's whole rotated image: torchvision's
    _compute_affine_output_size per sample, then the largest over the batch."""
    hw, hh = 0.5 * width, 0.5 * height
    corners = torch.tensor(
        [[-hw, -hh, 1.0], [-hw, hh, 1.0], [hw, hh, 1.0], [hw, -hh, 1.0]],
        dtype=torch.float32,
        device=matrix.device,
    )
    points = torch.matmul(corners, matrix.to(torch.float32).transpose(1, 2))  # [N, 4, 2]
    half = torch.tensor([hw, hh], device=matrix.device)
    low, high = points.amin(dim=1) + half, points.amax(dim=1) + half
    tol = 1e-4  # as torchvision: so that a 1e-15 above an integer does not round up
    size = (high / tol).trunc() * tol
    size = size.ceil() - ((low / tol).trunc() * tol).floor()
    out_w, out_h = size.amax(dim=0).tolist()
    return int(out_w), int(out_h)


def rotate(
    img: Tensor,
    angle: Param,
    interpolation: object = "nearest",
    expand: bool = False,
    center: Sequence[float] | None = None,
    fill: float | Sequence[float] | None = None,
) -> Tensor:
    """Rotation by `angle` degrees counter-clockwise about `center` (default the image's
    centre), as torchvision and PIL's Image.rotate. expand=True makes the output large
    enough for the whole image: with per-sample angles, the largest of the samples' sizes,
    each sample centred in it (torchvision would give each its own size). torchvision's exact
    paths for multiples of 90 degrees (torch.rot90) are not taken: the grid lands on the same
    pixel centres."""
    x, single = _as_batch(img)
    n, _, height, width = x.shape
    turn = _per_sample(angle, x, "angle", dtype=torch.float64).flatten().remainder(360.0)
    centre = (0.0, 0.0) if center is None else (center[0] - width * 0.5, center[1] - height * 0.5)
    zeros = torch.zeros_like(turn)
    matrix = _inverse_affine_matrix(
        centre, -turn, (zeros, zeros), torch.ones_like(turn), (zeros, zeros)
    )
    size = _expanded_size(matrix, width, height) if expand else (width, height)
    return _unbatch(_resample(x, matrix, size, interpolation, fill), single)
