"""decode="gpu"'s second half: the decoded regions of a whole batch cropped, resized, flipped,
placed and filled on the device in batch operations, byte for byte what the host path's resampler
(cpp/src/transform/resize.cc, Pillow's antialiased bilinear) makes of the same pixels.

Every image's filter taps are worked out as Pillow works them out (``precompute_coeffs``): in
float64, with the same operations in the same order, each torch operation rounding once as C does
without fused multiply-adds (so on the GPU too, whose kernels are one operation each here). They
are applied in Pillow's fixed point, 22 fraction bits summed in int32 with a uint8 intermediate
between the two passes, as one gather of every image's tap k per step k: integer arithmetic, the
same bytes on any device. Which pass goes first is Pillow 13's choice, per image.

An image arrives as the region of the scaled image its plan (the engine's RenderPlan, Image's
"plan" output) asked the decoder for; ``render`` takes a group of them padded to one size.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

PRECISION_BITS = 22
ROUNDING_HALF = 1 << (PRECISION_BITS - 1)

# The plan's columns (fields::render_plan_params).
DENOM = 0
DECODE = slice(1, 5)
VIEW = slice(5, 9)
BOX = slice(9, 13)
RECT = slice(13, 17)
HFLIP, VFLIP = 17, 18
PLAN_VALUES = 19


def tap_counts(plans: np.ndarray) -> tuple[int, int]:
    """The most filter taps any output pixel of these plans reads, across and down (Pillow's
    ksize, 2 ceil(support) + 1), worked out on the host so that no device value is waited for."""
    box, rect = plans[:, BOX], plans[:, RECT]

    def ksize(b0: np.ndarray, b1: np.ndarray, out: np.ndarray) -> int:
        span = b1.astype(np.float32) - b0.astype(np.float32)
        scale = span.astype(np.float64) / np.maximum(out, 1)
        return int(2 * math.ceil(float(np.maximum(scale, 1.0).max(initial=1.0))) + 1)

    return (ksize(box[:, 0], box[:, 2], rect[:, 2] - rect[:, 0]),
            ksize(box[:, 1], box[:, 3], rect[:, 3] - rect[:, 1]))  # fmt: skip


def horizontal_first(plans: np.ndarray) -> np.ndarray:
    """Per plan, whether the horizontal pass runs first: Pillow 13's rule, on the resampler's
    image (the view) and the rectangle it fills (transform::horizontal_first)."""
    view, rect = plans[:, VIEW], plans[:, RECT]
    dy = (view[:, 3] - view[:, 1]) - (rect[:, 3] - rect[:, 1])
    dx = (view[:, 2] - view[:, 0]) - (rect[:, 2] - rect[:, 0])
    return ~((dy > 0) & (dy > 2 * dx))


def axis_taps(plans: Tensor, axis: int, out_size: int, ksize: int) -> tuple[Tensor, Tensor]:
    """For each plan [N, 19] (float64, on the device) and each output position along `axis`
    (0: x, 1: y) of an output `out_size` long: the index of its first tap in the decoded region
    and its `ksize` fixed-point coefficients, int64 [N, out_size] and int32 [N, out_size, ksize]
    (zero past its taps, and everywhere outside the plan's rectangle)."""
    n = plans.shape[0]
    b0, b1 = plans[:, 9 + axis], plans[:, 11 + axis]
    r0, r1 = plans[:, 13 + axis], plans[:, 15 + axis]
    in_size = plans[:, 7 + axis] - plans[:, 5 + axis]  # the view's
    # region index = view coordinate + (view origin - decode origin)
    offset = (plans[:, 5 + axis] - plans[:, 1 + axis]).to(torch.int64)
    region = (plans[:, 3 + axis] - plans[:, 1 + axis]).to(torch.int64)
    length = r1 - r0
    # Pillow takes the box as C floats: edges rounded to float32, the width a float32 difference.
    in0 = b0.to(torch.float32).to(torch.float64)
    span = (b1.to(torch.float32) - b0.to(torch.float32)).to(torch.float64)
    scale = span / length.clamp(min=1)
    filterscale = torch.where(scale < 1.0, torch.ones_like(scale), scale)
    support = filterscale  # the bilinear filter's support is 1
    inv_filterscale = 1.0 / filterscale
    position = torch.arange(out_size, device=plans.device, dtype=torch.float64).expand(n, -1)
    slot = position - r0[:, None]  # within the rectangle, after the flip
    inside = (slot >= 0) & (slot < length[:, None])
    flip = plans[:, HFLIP if axis == 0 else VFLIP][:, None] != 0
    xx = torch.where(flip, (length[:, None] - 1) - slot, slot)
    center = in0[:, None] + (xx + 0.5) * scale[:, None]
    first = (center - support[:, None] + 0.5).trunc().clamp(min=0)
    last = torch.minimum((center + support[:, None] + 0.5).trunc(), in_size[:, None])
    count = torch.where(inside, (last - first).clamp(min=0), torch.zeros_like(last))
    taps = torch.arange(ksize, device=plans.device, dtype=torch.float64)
    x = ((first[..., None] + taps) - center[..., None] + 0.5) * inv_filterscale[:, None, None]
    x = x.abs()
    weights = torch.where(x < 1.0, 1.0 - x, torch.zeros_like(x))
    weights = torch.where(taps < count[..., None], weights, torch.zeros_like(weights))
    total = torch.zeros_like(center)
    for k in range(ksize):  # Pillow's order of summation
        total = total + weights[..., k]
    weights = torch.where(total[..., None] != 0, weights / total[..., None], weights)
    coeffs = (0.5 + weights * float(1 << PRECISION_BITS)).trunc().to(torch.int32)
    index = first.to(torch.int64) + offset[:, None]
    return index.clamp(torch.zeros_like(region[:, None]), (region - 1)[:, None]), coeffs


def _pass(pixels: Tensor, dim: int, index: Tensor, coeffs: Tensor) -> Tensor:
    """One resampling pass of uint8 [G, H, W, 3] along dim 1 (down) or 2 (across), to the
    length of `index` [G, L]; `coeffs` [G, L, K]."""
    shape = list(pixels.shape)
    shape[dim] = index.shape[1]
    acc = torch.full(shape, ROUNDING_HALF, dtype=torch.int32, device=pixels.device)
    # Every tap's index at once; a tap past the region's end (weight 0) reads its last pixel.
    ksize = coeffs.shape[2]
    taps = (index[..., None] + torch.arange(ksize, device=index.device)).clamp_(
        max=pixels.shape[dim] - 1
    )
    for k in range(ksize):
        tap = taps[..., k]
        if dim == 2:
            idx, weight = tap[:, None, :, None].expand(shape), coeffs[:, None, :, k, None]
        else:
            idx, weight = tap[:, :, None, None].expand(shape), coeffs[:, :, k, None, None]
        acc.addcmul_(pixels.gather(dim, idx), weight)
    return acc.bitwise_right_shift_(PRECISION_BITS).clamp_(0, 255).to(torch.uint8)


class BatchTaps:
    """Every image's taps across and down for a batch of plans, worked out once (about 220
    small operations on the device); the taps of a group of its images, rows [start, stop), are
    slices of them, cut to the group's own tap counts (the taps past an image's own count are
    zero, so the cut changes nothing)."""

    def __init__(self, plans: np.ndarray, height: int, width: int, device: torch.device):
        # Small host arrays go to the device without a copy that waits for the stream: a
        # blocking copy would make the host wait for every kernel queued before it (the
        # decode's too).
        self.plans = torch.from_numpy(np.ascontiguousarray(plans)).to(device, non_blocking=True)
        kx, ky = tap_counts(plans)
        self.ix, self.cx = axis_taps(self.plans, 0, width, kx)
        self.iy, self.cy = axis_taps(self.plans, 1, height, ky)

    def group(self, start: int, stop: int, plans: np.ndarray) -> tuple[Tensor, ...]:
        """(plans on the device, ix, cx, iy, cy) of rows [start, stop), whose plans these are."""
        kx, ky = tap_counts(plans)
        return (self.plans[start:stop], self.ix[start:stop], self.cx[start:stop, :, :kx],
                self.iy[start:stop], self.cy[start:stop, :, :ky])  # fmt: skip


def render(
    regions: Tensor,
    plans: np.ndarray,
    height: int,
    width: int,
    channels: int = 3,
    fill: int = 0,
    taps: tuple[Tensor, ...] | None = None,
) -> Tensor:
    """The output images, uint8 [G, height, width, channels], of G decoded regions (uint8
    [G, h, w, 3], each image's region, as its plan's decode rectangle, at its top left) under
    their plans (float64 [G, 19], on the host). `taps`: these plans' BatchTaps.group, when
    worked out for a whole batch already."""
    device = regions.device
    g = regions.shape[0]
    out = torch.empty((g, height, width, 3), dtype=torch.uint8, device=device)
    if taps is None:
        taps = BatchTaps(plans, height, width, device).group(0, g, plans)
    plans_d, ix, cx, iy, cy = taps
    across_first = horizontal_first(plans)
    for first in (True, False):
        chosen = np.flatnonzero(across_first == first)
        if chosen.size == 0:
            continue
        sel = torch.from_numpy(chosen).to(device, non_blocking=True)
        if chosen.size == g:
            part, pix, cix, piy, ciy = regions, ix, cx, iy, cy
        else:
            part, pix, cix, piy, ciy = (t.index_select(0, sel) for t in (regions, ix, cx, iy, cy))
        if first:
            done = _pass(_pass(part, 2, pix, cix), 1, piy, ciy)
        else:
            done = _pass(_pass(part, 1, piy, ciy), 2, pix, cix)
        if chosen.size == g:
            out = done
        else:
            out.index_copy_(0, sel, done)
    rect = plans_d[:, RECT]
    cols = torch.arange(width, device=device, dtype=torch.float64)
    rows = torch.arange(height, device=device, dtype=torch.float64)
    inside = (
        ((cols >= rect[:, 0, None]) & (cols < rect[:, 2, None]))[:, None, :]
        & ((rows >= rect[:, 1, None]) & (rows < rect[:, 3, None]))[:, :, None]
    )[..., None]
    if channels == 1:
        rgb = out.to(torch.int32)
        out = (
            (rgb[..., 0:1] * 19595 + rgb[..., 1:2] * 38470 + rgb[..., 2:3] * 7471 + 0x8000) >> 16
        ).to(torch.uint8)  # Pillow's RGB -> L
    return torch.where(inside, out, torch.full_like(out, fill))
