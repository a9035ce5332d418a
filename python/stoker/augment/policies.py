"""Automatic augmentation policies on batches: torchvision's RandAugment and TrivialAugmentWide
(transforms.v2: their op lists, magnitude bins and signs) and timm's RandAugment
(``rand-m9-mstd0.5``: its op list, level mapping, per-op probability and magnitude noise).

Each sample draws its own ops and magnitudes from the keyed draws; the batch is then processed
op by op: the samples that drew an op are gathered and transformed together by the functional
op (stoker.augment.functional) with their own magnitudes, so an op runs once a round whatever
the batch size, and a sample's result does not depend on the rest of its batch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from . import functional as F
from .keyed import KeyedDraws, stream_of
from .ops import BatchOp

# op(images, magnitudes [n], fill) -> images, for the samples that drew it
Apply = Callable[[Tensor, Tensor, Any], Tensor]


def _shear_x(x: Tensor, m: Tensor, fill: Any) -> Tensor:
    shear = torch.stack([torch.rad2deg(torch.atan(m)), torch.zeros_like(m)], dim=1)
    return F.affine(x, 0.0, [0.0, 0.0], 1.0, shear, fill=fill, center=[0.0, 0.0])


def _shear_y(x: Tensor, m: Tensor, fill: Any) -> Tensor:
    shear = torch.stack([torch.zeros_like(m), torch.rad2deg(torch.atan(m))], dim=1)
    return F.affine(x, 0.0, [0.0, 0.0], 1.0, shear, fill=fill, center=[0.0, 0.0])


def _translate(axis: int) -> Apply:
    def apply(x: Tensor, m: Tensor, fill: Any) -> Tensor:
        t = torch.zeros(len(m), 2, dtype=m.dtype, device=m.device)
        t[:, axis] = torch.trunc(m)  # torchvision: int(magnitude)
        return F.affine(x, 0.0, t, 1.0, [0.0, 0.0], fill=fill)

    return apply


def _solarize(x: Tensor, m: Tensor, fill: Any) -> Tensor:
    bound = 1.0 if x.is_floating_point() else 255.0
    return F.solarize(x, bound * m)  # transforms.v2: magnitudes in [0, 1] of the dtype's range


# torchvision.transforms.v2's ops: name -> (apply, magnitudes(num_bins, height, width), signed)
TORCHVISION_OPS: dict[str, tuple[Apply, Callable[[int, int, int], Tensor | None], bool]] = {
    "Identity": (lambda x, m, f: x, lambda b, h, w: None, False),
    "ShearX": (_shear_x, lambda b, h, w: torch.linspace(0.0, 0.3, b), True),
    "ShearY": (_shear_y, lambda b, h, w: torch.linspace(0.0, 0.3, b), True),
    "TranslateX": (_translate(0), lambda b, h, w: torch.linspace(0.0, 150.0 / 331.0 * w, b), True),
    "TranslateY": (_translate(1), lambda b, h, w: torch.linspace(0.0, 150.0 / 331.0 * h, b), True),
    "Rotate": (
        lambda x, m, f: F.rotate(x, m, fill=f),
        lambda b, h, w: torch.linspace(0, 30, b),
        True,
    ),  # fmt: skip
    "Brightness": (
        lambda x, m, f: F.adjust_brightness(x, 1.0 + m),
        lambda b, h, w: torch.linspace(0.0, 0.9, b),
        True,
    ),  # fmt: skip
    "Color": (
        lambda x, m, f: F.adjust_saturation(x, 1.0 + m),
        lambda b, h, w: torch.linspace(0.0, 0.9, b),
        True,
    ),  # fmt: skip
    "Contrast": (
        lambda x, m, f: F.adjust_contrast(x, 1.0 + m),
        lambda b, h, w: torch.linspace(0.0, 0.9, b),
        True,
    ),  # fmt: skip
    "Sharpness": (
        lambda x, m, f: F.adjust_sharpness(x, 1.0 + m),
        lambda b, h, w: torch.linspace(0.0, 0.9, b),
        True,
    ),  # fmt: skip
    "Posterize": (
        lambda x, m, f: F.posterize(x, m.long()),
        lambda b, h, w: 8 - (torch.arange(b) / ((b - 1) / 4)).round().int(),
        False,
    ),  # fmt: skip
    "Solarize": (_solarize, lambda b, h, w: torch.linspace(1.0, 0.0, b), False),
    "AutoContrast": (lambda x, m, f: F.autocontrast(x), lambda b, h, w: None, False),
    "Equalize": (lambda x, m, f: F.equalize(x), lambda b, h, w: None, False),
}

# TrivialAugmentWide's wider ranges (and its posterize down to 2 bits)
TRIVIAL_WIDE_SPACE: dict[str, Callable[[int, int, int], Tensor | None]] = {
    "Identity": lambda b, h, w: None,
    "ShearX": lambda b, h, w: torch.linspace(0.0, 0.99, b),
    "ShearY": lambda b, h, w: torch.linspace(0.0, 0.99, b),
    "TranslateX": lambda b, h, w: torch.linspace(0.0, 32.0, b),
    "TranslateY": lambda b, h, w: torch.linspace(0.0, 32.0, b),
    "Rotate": lambda b, h, w: torch.linspace(0.0, 135.0, b),
    "Brightness": lambda b, h, w: torch.linspace(0.0, 0.99, b),
    "Color": lambda b, h, w: torch.linspace(0.0, 0.99, b),
    "Contrast": lambda b, h, w: torch.linspace(0.0, 0.99, b),
    "Sharpness": lambda b, h, w: torch.linspace(0.0, 0.99, b),
    "Posterize": lambda b, h, w: 8 - (torch.arange(b) / ((b - 1) / 6)).round().int(),
    "Solarize": lambda b, h, w: torch.linspace(1.0, 0.0, b),
    "AutoContrast": lambda b, h, w: None,
    "Equalize": lambda b, h, w: None,
}


def _run(
    images: Tensor,
    ops: Sequence[Apply],
    op_index: Tensor,
    magnitude: Tensor,
    fill: Any,
    active: Tensor | None = None,
) -> Tensor:
    """One round: each sample's drawn op with its magnitude, op by op over the samples that
    drew it (`active` False: the sample skips this round)."""
    out = images
    copied = False
    for k, apply in enumerate(ops):
        chosen = op_index == k
        if active is not None:
            chosen &= active
        rows = chosen.nonzero().flatten()
        if not rows.numel():
            continue
        if not copied:
            out, copied = images.clone(), True
        out[rows] = apply(out[rows], magnitude[rows], fill)
    return out


def _check_fill(fill: Any) -> Any:
    if fill is None or isinstance(fill, (int, float)):
        return fill
    return [float(v) for v in fill]


def _torchvision_step(table: Tensor, fill: Any, streams: list[tuple[int, int, int]]) -> Any:
    """The worker form of RandAugment and TrivialAugmentWide: their magnitudes [14, bins]."""
    if fill is None:
        outside, values = False, (0, 0, 0)
    else:
        raw = fill if isinstance(fill, list) else [fill] * 3
        if len(raw) != 3 or not all(0 <= v <= 255 for v in raw):
            return None
        # the batch op rounds the filled float pixels half to even into uint8
        rounded = [int(torch.tensor(float(v)).round()) for v in raw]
        outside, values = True, (rounded[0], rounded[1], rounded[2])
    from .. import _core

    step = _core.AugmentStep()
    step.kind = _core.AugmentStepKind.torchvision_augment
    o = step.torchvision_augment
    o.bins = table.shape[1]
    o.magnitudes = table.to(torch.float64).flatten().tolist()
    o.fill_outside, o.fill, o.streams = outside, values, streams
    return step


def _rows(height: int, width: int, names: list[str], bins: int, space: Any) -> Tensor:
    """Each op's magnitudes over `bins` bins (0 where it has none): float64 [14, bins]."""
    table = torch.zeros(len(names), bins, dtype=torch.float64)
    for k, name in enumerate(names):
        values = space(name)(bins, height, width)
        if values is not None:
            table[k] = values.to(torch.float64)
    return table


