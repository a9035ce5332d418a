"""``stoker.RayWorkers``: a loader's workers as actors of a Ray cluster, on its CPU machines.

Each actor builds the loader from the recipe (the same class and arguments, on the host, with
``threads`` engine threads) and makes the chunks of steps it is given, streaming one step's
batch at a time through Ray's object store (numpy arrays: read without a copy where the actor is
on the trainer's machine, fetched over the network otherwise). A thread of the training process
per actor reads its streams and puts what arrives into the dispatcher's queue; an actor or a
node lost (any error of Ray's own, not of the step) is reported as lost, killed, and another
actor asked for in its place: it starts wherever the cluster has room, on a node that joins
later if none has.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
from typing import Any

from ...errors import InvalidArgumentError
from .steps import Chunk, Recipe, StepWorker, worker_failure


class RayWorkers:
    """Workers on a Ray cluster for a loader's ``remote_workers=``.

    ``count`` actors (at most: those the cluster has no room for wait for a node to join),
    each running stoker's engine with ``threads`` threads on ``threads`` of a node's CPUs
    (``num_cpus``, default ``threads``), spread over the nodes. ``address``: the cluster, as
    ``ray.init`` takes it; None uses the one this process is connected to, or ``ray.init``'s
    own rules (``RAY_ADDRESS``, a cluster started on this machine, else a new local one, which
    ``close()`` then stops). The pack's path must be readable where the actors run (a shared
    file system, or a URL: s3://, gs://, http(s)://). ``batches_in_flight``: batches each
    worker may have made and not yet handed to the training loop. ``fallback_after``: seconds
    without any worker ready after which the steps are made in the training process.
    ``runtime_env``: Ray's, for the actors (e.g. ``{"env_vars": {...}}``).
    """

    def __init__(self, count: int, threads: int = 1, *, address: str | None = None,
                 batches_in_flight: int = 8, num_cpus: float | None = None,
                 runtime_env: dict[str, Any] | None = None,
                 fallback_after: float = 10.0):  # fmt: skip
        for label, value in (("count", count), ("threads", threads),
                             ("batches_in_flight", batches_in_flight)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{label} must be a positive int, not {value!r}")
        self.count, self.threads, self.address = count, threads, address
        self.batches_in_flight, self.runtime_env = batches_in_flight, runtime_env
        self.num_cpus = float(threads) if num_cpus is None else float(num_cpus)
        self.fallback_after = float(fallback_after)

    def open(self, recipe: Recipe) -> "RayPool":
        return RayPool(self, recipe)

    def __repr__(self) -> str:
        return (
            f"RayWorkers(count={self.count}, threads={self.threads}, "
            f"address={self.address!r}, batches_in_flight={self.batches_in_flight})"
        )


class _StepActor:
    """The actor: a StepWorker, and its chunks as streams of results."""

    def __init__(self, recipe: Recipe):
        self.error: BaseException | None = None
        try:
            self.worker = StepWorker(recipe, to_numpy=True)
        except BaseException as e:  # said by ready(), with the node's name
            self.error = e

    def ready(self) -> dict[str, Any]:
        where = f"on {socket.gethostname()} (pid {os.getpid()})"
        if self.error is not None:
            return {"error": worker_failure(self.error, where)}
        return {"node": socket.gethostname(), "pid": os.getpid(),
                "threads": self.worker.loader.threads}  # fmt: skip

    def run(self, chunk: Chunk) -> Any:
        yield from self.worker.run(chunk)


class RayPool:
    """The actors of one RayWorkers, each with a thread here that reads what it sends: its
    readiness, then its chunks' streams in order (an actor runs one chunk at a time), each
    result fetched as soon as it is made (across the network, if the actor is elsewhere). The
    reads block in Ray, without polling: a lost actor makes them raise."""

    name = "ray"

    def __init__(self, spec: RayWorkers, recipe: Recipe):
        import ray

        self.ray, self.spec = ray, spec
        self.recipe = recipe.with_threads(spec.threads)
        self.started_ray = False
        if not ray.is_initialized():
            ray.init(address=spec.address, runtime_env=spec.runtime_env, log_to_driver=False)
            self.started_ray = True
        self.actor_class = ray.remote(_StepActor).options(
            num_cpus=spec.num_cpus, max_restarts=0, scheduling_strategy="SPREAD",
            runtime_env=spec.runtime_env)  # fmt: skip
        self.actors: dict[str, Any] = {}
        self.inboxes: dict[str, queue.SimpleQueue[Any]] = {}
        self.readers: list[threading.Thread] = []
        self.events: Any = None
        self.started = 0
        self.closing = False

    def start(self, events: Any) -> None:
        self.events = events
        for _ in range(self.spec.count):
            self._start_one()

    def _start_one(self) -> None:
        name = f"ray/{self.started}"
        self.started += 1
        actor: Any = self.actor_class.remote(self.recipe)
        inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.actors[name], self.inboxes[name] = actor, inbox
        reader = threading.Thread(target=self._read, args=(name, actor, inbox), daemon=True,
                                  name=f"stoker-ray-{name}")  # fmt: skip
        self.readers.append(reader)
        reader.start()

    def _read(self, name: str, actor: Any, inbox: "queue.SimpleQueue[Any]") -> None:
        ray, events = self.ray, self.events
        try:
            info = ray.get(actor.ready.remote())  # waits while the cluster has no room for it
            if "error" in info:
                events.put(("failed", name, info["error"]))
                return
            events.put(("ready", name, info))
            while (item := inbox.get()) is not None:
                stream, chunk = item
                for ref in stream:
                    events.put(("result", name, chunk, ray.get(ref)))
                events.put(("done", name, chunk))
        except ray.exceptions.RayTaskError as e:  # the worker's own code failed
            events.put(("failed", name, worker_failure(e.as_instanceof_cause(), name)))
        except ray.exceptions.RayError as e:  # the actor or its node is gone
            if not self.closing:
                events.put(("lost", name, f"{type(e).__name__}: {e}"))

    def submit(self, worker: str, chunk: Chunk) -> None:
        self.inboxes[worker].put((self.actors[worker].run.remote(chunk), chunk))

    def _kill(self, worker: str) -> None:
        actor = self.actors.pop(worker, None)
        self.inboxes[worker].put(None)
        if actor is not None:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass  # already gone with its node

    def lose(self, worker: str) -> None:
        self._kill(worker)
        self._start_one()

    def close(self) -> None:
        self.closing = True
        connected = self.ray.is_initialized()  # not at exit, after Ray's own shutdown
        for worker in list(self.actors):
            self._kill(worker)
        for reader in self.readers if connected else ():
            reader.join(timeout=30)
        if self.started_ray:
            self.ray.shutdown()
