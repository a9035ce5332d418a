"""stoker.mix: batches drawn from several loaders in given proportions, deterministic and
resumable (docs/MIX.md).

    mixed = stoker.mix([coco, objects365], weights=[0.7, 0.3], seed=0)
    for epoch in range(start_epoch, 90):
        mixed.set_epoch(epoch)
        for batch in mixed: ...
        torch.save({"data": mixed.state_dict(), ...}, "ckpt.pt")

Which source gives step ``s``'s batch is a pure function of (seed, epoch, s) and of which
sources have run out: never of timing, threads or how often the job was resumed."""

from __future__ import annotations

import bisect
import math
import os
import weakref
from typing import (
    Any,
    Callable,
    Generator,
    Generic,
    Iterable,
    Iterator,
    Literal,
    Sequence,
    TypeAlias,
    TypeVar,
    Union,
)

from .errors import InvalidArgumentError, step_out_of_range
from .loader_protocol import EpochSetter, rebuild

BatchT = TypeVar("BatchT")

StopRule = Literal["first_exhausted", "all_exhausted", "all_exhausted_without_replacement", "never"]
_STOP_RULES: tuple[str, ...] = (
    "first_exhausted",
    "all_exhausted",
    "all_exhausted_without_replacement",
    "never",
)

_STATE_VERSION = 1

# A source restarted within an epoch (stop="all_exhausted" or "never") runs its pass p >= 1 of
# mix epoch e at source epoch e + p * RESTART_EPOCH_STRIDE: its shuffle and augmentation draws
# then differ from every other pass of every epoch (e + p would repeat epoch e + 1's).
RESTART_EPOCH_STRIDE = 1 << 32

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


# What the stopping rule does when the source drawn has no batch left.
_END, _REDRAW, _RESTART = "end", "redraw", "restart"


Weights: TypeAlias = Union[
    Sequence[float], Sequence[tuple[int, Sequence[float]]], Callable[[int], Sequence[float]]
]
"""A mix's weights: one per loader, (step, weights) points, or a function of the step."""


class Schedule:
    """A mix's weights at each step: fixed, a list of ``(step, weights)`` points (linear in
    between, the first and last held before and after), or a function of the step. The step is
    the mix's batches handed out before this one over all its epochs (a resume carries it)."""

    def __init__(self, weights: Any, sources: int):
        self.sources = sources
        self.given = weights
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


# --- batch structure: what two sources must share for their batches to be mixed --------------


def _signature(batch: Any) -> tuple[Any, ...]:
    """A batch's structure: containers, dict keys, tuple arity, and per tensor (or array) its
    dtype, number of dimensions and device. Not sizes (a mix may be multi-resolution), and not
    inside lists (a batch's per-sample values: captions, JSON, variable-length targets)."""
    if isinstance(batch, dict):
        return ("dict", tuple(batch), tuple(_signature(v) for v in batch.values()))
    if isinstance(batch, tuple):
        return ("tuple", tuple(_signature(v) for v in batch))
    if isinstance(batch, list):
        return ("list",)
    dtype, shape = getattr(batch, "dtype", None), getattr(batch, "shape", None)
    if dtype is not None and shape is not None:
        device = str(getattr(batch, "device", "cpu"))
        return ("array", type(batch).__name__, str(dtype), len(shape), device)
    return ("value", type(batch).__name__)


def _describe(sig: tuple[Any, ...]) -> str:
    kind = sig[0]
    if kind == "dict":
        return f"a dict with keys {list(sig[1])}"
    if kind == "tuple":
        return f"a tuple of {len(sig[1])}"
    if kind == "list":
        return "a list"
    if kind == "array":
        return f"a {sig[2]} {sig[1]} with {sig[3]} dimensions on {sig[4]}"
    return f"a {sig[1]}"