class RandAugment(BatchOp):
    """torchvision's RandAugment: `num_ops` rounds, each sample drawing one of the 14 ops
    uniformly and, for signed ops, a sign; the magnitude is the `magnitude`-th of
    `num_magnitude_bins`. Nearest-neighbour geometry, outside pixels `fill` (None: black)."""

    name = "rand_augment"

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: int = 9,
        num_magnitude_bins: int = 31,
        fill: float | Sequence[float] | None = None,
    ):
        if not 0 <= magnitude < num_magnitude_bins:
            raise ValueError(f"magnitude must be in [0, {num_magnitude_bins}), not {magnitude}")
        self.num_ops, self.magnitude = int(num_ops), int(magnitude)
        self.num_magnitude_bins, self.fill = int(num_magnitude_bins), _check_fill(fill)

    def _engine_step(self, prefix: str, height: int, width: int) -> Any:
        names = list(TORCHVISION_OPS)
        bins = self.num_magnitude_bins
        table = _rows(height, width, names, bins, lambda n: TORCHVISION_OPS[n][1])
        table = table[:, self.magnitude : self.magnitude + 1]
        streams = [
            (stream_of(f"{prefix}{self.name}.op{r}"), stream_of(f"{prefix}{self.name}.sign{r}"), 0)
            for r in range(self.num_ops)
        ]
        return _torchvision_step(table, self.fill, streams)

    def apply(self, images: Tensor, draws: KeyedDraws) -> Tensor:
        names = list(TORCHVISION_OPS)
        _, _, height, width = images.shape
        # Each op's magnitude at this policy's bin, and whether it takes a random sign.
        table, signed = [], []
        for name in names:
            _, space, is_signed = TORCHVISION_OPS[name]
            values = space(self.num_magnitude_bins, height, width)
            table.append(0.0 if values is None else float(values[self.magnitude]))
            signed.append(is_signed)
        magnitudes = torch.tensor(table, dtype=torch.float64)
        signs = torch.tensor(signed)
        ops = [TORCHVISION_OPS[n][0] for n in names]
        for r in range(self.num_ops):
            op_index = draws.integers(f"{self.name}.op{r}", len(names)).cpu()
            negate = draws.bernoulli(f"{self.name}.sign{r}", 0.5).cpu() & signs[op_index]
            m = torch.where(negate, -magnitudes[op_index], magnitudes[op_index])
            images = _run(images, ops, op_index.to(images.device), m.to(images.device),
                          self.fill)  # fmt: skip
        return images


