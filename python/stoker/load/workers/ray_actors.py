"""``stoker.RayWorkers``: a loader's workers as actors of a Ray cluster, on its CPU machines.

Each actor builds the loader from the recipe (the same class and arguments, on the host, with
``threads`` engine threads) and makes the chunks of steps it is given, streaming one step's
batch at a time through Ray's object store (numpy arrays: read without a copy where the actor is
on the trainer's machine, fetched over the network otherwise). A thread of the training process
waits on the actors' streams and puts what arrives into the dispatcher's queue; an actor or a
node lost (any error of Ray's own, not of the step) is reported as lost, killed, and another
actor asked for in its place: it starts wherever the cluster has room, on a node that joins
later if none has.
"""

from __future__ import annotations

import os
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
        self.waiting: dict[Any, tuple[str, Chunk | None]] = {}  # ready refs and streams
        self.lock = threading.Lock()
        self.events: Any = None
        self.started = 0
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, events: Any) -> None:
        self.events = events
        for _ in range(self.spec.count):
            self._start_one()
        self.thread = threading.Thread(target=self._watch, daemon=True, name="stoker-ray-watch")
        self.thread.start()

    def _start_one(self) -> None:
        name = f"ray/{self.started}"
        self.started += 1
        actor: Any = self.actor_class.remote(self.recipe)
        with self.lock:
            self.actors[name] = actor
            self.waiting[actor.ready.remote()] = (name, None)

    def submit(self, worker: str, chunk: Chunk) -> None:
        stream = self.actors[worker].run.remote(chunk)
        with self.lock:
            self.waiting[stream] = (worker, chunk)

    def _watch(self) -> None:
        """Waits on the actors' streams and readiness; what arrives goes to the dispatcher."""
        ray = self.ray
        while not self.stop.is_set():
            with self.lock:
                waitables = list(self.waiting)
            if not waitables:
                self.stop.wait(0.01)
                continue
            ready, _ = ray.wait(waitables, num_returns=1, timeout=0.05, fetch_local=True)
            for item in ready:
                with self.lock:
                    entry = self.waiting.get(item)
                if entry is not None:
                    self._arrived(item, *entry)

    def _arrived(self, item: Any, name: str, chunk: Chunk | None) -> None:
        ray, events = self.ray, self.events
        try:
            if chunk is None:  # the actor's readiness
                with self.lock:
                    del self.waiting[item]
                info = ray.get(item)
                if "error" in info:
                    events.put(("failed", name, info["error"]))
                else:
                    events.put(("ready", name, info))
                return
            try:
                ref = next(item)
            except StopIteration:
                with self.lock:
                    self.waiting.pop(item, None)
                events.put(("done", name, chunk))
                return
            events.put(("result", name, chunk, ray.get(ref)))
        except ray.exceptions.RayTaskError as e:  # the worker's own code failed
            with self.lock:
                self.waiting.pop(item, None)
            events.put(("failed", name, worker_failure(e.as_instanceof_cause(), name)))
        except ray.exceptions.RayError as e:  # the actor or its node is gone
            self._forget(name)
            events.put(("lost", name, f"{type(e).__name__}: {e}"))

    def _forget(self, name: str) -> None:
        with self.lock:
            for key in [k for k, (n, _) in self.waiting.items() if n == name]:
                del self.waiting[key]

    def lose(self, worker: str) -> None:
        self._forget(worker)
        with self.lock:
            actor = self.actors.pop(worker, None)
        if actor is not None:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass  # already gone with its node
        self._start_one()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        with self.lock:
            actors = list(self.actors.values())
            self.actors.clear()
            self.waiting.clear()
        for actor in actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass
        if self.started_ray:
            self.ray.shutdown()
