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
from . import pil
from .keyed import KeyedDraws, stream_of
from .ops import BatchOp, DrawnOp

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


def _torchvision_drawn(name: str, magnitude: float, bin: int | None = None) -> DrawnOp:
    none = name in ("Identity", "AutoContrast", "Equalize")
    value = None if none else (int(magnitude) if name == "Posterize" else magnitude)
    return DrawnOp(name, value, bin=bin)


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

    def _rounds(self, draws: KeyedDraws, height: int, width: int) -> list[tuple[Tensor, Tensor]]:
        """Each round's (op index, signed magnitude) per sample, on the CPU."""
        names = list(TORCHVISION_OPS)
        # Each op's magnitude at this policy's bin, and whether it takes a random sign.
        table, signed = [], []
        for name in names:
            _, space, is_signed = TORCHVISION_OPS[name]
            values = space(self.num_magnitude_bins, height, width)
            table.append(0.0 if values is None else float(values[self.magnitude]))
            signed.append(is_signed)
        magnitudes = torch.tensor(table, dtype=torch.float64)
        signs = torch.tensor(signed)
        rounds = []
        for r in range(self.num_ops):
            op_index = draws.integers(f"{self.name}.op{r}", len(names)).cpu()
            negate = draws.bernoulli(f"{self.name}.sign{r}", 0.5).cpu() & signs[op_index]
            rounds.append((op_index, torch.where(negate, -magnitudes[op_index],
                                                 magnitudes[op_index])))  # fmt: skip
        return rounds

    def apply(self, images: Tensor, draws: KeyedDraws) -> Tensor:
        ops = [TORCHVISION_OPS[n][0] for n in TORCHVISION_OPS]
        for op_index, m in self._rounds(draws, images.shape[2], images.shape[3]):
            images = _run(images, ops, op_index.to(images.device), m.to(images.device),
                          self.fill)  # fmt: skip
        return images

    def drawn(self, draws: KeyedDraws, height: int, width: int) -> list[list[DrawnOp]]:
        names = list(TORCHVISION_OPS)
        out: list[list[DrawnOp]] = [[] for _ in range(len(draws))]
        for op_index, m in self._rounds(draws, height, width):
            for i, (k, value) in enumerate(zip(op_index.tolist(), m.tolist(), strict=True)):
                out[i].append(_torchvision_drawn(names[k], value))
        return out


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

    def _draw(self, draws: KeyedDraws, height: int, width: int) -> tuple[Tensor, Tensor, Tensor]:
        """(op index, bin, signed magnitude) per sample, on the CPU."""
        names = list(TRIVIAL_WIDE_SPACE)
        bins = self.num_magnitude_bins
        table = _rows(height, width, names, bins, TRIVIAL_WIDE_SPACE.get)
        signs = torch.tensor([TORCHVISION_OPS[n][2] for n in names])
        op_index = draws.integers(f"{self.name}.op", len(names)).cpu()
        which = draws.integers(f"{self.name}.bin", bins).cpu()
        negate = draws.bernoulli(f"{self.name}.sign", 0.5).cpu() & signs[op_index]
        m = table[op_index, which]
        return op_index, which, torch.where(negate, -m, m)

    def apply(self, images: Tensor, draws: KeyedDraws) -> Tensor:
        op_index, _, m = self._draw(draws, images.shape[2], images.shape[3])
        ops = [TORCHVISION_OPS[n][0] for n in TRIVIAL_WIDE_SPACE]
        return _run(images, ops, op_index.to(images.device), m.to(images.device), self.fill)

    def drawn(self, draws: KeyedDraws, height: int, width: int) -> list[list[DrawnOp]]:
        names = list(TRIVIAL_WIDE_SPACE)
        op_index, which, m = self._draw(draws, height, width)
        return [[_torchvision_drawn(names[k], value, b)] for k, b, value in
                zip(op_index.tolist(), which.tolist(), m.tolist(), strict=True)]  # fmt: skip


# --- timm's RandAugment -----------------------------------------------------------------------

_LEVEL_DENOM = 10.0


def _rotate_pil(x: Tensor, degrees: Tensor, fill: Any, resample: str = "nearest") -> Tensor:
    """PIL's Image.rotate(degrees, resample, fillcolor=fill) (counter-clockwise, about the
    centre, size kept), each sample its own angle."""
    return pil.rotate(x, degrees.tolist(), fill, resample)


def _shear_pil(axis: int) -> Apply:
    def apply(x: Tensor, level: Tensor, fill: Any, resample: str = "nearest") -> Tensor:
        rows = torch.zeros(len(level), 6, dtype=torch.float64, device=level.device)
        rows[:, 0] = rows[:, 4] = 1.0
        rows[:, 1 if axis == 0 else 3] = level
        return pil.affine(x, rows, fill, resample)

    return apply


