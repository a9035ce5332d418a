"""PIL's geometry and enhancers on batches, as timm's RandAugment runs them:
``Image.transform(size, AFFINE, matrix, resample, fillcolor=fill)`` with Pillow's NEAREST,
BILINEAR and BICUBIC filters, ``Image.rotate``'s matrix, ``ImageEnhance.Color``, ``Contrast``
and ``Sharpness`` and ``ImageOps.autocontrast``, each sample with its own magnitude, in torch
ops on the batch's device.

Bilinear and bicubic are Pillow's own float64 arithmetic (libImaging/Geometry.c's generic
transform with bilinear_filter32RGB and bicubic_filter32RGB), operation by operation, so a uint8
batch comes out byte for byte as Pillow makes each image (and as the worker form,
cpp/src/augment/pil_filters.cc, makes it): the source point of output pixel (x, y) is
(a x' + b y' + c, d x' + e y' + f) with x' = x + 0.5, y' = y + 0.5; outside the image it takes
the fill; inside, the pixel centres around it are blended (bilinear: two, then two; bicubic:
Pillow's cubic with a = -1 over four, then four, clipped), a neighbour past the edge being the
edge pixel, and the result truncated to a byte. A float batch takes the same blend without the
truncation (bicubic clipped to [0, 1]).

The enhancers are Pillow 13's arithmetic, so a uint8 batch comes out as Pillow makes each image
(and as the worker form, cpp/src/augment/augment.cc's pil_color and the like): a blend as
Image.blend computes it, degenerate + factor (image - degenerate) in float32 (the factor rounded
to float, the product and the sum each rounded), clipped to [0, 255] and truncated, with
Pillow's degenerate image: its luma (Convert.c: (19595 R + 38470 G + 7471 B + 2^15) >> 16) for
Color, that luma's mean rounded to a level (int(sum / count + 0.5)) for Contrast, the SMOOTH
filter ([[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13, rounded, the border kept) for Sharpness; and
autocontrast's table in float64 (int(v * scale + offset), scale = 255 / (hi - lo), offset =
-lo * scale, clipped; a channel with one value kept). A float batch (values in [0, 1]) takes
the same formulas without the rounding to levels, clipped to [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

RESAMPLE = ("nearest", "bilinear", "bicubic")


def rotation_matrices(degrees: Sequence[float], width: int, height: int) -> Tensor:
    """Image.rotate(degrees)'s affine matrix for each angle (counter-clockwise about the
    centre, size kept), worked out as Pillow's Python does: the angle modulo 360, its cosine
    and sine rounded to 15 places (Python's round), the centre's move. float64 [N, 6]."""
    rows = []
    cx, cy = width / 2.0, height / 2.0
    for d in degrees:
        angle = -math.radians(float(d) % 360.0)
        a, b = round(math.cos(angle), 15), round(math.sin(angle), 15)
        dd, e = round(-math.sin(angle), 15), round(math.cos(angle), 15)
        c = a * -cx + b * -cy + 0.0
        f = dd * -cx + e * -cy + 0.0
        rows.append([a, b, c + cx, dd, e, f + cy])
    return torch.tensor(rows, dtype=torch.float64).view(-1, 6)


def _fill_value(x: Tensor, fill: Any) -> Tensor:
    value = torch.as_tensor(0 if fill is None else fill, dtype=x.dtype, device=x.device)
    return value.view(1, -1, 1, 1) if value.dim() == 1 else value


def _cubic(v1: Tensor, v2: Tensor, v3: Tensor, v4: Tensor, d: Tensor) -> Tensor:
    """Pillow's BICUBIC macro: p2 = -v1 + v3, p3 = 2 (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3
    + v4, v2 + d (p2 + d (p3 + d p4)), each a float64 operation in Pillow's order (-v1 + v3 is
    v3 - v1, the same double)."""
    p2 = v3 - v1
    p3 = 2.0 * (v1 - v2) + v3 - v4
    p4 = (v2 - v1) - v3 + v4
    return v2 + d * (p2 + d * (p3 + d * p4))


def affine(x: Tensor, rows: Tensor, fill: Any, resample: str = "nearest") -> Tensor:
    """PIL's Image.transform(AFFINE, rows[i], resample, fillcolor=fill) on each image of `x`
    ([N, C, H, W], uint8 or float), `rows` float64 [N, 6]; outside, `fill` (None: 0)."""
    if resample not in RESAMPLE:
        raise ValueError(f"resample must be one of {RESAMPLE}, not {resample!r}")
    n, c, height, width = x.shape
    dev = x.device
    xs = (torch.arange(width, dtype=torch.float64, device=dev) + 0.5).view(1, 1, -1)
    ys = (torch.arange(height, dtype=torch.float64, device=dev) + 0.5).view(1, -1, 1)
    a, b, cc, d, e, f = (r.view(n, 1, 1) for r in rows.to(dev, torch.float64).unbind(1))
    u = a * xs + b * ys + cc  # Pillow's affine_transform: (a x' + b y') + c
    v = d * xs + e * ys + f
    inside = ((u >= 0) & (u < width) & (v >= 0) & (v < height)).view(n, 1, height, width)
    flat = x.reshape(n, c, -1)
    if resample == "nearest":
        at = v.floor().clamp(0, height - 1).long() * width + u.floor().clamp(0, width - 1).long()
        out = flat.gather(2, at.view(n, 1, -1).expand(n, c, -1)).view(n, c, height, width)
        return torch.where(inside, out, _fill_value(x, fill))
    su, sv = u - 0.5, v - 0.5
    fx, fy = su.floor(), sv.floor()
    dx, dy = (su - fx).view(n, 1, height, width), (sv - fy).view(n, 1, height, width)
    # each tap's row and column clipped to the image, worked out once (outside points are
    # clamped too: their values are not used)
    first = -1 if resample == "bicubic" else 0
    taps = range(first, first + (4 if resample == "bicubic" else 2))
    ix = fx.clamp(-2, width + 1).long()
    iy = fy.clamp(-2, height + 1).long()
    row_at = [(iy + k).clamp_(0, height - 1).mul_(width) for k in taps]
    col_at = [(ix + j).clamp_(0, width - 1) for j in taps]
    values = flat.to(torch.float64)

    def tap(k: int, j: int) -> Tensor:
        at = (row_at[k] + col_at[j]).view(n, 1, -1).expand(n, c, -1)
        return values.gather(2, at).view(n, c, height, width)

    if resample == "bilinear":
        a00, a01 = tap(0, 0), tap(0, 1)
        v1 = a00 + (a01 - a00) * dx
        a10, a11 = tap(1, 0), tap(1, 1)
        v2 = a10 + (a11 - a10) * dx
        out64 = v1 + (v2 - v1) * dy
    else:
        r1, r2, r3, r4 = (_cubic(tap(k, 0), tap(k, 1), tap(k, 2), tap(k, 3), dx)
                          for k in range(4))  # fmt: skip
        out64 = _cubic(r1, r2, r3, r4, dy).clamp(0.0, 1.0 if x.is_floating_point() else 255.0)
    out = out64.to(x.dtype) if x.is_floating_point() else out64.trunc().to(x.dtype)
    return torch.where(inside, out, _fill_value(x, fill))


def rotate(x: Tensor, degrees: Sequence[float], fill: Any, resample: str = "nearest") -> Tensor:
    """PIL's Image.rotate(degrees[i], resample, fillcolor=fill) on each image of `x`."""
    _, _, height, width = x.shape
    return affine(x, rotation_matrices(degrees, width, height), fill, resample)


