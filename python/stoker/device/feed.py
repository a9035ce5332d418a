"""``DeviceFeed`` and ``to_device``: a pass over the source with ``prefetch`` batches in flight,
the batches still being copied, the training stream's progress, and the pinned staging buffers
for batches that do not come in pinned memory. The package's docstring has the steps per batch.
"""

from __future__ import annotations

import collections
import operator
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from ..errors import InvalidArgumentError
from ..loader_protocol import rebuild
from .backend import device_backend
from .batches import _map_tensors, _replace, _tensors
from .normalize import Normalize

# Batches handed over whose copy may still be running. Past this, the host waits for the oldest.
_MAX_RETIRING = 2
# Batches handed over that the training stream may still be reading. Past this, the host waits
# for the oldest: the device then holds at most prefetch + 1 + _MAX_UNCONSUMED batches' outputs.
_MAX_UNCONSUMED = 2


class _StagingPool:
    """Pinned buffers for batches that do not come in pinned memory, reused by (shape, dtype,
    strides)."""

    def __init__(self, backend, keep: int):
        self._backend = backend
        self._keep = keep
        self._free: collections.deque[torch.Tensor] = collections.deque()
        self.allocated = 0

    def take(self, like: torch.Tensor) -> torch.Tensor:
        for i, buffer in enumerate(self._free):
            if (
                buffer.shape == like.shape
                and buffer.dtype == like.dtype
                and buffer.stride() == like.stride()
            ):
                del self._free[i]
                return buffer
        self.allocated += 1
        return self._backend.pinned_like(like)

    def give(self, buffer: torch.Tensor) -> None:
        self._free.append(buffer)
        while len(self._free) > self._keep:
            self._free.popleft()  # a shape no longer seen


class _InFlight:
    __slots__ = (
        "batch", "outputs", "host", "staged", "copied", "ready", "state", "reads_source_host",
        "reads_source_device", "job",
    )  # fmt: skip

    def __init__(self) -> None:
        self.batch: Any = None
        self.outputs: list[torch.Tensor] = []  # the device tensors handed over
        self.host: list[torch.Tensor] = []  # pinned host tensors the copies read
        self.staged: list[torch.Tensor] = []  # of those, the staging pool's
        self.copied: Any = None  # the backend's events
        self.ready: Any = None
        self.state: Any = None
        # The copies read memory that belongs to the source (not leased, not staged): pinned
        # host memory, or memory on the feed's GPU.
        self.reads_source_host = False
        self.reads_source_device = False
        self.job: Any = None  # with a stage thread: its work on this batch (batch and ready)


