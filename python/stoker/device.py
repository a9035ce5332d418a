"""The GPU feed: batches copied to the device from page-locked memory on a side stream, converted
and normalised there, handed over safely to the training stream.

What it does per batch (docs/GPU.md has the why and every contract):

1. The batch's host tensors must be in page-locked (pinned) memory, or the copy is neither
   asynchronous nor at full bandwidth. An ImageLoader's slots are page-locked once, in place,
   and stay so; other pinned tensors go as they are; anything else is first copied into a pinned
   staging buffer taken from a small pool. Where page-locking in place fails (WSL2, some
   confidential-computing machines), slots are staged like anything else, with one warning.
2. On the feed's own CUDA stream, which first waits for the work already queued on the stream
   current at ``next()`` (and on the current stream of a GPU the source's tensors live on): the
   copies (``non_blocking``), an event ``copied``, then the conversion to ``dtype`` and the
   normalisation in channels_last, then an event ``ready``.
3. ``prefetch`` batches are launched ahead. Handing a batch over, the stream current at
   ``next()`` waits for ``ready`` (on the GPU, not the host) and each output tensor is
   ``record_stream``-ed on it, so that the caching allocator does not give that memory to the
   side stream again before the training stream is done with it.
4. Host memory is given back only after its ``copied`` event has completed. A source's own
   buffers (not an ImageLoader's leased slots) may be rewritten as soon as the source is asked
   for its next batch: the feed never hands them out (a tensor already on the device is copied
   too), and asks only once the previous batch's copies of them are done.
5. The host runs at most ``_MAX_UNCONSUMED`` batches ahead of the training stream: past that it
   waits, so that outputs kept alive by ``record_stream`` cannot pile up on the device.

Every CUDA call is made with the feed's own device current (``torch.cuda.device``), so that a
feed for ``cuda:1`` never touches (or creates a context on) GPU 0. All CUDA calls go through
``_CudaBackend``. ``_HostBackend`` is the same path on the CPU (no copy, no stream: the events are
complete at once), so that everything but the CUDA calls runs in CI; the tests plug in stand-ins
for torch.cuda whose copies finish late, whose streams lag, and which record the device current
at every call.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from .errors import DeviceUnavailableError, InvalidArgumentError, StokerWarning
from .loader_protocol import rebuild

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Batches handed over whose copy may still be running. Past this, the host waits for the oldest.
_MAX_RETIRING = 2
# Batches handed over that the training stream may still be reading. Past this, the host waits
# for the oldest: the device then holds at most prefetch + 1 + _MAX_UNCONSUMED batches' outputs.
_MAX_UNCONSUMED = 2
_CUDA_HOST_REGISTER_PORTABLE = 1

_warned_page_lock = False


class _DoneEvent:
    """An event on the host: complete as soon as it exists."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


_DONE = _DoneEvent()


