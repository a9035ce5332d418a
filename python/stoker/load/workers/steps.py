"""What a worker does, wherever it runs (a Ray actor on another machine, or a thread of the
training process): it builds the loader from its recipe once, and for each chunk of steps it is
given positions its engine at the chunk's first step and hands out the chunk's batches, one
`StepResult` per step, bit for bit the batches the loader itself would make there (every draw is
keyed by (seed, epoch, sample), so it does not matter where a batch is made)."""

from __future__ import annotations

import dataclasses
import traceback
from collections import defaultdict, deque
from collections.abc import Iterator
from typing import Any

from ...errors import StokerError, StokerInternalError

# The options a worker's loader never takes from the trainer's: the trainer writes the files,
# counts the error budget, warns, moves batches to its device and reads its own record; the
# worker makes host batches, skipping what fails (the trainer accounts for it).
_WORKER_OVERRIDES: dict[str, Any] = {
    "device": None,
    "dtype": None,
    "mean": None,
    "std": None,
    "record": None,
    "quarantine": None,
    "max_errors": None,
    "remote_workers": None,
    "cache_dir": None,
    "cache_limit": None,
}


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How a worker builds its loader: the trainer's loader class and arguments, with the
    worker's own overrides (`worker_kwargs` makes them)."""

    loader_class: type
    kwargs: dict[str, Any]

    @classmethod
    def of(cls, loader: Any, augment_on_workers: bool) -> "Recipe":
        """The recipe for `loader`'s workers (each pool sets their threads).
        `augment_on_workers`: whether the trainer leaves the ops that have a worker form (on
        the host) to them."""
        kwargs = dict(loader._init_kwargs)
        accepted = set(kwargs)
        changes = dict(_WORKER_OVERRIDES)
        if kwargs.get("on_error") == "warn":
            changes["on_error"] = "skip"  # the trainer warns, as it accounts for the failures
        if not augment_on_workers:
            changes["augment"] = None
        kwargs.update({k: v for k, v in changes.items() if k in accepted})
        return cls(type(loader), kwargs)

    def with_threads(self, threads: int | str) -> "Recipe":
        """This recipe with `threads` engine threads (a cpu_budget bounds "auto" only)."""
        kwargs = dict(self.kwargs, threads=threads)
        if threads != "auto" and "cpu_budget" in kwargs:
            kwargs["cpu_budget"] = None
        return Recipe(self.loader_class, kwargs)


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Steps `first` .. `first + count - 1` of `epoch` for `rank` of `world_size`, of the
    trainer's pass number `generation` (results of an abandoned pass are dropped)."""

    epoch: int
    first: int
    count: int
    rank: int
    world_size: int
    generation: int
    ident: int  # unique within the dispatcher

    @property
    def steps(self) -> range:
        return range(self.first, self.first + self.count)


@dataclasses.dataclass
class StepResult:
    """One step's batch as a worker made it. `outputs`/`blobs`/`indices` are the engine's (numpy
    arrays when it crossed processes, tensors otherwise); `outputs` is None when every sample of
    the step failed or was missing (the loader hands out no batch there). `failures` (as
    skipped_since lists them) and `missing` are what the step left out, which the trainer counts
    as its own; `error` is the step's error under on_error="raise" (the chunk ends with it)."""

    step: int
    outputs: list[Any] | None = None
    blobs: list[Any] = dataclasses.field(default_factory=list)
    indices: Any = None
    failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    missing: int = 0
    error: BaseException | None = None
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    nbytes: int = 0


