"""Buckets: aspect-ratio buckets, a set of output sizes of about one area, each image cropped to
the one nearest its aspect, each batch of one bucket (what diffusion, detection and
vision-language training at native aspect use instead of a square crop); and video buckets of
(height, width, frames), each video in the largest it fills. The engine batches by group
(pipeline/batch_plan.h); this module says which bucket each image goes to and each bucket's
batch size."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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


Bucket = tuple[int, int, int]


class VideoBuckets:
    """Buckets of clip shape ``(height, width, frames)`` for videos of varied size, aspect and
    length (Open-Sora's ``bucket_config``): each batch holds clips of one bucket, ``frames``
    frames ``1 / fps`` s apart, each frame resized to cover ``height x width`` and cropped (one
    crop per clip: at random when the loader trains, centred otherwise).

    Which bucket a video goes to is worked out once, from the pack's video facts (its frame
    count, rate and size: ``stoker.video_facts``). It *fills* a bucket when it has at least the
    bucket's pixels (``height * width``, so never upscaled in area) and its first and last
    frames are at least ``(frames - 1) / fps`` s apart; of the buckets it fills, it goes to those
    of the aspect (width / height) nearest its own (within 1% of it in log ratio), the largest
    (``height * width * frames``, then more frames). ``keep``: the probability that a video is
    kept in its bucket (a float for all, or a dict by bucket, 1.0 for those it leaves out); one
    not kept tries the next bucket in that order, then those of other aspects (the nearer aspect
    first, the largest of an aspect first), and one kept nowhere, or that fills no bucket (or
    whose video does not open), is left out of every epoch (``loader.groups_excluded``). The
    draws are keyed by ``seed`` and the sample's place in the pack: the same every epoch and on
    every rank.

    Batch sizes: ``batch_size`` (an int for every bucket, or a dict by bucket; the loader's
    ``batch_size`` where not given), or ``max_tokens``: as many clips as fit that many tokens,
    a clip of ``ceil(frames / pt) * (height // ph) * (width // pw)`` for ``patch=(pt, ph, pw)``
    (a latent video model's patches, the VAE's compression included: ``(4, 16, 16)`` for a 4x8x8
    VAE and 1x2x2 patches), at least 1.
    """

    def __init__(
        self,
        buckets: Sequence[Bucket],
        *,
        fps: float,
        batch_size: int | dict[Bucket, int] | None = None,
        max_tokens: int | None = None,
        patch: tuple[int, int, int] = (1, 16, 16),
        keep: float | dict[Bucket, float] = 1.0,
        seed: int = 0,
    ):
        made = [_checked_bucket(b) for b in buckets]
        if not made:
            raise InvalidArgumentError("VideoBuckets needs at least one (height, width, frames)")
        if len(set(made)) != len(made):
            raise InvalidArgumentError(f"VideoBuckets: a bucket is given twice in {made}")
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= 1000:
            raise InvalidArgumentError(f"VideoBuckets: fps must be in (0, 1000], not {fps!r}")
        if batch_size is not None and max_tokens is not None:
            raise InvalidArgumentError("VideoBuckets takes batch_size= or max_tokens=, not both")
        if max_tokens is not None and not _positive(max_tokens):
            raise InvalidArgumentError(f"max_tokens must be a positive int, not {max_tokens!r}")
        if (not isinstance(patch, (tuple, list)) or len(patch) != 3
                or not all(_positive(p) for p in patch)):  # fmt: skip
            raise InvalidArgumentError(f"patch is (frames, height, width) > 0, not {patch!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InvalidArgumentError(f"seed must be an int >= 0, not {seed!r}")
        self.buckets: list[Bucket] = made
        self.fps = float(fps)
        self.max_tokens, self.patch, self.seed = max_tokens, tuple(patch), seed
        self._batch_size = _by_bucket(batch_size, made, "batch_size", _positive, None)
        self.keep = _by_bucket(keep, made, "keep", lambda p: _probability(p), 1.0)
        self.sizes = [(h, w) for h, w, _ in made]  # each bucket's frame size, as the engine's

    def tokens(self, bucket: Bucket) -> int:
        """A clip's tokens in `bucket`: ceil(frames / pt) * (height // ph) * (width // pw)."""
        h, w, t = bucket
        pt, ph, pw = self.patch
        return -(-t // pt) * max(1, h // ph) * max(1, w // pw)

    def batch_sizes(self, batch_size: int) -> list[int]:
        """Each bucket's batch size (`batch_size`: the loader's, where none is given)."""
        if self.max_tokens is not None:
            return [max(1, self.max_tokens // self.tokens(b)) for b in self.buckets]
        return [batch_size if s is None else int(s) for s in self._batch_size]

    def assign(self, facts: Any) -> Any:
        """Each video's bucket (an index into ``buckets``), or -1 where it is left out: int32
        [n], of a ``stoker.VideoFacts`` (or anything with its ``frames``, ``span``, ``height``
        and ``width`` arrays; without ``span``, ``(frames - 1) / fps``)."""
        import numpy as np

        frames = np.asarray(facts.frames, np.int64)
        if hasattr(facts, "span"):
            span = np.asarray(facts.span, np.float64)
        else:
            fps = np.asarray(facts.fps, np.float64)
            span = np.where(fps > 0, (frames - 1) / np.where(fps > 0, fps, 1), 0.0)
        hw = np.stack([np.asarray(facts.height, np.int64), np.asarray(facts.width, np.int64)], 1)
        n = len(frames)
        out = np.full(n, -1, np.int32)
        # The keep draws: one per (sample, bucket), in pack order, whatever the chunking.
        rng = np.random.default_rng([self.seed, 0x56494445])
        for lo in range(0, n, self._CHUNK):
            hi = min(n, lo + self._CHUNK)
            draws = rng.random((hi - lo, len(self.buckets)))
            out[lo:hi] = self._assign(frames[lo:hi], span[lo:hi], hw[lo:hi], draws)
        return out

    _CHUNK = 65536  # samples at a time: memory bounded by this times the buckets

    def _assign(self, frames: Any, span: Any, hw: Any, draws: Any) -> Any:
        import numpy as np

        n = len(frames)
        readable = (frames > 0) & (hw[:, 0] > 0) & (hw[:, 1] > 0)
        h, w, t = (np.asarray([b[i] for b in self.buckets], np.int64) for i in range(3))
        # The clip's first and last frames are (t - 1) / fps apart: the engine's test
        # (media_fields.cc, plan_by_time) with the same tolerance.
        fills = (readable[:, None] & (hw[:, :1] * hw[:, 1:] >= (h * w)[None, :])
                 & (span[:, None] + 1e-9 >= ((t - 1) / self.fps)[None, :]))  # fmt: skip
        ratio = np.log(np.where(readable, hw[:, 1], 1) / np.where(readable, hw[:, 0], 1))
        distance = np.abs(ratio[:, None] - np.log(w / h)[None, :])
        nearest = np.where(fills, distance, np.inf).min(axis=1, keepdims=True)
        other_aspect = distance > nearest + 0.01
        # The order a video tries the buckets it fills in: those of the nearest aspect, the
        # largest first (then more frames); then the others, the nearer aspect first, the
        # largest of an aspect first.
        shape = distance.shape
        rank = np.lexsort((distance, np.broadcast_to(-t, shape),
                           np.broadcast_to(-(h * w * t), shape),
                           np.where(other_aspect, distance, 0.0), other_aspect),
                          axis=-1)  # fmt: skip
        taken = fills & (draws < np.asarray(self.keep, np.float64)[None, :])
        ordered = np.take_along_axis(taken, rank, axis=1)
        first = ordered.argmax(axis=1)
        found = ordered[np.arange(n), first]
        out = np.full(n, -1, np.int32)
        out[found] = rank[np.arange(n), first][found]
        return out

    def _fingerprint(self) -> list[Any]:
        return [[list(b) for b in self.buckets], self.fps, self.max_tokens, list(self.patch),
                self._batch_size, self.keep, self.seed]  # fmt: skip

    def __repr__(self) -> str:
        sizes = (f", max_tokens={self.max_tokens}, patch={self.patch}"
                 if self.max_tokens is not None else "")  # fmt: skip
        return f"VideoBuckets({self.buckets}, fps={self.fps:g}{sizes})"


def _positive(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int) and v >= 1


def _probability(p: Any) -> bool:
    return not isinstance(p, bool) and isinstance(p, (int, float)) and 0 <= p <= 1


def _checked_bucket(bucket: Any) -> Bucket:
    if (
        not isinstance(bucket, (tuple, list))
        or len(bucket) != 3
        or any(isinstance(v, bool) or not isinstance(v, int) for v in bucket)
        or not (1 <= bucket[0] <= 16384 and 1 <= bucket[1] <= 16384 and 1 <= bucket[2] <= 4096)
    ):
        raise InvalidArgumentError(
            "a video bucket is (height, width, frames): sides 1-16384, frames 1-4096, "
            f"not {bucket!r}"
        )
    return int(bucket[0]), int(bucket[1]), int(bucket[2])


def _by_bucket(value: Any, buckets: list[Bucket], name: str, valid: Callable[[Any], bool],
               absent: Any) -> list[Any]:  # fmt: skip
    """One value per bucket of `value`: one for all, or a dict by bucket (`absent` for those it
    leaves out); a clear error for a bad one or for a key that is no bucket."""
    if value is None:
        return [absent] * len(buckets)
    if isinstance(value, dict):
        keys = {}
        for k, v in value.items():
            key = tuple(k) if isinstance(k, (tuple, list)) else k
            if key not in buckets:
                raise InvalidArgumentError(f"VideoBuckets: {name} names {k!r}, not a bucket")
            if not valid(v):
                raise InvalidArgumentError(f"VideoBuckets: {name}[{k!r}] = {v!r} is not valid")
            keys[key] = v
        return [keys.get(b, absent) for b in buckets]
    if not valid(value):
        raise InvalidArgumentError(f"VideoBuckets: {name} = {value!r} is not valid")
    return [value] * len(buckets)
