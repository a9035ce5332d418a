"""A device stage on a thread and a CUDA stream of its own (decode="gpu"'s decoding, rendering,
``augment=`` and normalising), so that its host work (building the decoder's per-image objects,
launching kernels, the decoder's own host waits) runs beside the training loop instead of taking
turns with the model's kernel launches on the training thread.

The training thread, in the feed, copies each batch to the device on the feed's side stream and
``submit``s it with the copy's event; the thread's stream waits for that event on the GPU, the
stage's work is queued on the thread's stream, and an event ``ready`` is recorded after it. At
``next()`` the training thread takes the job's result (waiting on the host only until the work is
queued, not done) and its stream waits for ``ready`` on the GPU, as for any batch of the feed.

One pass at a time: ``start`` begins a thread for a pass, ``stop`` ends it (the jobs not begun
are dropped, the one running finishes, the stream's work is waited for, the stage's ``on_stop``
frees what the pass held) and joins it: the pass's close calls it, so `break`, ``close()`` and
the loaders' exit hook (stoker.load.loader) stop the thread before the interpreter tears torch
down. Each device's stream is made in the first pass on that device (the pass's, resolved at
its start: after `torch.cuda.set_device` a pass works on the new device) and kept for the
passes after it. At most ``depth`` jobs wait to begin; ``submit`` blocks past that. A job
that raises fails alone: its exception is raised by its ``result()``, at its own batch.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import faults
from .batches import _tensors


class Job:
    """One batch's work on the stage thread: ``result()`` waits until it is queued on the
    stream (or failed) and returns (the batch, the event after its work), or raises."""

    __slots__ = ("batch", "after", "work", "_done", "_out", "_ready", "_error")

    def __init__(self, batch: Any, after: Any, work: Callable[[Any], Any]):
        self.batch, self.after = batch, after
        self.work: Callable[[Any], Any] | None = work
        self._done = threading.Event()
        self._out: Any = None
        self._ready: Any = None
        self._error: BaseException | None = None

    def finish(self, out: Any, ready: Any) -> None:
        self._out, self._ready, self.batch, self.work = out, ready, None, None
        self._done.set()

    def fail(self, error: BaseException) -> None:
        self._error, self.batch, self.work = error, None, None
        self._done.set()

    def result(self) -> tuple[Any, Any]:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._out, self._ready


_STOP = object()


class StageThread:
    """Each job's ``work(batch) -> batch`` on a thread and stream of its own (see the module's
    docstring); the work comes with the job, so that the thread holds no reference to whoever
    submits (a feed holding its stage thread would otherwise be a reference cycle).
    ``on_start(backend, stream)`` runs in each pass's thread before its first job, with the
    stream current (where a stage builds what it owns: the device decoder); ``on_stop()`` in the
    thread after the stream's work is done (where it frees the pass's buffers)."""

    def __init__(self, backend: Any, *, depth: int, name: str = "stoker-device-stage",
                 on_start: Callable[[Any, Any], None] | None = None,
                 on_stop: Callable[[], None] | None = None):  # fmt: skip
        self.backend = backend
        self.depth = depth
        self.name = name
        self.on_start, self.on_stop = on_start, on_stop
        self.stream: Any = None  # the pass's: its device's
        self._streams: dict[Any, Any] = {}  # by device index
        self._thread: threading.Thread | None = None
        self._jobs: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._teardown_error: BaseException | None = None
        # Figures (stats()): jobs done, the thread's seconds on them (wall, and its own CPU
        # time: what it held the GIL for, besides what C++ it ran without it), the most jobs
        # seen waiting to begin, and the threads started.
        self.jobs = 0
        self.busy_s = 0.0
        self.cpu_s = 0.0
        self.max_queued = 0
        self.threads_started = 0
        self.thread_ids: set[int] = set()

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Begin the thread of a pass (nothing if one is running)."""
        if self._thread is not None:
            return
        faults.point("thread", self.name, RuntimeError)
        self._jobs = queue.Queue(maxsize=self.depth)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.threads_started += 1
        self._thread.start()

    def submit(self, batch: Any, after: Any, work: Callable[[Any], Any]) -> Job:
        """Queue `work(batch)` (`batch` on the device, its copy ending at event `after`) for the
        thread; blocks while `depth` jobs wait to begin."""
        if self._thread is None:
            self.start()
        job = Job(batch, after, work)
        self._jobs.put(job)
        self.max_queued = max(self.max_queued, self._jobs.qsize())
        return job

    def stop(self) -> None:
        """End the pass's thread: drop the jobs not begun, let the running one finish, then the
        thread waits for its stream and frees the pass's buffers (on_stop) before it ends."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, Job):
                job.fail(RuntimeError("the pass ended before this batch's device stage ran"))
        self._jobs.put(_STOP)  # the queue is empty: this never blocks
        if thread is not threading.current_thread():
            thread.join()
        error, self._teardown_error = self._teardown_error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        backend = self.backend
        jobs = self._jobs  # this pass's: a later pass has its own
        served = False  # _STOP taken: nothing waits on this pass's jobs any more
        try:
            with backend.guard():
                stream = self._streams.get(backend.device.index)
                if stream is None:
                    stream = self._streams[backend.device.index] = backend.new_stream()
                self.stream = stream
                self.thread_ids.add(threading.get_ident())
                with backend.on_stream(stream):
                    if self.on_start is not None:
                        self.on_start(backend, stream)
                try:
                    self._serve(jobs, stream)
                    served = True
                finally:
                    backend.synchronize(stream)  # the pass's buffers are read no more
                    if self.on_stop is not None:
                        self.on_stop()
        except BaseException as e:  # noqa: BLE001 - reaches the consumer
            if served:
                self._teardown_error = e  # raised by stop()
            else:
                self._fail_all(jobs, e)  # every job of the pass fails with it

    def _serve(self, jobs: queue.Queue[Any], stream: Any) -> None:
        backend = self.backend
        while True:
            job = jobs.get()
            if job is _STOP:
                return
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                with backend.on_stream(stream):
                    backend.stream_waits(stream, job.after)  # the copy, on the GPU
                    for tensor in _tensors(job.batch):  # allocated on the side stream
                        backend.read_on(tensor, stream)
                    assert job.work is not None, "a job runs once"
                    out = job.work(job.batch)
                    ready = backend.event_on(stream)
            except BaseException as e:  # noqa: BLE001 - raised at its own batch
                job.fail(e)
            else:
                job.finish(out, ready)
            self.busy_s += time.perf_counter() - wall
            self.cpu_s += time.thread_time() - cpu
            self.jobs += 1

    @staticmethod
    def _fail_all(jobs: queue.Queue[Any], error: BaseException) -> None:
        while True:
            job = jobs.get()
            if job is _STOP:
                return
            job.fail(error)

    def stats(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "busy_s": self.busy_s,
            "cpu_s": self.cpu_s,
            "max_queued": self.max_queued,
            "threads_started": self.threads_started,
        }
