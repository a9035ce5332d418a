"""Aspect-ratio buckets: a set of output sizes of about one area, each image cropped to the one
nearest its aspect, each batch of one bucket (what diffusion, detection and vision-language
training at native aspect use instead of a square crop). The engine batches by group
(pipeline/batch_plan.h); this module says which bucket each image goes to and each bucket's
batch size."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgumentError


class AspectBuckets:
    """Output sizes ``(height, width)`` for images of varied aspect, given as the buckets'
    ``area`` or as a list of ``sizes``.

    ``AspectBuckets(area=1024 * 1024, step=64, max_ratio=4.0)``: for every width a multiple of
    ``step``, the tallest height, a multiple of ``step``, that keeps ``width * height <= area``,
    where the longer side is at most ``max_ratio`` times the shorter (kohya's and NovelAI's
    bucket sets are made so). ``AspectBuckets(sizes=[(768, 1344), (1024, 1024), ...])``: exactly
    these. ``.sizes`` lists them from the tallest to the widest.

    Each image goes to the bucket whose aspect (width / height) is nearest its own in log ratio
    (a tie to the taller); it is resized to cover the bucket, aspect kept, and cropped along the
    side with slack: at a random whole pixel when the loader trains, centred otherwise
    (``stoker.CoverCrop``). The sizes come from the pack's index (read once from the images'
    headers for packs written before the index recorded them).

    Batch sizes: the loader's ``batch_size`` for every bucket, or, with ``batch_pixels``, as
    many images as fit that many pixels (``batch_pixels // (height * width)``, at least 1): the
    same memory and about the same compute per step whatever the bucket.
    """

    def __init__(
        self,
        area: int | None = None,
        *,
        step: int = 64,
        max_ratio: float = 4.0,
        sizes: Sequence[tuple[int, int]] | None = None,
        batch_pixels: int | None = None,
    ):
        if (area is None) == (sizes is None):
            raise InvalidArgumentError(
                "AspectBuckets takes area= (buckets made for it) or sizes= (these), one of them"
            )
        if batch_pixels is not None and (
            isinstance(batch_pixels, bool) or not isinstance(batch_pixels, int) or batch_pixels < 1
        ):
            raise InvalidArgumentError(f"batch_pixels must be a positive int, not {batch_pixels!r}")
        self.area, self.step, self.max_ratio = area, step, max_ratio
        self.batch_pixels = batch_pixels
        if sizes is not None:
            made = [_checked_size(s) for s in sizes]
            if not made:
                raise InvalidArgumentError("AspectBuckets(sizes=...) needs at least one size")
            if len(set(made)) != len(made):
                raise InvalidArgumentError(f"AspectBuckets: a size is given twice in {made}")
        else:
            made = _make_sizes(area, step, max_ratio)
        # From the tallest to the widest: aspect (w / h) ascending, then the larger first.
        self.sizes: list[tuple[int, int]] = sorted(made, key=lambda s: (s[1] / s[0], -s[0] * s[1]))
        self._log_ratios = [math.log(w / h) for h, w in self.sizes]

    def batch_sizes(self, batch_size: int) -> list[int]:
        """Each bucket's batch size: `batch_size`, or the images that fit batch_pixels."""
        if self.batch_pixels is None:
            return [batch_size] * len(self.sizes)
        return [max(1, self.batch_pixels // (h * w)) for h, w in self.sizes]

    def bucket_of(self, height: int, width: int) -> int:
        """The index in ``sizes`` of the bucket for an image of height x width (an unknown size,
        0 x 0, goes to the squarest bucket)."""
        if height <= 0 or width <= 0:
            return min(range(len(self.sizes)), key=lambda k: abs(self._log_ratios[k]))
        r = math.log(width / height)
        return min(range(len(self.sizes)), key=lambda k: abs(r - self._log_ratios[k]))

    def assign(self, hw: Any) -> Any:
        """The bucket of each image of an int array [n, 2] of (height, width): int32 [n]."""
        import numpy as np

        hw = np.asarray(hw, dtype=np.int64).reshape(-1, 2)
        known = (hw[:, 0] > 0) & (hw[:, 1] > 0)
        ratios = np.zeros(len(hw))
        ratios[known] = np.log(hw[known, 1] / hw[known, 0])
        # Nearest in log ratio; argmin takes the first of equals: the taller bucket.
        distance = np.abs(ratios[:, None] - np.asarray(self._log_ratios)[None, :])
        out = np.argmin(distance, axis=1).astype(np.int32)
        out[~known] = self.bucket_of(0, 0)
        return out

    def _fingerprint(self) -> list[Any]:
        return [list(s) for s in self.sizes] + [self.batch_pixels]

    def __repr__(self) -> str:
        given = f"sizes={self.sizes}" if self.area is None else (
            f"area={self.area}, step={self.step}, max_ratio={self.max_ratio}")  # fmt: skip
        pixels = "" if self.batch_pixels is None else f", batch_pixels={self.batch_pixels}"
        return f"AspectBuckets({given}{pixels})"


def _checked_size(size: Any) -> tuple[int, int]:
    if (
        not isinstance(size, (tuple, list))
        or len(size) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 16384 for v in size)
    ):
        raise InvalidArgumentError(
            f"a bucket's size is (height, width), each an int in 1-16384, not {size!r}"
        )
    return int(size[0]), int(size[1])


def _make_sizes(area: Any, step: Any, max_ratio: Any) -> list[tuple[int, int]]:
    for name, value in (("area", area), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(
                f"AspectBuckets: {name} must be a positive int, not {value!r}"
            )
    if not isinstance(max_ratio, (int, float)) or not max_ratio >= 1:
        raise InvalidArgumentError(f"AspectBuckets: max_ratio must be >= 1, not {max_ratio!r}")
    if area < step * step:
        raise InvalidArgumentError(
            f"AspectBuckets: area {area} holds no bucket of sides a multiple of step {step}"
        )
    sizes = []
    for width in range(step, min(area // step, 16384) + 1, step):
        height = min(area // width // step * step, 16384)
        if height >= step and max(width, height) <= max_ratio * min(width, height):
            sizes.append((height, width))
    if not sizes:
        raise InvalidArgumentError(
            f"AspectBuckets: no bucket of area {area}, step {step} within max_ratio {max_ratio}"
        )
    return sizes