def _difference(a: tuple[Any, ...], b: tuple[Any, ...], path: str = "batch") -> str | None:
    """Where and how two signatures differ in a way a training step would notice; None if they
    do not. A list and a tuple are both sequences (torch's collate makes lists, stoker tuples)."""
    if {a[0], b[0]} == {"list", "tuple"} or (a[0] == b[0] == "list"):
        return None
    if a[0] != b[0] or (a[0] in ("dict", "tuple") and len(a[-1]) != len(b[-1])):
        return f"{path} is {_describe(a)} in one and {_describe(b)} in the other"
    if a[0] == "dict":
        if a[1] != b[1]:
            return f"{path} is {_describe(a)} in one and {_describe(b)} in the other"
        for key, x, y in zip(a[1], a[2], b[2]):
            found = _difference(x, y, f"{path}[{key!r}]")
            if found:
                return found
        return None
    if a[0] == "tuple":
        for k, (x, y) in enumerate(zip(a[1], b[1])):
            found = _difference(x, y, f"{path}[{k}]")
            if found:
                return found
        return None
    if a != b:
        return f"{path} is {_describe(a)} in one and {_describe(b)} in the other"
    return None


# --- the mix -------------------------------------------------------------------------------------


def _call_if_present(obj: Any, method: str, *args: Any) -> None:
    fn = getattr(obj, method, None)
    if callable(fn):
        fn(*args)


def _name(source: Any) -> str:
    return type(source).__name__