# --- Pillow's enhancers ---------------------------------------------------------------------------


def _factors(x: Tensor, factor: Any) -> Tensor:
    """Each sample's factor [N, 1, 1, 1] as Image.blend takes it: rounded once to float32 (or to
    the batch's float dtype)."""
    dtype = x.dtype if x.is_floating_point() else torch.float32
    f = torch.as_tensor(factor, dtype=torch.float64, device=x.device)
    return f.expand(x.shape[0]).to(dtype).view(-1, 1, 1, 1)


def _blend(degenerate: Tensor, x: Tensor, alpha: Tensor) -> Tensor:
    """Image.blend(degenerate, image, alpha): degenerate + alpha (image - degenerate), a product
    and then a sum (two torch ops: no fused multiply-add), clipped, truncated for uint8."""
    work = x.to(alpha.dtype)
    out = degenerate + alpha * (work - degenerate)
    if x.is_floating_point():
        return out.clamp_(0.0, 1.0)
    return out.clamp_(0.0, 255.0).to(x.dtype)  # the cast truncates


def _luma(x: Tensor) -> Tensor:
    """Pillow's luma [N, 1, H, W]: Convert.c's (19595 R + 38470 G + 7471 B + 2^15) >> 16 on
    uint8 (int32 on the device), the same weights unrounded on floats."""
    if x.shape[1] == 1:
        return x.to(torch.int32) if not x.is_floating_point() else x
    if x.is_floating_point():
        r, g, b = x.unbind(1)
        return ((r * 19595 + g * 38470 + b * 7471) / 65536.0).unsqueeze(1)
    r, g, b = x.to(torch.int32).unbind(1)
    return ((r * 19595 + g * 38470 + b * 7471 + 32768) >> 16).unsqueeze(1)