class StepWorker:
    """Builds a loader from a recipe and makes the batches of the chunks it is given."""

    def __init__(self, recipe: Recipe, to_numpy: bool):
        from ..stages.format import FormatBatch

        self.loader = recipe.loader_class(**recipe.kwargs)
        chain = self.loader._chain
        self.engine_pass = chain.engine
        self.host = chain.find(FormatBatch).source  # the host stages, up to the batch's format
        self.to_numpy = to_numpy
        self._seen = 0  # skipped samples already reported
        self._missing = 0
        self._seconds: dict[str, float] = {}

    def run(self, chunk: Chunk) -> Iterator[StepResult]:
        """The chunk's results, one per step, in step order; under on_error="raise" the last
        one may carry the error that ended it."""
        ep = self.engine_pass
        if (ep.options.rank, ep.options.world_size) != (chunk.rank, chunk.world_size):
            ep.options = dataclasses.replace(ep.options, rank=chunk.rank,
                                             world_size=chunk.world_size)  # fmt: skip
        batch_size = ep.options.batch_size
        consumed = min(chunk.first * batch_size * chunk.world_size, len(ep.dataset))
        ep.engine.load_state(chunk.epoch, consumed, chunk.first)  # grouped: the step
        ep.limit = chunk.count
        done = chunk.first  # steps before it are handed out
        batches = iter(self.host)
        try:
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                except StokerError as e:
                    yield from self._results(chunk, done, done, None, error=e)
                    return
                yield from self._results(chunk, done, batch.number, batch)
                done = batch.number + 1
            if done < chunk.first + chunk.count:  # the chunk's last steps made no batch
                yield from self._results(chunk, done, chunk.first + chunk.count - 1, None)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def _results(self, chunk: Chunk, first: int, last: int, batch: Any,
                 error: BaseException | None = None) -> Iterator[StepResult]:  # fmt: skip
        """Results of steps `first`..`last`: the steps before `last` made no batch (all their
        samples failed), `last` made `batch` (or none); what failed since the last result is
        split among them by the samples each step takes."""
        engine = self.engine_pass.engine
        failures = list(engine.skipped_since(self._seen))
        self._seen += len(failures)
        stats = engine.stats(False)
        missing = int(stats["missing"]) - self._missing
        self._missing = int(stats["missing"])
        seconds = {k: float(v) - self._seconds.get(k, 0.0) for k, v in stats["seconds"].items()}
        self._seconds = {k: float(v) for k, v in stats["seconds"].items()}
        by_step = self._split(chunk, first, last, failures)
        for step in range(first, last + 1):
            r = StepResult(step, failures=by_step.get(step, []))
            if step == last:
                r.missing, r.seconds, r.error = missing, seconds, error
                if batch is not None:
                    self._fill(r, batch)
            yield r

    def _split(self, chunk: Chunk, first: int, last: int,
               failures: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:  # fmt: skip
        if first == last or not failures:
            return {last: failures}
        owners: dict[int, deque[int]] = defaultdict(deque)
        engine = self.engine_pass.engine
        for step in range(first, last + 1):
            for index in engine.step_samples(chunk.epoch, step, chunk.rank, chunk.world_size):
                owners[int(index)].append(step)
        out: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for f in failures:
            steps = owners.get(int(f["index"]))
            out[steps.popleft() if steps else last].append(f)
        return out

    def _fill(self, r: StepResult, batch: Any) -> None:
        convert = (lambda t: t.numpy()) if self.to_numpy else (lambda t: t)
        r.outputs = [convert(t) for t in batch.outputs]
        r.blobs = batch.blobs
        r.indices = convert(batch.indices)
        r.nbytes = sum(int(t.nbytes) for t in r.outputs) + sum(
            len(b) for field in r.blobs for b in field
        )

    def close(self) -> None:
        self.loader.close()


def worker_failure(e: BaseException, where: str) -> StokerError:
    """A worker's own failure (not a sample's) as the trainer raises it: of its class, where
    it is a stoker error, naming the worker."""
    if isinstance(e, StokerError):
        try:
            return type(e)(f"remote worker {where}: {e}", reason=e.reason, shard=e.shard,
                           key=e.key, member=e.member)  # fmt: skip
        except TypeError:  # a class with its own constructor
            return e
    text = "".join(traceback.format_exception(e)).rstrip()
    return StokerInternalError(f"remote worker {where} failed: {type(e).__name__}: {e}\n{text}")
