"""The draw of each step of a mix: a number keyed by (seed, epoch, step), and the weights it is
compared with at that step (fixed, ``(step, weights)`` points, or a function of the step)."""

from __future__ import annotations

import bisect
import math
from typing import Any, Callable, Sequence, TypeAlias, Union

from ...errors import InvalidArgumentError

_M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's step and finaliser: a bijection of 64-bit integers that scatters every bit."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def keyed_uniform(seed: int, epoch: int, step: int) -> float:
    """A number in [0, 1) that depends on (seed, epoch, step) only: the draw of one step."""
    x = _mix64(_mix64(_mix64(seed & _M64) ^ (epoch & _M64)) ^ (step & _M64))
    return (x >> 11) * (1.0 / (1 << 53))


Weights: TypeAlias = Union[
    Sequence[float], Sequence[tuple[int, Sequence[float]]], Callable[[int], Sequence[float]]
]
"""A mix's weights: one per loader, (step, weights) points, or a function of the step."""


class Schedule:
    """A mix's weights at each step: fixed, a list of ``(step, weights)`` points (linear in
    between, the first and last held before and after), or a function of the step. The step is
    the mix's batches handed out before this one over all its epochs (a resume carries it)."""

    def __init__(self, weights: Any, sources: int, per_batch: Sequence[float] | None = None):
        """`per_batch`: each source's tokens per batch, when the weights are of tokens: a
        source's weight is divided by it, so that batches are drawn in the proportions that
        give the weights' proportions of tokens."""
        self.sources = sources
        self.given = weights
        self.per_batch = None if per_batch is None else tuple(float(t) for t in per_batch)
        self.fixed: tuple[float, ...] | None = None
        self._points: list[tuple[int, tuple[float, ...]]] = []
        self._fn: Callable[[int], Sequence[float]] | None = None
        if callable(weights):
            self._fn = weights
            return
        if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
            raise InvalidArgumentError(
                "mix: weights must be a list of numbers, a list of (step, weights) points or a "
                f"function of the step, not {type(weights).__name__}"
            )
        if weights and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in weights):
            steps = [p[0] for p in weights]
            for k, step in enumerate(steps):
                if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                    raise InvalidArgumentError(
                        f"mix: weights[{k}] is a (step, weights) point: its step must be an int "
                        f">= 0, not {step!r}"
                    )
            if any(b <= a for a, b in zip(steps, steps[1:])):
                raise InvalidArgumentError("mix: the (step, weights) points' steps must increase")
            self._points = [(int(p[0]), self._check(p[1], f"at step {p[0]}")) for p in weights]
            return
        self.fixed = self._check(weights, "")

    def _check(self, weights: Any, where: str) -> tuple[float, ...]:
        """Weights checked and normalised; `where` says which step gave them."""
        at = f" {where}" if where else ""
        if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
            raise InvalidArgumentError(
                f"mix: weights{at} must be a list of numbers, not {type(weights).__name__}"
            )
        if len(weights) != self.sources:
            raise InvalidArgumentError(
                f"mix: {self.sources} loaders but {len(weights)} weights{at}: give one weight each"
            )
        for k, w in enumerate(weights):
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
                raise InvalidArgumentError(
                    f"mix: weights[{k}]{at} must be a finite number, not {w!r}"
                )
            if w < 0:
                raise InvalidArgumentError(f"mix: weights[{k}]{at} must be >= 0, not {w}")
        if self.per_batch is not None:
            weights = [w / t for w, t in zip(weights, self.per_batch)]
        total = float(sum(weights))
        if not total > 0:
            raise InvalidArgumentError(
                f"mix: the weights{at} sum to 0: give at least one positive weight"
            )
        return tuple(float(w) / total for w in weights)

    def at(self, step: int) -> tuple[float, ...]:
        """The normalised weights of the mix's `step`."""
        if self.fixed is not None:
            return self.fixed
        if self._fn is not None:
            return self._check(self._fn(step), f"at step {step}")
        points = self._points
        if step <= points[0][0]:
            return points[0][1]
        if step >= points[-1][0]:
            return points[-1][1]
        k = bisect.bisect_right([p[0] for p in points], step)
        (s0, w0), (s1, w1) = points[k - 1], points[k]
        t = (step - s0) / (s1 - s0)
        return self._check([a + (b - a) * t for a, b in zip(w0, w1)], f"at step {step}")

    def may_draw(self, i: int) -> bool:
        """Whether source i can ever be drawn (a fixed weight of 0: never)."""
        return self.fixed is None or self.fixed[i] > 0
