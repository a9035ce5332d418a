"""Where an image's pixels go in the output: the geometries an Image (or a Video's frames) is
drawn with, each naming the C++ kind and its options (fields/geometry.h), and their checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import _core
from ..errors import InvalidArgumentError


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision's RandomResizedCrop: a random area fraction ``scale`` and aspect ``ratio``."""

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)


@dataclass(frozen=True)
class CenterCrop:
    """torchvision's Resize(resize_size) + CenterCrop(size): the shorter side to ``resize_size``
    (default ``round(min(size) * 256 / 224)``), then the centre."""

    resize_size: int | None = None


@dataclass(frozen=True)
class Resize:
    """The whole image resized to the output size; the aspect ratio is not kept."""


@dataclass(frozen=True)
class Letterbox:
    """The whole image scaled to fit (longer side first), centred, the rest ``fill`` (YOLO-style
    detectors use 114)."""

    fill: int = 114


@dataclass(frozen=True)
class RandomCrop:
    """torchvision's RandomCrop(size, padding): the image padded by ``padding`` (with ``fill``)
    on every side, a window of the output size at a random place (CIFAR-style). ``size``, as
    torchvision takes it (``RandomCrop(32, padding=4)``), is the Image field's own and may be left
    out; given, it must be the same."""

    size: int | tuple[int, int] | None = None
    padding: int = 0
    fill: int = 0


@dataclass(frozen=True)
class CoverCrop:
    """The image resized to cover the output, its aspect kept, then the output's window of it:
    at a random whole pixel along the side with slack (``random=True``; ``None``: when the
    loader trains) or centred. What aspect buckets crop with (kohya's and diffusers' bucketing:
    resize, then crop), and a square output's crop that keeps the most of each image."""

    random: bool | None = None


Geometry = RandomResizedCrop | CenterCrop | Resize | Letterbox | RandomCrop | CoverCrop


def _set_geometry(g: Any, geometry: Geometry | None, hflip: float | None, vflip: float,
                  train: bool) -> int:  # fmt: skip
    """Fills a _core.GeometryOptions from a geometry class (RandomResizedCrop when training,
    CenterCrop otherwise, by default) and the flips; returns the fill value it needs."""
    g.hflip = (0.5 if train and geometry is None else 0.0) if hflip is None else hflip
    g.vflip = vflip
    if geometry is None:
        geometry = RandomResizedCrop() if train else CenterCrop()
    if isinstance(geometry, RandomResizedCrop):
        g.kind = _core.GeometryKind.random_resized_crop
        g.crop.scale_min, g.crop.scale_max = map(float, geometry.scale)
        g.crop.ratio_min, g.crop.ratio_max = map(float, geometry.ratio)
    elif isinstance(geometry, CenterCrop):
        g.kind = _core.GeometryKind.resize_center_crop
        g.resize_size = geometry.resize_size or 0
    elif isinstance(geometry, Resize):
        g.kind = _core.GeometryKind.resize
    elif isinstance(geometry, Letterbox):
        g.kind = _core.GeometryKind.letterbox
        return geometry.fill
    elif isinstance(geometry, CoverCrop):
        g.kind = _core.GeometryKind.cover_crop
        g.random_position = train if geometry.random is None else bool(geometry.random)
    else:
        g.kind = _core.GeometryKind.random_crop
        g.padding = geometry.padding
        return geometry.fill
    return 0


def _check_geometry(geometry: Any, size: tuple[int, int]) -> None:
    if geometry is not None and not isinstance(
        geometry, (RandomResizedCrop, CenterCrop, Resize, Letterbox, RandomCrop, CoverCrop)
    ):
        raise InvalidArgumentError(
            f"geometry must be RandomResizedCrop, CenterCrop, Resize, Letterbox, RandomCrop or "
            f"CoverCrop, not {geometry!r}"
        )
    if isinstance(geometry, RandomCrop) and geometry.size is not None:
        crop = geometry.size if isinstance(geometry.size, tuple) else (geometry.size,) * 2
        if tuple(crop) != tuple(size):
            raise InvalidArgumentError(
                f"RandomCrop({geometry.size}) crops another size than the field's {size}: "
                "give the size once, as the field's size="
            )


def _size(size: Any) -> tuple[int, int]:
    if isinstance(size, int):
        size = (size, size)
    if len(size) != 2 or any(not isinstance(s, int) or s <= 0 for s in size):
        raise InvalidArgumentError(f"size must be an int or (height, width), not {size!r}")
    return (size[0], size[1])
