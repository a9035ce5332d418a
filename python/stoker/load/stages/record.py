"""record=: each step's samples appended to a file as the pass hands the batch on (the format and
the reader are stoker.load.record's)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from . import HostBatch, Mapped, Stage
from .engine import EnginePass


class RecordSteps(Stage):
    """Writes the samples of every batch of the pass, positioned at the pass's first step."""

    def __init__(self, source: Stage, engine: EnginePass, path: str | os.PathLike):
        from ..record import StepRecorder

        super().__init__(source)
        self.engine = engine
        self.recorder = StepRecorder(path)
        self.steps = 0  # lines written by this loader

    def __iter__(self) -> Iterator[Any]:
        assert self.source is not None
        batches = iter(self.source)  # the pass begins: its epoch and first step are known
        o = self.engine.engine.options
        self.recorder.begin(self.engine.epoch, self.engine.step, o.rank, o.world_size)
        return Mapped(self.apply, batches)

    def apply(self, batch: HostBatch) -> HostBatch:
        self.recorder.write_samples(batch.indices, self.engine.dataset)
        self.steps += 1
        return batch

    def stats(self, into: dict[str, Any]) -> None:
        super().stats(into)
        into["record"] = {"path": self.recorder.path, "steps": self.steps}

    def close(self) -> None:
        self.recorder.close()