class Mix(Generic[BatchT]):
    """Batches drawn from several loaders in given proportions: see :func:`mix`."""

    def __init__(
        self,
        loaders: Sequence[Iterable[BatchT]],
        weights: Weights,
        *,
        seed: int = 0,
        stop: StopRule = "first_exhausted",
        length: int | None = None,
        check_structure: bool = True,
        record: str | os.PathLike | None = None,
    ):
        if isinstance(loaders, (str, bytes)) or not isinstance(loaders, Sequence):
            raise InvalidArgumentError(
                f"mix: loaders must be a list of loaders, not {type(loaders).__name__}"
            )
        if not loaders:
            raise InvalidArgumentError("mix: give at least one loader")
        for k, source in enumerate(loaders):
            if not callable(getattr(source, "__iter__", None)):
                raise InvalidArgumentError(
                    f"mix: loaders[{k}] ({_name(source)}) is not iterable: give loaders of batches"
                )
            for j in range(k):
                if loaders[j] is source:
                    raise InvalidArgumentError(
                        f"mix: loaders[{k}] is loaders[{j}]: give each loader once (two passes "
                        "over one loader at the same time cancel each other; add the weights)"
                    )
        schedule = Schedule(weights, len(loaders))
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise InvalidArgumentError(f"mix: seed must be an int >= 0, not {seed!r}")
        if stop not in _STOP_RULES:
            raise InvalidArgumentError(
                f"mix: stop must be one of {', '.join(map(repr, _STOP_RULES))}, not {stop!r} "
                "(torchdata's FIRST_DATASET_EXHAUSTED, CYCLE_UNTIL_ALL_DATASETS_EXHAUSTED, "
                "ALL_DATASETS_EXHAUSTED and CYCLE_FOREVER, in that order)"
            )
        if length is not None and (
            isinstance(length, bool) or not isinstance(length, int) or length <= 0
        ):
            raise InvalidArgumentError(
                f"mix: length must be a positive int or None, not {length!r}"
            )
        self.sources: tuple[Iterable[BatchT], ...] = tuple(loaders)
        self._schedule = schedule
        self._steps_before = 0  # the schedule's step at the start of the pass to come
        self.seed = seed
        self.stop: str = stop
        self.length = length
        self.check_structure = check_structure
        self._epoch = 0  # of the pass in progress, or of the next one
        self._live: _Position | None = None  # the pass in progress (or abandoned by `break`)
        self._resume: _Position | None = None  # loaded by load_state_dict, for the next pass
        self._finished: _Position | None = None  # the last pass that ran to its end, for stats()
        self._pass: weakref.ref[Generator[BatchT, None, None]] | None = None
        self._reference: tuple[int, tuple[Any, ...]] | None = None  # (source, signature)
        self._total = [0] * len(self.sources)
        self._length_cache: tuple[tuple[Any, ...], int] | None = None
        self._closed = False
        self.record = None if record is None else os.fspath(record)
        self._recorder: Any = None
        if record is not None:
            from .record import StepRecorder

            self._recorder = StepRecorder(record)

    # --- the DataLoader-like surface ---------------------------------------------------------
    @property
    def weights(self) -> tuple[float, ...]:
        """The weights (normalised) of the step to come: fixed, or the schedule's there."""
        position = self._position()
        return self._schedule.at(position.first_step + position.step)

    @property
    def epoch(self) -> int:
        """The epoch of the pass in progress, or of the next pass."""
        return self._position().epoch

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next pass (its draws), and forward it to every source that
        has ``set_epoch``. After ``load_state_dict``, the epoch of the state loaded keeps its
        position (so the usual ``set_epoch(epoch)`` at the top of the loop resumes it); another
        epoch starts from its beginning."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidArgumentError(f"mix: epoch must be an int >= 0, not {epoch!r}")
        if self._resume is not None and self._resume.epoch == epoch:
            return
        self._resume = None
        self._epoch = epoch
        self._length_cache = None
        for source in self.sources:
            _call_if_present(source, "set_epoch", epoch)

    @property
    def sampler(self) -> EpochSetter:
        """What trainers that call ``loader.sampler.set_epoch(epoch)`` (Lightning) reach: this
        mix's ``set_epoch``."""
        return EpochSetter(self)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles to its arguments (each source pickled with its own position) and, when
        every source has a state, the mix's own; unpickled, it continues where this one stands
        (docs/INTEGRATIONS.md)."""
        arguments = dict(
            loaders=list(self.sources),
            weights=self._schedule.given,
            seed=self.seed,
            stop=self.stop,
            length=self.length,
            check_structure=self.check_structure,
            record=self.record,
        )
        state = None if self._stateless_source() else self._state_dict()
        return (rebuild, (Mix, arguments, state))

    def __iter__(self) -> Iterator[BatchT]:
        """One epoch of the mix. A pass abandoned with ``break`` is closed by the next
        ``iter()``, which starts its epoch again (as a stoker loader does), unless a state was
        loaded since."""
        if self._closed:
            raise InvalidArgumentError("mix: the mix is closed")
        self._abandon_pass()
        position, self._resume = self._resume, None
        resumed = position is not None and position.step > 0
        if position is None or not resumed:
            # Nothing of this epoch handed out yet: start it afresh, whatever the sources hold.
            epoch = self._epoch if position is None else position.epoch
            position = _Position(epoch, self._schedule, self.stop, self._steps_before)
        self._epoch = position.epoch
        self._live = position
        if self._recorder is not None:
            rank, world_size = self._ranks()
            self._recorder.begin(position.epoch, position.step, rank, world_size)
        batches = self._run(position, resumed)
        self._pass = weakref.ref(batches)
        return batches

    def _ranks(self) -> tuple[int, int]:
        """The job's ranks, for the record: a stoker source's (given, or resolved as it would),
        else the launcher's."""
        for source in self.sources:
            rank, world_size = getattr(source, "rank", None), getattr(source, "world_size", None)
            if isinstance(rank, int) and isinstance(world_size, int):
                return rank, world_size
        from .loader import resolve_ranks

        return resolve_ranks(None, None, strict=False)

    def _run(self, position: _Position, resumed: bool) -> Generator[BatchT, None, None]:
        iterators: dict[int, Iterator[BatchT]] = {}
        try:
            if self._schedule.fixed is not None:  # the sources of positive weight, now
                for k in range(len(self.sources)):
                    if self._schedule.fixed[k] > 0 and not (
                        position.exhausted[k] and self.stop == "all_exhausted_without_replacement"
                    ):
                        iterators[k] = self._start(k, position, resumed)
            while True:
                i = position.pick(self.seed, self.length)
                if i is None:
                    break
                if i not in iterators:  # a scheduled mix starts a source when first drawn
                    iterators[i] = self._start(i, position, resumed)
                try:
                    batch = next(iterators[i])
                except StopIteration:
                    action = position.ran_out(i)
                    if action == _END:
                        break
                    self._close_iterator(i, iterators.pop(i))
                    if action == _RESTART:
                        iterators[i] = self._start(i, position, resumed=False)
                    continue  # draw this step again
                if self.check_structure:
                    self._check(i, batch)
                if self._recorder is not None:
                    self._recorder.write(source=i, source_epoch=position.source_epoch(i),
                                         source_step=position.taken[i])  # fmt: skip
                position.took(i)
                self._total[i] += 1
                yield batch
            # The epoch is over: the next pass is the next epoch, unless set_epoch chose one.
            if self._live is position:
                self._live, self._finished = None, position
                self._steps_before = position.first_step + position.step
                if self._epoch == position.epoch:
                    self._epoch = position.epoch + 1
                    self._length_cache = None
        finally:
            for k, it in iterators.items():
                self._close_iterator(k, it)

    def _start(self, i: int, position: _Position, resumed: bool) -> Iterator[BatchT]:
        """A pass of source i: where its loaded state left it, or from the beginning of the
        source epoch this pass runs at."""
        source = self.sources[i]
        if not (resumed and position.started[i]):  # else its loaded state continues
            _call_if_present(source, "set_epoch", position.source_epoch(i))
        position.started[i] = True
        return iter(source)

    def _close_iterator(self, i: int, it: Iterator[BatchT]) -> None:
        # An iterator made for the pass (a loader's, a DataLoader's) is closed with it; an
        # iterator or generator given as the source itself is the caller's.
        if it is not self.sources[i]:
            _call_if_present(it, "close")

    def _abandon_pass(self) -> None:
        batches = self._pass() if self._pass is not None else None
        self._pass = None
        if batches is not None:
            batches.close()

    def _check(self, i: int, batch: Any) -> None:
        signature = _signature(batch)
        if self._reference is None:
            self._reference = (i, signature)
            return
        first, reference = self._reference
        if signature == reference:
            return
        found = _difference(reference, signature)
        if found:
            raise InvalidArgumentError(
                f"mix: a batch of source {i} ({_name(self.sources[i])}) cannot be mixed with one "
                f"of source {first} ({_name(self.sources[first])}): {found}. Give the loaders "
                "the same fields, return_index, device and dtype (sizes may differ), or "
                "check_structure=False if the training step tells them apart itself"
            )

    def _position(self) -> _Position:
        if self._live is not None:
            return self._live
        if self._resume is not None:
            return self._resume
        return _Position(self._epoch, self._schedule, self.stop, self._steps_before)

    def __len__(self) -> int:
        """Batches this epoch of the mix yields (the epoch in progress, or the next one), if
        source i yields ``len(source_i)`` batches every pass: the draws replayed under the
        stopping rule. It may differ from one epoch to the next (except with ``stop="never"``,
        where it is ``length``); it is the same on every rank whose sources have the same
        lengths."""
        if self.stop == "never":
            if self.length is None:
                raise TypeError("mix: stop='never' without length never ends: it has no len()")
            return self.length
        lengths = self._source_lengths("len()")
        position = self._position()
        epoch = position.epoch
        key = (epoch, position.first_step, tuple(lengths))
        if self._length_cache is None or self._length_cache[0] != key:
            n = epoch_length(
                lengths,
                self._schedule,
                seed=self.seed,
                epoch=epoch,
                stop=self.stop,
                length=self.length,
                first_step=position.first_step,
            )
            self._length_cache = (key, n)
        return self._length_cache[1]

    def _source_lengths(self, needed_by: str) -> list[int]:
        """len() of each source that can be drawn (0 for the others)."""
        lengths = []
        for i, source in enumerate(self.sources):
            if not self._schedule.may_draw(i):
                lengths.append(0)
                continue
            try:
                lengths.append(len(source))  # type: ignore[arg-type]
            except TypeError:
                raise TypeError(
                    f"mix: {needed_by} needs the len() of every source, and source {i} "
                    f"({_name(source)}) has none"
                ) from None
        return lengths

    # --- resume ------------------------------------------------------------------------------
    def _stateless_source(self) -> str | None:
        for i, source in enumerate(self.sources):
            if not self._schedule.may_draw(i):
                continue
            if not (
                callable(getattr(source, "state_dict", None))
                and callable(getattr(source, "load_state_dict", None))
            ):
                return (
                    f"mix: source {i} ({_name(source)}) has no state_dict()/load_state_dict(), so "
                    "the mix cannot save where it stands: use stoker loaders (or a torchdata "
                    "StatefulDataLoader) as sources"
                )
        return None

    @property
    def state_dict(self) -> Callable[[], dict[str, Any]]:
        """``state_dict()``: where the mix stands, resumable exactly with ``load_state_dict``:
        its epoch and step, each source's batches drawn, pass and whether it ran out, and each
        source's own ``state_dict()``. Present only when every source (of positive weight) has
        ``state_dict`` and ``load_state_dict``; otherwise reading it raises an AttributeError
        that names the source (so ``stoker.to_device`` sees a mix without state)."""
        problem = self._stateless_source()
        if problem:
            raise AttributeError(problem)
        return self._state_dict

    @property
    def load_state_dict(self) -> Callable[[dict[str, Any]], None]:
        """``load_state_dict(state)``: the next pass continues exactly where ``state`` was taken
        (each source's state is loaded now). Refused if the seed, weights, stopping rule, length
        or number of sources differ. Present under the same condition as ``state_dict``."""
        problem = self._stateless_source()
        if problem:
            raise AttributeError(problem)
        return self._load_state_dict

    def _state_dict(self) -> dict[str, Any]:
        position = self._position()
        sources: list[Any] = [None] * len(self.sources)
        if position.step > 0:  # at step 0 the pass starts afresh: the sources' states are moot
            for i, source in enumerate(self.sources):
                if self._schedule.may_draw(i):
                    sources[i] = source.state_dict()  # type: ignore[attr-defined]
        return {
            "version": _STATE_VERSION,
            "kind": "stoker.mix",
            "seed": self.seed,
            "weights": list(self.weights),
            "stop": self.stop,
            "length": self.length,
            **position.state(),
            "total": list(self._total),
            "sources": sources,
        }

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("kind") != "stoker.mix":
            raise InvalidArgumentError("mix: not a state of stoker.mix")
        if state.get("version") != _STATE_VERSION:
            raise InvalidArgumentError(f"mix: unknown state version {state.get('version')!r}")
        n = len(self.sources)
        if len(state["weights"]) != n:
            raise InvalidArgumentError(
                f"cannot resume: the state mixes {len(state['weights'])} sources, this mix {n}"
            )
        for name, mine in (("seed", self.seed), ("stop", self.stop), ("length", self.length)):
            if state[name] != mine:
                raise InvalidArgumentError(
                    f"cannot resume: the state has {name}={state[name]!r}, this mix {mine!r}"
                )
        at = int(state.get("first_step", 0)) + int(state["step"])
        now = self._schedule.at(at)
        if not all(math.isclose(a, b, rel_tol=1e-12) for a, b in zip(state["weights"], now)):
            raise InvalidArgumentError(
                f"cannot resume: the state has weights {state['weights']} at step {at}, this mix "
                f"{list(now)} (a different mix draws a different sequence)"
            )
        position = _Position.from_state(state, self._schedule, self.stop)
        self._abandon_pass()
        self._live = None
        self._length_cache = None
        if position.step > 0:
            for i, source in enumerate(self.sources):
                if not self._schedule.may_draw(i) or (
                    position.exhausted[i] and self.stop == "all_exhausted_without_replacement"
                ):
                    continue  # never iterated again this epoch
                if state["sources"][i] is None:
                    raise InvalidArgumentError(
                        f"cannot resume: the state holds no state of source {i} "
                        f"({_name(source)}): its state_dict() gave None"
                    )
                source.load_state_dict(state["sources"][i])  # type: ignore[attr-defined]
        self._epoch = position.epoch
        self._resume = position
        self._steps_before = position.first_step
        self._total = [int(v) for v in state.get("total", self._total)]

    # --- replay ------------------------------------------------------------------------------
    def source_at(self, epoch: int, step: int) -> tuple[int, int, int]:
        """Which loader gave batch `step` of `epoch`: (source, its epoch for that pass, its
        step in that pass), from the draws and the loaders' lengths replayed without a batch
        (a pass from the epoch's start; with a schedule, counted from the step the mix's
        state is at now). StepOutOfRangeError (an IndexError) past the epoch's last batch."""
        batches = 0
        for drawn, position in replay(self._source_lengths("replay"), self._schedule,
                                      seed=self.seed, epoch=epoch, stop=self.stop,
                                      length=self.length,
                                      first_step=self._position().first_step):  # fmt: skip
            if position.step == step:
                return drawn, position.source_epoch(drawn), position.taken[drawn]
            batches += 1
        raise step_out_of_range(epoch, step, batches)

    def sample_ids(self, epoch: int, step: int, rank: int | None = None) -> dict[str, Any]:
        """The loader batch `step` of `epoch` came from, and its samples there
        (``{"source": i, "samples": source.sample_ids(...)}``): computed, nothing read."""
        i, source_epoch, source_step = self.source_at(epoch, step)
        source = self.sources[i]
        if not callable(getattr(source, "sample_ids", None)):
            raise TypeError(f"mix: source {i} ({_name(source)}) has no sample_ids()")
        samples = source.sample_ids(source_epoch, source_step, rank)  # type: ignore[attr-defined]
        return {"source": i, "samples": samples}

    def batch_at(self, epoch: int, step: int) -> BatchT:
        """Batch `step` of `epoch` as a pass from the epoch's start gave it: the loader the
        draw picked, at its own step (its ``batch_at``)."""
        i, source_epoch, source_step = self.source_at(epoch, step)
        source = self.sources[i]
        if not callable(getattr(source, "batch_at", None)):
            raise TypeError(f"mix: source {i} ({_name(source)}) has no batch_at()")
        return source.batch_at(source_epoch, source_step)  # type: ignore[attr-defined]

    # --- what happened -----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The pass in progress (or the state loaded, or else the last pass finished): its
        ``epoch`` and ``step``, the batches each source gave (``batches``) and their share of
        the step's batches (``proportions``) beside ``weights`` (normalised), each source's
        ``passes`` and whether it has ``exhausted`` its data, and ``total_batches`` per source
        over the mix's life (carried by the state, so across resumes)."""
        position = self._live or self._resume or self._finished or self._position()
        step = position.step
        return {
            "epoch": position.epoch,
            "step": step,
            "batches": list(position.drawn),
            "proportions": [d / step if step else 0.0 for d in position.drawn],
            "weights": list(self.weights),
            "passes": [
                r + 1 if started else 0 for r, started in zip(position.restarts, position.started)
            ],  # fmt: skip
            "exhausted": list(position.exhausted),
            "total_batches": list(self._total),
        }

    def close(self) -> None:
        """End the pass in progress and close every source that has ``close()``."""
        if self._closed:
            return
        self._closed = True
        self._abandon_pass()
        if self._recorder is not None:
            self._recorder.close()
        for source in self.sources:
            _call_if_present(source, "close")

    def __enter__(self) -> Mix[BatchT]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        sources = ", ".join(_name(s) for s in self.sources)
        weights = (
            ", ".join(f"{w:.4g}" for w in self._schedule.fixed)
            if self._schedule.fixed is not None
            else "a schedule, now " + ", ".join(f"{w:.4g}" for w in self.weights)
        )
        length = "" if self.length is None else f", length={self.length}"
        return (
            f"Mix([{sources}], weights=[{weights}], seed={self.seed}, stop={self.stop!r}"
            f"{length}, epoch={self.epoch})"
        )


