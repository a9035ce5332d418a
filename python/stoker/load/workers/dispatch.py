"""The trainer's side of remote workers: which worker makes which steps, and the results taken
back in step order.

A pass's steps are cut into chunks of a few steps; a worker with room gets the next chunk (the
steps of a lost worker first). A worker holds at most `in_flight` steps not yet taken by the
training loop (made, on their way, or waiting to be taken), so a slow trainer never fills the
object store; the chunk the loop waits for is given out even past that bound. A lost worker's
steps not yet received go to the others (the pool starts another worker in its place, used once
it is ready); when no worker has been ready for `fallback_after` seconds, a worker in this
process makes them, until a remote worker is ready again: then the fallback takes no new chunk,
finishes those it has and stops (a later loss of every worker starts another). Every step is
made where it is assigned and taken exactly once; results of an abandoned pass are dropped. No
wait is without a deadline: a step not made within `timeout` seconds of the trainer asking for
it raises, naming the step and what each worker holds.

The dispatcher runs in the training thread, driven by `take`; the pools' own threads only put
events into its queue:
    ("ready", worker, info)            a worker can take chunks
    ("result", worker, chunk, result)  one step of a chunk, in the chunk's order
    ("done", worker, chunk)            the chunk's last result was sent
    ("lost", worker, reason)           the worker is gone: what it had not sent is remade
    ("failed", worker, error)          it cannot work at all (the loader cannot be built there,
                                       or its reader here failed): raised at the trainer's next()
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from ...errors import StokerError
from .steps import Chunk, StepResult


class Pool(Protocol):
    """Workers somewhere (Ray actors, threads of this process), started from one recipe."""

    name: str

    def start(self, events: "queue.SimpleQueue[tuple[Any, ...]]") -> None: ...
    def submit(self, worker: str, chunk: Chunk) -> None: ...
    def lose(self, worker: str) -> None: ...  # stop it; start another in its place
    def close(self) -> None: ...


@dataclasses.dataclass
class _Worker:
    name: str
    pool: Pool
    info: dict[str, Any]
    load: int = 0  # steps assigned and not yet taken by the loop (or dropped)
    most_load: int = 0
    chunks: dict[int, tuple[Chunk, set[int]]] = dataclasses.field(default_factory=dict)
    steps: int = 0
    samples: int = 0
    nbytes: int = 0
    busy_since: float | None = None
    busy_s: float = 0.0

    def report(self) -> dict[str, Any]:
        busy = self.busy_s + (time.perf_counter() - self.busy_since if self.busy_since else 0.0)
        return dict(self.info, name=self.name, steps=self.steps, samples=self.samples,
                    bytes=self.nbytes, busy_s=busy, most_in_flight=self.most_load,
                    samples_per_second=self.samples / busy if busy > 0 else 0.0)  # fmt: skip


class Dispatcher:
    """Chunks of a pass's steps to workers, their results back in step order."""

    def __init__(self, pools: list[Pool], in_flight: int,
                 fallback: Callable[[], Pool] | None = None,
                 fallback_after: float | None = 10.0, timeout: float | None = 600.0):  # fmt: skip
        """`fallback`: makes a pool of this process (None: no fallback; `fallback_after` None
        too); `timeout`: seconds the trainer waits for one step at most (None: no limit)."""
        if in_flight < 1:
            raise ValueError("in_flight must be at least 1")
        self.in_flight = in_flight
        self.chunk_steps = max(1, in_flight // 2)
        self.events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self.pools: list[Pool] = []
        self.workers: dict[str, _Worker] = {}
        self.make_fallback = fallback if fallback_after is not None else None
        self.fallback_after, self.timeout = fallback_after, timeout
        self.fallback: Pool | None = None  # the fallback pool while it runs
        self.fallbacks = 0  # started so far
        self.generation = 0
        self.pending: deque[Chunk] = deque()
        self.results: dict[int, tuple[str, StepResult]] = {}
        self.idents = itertools.count()
        self.last_ready = time.perf_counter()
        self.retired: list[_Worker] = []  # the lost ones, for the figures
        self._template = Chunk(0, 0, 0, 0, 1, 0, -1)  # the pass's, for the steps made again
        self.lost = self.recomputed = 0
        self.wait_s = 0.0
        self.closed = False
        for pool in pools:
            self.add_pool(pool)

    def add_pool(self, pool: Pool) -> None:
        self.pools.append(pool)
        pool.start(self.events)

    # --- a pass -----------------------------------------------------------------------------
    def begin(self, epoch: int, first: int, end: int, rank: int, world_size: int) -> None:
        """A new pass: steps `first`..`end - 1` of `epoch` for this rank. What the last pass
        left is dropped (its steps still on their way are dropped as they arrive)."""
        self.generation += 1
        for worker_name, _ in self.results.values():
            if worker_name in self.workers:
                self.workers[worker_name].load -= 1
        self.results.clear()
        self.pending.clear()
        self._template = Chunk(epoch, first, 0, rank, world_size, self.generation, -1)
        for start in range(first, end, self.chunk_steps):
            count = min(self.chunk_steps, end - start)
            self.pending.append(Chunk(epoch, start, count, rank, world_size, self.generation,
                                      next(self.idents)))  # fmt: skip
        self.last_ready = time.perf_counter()

    def take(self, step: int) -> StepResult:
        """Step `step`'s result, waiting for it (its wait is the trainer's wait), at most
        `timeout` seconds."""
        self._drain()
        if step not in self.results:
            began = time.perf_counter()
            try:
                while step not in self.results:
                    self._assign(step)
                    self._fall_back_if_alone()
                    self._retire_fallback()
                    waited = time.perf_counter() - began
                    if self.timeout is not None and waited > self.timeout:
                        raise self._timed_out(step, waited)
                    try:
                        event = self.events.get(timeout=0.2)
                    except queue.Empty:
                        continue
                    self._handle(event)
                    self._drain()
            finally:
                self.wait_s += time.perf_counter() - began
        name, result = self.results.pop(step)
        if name in self.workers:
            self.workers[name].load -= 1
        self._assign(step + 1)
        return result

    # --- events -----------------------------------------------------------------------------
    def _drain(self) -> None:
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            self._handle(event)

    def _handle(self, event: tuple[Any, ...]) -> None:
        kind, name = event[0], event[1]
        if kind == "ready":
            pool = next((p for p in self.pools if name.startswith(p.name + "/")), None)
            if pool is None:
                return  # of a pool closed meanwhile (a fallback retired)
            self.workers[name] = _Worker(name, pool, dict(event[2]))
            self.last_ready = time.perf_counter()
            return
        if kind == "failed":
            raise event[2]
        worker = self.workers.get(name)
        if kind == "lost":
            if worker is not None:
                self._lose(worker, str(event[2]))
            elif not any(w.name == name for w in self.retired):  # lost before it was ready
                pool = next((p for p in self.pools if name.startswith(p.name + "/")), None)
                if pool is not None:
                    self._lose(_Worker(name, pool, {}), str(event[2]), ready=False)
            return
        if worker is None:
            return  # from a worker already given up as lost
        chunk: Chunk = event[2]
        entry = worker.chunks.get(chunk.ident)
        if kind == "done":
            if entry is not None:
                del worker.chunks[chunk.ident]
                worker.load -= len(entry[1])
                if entry[1] and chunk.generation == self.generation:
                    self._redo(entry[1])  # a chunk cut short without an error: made again
                if not worker.chunks and worker.busy_since is not None:
                    worker.busy_s += time.perf_counter() - worker.busy_since
                    worker.busy_since = None
            return
        result: StepResult = event[3]
        if entry is None or result.step not in entry[1]:
            return
        entry[1].discard(result.step)
        if chunk.generation != self.generation:
            worker.load -= 1  # a result of an abandoned pass
            return
        if result.error is not None:
            # on_error="raise": the chunk ends here; the loop raises at this step
            worker.load -= len(entry[1])
            entry[1].clear()
        self.results[result.step] = (name, result)
        worker.steps += 1
        worker.nbytes += result.nbytes
        if result.indices is not None:
            worker.samples += len(result.indices)

    def _lose(self, worker: _Worker, reason: str, ready: bool = True) -> None:
        """`worker` is gone: what it held is made again; its pool starts another in its place."""
        if ready:
            del self.workers[worker.name]
        worker.info["lost"] = reason
        self.retired.append(worker)
        self.lost += 1
        remade: set[int] = set()
        for chunk, steps in worker.chunks.values():
            if chunk.generation == self.generation:
                remade |= steps
        self.recomputed += len(remade)
        self._redo(remade)
        worker.pool.lose(worker.name)

    def _redo(self, steps: set[int]) -> None:
        """Steps to make again, before any other."""
        if not steps:
            return
        ordered = sorted(steps)
        head = self._template
        chunks = []
        for start in range(0, len(ordered), self.chunk_steps):
            part = ordered[start : start + self.chunk_steps]
            run = [part[0]]
            for s in part[1:]:  # contiguous runs only: a chunk is a range of steps
                if s == run[-1] + 1:
                    run.append(s)
                else:
                    chunks.append(dataclasses.replace(head, first=run[0], count=len(run),
                                                      ident=next(self.idents)))  # fmt: skip
                    run = [s]
            chunks.append(dataclasses.replace(head, first=run[0], count=len(run),
                                              ident=next(self.idents)))  # fmt: skip
        self.pending.extendleft(reversed(chunks))

    # --- assignment -------------------------------------------------------------------------
    def _assign(self, wanted: int) -> None:
        """The next chunks to the workers with room; the chunk the loop waits for even past
        the bound (the least loaded worker takes it)."""
        retiring = self.fallback is not None and any(
            w.pool is not self.fallback for w in self.workers.values())  # fmt: skip
        candidates = [w for w in self.workers.values() if not (retiring and self._is_fallback(w))]
        while self.pending and candidates:
            chunk = self.pending[0]
            worker = min(candidates, key=lambda w: w.load)
            if worker.load + chunk.count > self.in_flight and chunk.first > wanted:
                return
            self.pending.popleft()
            worker.chunks[chunk.ident] = (chunk, set(chunk.steps))
            worker.load += chunk.count
            worker.most_load = max(worker.most_load, worker.load)
            if worker.busy_since is None:
                worker.busy_since = time.perf_counter()
            worker.pool.submit(worker.name, chunk)

    def _fall_back_if_alone(self) -> None:
        """No worker ready for fallback_after seconds: one in this process makes the steps."""
        if self.workers or self.fallback is not None or self.make_fallback is None:
            return
        assert self.fallback_after is not None
        if time.perf_counter() - self.last_ready < self.fallback_after:
            return
        pool = self.make_fallback()
        self.fallbacks += 1
        if self.fallbacks > 1:  # names unique over the loader's life (stats, late events)
            pool.name = f"{pool.name}-{self.fallbacks}"
        self.fallback = pool
        self.add_pool(pool)

    def _is_fallback(self, worker: _Worker) -> bool:
        return self.fallback is not None and worker.pool is self.fallback

    def _retire_fallback(self) -> None:
        """A remote worker is ready again: the fallback takes no new chunk (_assign leaves it
        out), and once the chunks it has are done, it stops and its pool closes."""
        pool = self.fallback
        if pool is None or not any(w.pool is not pool for w in self.workers.values()):
            return
        mine = [w for w in self.workers.values() if w.pool is pool]
        if any(w.chunks for w in mine):
            return  # finishing what it has
        for w in mine:
            del self.workers[w.name]
            w.info["retired"] = "a remote worker was ready again"
            self.retired.append(w)
        self.fallback = None
        self.pools.remove(pool)
        pool.close()

    def _timed_out(self, step: int, waited: float) -> StokerError:
        held = {w.name: sorted(s for _, steps in w.chunks.values() for s in steps)
                for w in self.workers.values()}  # fmt: skip
        lost = {w.name: w.info["lost"] for w in self.retired if "lost" in w.info}
        return StokerError(
            f"remote_workers: step {step} not made after {waited:.0f} s (timeout="
            f"{self.timeout:g}): workers ready and the steps each holds: {held or 'none'}"
            + (f"; lost: {lost}" if lost else "")
            + ("" if self.make_fallback is not None else "; no fallback in this process")
        )

    # --- figures and the end ----------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        self._drain()  # the workers ready, lost or done by now
        return {
            "workers": [w.report() for w in [*self.workers.values(), *self.retired]],
            "lost": self.lost,
            "recomputed_steps": self.recomputed,
            "trainer_wait_s": self.wait_s,
            "bytes": sum(w.nbytes for w in [*self.workers.values(), *self.retired]),
            "batches_in_flight": self.in_flight,
        }

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.results.clear()
        errors: list[BaseException] = []
        for pool in self.pools:
            try:
                pool.close()
            except Exception as e:  # close every pool, then say what failed
                errors.append(e)
        if errors:
            raise StokerError(f"closing the workers failed: {errors[0]}") from errors[0]