class _Pass(Iterator[Any]):
    """One iteration over the source: the in-flight window, the batches still being copied and
    the training stream's progress."""

    def __init__(self, feed: "DeviceFeed"):
        self._feed = feed
        self._source = iter(feed.source)
        # An iterator made for this pass (an ImageLoader's, a DataLoader's) is closed with it; a
        # generator or iterator passed in as the source is the caller's to close.
        self._owns_source = self._source is not feed.source
        self._in_flight: collections.deque[_InFlight] = collections.deque()
        self._retiring: collections.deque[_InFlight] = collections.deque()
        # One event per batch handed over before the last: the end of the training stream's
        # work on it.
        self._unconsumed: collections.deque[Any] = collections.deque()
        self._last_launched: _InFlight | None = None
        self._exhausted = False
        self._error: Exception | None = None  # from the source, raised after the batches before it
        self._busy = threading.Lock()
        self.handed_over = 0

    def __iter__(self) -> "_Pass":
        return self

    def __next__(self) -> Any:
        if not self._busy.acquire(blocking=False):
            raise InvalidArgumentError(
                "next() on a device feed's pass while another next() on it is running: iterate "
                "each pass from one thread at a time (a batch is ready for the stream current "
                "in the thread whose next() returned it)"
            )
        try:
            with self._feed._backend.guard():
                return self._next()
        finally:
            self._busy.release()

    def _next(self) -> Any:
        feed = self._feed
        backend = feed._backend
        self._retire()
        if self.handed_over:
            # The loop has queued its work on the previous batch by now.
            self._bound_unconsumed(backend.mark_consumer())
        # `prefetch` batches in flight besides the one handed out now.
        while not self._exhausted and len(self._in_flight) <= feed.prefetch:
            if self._in_flight and operator.length_hint(self._source, -1) == 0:
                # The source says it has no batch left: the next() that would tell so is put off
                # until the loop asks for one past the last, as it ends the source's pass (a
                # loader's epoch, which a `break` before the end must leave where it was).
                break
            self._release_source_buffers()
            try:
                batch = next(self._source)
            except StopIteration:
                self._exhausted = True
                break
            except Exception as e:
                # Raised when the loop reaches it, after the batches pulled before it, as the
                # source itself would have: a CorruptDataError does not cost the batches in flight.
                self._error, self._exhausted = e, True
                break
            state = feed._source_state() if feed._source_state is not None else None
            self._last_launched = feed._launch(batch, state)
            self._in_flight.append(self._last_launched)
        if not self._in_flight:
            error, self._error = self._error, None
            self.close()
            feed._pass_ended(self)
            if error is not None:
                raise error
            raise StopIteration
        entry = self._in_flight.popleft()
        if entry.job is not None:
            self._take_job(entry)
        backend.wait(entry.ready)  # the training stream waits on the GPU, not the host
        for tensor in entry.outputs:
            backend.hand_over(tensor)
        self._retiring.append(entry)
        self.handed_over += 1
        feed.batches += 1
        feed._last_state = entry.state
        batch, entry.batch, entry.outputs = entry.batch, None, []
        return batch

    def _take_job(self, entry: _InFlight) -> None:
        """The stage thread's batch and `ready` event for `entry`; its error ends the pass
        (after the batches before it) and is raised here, at its own batch."""
        t0 = time.perf_counter()
        try:
            entry.batch, entry.ready = entry.job.result()
        except BaseException:
            entry.job = None
            self._retiring.append(entry)  # its copies may be running: close() waits for them
            self.close()
            self._feed._pass_ended(self)
            raise
        finally:
            self._feed.stage_wait_s += time.perf_counter() - t0
        entry.job = None
        entry.outputs.extend(_tensors(entry.batch))

    def _wait(self, event) -> None:
        t0 = time.perf_counter()
        event.synchronize()
        self._feed.host_wait_s += time.perf_counter() - t0

    def _release_source_buffers(self) -> None:
        """Before the source is asked for its next batch, by which it may rewrite the buffers of
        the last one: the copies reading its pinned memory are done (the host waits), and what it
        queues next on the feed GPU's current stream runs after the side stream's copies of it (the
        GPU waits). A copy from another GPU runs on that GPU's current stream (torch's), so what
        the source queues there next is ordered after it already."""
        entry, self._last_launched = self._last_launched, None
        if entry is None:
            return
        if entry.reads_source_host and not entry.copied.query():
            self._wait(entry.copied)
            self._feed.source_waits += 1
        if entry.reads_source_device:
            # What the source queues next there waits until the side stream has copied it.
            self._feed._backend.wait(entry.copied)

    def _bound_unconsumed(self, consumed) -> None:
        """Keep the host at most _MAX_UNCONSUMED batches ahead of the training stream: outputs
        kept alive by record_stream would otherwise pile up on the device."""
        self._unconsumed.append(consumed)
        while self._unconsumed and self._unconsumed[0].query():
            self._unconsumed.popleft()
        while len(self._unconsumed) > _MAX_UNCONSUMED:
            self._wait(self._unconsumed.popleft())

    def _retire(self) -> None:
        """Give back the host memory of every batch whose copy has finished."""
        while self._retiring and self._retiring[0].copied.query():
            self._feed._release(self._retiring.popleft())
        while len(self._retiring) > _MAX_RETIRING:
            # Waited for before it leaves the queue: interrupted, the memory stays held.
            self._wait(self._retiring[0].copied)
            self._feed._release(self._retiring.popleft())

    def close(self) -> None:
        """Stop the stage thread (the batch it is on finishes, the rest are dropped), wait for
        the copies still running, then give back all host memory."""
        if self._feed._stage_thread is not None:
            self._feed._stage_thread.stop()
        with self._feed._backend.guard():
            for queue in (self._retiring, self._in_flight):
                while queue:
                    queue[0].copied.synchronize()
                    self._feed._release(queue.popleft())
        self._unconsumed.clear()
        self._last_launched = None
        self._exhausted = True
        self._error = None  # its traceback's frames hold this pass: a cycle holding the source
        close = getattr(self._source, "close", None) if self._owns_source else None
        if close is not None:
            close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class DeviceFeed:
    """Batches from ``source`` on ``device``: see :func:`to_device`."""

    def __init__(
        self,
        source: Iterable[Any],
        device: str | torch.device,
        *,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        dtype: torch.dtype | None = None,
        prefetch: int = 2,
        channels_last: bool = True,
        image: int | str | tuple[int | str, ...] = 0,
        backend: Any = None,
        source_leases_memory: bool = False,
        source_state: Callable[[], Any] | None = None,
        augment: Callable[[Any], Any] | None = None,
        stage_thread: Any = None,
    ):
        """``source_leases_memory``: the source never rewrites a batch's host memory while the
        feed holds its tensors (an ImageLoader's slots go back to the engine only when the feed
        drops them), so the feed may ask for the next batch before the copies are done.
        ``augment``: a loader's device stages, batch -> batch, run once the batch is on the
        device and before it is normalised: on the side stream, or with ``stage_thread`` (a
        stage_thread.StageThread) on that thread's own stream, normalising included."""
        if prefetch < 1:
            raise InvalidArgumentError(f"prefetch must be >= 1, not {prefetch}")
        # What pickling rebuilds the feed from (to_device's arguments); None for a loader's own
        # feed, which its loader rebuilds.
        self._arguments: dict[str, Any] | None = (
            None
            if backend is not None or source_state is not None
            else dict(
                iterable=source,
                device=device,
                mean=mean,
                std=std,
                dtype=dtype,
                prefetch=prefetch,
                channels_last=channels_last,
                image=image,
            )
        )
        self.source = source
        self._backend = backend if backend is not None else device_backend(device)
        self.normalize = Normalize(mean, std, dtype, channels_last)
        self.prefetch = prefetch
        self.image = image
        self._source_leases_memory = source_leases_memory
        self.augment = augment
        self._stage_thread = stage_thread
        state_dict = getattr(source, "state_dict", None)
        if source_state is None and callable(state_dict):
            source_state = state_dict
        self._source_state = source_state
        self._staging = _StagingPool(self._backend, keep=2 * (prefetch + _MAX_RETIRING + 1))
        # Weak: the pass's iterator holds the source (an ImageLoader holds this feed), and a cycle
        # would let the garbage collector close a loader in the middle of its pass.
        self._pass: weakref.ref[_Pass] | None = None
        self._last_state: Any = None
        # Counters: batches handed over, bytes copied straight from pinned memory and through
        # staging, host seconds spent waiting (on copies, or on the training stream), and how
        # often the source had to wait for the copies of its own pinned buffers.
        self.batches = 0
        self.direct_bytes = 0
        self.staged_bytes = 0
        self.host_wait_s = 0.0
        self.source_waits = 0
        self.stage_wait_s = 0.0  # waiting at next() for the stage thread to queue a batch

    @property
    def device(self) -> torch.device:
        """The device batches go to (for a bare "cuda", the current device when the last pass
        started)."""
        return self._backend.device

    # --- the loader-like surface -----------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        self.close()  # a pass abandoned with `break` gives its memory back now
        self._last_state = None
        self._backend.bind()
        new_pass = _Pass(self)
        self._pass = weakref.ref(new_pass)
        return new_pass

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]

    @property
    def sampler(self) -> Any:
        """The source's ``sampler`` (a DataLoader's, or a stoker loader's ``set_epoch``), which
        trainers reach for ``set_epoch``; None if it has none."""
        return getattr(self.source, "sampler", None)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles to ``to_device``'s arguments (the source pickled with them) and the source's
        state as of the last batch handed over; unpickled, the feed is made again around the
        unpickled source and continues from there."""
        if self._arguments is None:
            raise TypeError("a loader's own device feed is pickled with its loader")
        state = self.state_dict() if self._source_state is not None else None
        return (rebuild, (to_device, self._arguments, state))

    def set_epoch(self, epoch: int) -> None:
        self.source.set_epoch(epoch)  # type: ignore[attr-defined]

    def state_dict(self) -> Any:
        """The source's state as of the last batch handed over (not the ones in flight)."""
        if self._last_state is not None:
            return self._last_state
        return self._source_state() if self._source_state is not None else None

    def load_state_dict(self, state: Any) -> None:
        self.close()
        self._last_state = None
        self.source.load_state_dict(state)  # type: ignore[attr-defined]

    def stats(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "direct_bytes": self.direct_bytes,
            "staged_bytes": self.staged_bytes,
            "staging_buffers": self._staging.allocated,
            "host_wait_s": self.host_wait_s,
            "source_waits": self.source_waits,
            **({"stage_wait_s": self.stage_wait_s} if self._stage_thread is not None else {}),
        }

    def close(self) -> None:
        """End the pass in progress: wait for its copies and give its host memory back."""
        current = self._pass() if self._pass is not None else None
        if current is not None:
            current.close()
        self._pass = None

    # --- the work --------------------------------------------------------------------------
    def _launch(self, batch: Any, state: Any) -> _InFlight:
        backend = self._backend
        entry = _InFlight()
        entry.state = state

        device, leased = backend.device, self._source_leases_memory

        def move(tensor: torch.Tensor) -> torch.Tensor:
            nbytes = tensor.numel() * tensor.element_size()
            if tensor.device == device:
                if leased:  # an ImageLoader's slot on the host (device="cpu"): handed out as is
                    return tensor
                # The source's memory, which it may rewrite once asked for the next batch: the
                # feed hands out its own copy.
                backend.read_on_side(tensor)
                entry.reads_source_device = True
                self.direct_bytes += nbytes
                entry.host.append(tensor)
                return backend.copy(tensor)
            if tensor.device.type != "cpu":  # another GPU's
                self.direct_bytes += nbytes
                return backend.copy(tensor)
            if backend.is_pinned(tensor):
                self.direct_bytes += nbytes
                host = tensor
                entry.reads_source_host |= not leased
            else:
                host = self._staging.take(tensor)
                host.copy_(tensor)
                entry.staged.append(host)
                self.staged_bytes += nbytes
            entry.host.append(host)
            return backend.copy(host)

        devices = {t.device for t in _tensors(batch) if t.device.type != "cpu"}
        # Ordered after what was queued on the current stream(s) when the batch was pulled, as
        # `tensor.to(device, non_blocking=True)` there would be. Outside side_stream(), where the
        # current stream is the side stream itself.
        backend.wait_for_producers(devices)
        try:
            with backend.side_stream():
                moved = _map_tensors(batch, move)
                entry.copied = backend.record_event()
                if self._stage_thread is None:
                    moved = self._device_work(moved)
                    entry.ready = backend.record_event()
            if self._stage_thread is not None:
                entry.job = self._stage_thread.submit(moved, entry.copied, self._device_work)
                return entry  # the batch and its outputs come with the job's result
        except BaseException:
            if entry.host:  # copies may be running: the memory they read must outlive them
                with backend.side_stream():
                    backend.record_event().synchronize()
                self._release(entry)
            raise
        entry.batch = moved
        entry.outputs.extend(_tensors(moved))
        return entry

    def _device_work(self, moved: Any) -> Any:
        """What runs on a batch once it is on the device: the device stages, then the
        conversion and normalisation of its images."""
        if self.augment is not None:
            moved = self.augment(moved)
        return _replace(moved, self.image, self.normalize)

    def _release(self, entry: _InFlight) -> None:
        for buffer in entry.staged:
            self._staging.give(buffer)
        entry.host, entry.staged, entry.batch, entry.outputs = [], [], None, []

    def _pass_ended(self, finished: _Pass) -> None:
        if self._pass is not None and self._pass() is finished:
            self._pass = None
            self._last_state = None