class TrivialAugmentWide(BatchOp):
    """torchvision's TrivialAugmentWide: one op a sample, its magnitude a uniformly drawn bin
    of the wide ranges, a random sign for signed ops."""

    name = "trivial_augment_wide"

    def __init__(self, num_magnitude_bins: int = 31, fill: float | Sequence[float] | None = None):
        self.num_magnitude_bins, self.fill = int(num_magnitude_bins), _check_fill(fill)

    def _engine_step(self, prefix: str, height: int, width: int) -> Any:
        names = list(TRIVIAL_WIDE_SPACE)
        table = _rows(height, width, names, self.num_magnitude_bins, TRIVIAL_WIDE_SPACE.get)
        streams = [tuple(stream_of(f"{prefix}{self.name}.{d}") for d in ("op", "sign", "bin"))]
        return _torchvision_step(table, self.fill, streams)  # type: ignore[arg-type]

    def apply(self, images: Tensor, draws: KeyedDraws) -> Tensor:
        names = list(TRIVIAL_WIDE_SPACE)
        _, _, height, width = images.shape
        bins = self.num_magnitude_bins
        table = torch.zeros(len(names), bins, dtype=torch.float64)
        for k, name in enumerate(names):
            values = TRIVIAL_WIDE_SPACE[name](bins, height, width)
            if values is not None:
                table[k] = values.to(torch.float64)
        signs = torch.tensor([TORCHVISION_OPS[n][2] for n in names])
        op_index = draws.integers(f"{self.name}.op", len(names)).cpu()
        which = draws.integers(f"{self.name}.bin", bins).cpu()
        negate = draws.bernoulli(f"{self.name}.sign", 0.5).cpu() & signs[op_index]
        m = table[op_index, which]
        m = torch.where(negate, -m, m)
        ops = [TORCHVISION_OPS[n][0] for n in names]
        return _run(images, ops, op_index.to(images.device), m.to(images.device), self.fill)


