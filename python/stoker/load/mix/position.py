"""Where one epoch of a mix stands, the stopping rule that moves it on when a source runs out,
and the epoch replayed without its batches: which source gives each step (for ``len()``
and ``source_at``) from the draws and the sources' lengths alone."""

from __future__ import annotations

import bisect
from typing import Any, Iterator, Literal, Sequence

from ...errors import InvalidArgumentError
from .draws import Schedule, keyed_uniform

StopRule = Literal["first_exhausted", "all_exhausted", "all_exhausted_without_replacement", "never"]
_STOP_RULES: tuple[str, ...] = (
    "first_exhausted",
    "all_exhausted",
    "all_exhausted_without_replacement",
    "never",
)

# A source restarted within an epoch (stop="all_exhausted" or "never") runs its pass p >= 1 of
# mix epoch e at source epoch e + p * RESTART_EPOCH_STRIDE: its shuffle and augmentation draws
# then differ from every other pass of every epoch (e + p would repeat epoch e + 1's).
RESTART_EPOCH_STRIDE = 1 << 32


# What the stopping rule does when the source drawn has no batch left.
_END, _REDRAW, _RESTART = "end", "redraw", "restart"


class _Position:
    """Where one epoch of the mix stands, and the stopping rule that moves it on. The iteration
    and len() (which replays it with the sources' lengths) share it, so they cannot disagree."""

    def __init__(self, epoch: int, weights: Schedule, stop: str, first_step: int = 0):
        n = weights.sources
        self.epoch = epoch
        self.step = 0  # batches handed out this epoch
        self.first_step = first_step  # the schedule's step at this epoch's start
        self.drawn = [0] * n  # this epoch's, per source
        self.taken = [0] * n  # in the source's current pass
        self.restarts = [0] * n  # passes restarted this epoch: the current one is pass `restarts`
        self.exhausted = [False] * n  # has run out at least once this epoch
        self.started = [False] * n  # iterated this epoch (a scheduled mix starts them when drawn)
        self._schedule = weights
        self._weights = list(weights.at(first_step))
        self._stop = stop
        self._cumulative: list[float] = []
        self._candidates: list[int] = []
        self._refresh()

    def _refresh(self) -> None:
        """The sources a draw may pick, with their cumulative weights."""
        if not self._schedule.fixed:
            self._weights = list(self._schedule.at(self.first_step + self.step))
        dropped = self._stop == "all_exhausted_without_replacement"
        self._candidates = [
            i for i, w in enumerate(self._weights) if w > 0 and not (dropped and self.exhausted[i])
        ]
        total = 0.0
        self._cumulative = []
        for i in self._candidates:
            total += self._weights[i]
            self._cumulative.append(total)

    def pick(self, seed: int, length: int | None) -> int | None:
        """The source of this step's batch; None once the epoch is over."""
        if not self._schedule.fixed:
            self._refresh()  # the weights of this step
        if (length is not None and self.step >= length) or not self._candidates:
            return None
        target = keyed_uniform(seed, self.epoch, self.step) * self._cumulative[-1]
        k = bisect.bisect_right(self._cumulative, target)
        return self._candidates[min(k, len(self._candidates) - 1)]

    def took(self, i: int) -> None:
        self.step += 1
        self.drawn[i] += 1
        self.taken[i] += 1

    def ran_out(self, i: int) -> str:
        """Source i, drawn, has no batch left in its pass: end the epoch, draw again among the
        others, or restart it."""
        self.exhausted[i] = True
        if self._stop == "first_exhausted":
            return _END
        if self._stop == "all_exhausted_without_replacement":
            self._refresh()
            return _REDRAW
        if self._stop == "all_exhausted" and all(
            self.exhausted[j] for j, w in enumerate(self._weights) if w > 0
        ):
            return _END
        if self.taken[i] == 0:
            raise InvalidArgumentError(
                f"mix: source {i} gave no batch in a whole pass, so it cannot be cycled "
                f"(stop={self._stop!r}): give it weight 0 or leave it out"
            )
        self.restarts[i] += 1
        self.taken[i] = 0
        return _RESTART

    def source_epoch(self, i: int) -> int:
        return self.epoch + self.restarts[i] * RESTART_EPOCH_STRIDE

    def state(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "drawn": list(self.drawn),
            "taken": list(self.taken),
            "restarts": list(self.restarts),
            "exhausted": list(self.exhausted),
            "first_step": self.first_step,
            "started": list(self.started),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], weights: Schedule, stop: str) -> _Position:
        position = cls(int(state["epoch"]), weights, stop, int(state.get("first_step", 0)))
        position.step = int(state["step"])
        # states saved before schedules: every source of the pass was started with it
        started = state.get("started", [True] * len(position.started))
        position.started = [bool(v) for v in started]
        position.drawn = [int(v) for v in state["drawn"]]
        position.taken = [int(v) for v in state["taken"]]
        position.restarts = [int(v) for v in state["restarts"]]
        position.exhausted = [bool(v) for v in state["exhausted"]]
        position._refresh()
        return position


def epoch_length(
    lengths: Sequence[int],
    weights: Schedule,
    *,
    seed: int,
    epoch: int,
    stop: str,
    length: int | None,
    first_step: int = 0,
) -> int:
    """Batches one epoch of the mix yields when source i yields lengths[i] batches a pass: the
    iteration's own draws and stopping rule, replayed without the batches."""
    return sum(1 for _ in replay(lengths, weights, seed=seed, epoch=epoch, stop=stop,
                                 length=length, first_step=first_step))  # fmt: skip


def replay(
    lengths: Sequence[int],
    weights: Schedule,
    *,
    seed: int,
    epoch: int,
    stop: str,
    length: int | None,
    first_step: int = 0,
) -> Iterator[tuple[int, _Position]]:
    """Each batch of one epoch when source i yields lengths[i] batches a pass: the source drawn
    and the position just before it takes the batch (its step, the source's pass and step)."""
    position = _Position(epoch, weights, stop, first_step)
    while True:
        i = position.pick(seed, length)
        if i is None:
            return
        if position.taken[i] < lengths[i]:
            yield i, position
            position.took(i)
        elif position.ran_out(i) == _END:
            return
