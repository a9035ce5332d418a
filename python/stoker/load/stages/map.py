"""The MapSamples stage: a loader's ``map=fn``, per-sample Python on the decoded fields for
what stoker.augment does not have (an albumentations pipeline, a project's own transform), run
on a pool of threads.

Each sample is handed to ``fn`` as a dict of numpy arrays, field by field: an image HxWxC uint8
(a view of the batch's own memory, which is channels_last), a mask HxW, an array its shape, a
label a 0-d array; Bytes/Text/Json fields as their Python values. ``fn`` returns a dict with
the same fields (or the subset it changed), each array of the same shape and dtype as given:
the results are written back into the batch in place. ``fn(sample, rng)`` (two parameters)
also gets a numpy Generator keyed by (seed, epoch, the sample's index), so its randomness is
repeatable and survives a resume; a pipeline with its own global generator (albumentations',
numpy's) is not.

The threads run Python, so they share the GIL: the stage gains where ``fn`` spends its time in
code that releases it (OpenCV, numpy on large arrays, PIL). Its time is ``stats()["seconds"]
["map"]`` (wall seconds of the stage), which the doctor weighs against the rest of the step.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from typing import Any

import numpy as np

from ... import faults
from ..closing import may_wait
from ...errors import InvalidArgumentError
from . import HostBatch, Stage


def _takes_rng(fn: Callable[..., Any]) -> bool:
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return False
    return len(params) >= 2


class MapStage:
    """``map=fn`` of a loader: fn over each sample of a batch on `threads` threads."""

    def __init__(
        self, fn: Callable[..., Mapping[str, Any]], threads: int, seed: int, images: set[str]
    ):
        if not callable(fn):
            raise InvalidArgumentError(f"map= takes a function of a sample, not {fn!r}")
        if threads < 1:
            raise InvalidArgumentError(f"map_threads must be at least 1, not {threads}")
        self.fn, self.threads, self.seed, self.images = fn, int(threads), int(seed), images
        self.takes_rng = _takes_rng(fn)
        self.seconds = 0.0
        self._pool: futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._pool_name = f"stoker-map-{id(self):x}"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"], state["_lock"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._pool_name = f"stoker-map-{id(self):x}"

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            # The loader may be collected in one of these threads (the garbage collector runs
            # where it allocates): that thread cannot wait for itself.
            own = threading.current_thread().name.startswith(self._pool_name + "_")
            pool.shutdown(wait=not own and may_wait())

    def __call__(self, batch: dict[str, Any], indices: Any, epoch: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        n = len(indices)
        ids = indices.tolist()
        if self.threads == 1 or n == 1:
            for i in range(n):
                self._one(batch, i, ids[i], epoch)
        else:
            if self._pool is None:
                faults.point("thread", self._pool_name, RuntimeError)
                self._pool = futures.ThreadPoolExecutor(self.threads, self._pool_name)
            done = [self._pool.submit(self._one, batch, i, ids[i], epoch) for i in range(n)]
            # Every call returns before the batch moves on, an error or not: none may write into
            # the batch's memory once the loader has it back.
            futures.wait(done)
            for f in done:
                f.result()
        with self._lock:
            self.seconds += time.perf_counter() - t0
        return batch

    def _sample(self, batch: dict[str, Any], i: int) -> dict[str, Any]:
        sample: dict[str, Any] = {}
        for name, value in batch.items():
            if isinstance(value, list):
                sample[name] = value[i]
                continue
            row = value[i]
            if name in self.images and row.dim() == 3:
                row = row.permute(1, 2, 0)  # HxWxC: a view of the (channels_last) batch
            sample[name] = row.numpy()
        return sample

    def _one(self, batch: dict[str, Any], i: int, index: int, epoch: int) -> None:
        sample = self._sample(batch, i)
        if self.takes_rng:
            rng = np.random.default_rng([self.seed, epoch, index])
            out = self.fn(sample, rng)
        else:
            out = self.fn(sample)
        if not isinstance(out, Mapping):
            raise InvalidArgumentError(
                f"map=: the function returned {type(out).__name__}, not a dict of fields"
            )
        for name, value in out.items():
            if name not in batch:
                raise InvalidArgumentError(
                    f"map=: the function returned a field {name!r} the batch does not have "
                    f"({', '.join(batch)})"
                )
            if isinstance(batch[name], list):
                batch[name][i] = value
                continue
            given = sample[name]
            if value is given:
                continue
            array = np.asarray(value)
            if array.shape != given.shape:
                raise InvalidArgumentError(
                    f"map=: field {name!r} came back {array.shape}, it went in {given.shape} "
                    "(a batch has fixed shapes: resize or crop in the field's geometry instead)"
                )
            np.copyto(given, array, casting="same_kind")


class MapSamples(Stage):
    def __init__(self, source: Stage, fn: Callable[..., Any], threads: int, seed: int,
                 images: set[str]):  # fmt: skip
        super().__init__(source)
        self.map = MapStage(fn, threads, seed, images)

    def apply(self, batch: HostBatch) -> HostBatch:
        batch.fields = self.map(batch.fields, batch.indices, batch.epoch)
        return batch

    def stats(self, into: dict[str, Any]) -> None:
        super().stats(into)
        into["seconds"]["map"] = self.map.seconds

    def close(self) -> None:
        self.map.close()