# --- timm's RandAugment -----------------------------------------------------------------------

_LEVEL_DENOM = 10.0


def _pil_affine(x: Tensor, rows: Tensor, fill: Any) -> Tensor:
    """PIL's Image.transform(AFFINE, (a, b, c, d, e, f), NEAREST) per sample, as timm's PIL ops
    run it: output pixel (x, y) takes the input pixel under (a x' + b y' + c, d x' + e y' + f)
    at its centre (x' = x + 0.5), floored; outside the image, `fill`. `rows`: [N, 6]."""
    n, c, height, width = x.shape
    dev = x.device
    xs = torch.arange(width, dtype=torch.float64, device=dev) + 0.5
    ys = torch.arange(height, dtype=torch.float64, device=dev) + 0.5
    a, b, cc, d, e, f = (r.view(n, 1, 1) for r in rows.to(dev).unbind(1))
    ix = torch.floor(a * xs.view(1, 1, -1) + b * ys.view(1, -1, 1) + cc).long()
    iy = torch.floor(d * xs.view(1, 1, -1) + e * ys.view(1, -1, 1) + f).long()
    inside = (ix >= 0) & (ix < width) & (iy >= 0) & (iy < height)
    where = (iy.clamp(0, height - 1) * width + ix.clamp(0, width - 1)).view(n, 1, -1)
    out = x.reshape(n, c, -1).gather(2, where.expand(n, c, -1)).view(n, c, height, width)
    value = torch.as_tensor(0 if fill is None else fill, dtype=x.dtype, device=dev)
    value = value.view(1, -1, 1, 1) if value.dim() == 1 else value
    return torch.where(inside.view(n, 1, height, width), out, value)


def _rotate_pil(x: Tensor, degrees: Tensor, fill: Any) -> Tensor:
    """PIL's Image.rotate(degrees, NEAREST, fillcolor=fill) (counter-clockwise, about the
    centre, size kept): its matrix, rounded to 15 places as PIL does."""
    _, _, height, width = x.shape
    angle = -torch.deg2rad(degrees.to(torch.float64))
    cos, sin = (
        torch.round(torch.cos(angle), decimals=15),
        torch.round(torch.sin(angle), decimals=15),
    )
    cx, cy = width / 2.0, height / 2.0
    rows = torch.stack([cos, sin, -cos * cx - sin * cy + cx,
                        -sin, cos, sin * cx - cos * cy + cy], dim=1)  # fmt: skip
    return _pil_affine(x, rows, fill)


def _shear_pil(axis: int) -> Apply:
    def apply(x: Tensor, level: Tensor, fill: Any) -> Tensor:
        rows = torch.zeros(len(level), 6, dtype=torch.float64, device=level.device)
        rows[:, 0] = rows[:, 4] = 1.0
        rows[:, 1 if axis == 0 else 3] = level
        return _pil_affine(x, rows, fill)

    return apply


def _translate_pil(axis: int, size_of: Callable[[Tensor], int]) -> Apply:
    def apply(x: Tensor, level: Tensor, fill: Any) -> Tensor:
        rows = torch.zeros(len(level), 6, dtype=torch.float64, device=level.device)
        rows[:, 0] = rows[:, 4] = 1.0
        rows[:, 2 if axis == 0 else 5] = level * size_of(x)
        return _pil_affine(x, rows, fill)

    return apply


