"""The Mix: an iterable of batches drawn from several loaders, with a DataLoader's surface
(``len``, ``set_epoch``, ``state_dict``/``load_state_dict``, ``stats``, ``close``) and the replay
of any step (``source_at``, ``sample_ids``, ``batch_at``)."""

from __future__ import annotations

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
    Sequence,
    TypeVar,
)

from ...errors import InvalidArgumentError, step_out_of_range
from ...loader_protocol import EpochSetter, rebuild
from .draws import Schedule, Weights
from .position import _END, _RESTART, _STOP_RULES, StopRule, _Position, epoch_length, replay
from .structure import _difference, _signature

BatchT = TypeVar("BatchT")

_STATE_VERSION = 1


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
        by: str = "batches",
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
        if by not in ("batches", "tokens"):
            raise InvalidArgumentError(f"mix: by is 'batches' or 'tokens', not {by!r}")
        per_batch = None
        if by == "tokens":
            per_batch = []
            for k, source in enumerate(loaders):
                tokens = getattr(source, "tokens_per_batch", None)
                if not isinstance(tokens, int) or tokens < 1:
                    raise InvalidArgumentError(
                        f"mix: by='tokens' needs loaders that say their tokens_per_batch "
                        f"(TokenLoader); loaders[{k}] ({_name(source)}) does not"
                    )
                per_batch.append(tokens)
        self.by = by
        schedule = Schedule(weights, len(loaders), per_batch)
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
            from ..record import StepRecorder

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
            by=self.by,
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
        from ..loader import resolve_ranks

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