def _check_channels(x: Tensor, op: str) -> None:
    if x.dim() != 4 or x.shape[1] not in (1, 3):
        raise TypeError(f"{op} takes [N, 1 or 3, H, W] images, not {tuple(x.shape)}")


def color(x: Tensor, factor: Any) -> Tensor:
    """ImageEnhance.Color(image).enhance(factor[i]) on each image of `x` ([N, C, H, W]): a blend
    with the image's Pillow luma (0 grey, 1 the image); a 1-channel image is kept, as Pillow's
    L image."""
    _check_channels(x, "color")
    if x.shape[1] == 1:
        return x.clone()
    alpha = _factors(x, factor)
    return _blend(_luma(x).to(alpha.dtype), x, alpha)


def contrast(x: Tensor, factor: Any) -> Tensor:
    """ImageEnhance.Contrast(image).enhance(factor[i]): a blend with the mean of the image's
    Pillow luma, rounded to a level on uint8 (int(sum / count + 0.5), in float64)."""
    _check_channels(x, "contrast")
    alpha = _factors(x, factor)
    luma = _luma(x)
    if x.is_floating_point():
        mean = luma.mean(dim=(1, 2, 3), keepdim=True)
    else:
        total = luma.sum(dim=(1, 2, 3), keepdim=True, dtype=torch.int64).to(torch.float64)
        # a true division (by a number, CUDA's kernel multiplies by its reciprocal, which can
        # take a mean of exactly k + 1/2 below it)
        count = torch.full_like(total, luma.shape[2] * luma.shape[3])
        mean = (total / count + 0.5).floor()  # int() of a positive value
    return _blend(mean.to(alpha.dtype), x, alpha)


def sharpness(x: Tensor, factor: Any) -> Tensor:
    """ImageEnhance.Sharpness(image).enhance(factor[i]): a blend with the image smoothed by
    Pillow's SMOOTH filter (k / 13 rounded to a level on uint8, k the sum under [[1, 1, 1],
    [1, 5, 1], [1, 1, 1]]; Pillow's float32 taps round the same: k / 13 is never within 1 / 26
    of a half), its border rows and columns the image's own; images under 3 x 3 are kept."""
    _check_channels(x, "sharpness")
    height, width = x.shape[2], x.shape[3]
    if height < 3 or width < 3 or x.numel() == 0:
        return x.clone()
    alpha = _factors(x, factor)
    v = x.to(torch.float64 if x.is_floating_point() else torch.int32)
    k = 4 * v[:, :, 1:-1, 1:-1]
    for dy in range(3):
        for dx in range(3):
            k = k + v[:, :, dy : height - 2 + dy, dx : width - 2 + dx]
    degenerate = v.to(alpha.dtype)  # a copy: the border stays the image's
    if x.is_floating_point():
        degenerate[:, :, 1:-1, 1:-1] = (k / 13.0).to(alpha.dtype)
    else:
        degenerate[:, :, 1:-1, 1:-1] = torch.div(2 * k + 13, 26, rounding_mode="floor").to(
            alpha.dtype
        )
    return _blend(degenerate, x, alpha)


def autocontrast(x: Tensor) -> Tensor:
    """ImageOps.autocontrast(image) on each image: each channel's [lo, hi] stretched to the full
    range through Pillow's table (uint8: int(v * scale + offset) in float64, scale = 255 /
    (hi - lo), offset = -lo * scale, clipped); a channel with one value is kept."""
    _check_channels(x, "autocontrast")
    if x.numel() == 0:
        return x.clone()
    v = x.to(torch.float64)
    lo = v.amin(dim=(2, 3), keepdim=True)
    hi = v.amax(dim=(2, 3), keepdim=True)
    flat = hi <= lo
    span = torch.where(flat, torch.ones_like(hi), hi - lo)
    if x.is_floating_point():
        out = ((v - lo) / span).clamp_(0.0, 1.0).to(x.dtype)
    else:
        scale = torch.full_like(span, 255.0) / span  # 255.0 / span is span's reciprocal x 255
        offset = -lo * scale
        out = (v * scale + offset).trunc_().clamp_(0.0, 255.0).to(x.dtype)
    return torch.where(flat, x, out)
