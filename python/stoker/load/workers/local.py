"""Workers as threads of the training process: the loader's own threads working alongside
remote workers (``threads=``), and the fallback that makes the steps when no remote worker is
left. Each thread builds the loader from the recipe (its engine's threads do the work, without
the GIL) and hands its batches over without a copy."""

from __future__ import annotations

import os
import queue
import socket
import threading
from typing import Any

from .steps import Chunk, Recipe, StepWorker, worker_failure


class ThreadWorkers:
    """`count` workers in this process, each an engine of `threads` threads."""

    def __init__(self, count: int = 1, threads: int | str = 1, name: str = "local",
                 batches_in_flight: int = 8):  # fmt: skip
        self.count, self.threads, self.name = count, threads, name
        self.batches_in_flight, self.fallback_after = batches_in_flight, 10.0

    def open(self, recipe: Recipe) -> "ThreadPool":
        return ThreadPool(self, recipe)


class ThreadPool:
    def __init__(self, spec: ThreadWorkers, recipe: Recipe):
        self.name, self.spec = spec.name, spec
        self.recipe = recipe.with_threads(spec.threads)
        self.inboxes: dict[str, queue.SimpleQueue[Chunk | None]] = {}
        self.threads: dict[str, threading.Thread] = {}
        self.stopped: set[str] = set()
        self.events: Any = None
        self.started = 0

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
        self.inboxes[name], self.threads[name] = inbox, thread
        thread.start()

    def _work(self, name: str, inbox: "queue.SimpleQueue[Chunk | None]") -> None:
        try:
            worker = StepWorker(self.recipe, to_numpy=False)
        except BaseException as e:
            self.events.put(("failed", name, worker_failure(e, f"{name} (this process)")))
            return
        info = {"node": socket.gethostname(), "pid": os.getpid(), "threads": worker.loader.threads}
        self.events.put(("ready", name, info))
        try:
            while (chunk := inbox.get()) is not None:
                for result in worker.run(chunk):
                    if name in self.stopped:
                        return
                    self.events.put(("result", name, chunk, result))
                self.events.put(("done", name, chunk))
        except BaseException as e:
            self.events.put(("failed", name, worker_failure(e, f"{name} (this process)")))
        finally:
            worker.close()

    def submit(self, worker: str, chunk: Chunk) -> None:
        self.inboxes[worker].put(chunk)

    def kill(self, worker: str) -> None:
        """Stop a worker where it stands, as a lost machine would (tests)."""
        self.stopped.add(worker)
        self.events.put(("lost", worker, "stopped"))

    def lose(self, worker: str) -> None:
        self.stopped.add(worker)
        self.inboxes[worker].put(None)
        self._start_one()

    def close(self) -> None:
        for name, inbox in self.inboxes.items():
            self.stopped.add(name)
            inbox.put(None)
        for thread in self.threads.values():
            thread.join()