def _solarize_add(x: Tensor, add: Tensor, fill: Any) -> Tensor:
    """timm's solarize_add: pixels below 128 raised by `add` (clipped at 255)."""
    bound = 1.0 if x.is_floating_point() else 255.0
    threshold = 128.0 / 255.0 * bound
    a = add.to(torch.float32).view(-1, 1, 1, 1) * (bound / 255.0)
    raised = (x.to(torch.float32) + a).clamp(max=bound).to(x.dtype)
    return torch.where(x < threshold, raised, x)


def _posterize_timm(x: Tensor, bits: Tensor, fill: Any) -> Tensor:
    return F.posterize(x, bits.clamp(0, 8).long())


# name -> (apply, level -> magnitude (level in [0, 10]), signed): timm's _RAND_TRANSFORMS with
# its LEVEL_TO_ARG functions (auto_augment.py).
TIMM_RAND_OPS: dict[str, tuple[Apply, Callable[[Tensor], Tensor], bool]] = {
    "AutoContrast": (lambda x, m, f: F.autocontrast(x), lambda lv: lv, False),
    "Equalize": (lambda x, m, f: F.equalize(x), lambda lv: lv, False),
    "Invert": (lambda x, m, f: F.invert(x), lambda lv: lv, False),
    "Rotate": (_rotate_pil, lambda lv: lv / _LEVEL_DENOM * 30.0, True),
    "Posterize": (_posterize_timm, lambda lv: torch.trunc(lv / _LEVEL_DENOM * 4), False),
    "Solarize": (
        lambda x, m, f: F.solarize(x, m / 255.0 if x.is_floating_point() else m),
        lambda lv: torch.trunc(lv / _LEVEL_DENOM * 256),
        False,
    ),  # fmt: skip
    "SolarizeAdd": (_solarize_add, lambda lv: torch.trunc(lv / _LEVEL_DENOM * 110), False),
    "Color": (
        lambda x, m, f: F.adjust_saturation(x, m),
        lambda lv: lv / _LEVEL_DENOM * 1.8 + 0.1,
        False,
    ),  # fmt: skip
    "Contrast": (
        lambda x, m, f: F.adjust_contrast(x, m),
        lambda lv: lv / _LEVEL_DENOM * 1.8 + 0.1,
        False,
    ),  # fmt: skip
    "Brightness": (
        lambda x, m, f: F.adjust_brightness(x, m),
        lambda lv: lv / _LEVEL_DENOM * 1.8 + 0.1,
        False,
    ),  # fmt: skip
    "Sharpness": (
        lambda x, m, f: F.adjust_sharpness(x, m),
        lambda lv: lv / _LEVEL_DENOM * 1.8 + 0.1,
        False,
    ),  # fmt: skip
    "ShearX": (_shear_pil(0), lambda lv: lv / _LEVEL_DENOM * 0.3, True),
    "ShearY": (_shear_pil(1), lambda lv: lv / _LEVEL_DENOM * 0.3, True),
    "TranslateXRel": (
        _translate_pil(0, lambda x: x.shape[3]),
        lambda lv: lv / _LEVEL_DENOM * 0.45,
        True,
    ),  # fmt: skip
    "TranslateYRel": (
        _translate_pil(1, lambda x: x.shape[2]),
        lambda lv: lv / _LEVEL_DENOM * 0.45,
        True,
    ),  # fmt: skip
}

IMAGENET_MEAN_FILL = (124, 116, 104)  # timm's img_mean hparam: round(255 x ImageNet's mean)