class _HostBackend:
    """device="cpu": the feed's logic on the host. No stream and no DMA: the events are complete
    at once. A source's tensors are cloned (contract 2); an ImageLoader's leased slots pass
    through."""

    pins_host_memory = False

    def __init__(self, device: torch.device):
        self.device = torch.device("cpu")

    def bind(self) -> None:
        pass

    def guard(self):
        return contextlib.nullcontext()

    def pin(self, address: int, nbytes: int) -> bool:
        return True

    def unpin(self, address: int) -> None:
        pass

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return True  # nothing to stage: the tensor is already where it is going

    def pinned_like(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(tensor)

    def side_stream(self):
        return contextlib.nullcontext()

    def wait_for_producers(self, devices: Iterable[torch.device]) -> None:
        pass

    def read_on_side(self, tensor: torch.Tensor) -> None:
        pass

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        # Already where it is going, but the source's: the feed hands out its own copy.
        return tensor.clone()

    def record_event(self):
        return _DONE

    def mark_consumer(self):
        return _DONE

    def wait(self, event) -> None:
        pass

    def hand_over(self, tensor: torch.Tensor) -> None:
        pass


def _cuda_runtime_get_last_error() -> list[Callable[[], int]]:
    """cudaGetLastError of each CUDA runtime loaded in this process (torch's own among them;
    torch's cudart bindings do not have it). Empty where the runtime is not a shared library."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "libcudart" in line}
    except OSError:
        return []
    functions: list[Callable[[], int]] = []
    for path in sorted(paths):
        try:
            function = ctypes.CDLL(path).cudaGetLastError  # the loaded copy: the same state
        except (OSError, AttributeError):
            continue  # " (deleted)", or not a runtime after all
        function.restype = ctypes.c_int
        functions.append(function)
    return functions


class _CudaBackend:
    """The CUDA calls of the feed, and nothing else. The caller holds ``guard()`` around every
    call but pin/unpin, which take it themselves."""

    pins_host_memory = True

    def __init__(self, device: torch.device):
        # A bare "cuda" means the current device when each pass starts, as torch resolves it at
        # the time of use: a loader built before torch.cuda.set_device(local_rank) still feeds
        # that rank's GPU.
        # Nothing touches a GPU before the first pass: building a loader creates no context.
        self.requested = device
        self._streams: dict[int, torch.cuda.Stream] = {}
        self.device = self._resolve()

    def _resolve(self) -> torch.device:
        index = self.requested.index
        return torch.device("cuda", torch.cuda.current_device() if index is None else index)

    def bind(self) -> None:
        """Resolve the device for the pass that starts (see __init__), and its side stream."""
        self.device = self._resolve()
        if self.device.index not in self._streams:
            with self.guard():
                self._streams[self.device.index] = torch.cuda.Stream(self.device)
        self._stream = self._streams[self.device.index]

    def guard(self):
        # torch.cuda.device, unlike leaving torch.cuda.stream(s) for another device's stream,
        # restores the previous device without creating a CUDA context on it.
        return torch.cuda.device(self.device)

    def _clear_error(self) -> None:
        """A failed runtime call leaves its error as the thread's "last error", which torch's
        check after the next kernel launch would report as that kernel's: clear it here."""
        runtimes = _cuda_runtime_get_last_error()
        for get_last_error in runtimes:
            get_last_error()
        if runtimes:
            return
        try:  # a launch whose check reports the stale error, and so clears it
            torch.empty(1, device=self.device).zero_()
        except RuntimeError:
            pass

    def pin(self, address: int, nbytes: int) -> bool:
        """Page-lock memory in place, as torch.cuda._pin_memory_utils does. False, with one
        warning per process, where the system refuses: the caller then stages instead."""
        global _warned_page_lock
        with self.guard():
            code = int(
                torch.cuda.cudart().cudaHostRegister(address, nbytes, _CUDA_HOST_REGISTER_PORTABLE)
            )
            if code == 0:
                return True
            self._clear_error()
        if not _warned_page_lock:
            _warned_page_lock = True
            warnings.warn(
                f"stoker cannot page-lock its batch slots in place (cudaHostRegister returned "
                f"{code}; unsupported on WSL2 and some confidential-computing machines): batches "
                "are copied into torch's pinned buffers first, which costs one host copy each",
                StokerWarning,
                stacklevel=2,
            )
        return False

    def unpin(self, address: int) -> None:
        with self.guard():
            code = int(torch.cuda.cudart().cudaHostUnregister(address))
            if code == 0:
                return
            self._clear_error()
        warnings.warn(
            f"stoker: cudaHostUnregister({address:#x}) returned {code}; the memory stays "
            "page-locked until the process exits",
            StokerWarning,
            stacklevel=2,
        )

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.is_pinned()

    def pinned_like(self, tensor: torch.Tensor) -> torch.Tensor:
        # The same strides: a channels_last batch is staged with one plain memcpy.
        return torch.empty_like(tensor, pin_memory=True)

    def side_stream(self):
        return torch.cuda.stream(self._stream)

    def wait_for_producers(self, devices: Iterable[torch.device]) -> None:
        """The side stream waits for the work queued so far on the current stream of the feed's
        device and of every device the batch's tensors are on: whatever produced the batch
        there (a kernel, a device-to-host copy into pinned memory) is done before it is read."""
        for device in {self.device, *devices}:
            self._stream.wait_stream(torch.cuda.current_stream(device))

    def read_on_side(self, tensor: torch.Tensor) -> None:
        # A source's tensor on the feed's GPU, copied by the side stream: its memory must not go
        # back to the source's stream before that copy is done.
        tensor.record_stream(self._stream)

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        # copy=True: a tensor already on this GPU is copied too, never handed out as the
        # source's own memory. From another GPU, torch copies on that GPU's current stream,
        # between barriers with the side stream.
        return tensor.to(self.device, non_blocking=True, copy=True)

    @staticmethod
    def _event_on(stream):
        event = torch.cuda.Event(blocking=True)  # synchronize() sleeps instead of spinning a core
        event.record(stream)
        return event

    def record_event(self):
        return self._event_on(self._stream)

    def mark_consumer(self):
        """An event at the end of the work queued so far on the training stream."""
        return self._event_on(torch.cuda.current_stream(self.device))

    def wait(self, event) -> None:
        """The stream current on the feed's GPU (the training loop's) waits for `event`."""
        torch.cuda.current_stream(self.device).wait_event(event)

    def hand_over(self, tensor: torch.Tensor) -> None:
        tensor.record_stream(torch.cuda.current_stream(self.device))


def device_backend(device: str | torch.device):
    """The backend for `device`, or a clear error where it cannot work."""
    device = torch.device(device)
    if device.type == "cpu":
        return _HostBackend(device)
    if device.type != "cuda":
        raise InvalidArgumentError(f"device must be 'cuda' or 'cpu', not {str(device)!r}")
    if not torch.cuda.is_available():
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            raise DeviceUnavailableError(
                f"device={str(device)!r} needs a CUDA build of torch; this is torch "
                f"{torch.__version__}, built without CUDA. Use device='cpu' (or leave device "
                "unset) to get batches on the host"
            )
        raise DeviceUnavailableError(
            f"device={str(device)!r}: torch {torch.__version__} was built with CUDA "
            f"{torch.version.cuda} but sees no GPU (torch.cuda.is_available() is False; check "
            "the driver and CUDA_VISIBLE_DEVICES)"
        )
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise DeviceUnavailableError(
            f"device={str(device)!r}: this machine has {torch.cuda.device_count()} GPU(s)"
        )
    return _CudaBackend(device)


class Normalize:
    """uint8 or float images -> ``dtype``, optionally ``(x/255 - mean) / std`` per channel.

    uint8 input is scaled by 1/255 first, so ``mean`` and ``std`` are in [0, 1] units, as in
    torchvision's ``Normalize`` after ``ToTensor``. The arithmetic is float32 in a fixed order of
    correctly rounded operations, so the GPU gives the CPU's result bit for bit; the cast to
    ``dtype`` comes last. 4-D output is channels_last.
    """

    def __init__(
        self,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        dtype: torch.dtype | None = None,
        channels_last: bool = True,
    ):
        if (mean is None) != (std is None):
            raise InvalidArgumentError("give mean and std together, or neither")
        self.mean: tuple[float, ...] | None = None
        self.std: tuple[float, ...] | None = None
        if mean is not None and std is not None:
            self.mean = tuple(float(m) for m in mean)
            self.std = tuple(float(s) for s in std)
            if len(self.mean) != len(self.std) or not self.mean:
                raise InvalidArgumentError(
                    f"mean and std need one value per channel: {len(self.mean)} and "
                    f"{len(self.std)} given"
                )
            if any(not s > 0 for s in self.std):
                raise InvalidArgumentError(f"std must be positive, not {self.std}")
        if dtype is None and mean is not None:
            dtype = torch.float32
        if dtype is not None and not (dtype.is_floating_point or dtype == torch.uint8):
            raise InvalidArgumentError(f"dtype must be a floating type or torch.uint8, not {dtype}")
        if dtype == torch.uint8 and mean is not None:
            raise InvalidArgumentError("mean/std give floats: choose a floating dtype")
        self.dtype = dtype
        self.channels_last = channels_last
        self._constants: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._divisors: dict[torch.device, torch.Tensor] = {}

    def _mean_scale(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(what to subtract, what to multiply by): float32 on x's device, shaped to broadcast.

        (x/255 - mean)/std is computed as (x - 255*mean) * (1/(255*std)), each constant worked
        out in float64 and rounded once to float32.
        """
        key = (x.device, x.dtype, x.dim())
        assert self.mean is not None and self.std is not None, "called only with mean and std"
        if key not in self._constants:
            unit = 255.0 if x.dtype == torch.uint8 else 1.0
            shape = (1, -1, 1, 1) if x.dim() == 4 else (-1, 1, 1)
            sub = torch.tensor([m * unit for m in self.mean], dtype=torch.float64)
            mul = torch.tensor([1.0 / (s * unit) for s in self.std], dtype=torch.float64)
            self._constants[key] = (
                sub.to(torch.float32).reshape(shape).to(x.device),
                mul.to(torch.float32).reshape(shape).to(x.device),
            )
        return self._constants[key]

    def _divisor(self, device: torch.device) -> torch.Tensor:
        if device not in self._divisors:
            self._divisors[device] = torch.full((), 255.0, dtype=torch.float32, device=device)
        return self._divisors[device]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        four_d = x.dim() == 4
        format = torch.channels_last if (four_d and self.channels_last) else torch.preserve_format
        if self.dtype is None or (self.dtype == x.dtype and self.mean is None):
            return x.contiguous(memory_format=format) if four_d and self.channels_last else x
        if self.mean is None:
            if self.dtype == torch.uint8 or not x.dtype == torch.uint8:
                return x.to(dtype=self.dtype, memory_format=format)
            y = x.to(dtype=torch.float32, memory_format=format)
            # x / 255 correctly rounded, as torchvision's ToTensor on the CPU. Divided by a tensor
            # on y's device, not by the number 255: CUDA's kernel multiplies by the float32
            # reciprocal of a number, which is one ulp off for 126 of the 256 values.
            y.div_(self._divisor(y.device))
            return y if self.dtype == torch.float32 else y.to(self.dtype)
        if x.dim() not in (3, 4):
            raise InvalidArgumentError(
                f"mean/std apply to images [N, C, H, W] or [C, H, W], not shape {tuple(x.shape)}"
            )
        channels = x.shape[1] if four_d else x.shape[0]
        if channels != len(self.mean):
            raise InvalidArgumentError(
                f"mean/std have {len(self.mean)} channels, the images {channels} "
                f"(shape {tuple(x.shape)}; channels are dim {1 if four_d else 0})"
            )
        sub, mul = self._mean_scale(x)
        y = x.to(dtype=torch.float32, memory_format=format)
        if y.data_ptr() == x.data_ptr():
            y = y.clone(memory_format=format)  # float32 input: never write into the caller's batch
        y.sub_(sub).mul_(mul)
        return y if self.dtype == torch.float32 else y.to(self.dtype)


def _map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_map_tensors(b, fn) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map_tensors(b, fn) for b in batch)
    if isinstance(batch, dict):
        return type(batch)((k, _map_tensors(v, fn)) for k, v in batch.items())
    return batch


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    """The tensors of a batch, nested structures included, without rebuilding it."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            yield from _tensors(item)
    elif isinstance(batch, dict):
        for item in batch.values():
            yield from _tensors(item)


def _replace(
    batch: Any, image: int | str | tuple[int | str, ...], fn: Callable[[torch.Tensor], torch.Tensor]
) -> Any:
    """`batch` with fn applied to its image tensor: the batch itself, or batch[image] (each of
    them, for a tuple of keys)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(image, tuple):
        for key in image:
            batch = _replace(batch, key, fn)
        return batch
    try:
        element = batch[image]
    except (KeyError, IndexError, TypeError):
        raise InvalidArgumentError(
            f"the batch has no element {image!r} to normalise (a {type(batch).__name__})"
        ) from None
    if not isinstance(element, torch.Tensor):
        raise InvalidArgumentError(f"batch[{image!r}] is a {type(element).__name__}, not a tensor")
    if isinstance(batch, dict):
        out = type(batch)(batch)
        out[image] = fn(element)
        return out
    items = list(batch)
    assert isinstance(image, int), "a str key raised above for a sequence"
    items[image] = fn(element)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*items)
    return type(batch)(items)


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
        "reads_source_device",
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
        backend.wait(entry.ready)  # the training stream waits on the GPU, not the host
        for tensor in entry.outputs:
            backend.hand_over(tensor)
        self._retiring.append(entry)
        self.handed_over += 1
        feed.batches += 1
        feed._last_state = entry.state
        batch, entry.batch, entry.outputs = entry.batch, None, []
        return batch

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
        """Wait for the copies still running, then give back all host memory."""
        with self._feed._backend.guard():
            for queue in (self._retiring, self._in_flight):
                while queue:
                    queue[0].copied.synchronize()
                    self._feed._release(queue.popleft())
        self._unconsumed.clear()
        self._last_launched = None
        self._exhausted = True
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
    ):
        """``source_leases_memory``: the source never rewrites a batch's host memory while the
        feed holds its tensors (an ImageLoader's slots go back to the engine only when the feed
        drops them), so the feed may ask for the next batch before the copies are done.
        ``augment``: a loader's augmentation, batch -> batch, run on the side stream once the
        batch is on the device and before it is normalised."""
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
                if self.augment is not None:
                    moved = self.augment(moved)
                moved = _replace(moved, self.image, self.normalize)
                entry.ready = backend.record_event()
        except BaseException:
            if entry.host:  # copies may be running: the memory they read must outlive them
                with backend.side_stream():
                    backend.record_event().synchronize()
                self._release(entry)
            raise
        entry.batch = moved
        entry.outputs.extend(_tensors(moved))
        return entry

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