def _translate_pil(axis: int, size_of: Callable[[Tensor], int]) -> Apply:
    def apply(x: Tensor, level: Tensor, fill: Any, resample: str = "nearest") -> Tensor:
        rows = torch.zeros(len(level), 6, dtype=torch.float64, device=level.device)
        rows[:, 0] = rows[:, 4] = 1.0
        rows[:, 2 if axis == 0 else 5] = level * size_of(x)
        return pil.affine(x, rows, fill, resample)

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
# its LEVEL_TO_ARG functions (auto_augment.py). Each computes what timm's op computes on a PIL
# image: Pillow's geometry (stoker.augment.pil) and enhancers (Color, Contrast, Sharpness,
# AutoContrast: Pillow's arithmetic, not torchvision's); Brightness, the point ops and
# Equalize give Pillow's bytes with torchvision's arithmetic too.
TIMM_RAND_OPS: dict[str, tuple[Apply, Callable[[Tensor], Tensor], bool]] = {
    "AutoContrast": (lambda x, m, f: pil.autocontrast(x), lambda lv: lv, False),
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
        lambda x, m, f: pil.color(x, m),
        lambda lv: lv / _LEVEL_DENOM * 1.8 + 0.1,
        False,
    ),  # fmt: skip
    "Contrast": (
        lambda x, m, f: pil.contrast(x, m),
        lambda lv: lv / _LEVEL_DENOM * 1.8 + 0.1,
        False,
    ),  # fmt: skip
    "Brightness": (
        lambda x, m, f: F.adjust_brightness(x, m),
        lambda lv: lv / _LEVEL_DENOM * 1.8 + 0.1,
        False,
    ),  # fmt: skip
    "Sharpness": (
        lambda x, m, f: pil.sharpness(x, m),
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

# timm's interpolation choices for its geometric ops: "random" is _RANDOM_INTERPOLATION (bilinear
# or bicubic, drawn each time an op runs: AugmentOp's default and timm's training default,
# --train-interpolation random); a name is create_transform(interpolation=name)'s fixed filter.
TIMM_INTERPOLATION = {"random": ("bilinear", "bicubic"), "bilinear": ("bilinear",),
                      "bicubic": ("bicubic",), "nearest": ("nearest",)}  # fmt: skip
_GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")


def _interpolation(value: str | Sequence[str]) -> tuple[str, ...]:
    """timm's interpolation choice as the filters drawn from, each as likely."""
    if isinstance(value, str):
        if value in TIMM_INTERPOLATION:
            return TIMM_INTERPOLATION[value]
        choices = [value]
    else:
        choices = list(value)
    if not choices or any(c not in pil.RESAMPLE for c in choices):
        raise ValueError(
            f"interpolation must be 'random', 'bilinear', 'bicubic', 'nearest' or a list of "
            f"those filters, not {value!r} (Pillow's transform, which timm's geometric ops call, "
            "takes no other)"
        )
    return tuple(choices)


class TimmRandAugment(BatchOp):
    """timm's RandAugment (``rand_augment_transform("rand-m9-mstd0.5", hparams)``): `num_layers`
    ops a sample drawn uniformly (with replacement) from timm's 15, each applied with
    probability `prob` (0.5) at magnitude N(magnitude, magnitude_std) clipped to [0, 10] (a
    new draw per op), signed ops negated with probability 1/2. Geometry (Rotate, ShearX/Y,
    TranslateX/YRel) is PIL's transform filled with the ImageNet mean (``create_transform``'s
    ``img_mean``), resampled as timm does: `interpolation` "random" (timm's default) draws
    bilinear or bicubic for each op, "bilinear", "bicubic" or "nearest" holds one (as
    ``create_transform(interpolation=...)``), a list draws among its filters; Pillow's own
    filters, byte for byte. Color, Contrast, Sharpness and AutoContrast are Pillow's
    ImageEnhance and ImageOps.autocontrast, byte for byte (stoker.augment.pil): each image is
    what timm's ops make of it for the same draws. ``drawn(draws, height, width)`` lists each
    sample's ops."""

    name = "timm_rand_augment"

    def __init__(
        self,
        magnitude: float = 9,
        num_layers: int = 2,
        magnitude_std: float = 0.5,
        prob: float = 0.5,
        magnitude_max: float = 10.0,
        fill: float | Sequence[float] | None = IMAGENET_MEAN_FILL,
        interpolation: str | Sequence[str] = "random",
    ):
        self.magnitude, self.num_layers = float(magnitude), int(num_layers)
        self.magnitude_std, self.prob = float(magnitude_std), float(prob)
        self.magnitude_max, self.fill = float(magnitude_max), _check_fill(fill)
        self.interpolation = interpolation
        self._filters = _interpolation(interpolation)

    @classmethod
    def from_config(cls, config: str, **kwargs: Any) -> TimmRandAugment:
        """timm's config string: ``rand-m9-mstd0.5`` (``-n2`` layers, ``-mmax10``, ``-p0.5``);
        keyword arguments (``interpolation="bicubic"``) as the constructor's."""
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
        o.interpolation = [getattr(_core.Resample, f) for f in self._filters]
        o.streams = [
            tuple(
                stream_of(f"{prefix}{self.name}.{d}{r}")
                for d in ("op", "apply", "level", "sign", "filter")
            )  # fmt: skip
            for r in range(self.num_layers)
        ]
        return step

    def _layers(self, draws: KeyedDraws) -> list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor]]:
        """Each layer's (op index, applied, level, signed magnitude, filter index) per sample,
        on the CPU, as the worker form draws them (the level's normal from the C library's
        log1p and cos, as there, where torch's own may differ in the last bit)."""
        names = list(TIMM_RAND_OPS)
        signs = torch.tensor([TIMM_RAND_OPS[n][2] for n in names])
        layers = []
        for r in range(self.num_layers):
            op_index = draws.integers(f"{self.name}.op{r}", len(names)).cpu()
            active = draws.bernoulli(f"{self.name}.apply{r}", self.prob).cpu()
            level = torch.full((len(op_index),), self.magnitude, dtype=torch.float64)
            if self.magnitude_std > 0:
                u = draws.uniform(f"{self.name}.level{r}", size=2).cpu().double().tolist()
                normal = torch.tensor(
                    [math.sqrt(-2.0 * math.log1p(-u1)) * math.cos(2 * math.pi * u2)
                     for u1, u2 in u], dtype=torch.float64)  # fmt: skip
                level = level + self.magnitude_std * normal
            level = level.clamp(0.0, self.magnitude_max)
            m = torch.zeros_like(level)
            for k, name in enumerate(names):
                rows = op_index == k
                if rows.any():
                    m[rows] = TIMM_RAND_OPS[name][1](level[rows]).to(torch.float64)
            negate = draws.bernoulli(f"{self.name}.sign{r}", 0.5).cpu() & signs[op_index]
            m = torch.where(negate, -m, m)
            filters = draws.integers(f"{self.name}.filter{r}", len(self._filters)).cpu()
            layers.append((op_index, active, level, m, filters))
        return layers

    def apply(self, images: Tensor, draws: KeyedDraws) -> Tensor:
        names = list(TIMM_RAND_OPS)
        fill = self.fill
        if fill is not None and images.is_floating_point():
            fill = [v / 255.0 for v in (fill if isinstance(fill, list) else [fill])]
        dev = images.device
        out, copied = images, False
        for op_index, active, _, m, filters in self._layers(draws):
            for k, name in enumerate(names):
                apply = TIMM_RAND_OPS[name][0]
                chosen = (op_index == k) & active
                for f, resample in enumerate(self._filters if name in _GEOMETRIC else [None]):
                    picked = chosen & (filters == f) if resample else chosen
                    rows = picked.nonzero().flatten()
                    if not rows.numel():
                        continue
                    if not copied:
                        out, copied = images.clone(), True
                    at = rows.to(dev)
                    if resample:
                        out[at] = apply(out[at], m[rows].to(dev), fill, resample)  # type: ignore[call-arg]
                    else:
                        out[at] = apply(out[at], m[rows].to(dev), fill)
        return out

    def drawn(self, draws: KeyedDraws, height: int, width: int) -> list[list[DrawnOp]]:
        names = list(TIMM_RAND_OPS)
        out: list[list[DrawnOp]] = [[] for _ in range(len(draws))]
        for op_index, active, level, m, filters in self._layers(draws):
            for i, (k, on, lv, value, f) in enumerate(zip(
                    op_index.tolist(), active.tolist(), level.tolist(), m.tolist(),
                    filters.tolist(), strict=True)):  # fmt: skip
                name = names[k]
                magnitude = None if name in ("AutoContrast", "Equalize", "Invert") else value
                if name in ("Posterize", "Solarize", "SolarizeAdd"):
                    magnitude = int(value)
                resample = self._filters[f] if name in _GEOMETRIC else None
                out[i].append(DrawnOp(name, magnitude, bool(on), lv, resample))
        return out
