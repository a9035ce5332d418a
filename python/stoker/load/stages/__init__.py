"""A loader's pass is a chain of stages, one module each, every one with the same contract.

A stage holds its source (the stage before it; the first one, the engine's pass, has none) and
answers four things: iterate (``for batch in stage``: one pass over its source, each batch
transformed by ``apply``), ``state_dict``/``load_state_dict`` (where the pass stands; only the
engine and the device feed hold a position, the others pass their source's on), ``stats(into)``
(its figures added to the loader's ``stats()``, after its source's), and ``close`` (its own
resources only). A Loader checks its options once and composes the chain (stoker.load.chain)
as a transaction: each stage's ``close`` enters the loader's ExitStack as soon as the stage
exists, so a failure part way closes the stages built, last first, and the loader's
``close()`` closes them all in that order. A new kind of work is one more stage, never a branch
in the Loader.

The chain, in order (each present only when its option asks for it)::

    EnginePass          the C++ engine's batches (or, resident on a GPU, only their indices)
    WorkerSteps         remote_workers=: the batches made by workers elsewhere, taken in step
                        order for the engine's steps (then an engine of indices only)
    ResidentGather      resident=True on a GPU: the batch gathered from tensors held there
    RecordSteps         record=: each step's samples, appended to a file
    PinSlots            device=: each batch slot page-locked once, where the feed reads it
    DeviceDecodeQueue   decode="gpu"/"auto": the handed-over files queued for the device
    MapSamples          map=fn: per-sample Python on a thread pool
    FormatBatch         the batch as the loop gets it (the preset's layout)
    AugmentBatch        augment=: the batch ops (on the host; on a GPU, inside the feed)
    DeviceFeedStage     device=: batches copied to the device on a side stream, where the
                        device stages run (DeviceDecode, AugmentBatch), then converted

Between EnginePass and FormatBatch a batch is a `HostBatch`; after it, what the loop gets.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterator
from typing import Any


@dataclasses.dataclass
class HostBatch:
    """A batch on its way through the host stages: its fields by name, the samples' pack
    indices, the epoch of its pass, and the engine's own outputs (for the stages that read
    them: the device decode's plans)."""

    fields: dict[str, Any]
    indices: Any
    epoch: int
    outputs: list[Any]
    blobs: list[Any]
    address: int  # the batch slot's, for the feed's page-locking (0: not an engine slot)
    number: int = -1  # the step of the epoch (this rank's batches before it)


class Stage:
    """The contract every stage keeps. Subclasses override `apply` (a batch in, a batch out)
    or `__iter__` (the source stage), and add to `stats` and `close` what is theirs."""

    def __init__(self, source: "Stage | None" = None):
        self.source = source

    def __iter__(self) -> Iterator[Any]:
        assert self.source is not None
        return Mapped(self.apply, iter(self.source))  # the pass begins now, as a for loop's

    def apply(self, batch: Any) -> Any:
        return batch

    def state_dict(self) -> dict[str, Any]:
        assert self.source is not None
        return self.source.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert self.source is not None
        self.source.load_state_dict(state)

    def stats(self, into: dict[str, Any]) -> None:
        if self.source is not None:
            self.source.stats(into)

    def close(self) -> None:
        """Release what this stage holds (never its source's: the chain closes each stage)."""


def length_hint(source: Iterator[Any]) -> Any:
    """`source`'s own ``__length_hint__`` (batches left, at most), or NotImplemented where it
    has none: what an iterator that hands out one batch for each of its source's returns."""
    n = operator.length_hint(source, -1)
    return n if n >= 0 else NotImplemented


class Mapped:
    """A pass's batches from its source's, through `fn`; closing it closes the source's pass
    (what `break` and a new pass do to the one in progress)."""

    def __init__(self, fn: Any, source: Iterator[Any]):
        self.fn, self.source = fn, source

    def __iter__(self) -> "Mapped":
        return self

    def __next__(self) -> Any:
        return self.fn(next(self.source))

    def __length_hint__(self) -> int:
        return length_hint(self.source)  # one batch out for each one in

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        if close is not None:
            close()
