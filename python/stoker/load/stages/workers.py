"""remote_workers=: the batches made by workers elsewhere (stoker.load.workers), in place of the
engine's. The engine here makes only each step's indices (load_samples=False): it holds the
pass's position, so `len`, `set_epoch`, ranks, `state_dict` and the resume are the loader's own;
for each of its steps the stage takes the workers' result, counts what failed there as the
engine's own failures (the skipped list, the warnings, `max_errors` and its error are the same
as a loader that decoded them), and hands on the batch, which is bit for bit the one the engine
would have made at that step."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

from . import HostBatch, Stage, length_hint
from .engine import Batches, EnginePass


class WorkerSteps(Stage):
    def __init__(self, source: EnginePass, dispatcher: Any):
        super().__init__(source)
        self.engine_pass, self.dispatcher = source, dispatcher
        self.seconds: dict[str, float] = {}

    def __iter__(self) -> Iterator[HostBatch]:
        steps = iter(self.engine_pass)  # the pass begins: its epoch, ranks and first step
        ep, engine = self.engine_pass, self.engine_pass.engine
        o = engine.options
        self.dispatcher.begin(ep.epoch, ep.step, engine.num_batches, o.rank, o.world_size)
        # the steps' count of batches left: at most, since a step whose samples all failed hands
        # out no batch; the feed reads it so as not to pull ahead past the pass's end
        return Batches(self._batches(steps), lambda: length_hint(steps))

    def _batches(self, steps: Iterator[HostBatch]) -> Generator[HostBatch, None, None]:
        ep = self.engine_pass
        for step in steps:
            result = self.dispatcher.take(step.number)
            for k, v in result.seconds.items():
                self.seconds[k] = self.seconds.get(k, 0.0) + v
            if result.failures or result.missing:
                ep.engine.account_elsewhere(result.failures, result.missing)
                if ep.options.on_error == "warn":
                    ep._warn_skipped()
            if result.error is not None:
                raise result.error
            if result.outputs is None:
                continue  # every sample of the step failed: the loader hands out no batch
            outputs = [_tensor(t) for t in result.outputs]
            yield HostBatch(ep.assemble(outputs, result.blobs), _tensor(result.indices),
                            step.epoch, outputs, result.blobs, 0, step.number)  # fmt: skip

    def stats(self, into: dict[str, Any]) -> None:
        super().stats(into)
        seconds = into.setdefault("seconds", {})
        for k, v in self.seconds.items():  # the workers' stage times, summed as the engine's
            seconds[k] = seconds.get(k, 0.0) + v
        workers = self.dispatcher.stats()
        seconds["wait"] = seconds.get("wait", 0.0) + workers["trainer_wait_s"]
        into["workers"] = workers


def _tensor(array: Any) -> Any:
    """A worker's numpy array (its own memory: the Ray pool copies results out of the object
    store) as a tensor; a tensor as it is."""
    import numpy as np
    import torch

    if not isinstance(array, np.ndarray):
        return array
    return torch.from_numpy(array)