def to_device(
    iterable: Iterable[Any],
    device: str | torch.device,
    *,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    dtype: torch.dtype | None = None,
    prefetch: int = 2,
    channels_last: bool = True,
    image: int | str | tuple[int | str, ...] = 0,
) -> DeviceFeed:
    """Wrap any iterable of batches (a torch DataLoader, an ImageLoader) so that they arrive on
    ``device``, copied on a side stream ``prefetch`` batches ahead.

    A batch is a tensor, or a tuple, list or dict of them (nested structures too); every tensor is
    moved, anything else passes through. ``batch[image]`` (the batch itself if it is a tensor; each
    ``batch[k]`` for a tuple of keys) is the image tensor: it is converted to ``dtype`` and,
    given ``mean`` and ``std`` (in [0, 1] units; uint8 images are scaled by 1/255 first),
    normalised on the device. 4-D images come out channels_last unless ``channels_last=False``.
    Without ``dtype``, ``mean`` and ``std`` the images are moved unchanged.

    Tensors already in pinned memory (``DataLoader(pin_memory=True)``) are copied directly; others
    are first copied into reused pinned staging buffers on the calling thread (``stats()`` counts
    both). ``device="cpu"`` is the same path with nothing to copy. A bare ``"cuda"`` is the
    current device when each pass starts, as torch resolves it; every CUDA call is made with
    that device current, so no other GPU is touched.

    The contracts (docs/GPU.md):

    - The source may rewrite its buffers, pinned or on a GPU, once it is asked for its next
      batch: what the feed hands out is always its own copy, it asks only after the last
      batch's copies from the source's pinned memory are done, and the GPU's current stream
      waits for the copies of the source's memory there.
    - A batch's copy is ordered after the work queued on the stream current at the ``next()``
      that pulled it (and on the current stream of the GPU its tensors are on), as
      ``tensor.to(device, non_blocking=True)`` there would be.
    - A batch is ready for, and protected on, the stream current at the ``next()`` that returned
      it, in the thread that called it. To use it on another stream ``s``, do what any tensor
      needs: ``s.wait_stream(torch.cuda.current_stream())`` and ``t.record_stream(s)``. One pass
      is iterated by one thread at a time; a concurrent ``next()`` raises.
    - The host runs at most two batches ahead of the training stream: the device holds at most
      ``prefetch + 3`` batches' outputs, besides those the loop keeps.

    The wrapper has ``len``, ``set_epoch``, and ``state_dict`` / ``load_state_dict`` when the source
    has them; ``state_dict()`` is the source's state as of the last batch handed out, not the
    ``prefetch`` batches in flight, so a resumed run sees every batch once.
    """
    return DeviceFeed(
        iterable,
        device,
        mean=mean,
        std=std,
        dtype=dtype,
        prefetch=prefetch,
        channels_last=channels_last,
        image=image,
    )