def mix(
    loaders: Sequence[Iterable[BatchT]],
    weights: Weights,
    *,
    seed: int = 0,
    stop: StopRule = "first_exhausted",
    length: int | None = None,
    check_structure: bool = True,
    record: str | os.PathLike | None = None,
) -> Mix[BatchT]:
    """Batches from several loaders in the given proportions, as one loader.

    Each step draws which loader gives the next batch, with probability ``weights[i]`` (any
    non-negative numbers, normalised; a weight of 0 leaves its loader out), from a random number
    keyed by (``seed``, epoch, step): the sequence of sources is a pure function of the seed, the
    epoch and the stopping rule, never of timing, so it is the same on every rank, run or resume.

    ``stop`` says what happens when the loader drawn has no batch left in its pass (the names
    and meanings of HuggingFace datasets' ``interleave_datasets``):

    - ``"first_exhausted"`` (default): the epoch ends there. Proportions hold to the end; each
      batch is seen at most once per epoch; what the other loaders had left is not.
    - ``"all_exhausted"``: that loader starts its next pass (oversampling) and the epoch ends
      when every loader has run out at least once. Proportions hold to the end; the smaller
      loaders' batches are seen several times.
    - ``"all_exhausted_without_replacement"``: that loader leaves the draw, the others are drawn
      with their weights renormalised, and the epoch ends when all have run out: every batch
      exactly once, but the end of the epoch is made of the largest loaders only.
    - ``"never"``: loaders restart whenever they run out; the epoch is ``length`` batches
      (endless without it).

    ``length``: at most this many batches per epoch (exactly this many with ``"never"``).

    Weights on a schedule (a curriculum): ``weights=[(0, [1, 0]), (10_000, [0.5, 0.5])]``
    (``(step, weights)`` points, linear in between, the first and last held before and after)
    or ``weights=lambda step: [...]``. The step is the mix's batches handed out before this one,
    over all its epochs; ``state_dict`` carries it, so a resume continues exactly across a weight
    change. The draw stays keyed by (seed, epoch, step in the epoch). A scheduled mix starts a
    loader's pass when it is first drawn; ``len()`` replays the schedule too.

    A restarted loader's pass ``p`` (from 1) in epoch ``e`` runs at its epoch
    ``e + p * 2**32`` (``set_epoch``), so no pass repeats another's order or augmentation.

    The result iterates like a DataLoader: ``len()`` (when the loaders have one), ``set_epoch``
    (forwarded to every loader), ``state_dict()``/``load_state_dict()`` (when every loader has
    them: the mix's position plus each loader's state; a resume continues with exactly the
    batches an uninterrupted run would have given), ``stats()`` (batches per loader, realised
    proportions) and ``close()`` (closes the loaders). ``stoker.to_device`` works on top of it.

    ``check_structure``: every batch is compared with the mix's first one (container types,
    dict keys, tuple lengths, each tensor's dtype, number of dimensions and device; not sizes):
    a difference raises ``InvalidArgumentError`` naming both loaders and where they differ.

    Replay: ``source_at(epoch, step)``, ``sample_ids`` and ``batch_at`` say which loader a step
    drew and give its batch again; ``record="mix.jsonl"`` appends a line per step naming the
    loader drawn and that loader's own epoch and step (whose ``record=`` lists the samples).
    """
    return Mix(
        loaders,
        weights,
        seed=seed,
        stop=stop,
        length=length,
        check_structure=check_structure,
        record=record,
    )