class TimmRandAugment(BatchOp):
    """timm's RandAugment (``rand_augment_transform("rand-m9-mstd0.5", hparams)``): `num_layers`
    ops a sample drawn uniformly (with replacement) from timm's 15, each applied with
    probability `prob` (0.5) at magnitude N(magnitude, magnitude_std) clipped to [0, 10] (a
    new draw per op), signed ops negated with probability 1/2; geometry is PIL's transform
    filled with the ImageNet mean (``create_transform``'s ``img_mean``), sampled nearest: timm
    itself samples bilinear or bicubic (at random, or ``create_transform``'s interpolation),
    which stoker does not compute yet."""

    name = "timm_rand_augment"

    def __init__(
        self,
        magnitude: float = 9,
        num_layers: int = 2,
        magnitude_std: float = 0.5,
        prob: float = 0.5,
        magnitude_max: float = 10.0,
        fill: float | Sequence[float] | None = IMAGENET_MEAN_FILL,
    ):
        self.magnitude, self.num_layers = float(magnitude), int(num_layers)
        self.magnitude_std, self.prob = float(magnitude_std), float(prob)
        self.magnitude_max, self.fill = float(magnitude_max), _check_fill(fill)

    @classmethod
    def from_config(cls, config: str, **kwargs: Any) -> TimmRandAugment:
        """timm's config string: ``rand-m9-mstd0.5`` (``-n2`` layers, ``-mmax10``, ``-p0.5``)."""
        parts = config.split("-")
        if parts[0] != "rand":
            raise ValueError(f"a RandAugment config starts with 'rand', not {config!r}")
        options: dict[str, Any] = {}
        for part in parts[1:]:
            key, value = re.match(r"([a-z]+)(.*)", part).groups()  # type: ignore[union-attr]
            if key == "m":
                options["magnitude"] = float(value)
            elif key == "n":
                options["num_layers"] = int(value)
            elif key == "mstd":
                options["magnitude_std"] = float(value)
            elif key == "mmax":
                options["magnitude_max"] = float(value)
            elif key == "p":
                options["prob"] = float(value)
            else:
                raise ValueError(f"{config!r}: {part!r} is not a RandAugment option stoker knows")
        return cls(**{**options, **kwargs})

    def _engine_step(self, prefix: str, height: int, width: int) -> Any:
        if self.fill is None:
            fill = (0, 0, 0)
        else:
            values = self.fill if isinstance(self.fill, list) else [self.fill] * 3
            if len(values) != 3 or not all(0 <= v <= 255 for v in values):
                return None
            fill = (int(values[0]), int(values[1]), int(values[2]))  # the batch op's uint8 cast
        from .. import _core

        step = _core.AugmentStep()
        step.kind = _core.AugmentStepKind.timm_rand_augment
        o = step.timm_rand_augment
        o.magnitude, o.magnitude_std, o.prob = self.magnitude, self.magnitude_std, self.prob
        o.magnitude_max, o.fill = self.magnitude_max, fill
        o.streams = [
            tuple(
                stream_of(f"{prefix}{self.name}.{d}{r}") for d in ("op", "apply", "level", "sign")
            )
            for r in range(self.num_layers)
        ]
        return step

    def apply(self, images: Tensor, draws: KeyedDraws) -> Tensor:
        names = list(TIMM_RAND_OPS)
        signs = torch.tensor([TIMM_RAND_OPS[n][2] for n in names])
        ops = [TIMM_RAND_OPS[n][0] for n in names]
        fill = self.fill
        if fill is not None and images.is_floating_point():
            fill = [v / 255.0 for v in (fill if isinstance(fill, list) else [fill])]
        for r in range(self.num_layers):
            op_index = draws.integers(f"{self.name}.op{r}", len(names)).cpu()
            active = draws.bernoulli(f"{self.name}.apply{r}", self.prob).cpu()
            level = torch.full((len(op_index),), self.magnitude, dtype=torch.float64)
            if self.magnitude_std > 0:
                u1, u2 = draws.uniform(f"{self.name}.level{r}", size=2).cpu().double().unbind(1)
                normal = torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos(2 * math.pi * u2)
                level = level + self.magnitude_std * normal
            level = level.clamp(0.0, self.magnitude_max)
            m = torch.zeros_like(level)
            for k, name in enumerate(names):
                rows = op_index == k
                if rows.any():
                    m[rows] = TIMM_RAND_OPS[name][1](level[rows]).to(torch.float64)
            negate = draws.bernoulli(f"{self.name}.sign{r}", 0.5).cpu() & signs[op_index]
            m = torch.where(negate, -m, m)
            images = _run(images, ops, op_index.to(images.device), m.to(images.device), fill,
                          active.to(images.device))  # fmt: skip
        return images
