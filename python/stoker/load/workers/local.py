"""Workers as threads of the training process: the loader's own threads working alongside
remote workers (``threads=``), and the fallback that makes the steps when no remote worker is
left. Each thread builds the loader from the recipe (its engine's threads do the work, without
the GIL) and hands its batches over without a copy."""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from typing import Any

from ... import faults
from ...errors import StokerError
from .steps import Chunk, Recipe, StepWorker, worker_failure

JOIN_TIMEOUT_S = 60.0  # close() waits this long for a thread to end, then says which did not


class ThreadWorkers:
    """`count` workers in this process, each an engine of `threads` threads."""

    def __init__(self, count: int = 1, threads: int | str = 1, name: str = "local",
                 batches_in_flight: int = 8):  # fmt: skip
        self.count, self.threads, self.name = count, threads, name
        self.batches_in_flight, self.fallback_after = batches_in_flight, 10.0
        self.timeout: float | None = 600.0

    def open(self, recipe: Recipe) -> "ThreadPool":
        return ThreadPool(self, recipe)


class ThreadPool:
    def __init__(self, spec: ThreadWorkers, recipe: Recipe):
        self.name, self.spec = spec.name, spec
        self.recipe = recipe.with_threads(spec.threads)
        self.inboxes: dict[str, queue.SimpleQueue[Chunk | None]] = {}
        self.threads: dict[str, threading.Thread] = {}
        self.workers: dict[str, StepWorker] = {}  # each thread's, once built
        self.stopped: set[str] = set()
        self.events: Any = None
        self.started = 0
        self.lock = threading.Lock()  # guards workers and stopped between the threads

    def start(self, events: Any) -> None:
        self.events = events
        for _ in range(self.spec.count):
            self._start_one()

    def _start_one(self) -> None:
        name = f"{self.name}/{self.started}"
        self.started += 1
        inbox: queue.SimpleQueue[Chunk | None] = queue.SimpleQueue()
        thread = threading.Thread(target=self._work, args=(name, inbox), daemon=True,
                                  name=f"stoker-worker-{name}")  # fmt: skip
        faults.point("thread", thread.name, RuntimeError)
        thread.start()
        self.inboxes[name], self.threads[name] = inbox, thread

    def _work(self, name: str, inbox: "queue.SimpleQueue[Chunk | None]") -> None:
        where = f"{name} (this process)"
        worker: StepWorker | None = None
        try:
            worker = StepWorker(self.recipe, to_numpy=False)
            with self.lock:
                if name in self.stopped:  # closed while it was being built
                    return
                self.workers[name] = worker
            info = {"node": socket.gethostname(), "pid": os.getpid(),
                    "threads": worker.loader.threads}  # fmt: skip
            self.events.put(("ready", name, info))
            while (chunk := inbox.get()) is not None:
                for result in worker.run(chunk):
                    if name in self.stopped:
                        return
                    self.events.put(("result", name, chunk, result))
                if name in self.stopped:
                    return
                self.events.put(("done", name, chunk))
        except BaseException as e:  # any failure reaches the trainer, never a silent end
            if name not in self.stopped:
                self.events.put(("failed", name, worker_failure(e, where)))
        finally:
            if worker is not None:
                worker.close()

    def submit(self, worker: str, chunk: Chunk) -> None:
        self.inboxes[worker].put(chunk)

    def kill(self, worker: str) -> None:
        """Stop a worker where it stands, as a lost machine would (tests)."""
        self.stopped.add(worker)
        self.events.put(("lost", worker, "stopped"))

    def _stop(self, name: str) -> None:
        """The thread ends at its next result (its loader closed now, so that a step in
        progress ends at once)."""
        with self.lock:
            self.stopped.add(name)
            worker = self.workers.pop(name, None)
        self.inboxes[name].put(None)
        if worker is not None:
            worker.close()

    def lose(self, worker: str) -> None:
        self._stop(worker)
        self._start_one()

    def close(self) -> None:
        for name in list(self.inboxes):
            self._stop(name)
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for thread in self.threads.values():
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in self.threads.values() if t.is_alive()]
        if stuck:
            raise StokerError(f"worker threads {', '.join(stuck)} did not stop within "
                              f"{JOIN_TIMEOUT_S:g} s of close()")  # fmt: skip
