"""``stoker.RayWorkers``: a loader's workers as actors of a Ray cluster, on its CPU machines.

Each actor builds the loader from the recipe (the same class and arguments, on the host, with
``threads`` engine threads) and makes the chunks of steps it is given, streaming one step's
batch at a time through Ray's object store (numpy arrays: read without a copy where the actor is
on the trainer's machine, fetched over the network otherwise). A thread of the training process
per actor reads its streams and puts what arrives into the dispatcher's queue; an actor or a
node lost (any error of Ray's own, not of the step: its process killed, its node gone) is
reported as lost, killed, and another actor asked for in its place: it starts wherever the
cluster has room, on a node that joins later if none has. Any other failure, of the actor's
code or of the reading thread here, reaches the training loop at its next batch as an error
naming the worker, its node and the cause, with the traceback where it happened.

The connection to Ray is the process's (stoker.ray_session): a pool opens it if the process has
none, and the last stoker user of a connection stoker opened shuts it down; one the user opened
is never shut down by stoker.

A result read from the object store is copied into memory of the trainer's own (a batch's
tensors are the loop's to change in place, and Ray's objects are read-only): about 1 ms per
10 MB on one core, which the trainer's wait for a batch from another machine hides.
"""

from __future__ import annotations

import os
import queue
import re
import socket
import threading
import time
import traceback
from typing import Any

from ... import faults
from ...errors import InvalidArgumentError, StokerError
from .steps import Chunk, Recipe, StepWorker, worker_failure

JOIN_TIMEOUT_S = 30.0  # close() waits this long for the reading threads once the actors are gone


class RayWorkers:
    """Workers on a Ray cluster for a loader's ``remote_workers=``.

    ``count`` actors (at most: those the cluster has no room for wait for a node to join),
    each running stoker's engine with ``threads`` threads on ``threads`` of a node's CPUs
    (``num_cpus``, default ``threads``), spread over the nodes. ``address``: the cluster, as
    ``ray.init`` takes it; None uses the one this process is connected to, or ``ray.init``'s
    own rules (``RAY_ADDRESS``, a cluster started on this machine, else a new local one). A
    connection stoker opens is shut down when the last stoker loader (or pack) using it closes;
    one the user opened, never. The pack's path must be readable where the actors run (a shared
    file system, or a URL: s3://, gs://, http(s)://). ``batches_in_flight``: batches each
    worker may have made and not yet handed to the training loop. ``fallback_after``: seconds
    without any worker ready after which the steps are made in the training process, until a
    worker is ready again (None: never; then a step waits for a worker). ``timeout``: seconds
    the training loop waits for one batch at most; past it, an error naming the step and what
    each worker holds (None: no limit). ``runtime_env``: Ray's, for the actors (e.g.
    ``{"env_vars": {...}}``).
    """

    def __init__(self, count: int, threads: int = 1, *, address: str | None = None,
                 batches_in_flight: int = 8, num_cpus: float | None = None,
                 runtime_env: dict[str, Any] | None = None,
                 fallback_after: float | None = 10.0,
                 timeout: float | None = 600.0):  # fmt: skip
        for label, value in (("count", count), ("threads", threads),
                             ("batches_in_flight", batches_in_flight)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{label} must be a positive int, not {value!r}")
        self.count, self.threads, self.address = count, threads, address
        self.batches_in_flight, self.runtime_env = batches_in_flight, runtime_env
        self.num_cpus = float(threads) if num_cpus is None else float(num_cpus)
        for label, seconds in (("fallback_after", fallback_after), ("timeout", timeout)):
            number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
            if seconds is not None and not (number and seconds >= 0):
                raise InvalidArgumentError(f"{label} must be seconds >= 0 or None, not {seconds!r}")
        self.fallback_after = None if fallback_after is None else float(fallback_after)
        self.timeout = None if timeout is None else float(timeout)

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

        from ... import ray_session

        self.ray, self.spec = ray, spec
        self.recipe = recipe.with_threads(spec.threads)
        self.actor_class = ray.remote(_StepActor).options(
            num_cpus=spec.num_cpus, max_restarts=0, scheduling_strategy="SPREAD",
            runtime_env=spec.runtime_env)  # fmt: skip
        self.actors: dict[str, Any] = {}
        self.inboxes: dict[str, queue.SimpleQueue[Any]] = {}
        self.readers: list[threading.Thread] = []
        self.events: Any = None
        self.started = 0
        self.closing = False
        self.killed: set[str] = set()  # workers this pool stopped itself
        # Last: a pool whose construction fails holds no connection.
        _check_same_cluster(ray, spec.address)
        self._release = ray_session.connect(spec.address, runtime_env=spec.runtime_env,
                                            log_to_driver=False)  # fmt: skip

    def start(self, events: Any) -> None:
        self.events = events
        for _ in range(self.spec.count):
            self._start_one()

    def _start_one(self) -> None:
        name = f"ray/{self.started}"
        self.started += 1
        faults.point("actor", name, self.ray.exceptions.RaySystemError)
        actor = self.actor_class.remote(self.recipe)
        inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.actors[name], self.inboxes[name] = actor, inbox
        reader = threading.Thread(target=self._read, args=(name, actor, inbox), daemon=True,
                                  name=f"stoker-ray-{name}")  # fmt: skip
        try:
            faults.point("thread", reader.name, RuntimeError)
            reader.start()
        except BaseException:
            self._kill(name)
            raise
        self.readers.append(reader)

    def _get(self, ref: Any, what: str) -> Any:
        ray = self.ray
        faults.point("ray_get", what, ray.exceptions.RaySystemError)
        return ray.get(ref)

    def _read(self, name: str, actor: Any, inbox: "queue.SimpleQueue[Any]") -> None:
        ray, events = self.ray, self.events
        node = ""
        try:
            info = self._get(actor.ready.remote(), f"{name}'s readiness")
            if "error" in info:
                events.put(("failed", name, info["error"]))
                return
            node = f" on {info['node']} (pid {info['pid']})"
            events.put(("ready", name, info))
            while (item := inbox.get()) is not None:
                stream, chunk = item
                for ref in stream:
                    events.put(("result", name, chunk, _owned(self._get(ref, f"{name}'s step"))))
                events.put(("done", name, chunk))
        except ray.exceptions.RayTaskError as e:  # the worker's own code failed
            events.put(("failed", name, worker_failure(e.as_instanceof_cause(), name + node)))
        except ray.exceptions.RayError as e:  # the actor or its node is gone
            if not self.closing and name not in self.killed:  # not one this pool let go
                events.put(("lost", name, f"{type(e).__name__}: {e}"))
        except BaseException as e:  # anything else: said at the trainer's next batch
            if not self.closing:
                text = "".join(traceback.format_exception(e)).rstrip()
                events.put(("failed", name, StokerError(
                    f"remote worker {name}{node}: reading its results here failed: "
                    f"{type(e).__name__}: {e}\n{text}")))  # fmt: skip

    def submit(self, worker: str, chunk: Chunk) -> None:
        self.inboxes[worker].put((self.actors[worker].run.remote(chunk), chunk))

    def _kill(self, worker: str) -> None:
        self.killed.add(worker)
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
        try:
            connected = self.ray.is_initialized()  # not at exit, after Ray's own shutdown
            for worker in list(self.actors):
                self._kill(worker)
            deadline = time.monotonic() + JOIN_TIMEOUT_S
            for reader in self.readers if connected else ():
                reader.join(max(0.0, deadline - time.monotonic()))
            stuck = [r.name for r in self.readers if r.is_alive()] if connected else []
            if stuck:
                raise StokerError(
                    f"threads {', '.join(stuck)} still read from Ray "
                    f"{JOIN_TIMEOUT_S:g} s after their actors were killed"
                )
        finally:
            self._release()


def _check_same_cluster(ray: Any, address: str | None) -> None:
    """A process has one Ray connection: an address (host:port) naming another cluster than the
    one it is connected to is refused rather than silently ignored."""
    if address is None or not ray.is_initialized() or not re.fullmatch(r"[\w.-]+:\d+", address):
        return
    current = ray.get_runtime_context().gcs_address
    if current != address:
        raise InvalidArgumentError(
            f"RayWorkers(address={address!r}): this process is connected to the Ray cluster at "
            f"{current} (one connection per process): give that address, or none"
        )


def _owned(result: Any) -> Any:
    """A step's result with its arrays copied out of Ray's object store, which maps them
    read-only into this process: the batch's tensors are then the trainer's own, to change in
    place, and the store's memory is free as soon as the result is read."""
    import numpy as np

    def own(a: Any) -> Any:
        return np.array(a, copy=True) if isinstance(a, np.ndarray) and not a.flags.writeable else a

    if result.outputs is not None:
        result.outputs = [own(a) for a in result.outputs]
    result.indices = own(result.indices)
    return result
