"""The GPU feed: batches copied to the device from page-locked memory on a side stream, converted
and normalised there, handed over safely to the training stream.

What it does per batch (docs/GPU.md has the why):

1. The batch's tensors must be in page-locked (pinned) host memory, or the copy is neither
   asynchronous nor at full bandwidth. An ImageLoader's slots are pinned once, in place, and
   stay pinned; other pinned tensors go as they are; anything else is first copied into a pinned
   staging buffer taken from a small pool.
2. On the feed's own CUDA stream: the copies (``non_blocking``), an event ``copied``, then uint8 ->
   float32 -> (x/255 - mean)/std -> ``dtype`` in channels_last, then an event ``ready``.
3. ``prefetch`` batches are launched ahead, so copies of the next batches overlap the step in
   progress. Handing a batch over, the training stream waits for ``ready`` (on the GPU, not the
   host) and each output tensor is ``record_stream``-ed on it: the caching allocator then does not
   give that memory to the side stream again before the training stream is done with it.
4. The host memory of a batch (a loader slot, a staging buffer) is given back only after its
   ``copied`` event has completed, checked with ``query()``; the host waits on an event only when
   more than ``_MAX_RETIRING`` batches are still being copied.

All CUDA calls go through ``_CudaBackend``. ``_HostBackend`` is the same path on the CPU (no copy,
no stream: the events are complete at once), so that everything but the CUDA calls runs in CI;
tests plug in a backend whose "copies" complete late to check that no host memory is reused early.
"""

from __future__ import annotations

import collections
import time
import weakref
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from .errors import DeviceUnavailableError, InvalidArgumentError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Batches handed over whose copy may still be running. Past this, the host waits for the oldest.
_MAX_RETIRING = 2
_CUDA_HOST_REGISTER_PORTABLE = 1


class _DoneEvent:
    """An event on the host: complete as soon as it exists."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class _HostBackend:
    """device="cpu": the feed's logic with nothing to copy. Tensors pass through unchanged."""

    pins_host_memory = False

    def __init__(self, device: torch.device):
        self.device = device

    def pin(self, address: int, nbytes: int) -> None:
        pass

    def unpin(self, address: int) -> None:
        pass

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return True  # nothing to stage: the tensor is already where it is going

    def pinned_empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def side_stream(self):
        import contextlib

        return contextlib.nullcontext()

    def copy(self, host: torch.Tensor) -> torch.Tensor:
        return host

    def record_event(self):
        return _DoneEvent()

    def wait(self, event) -> None:
        pass

    def hand_over(self, tensor: torch.Tensor) -> None:
        pass


class _CudaBackend:
    """The CUDA calls of the feed, and nothing else."""

    pins_host_memory = True

    def __init__(self, device: torch.device):
        self.device = device
        self._stream = torch.cuda.Stream(device)

    def pin(self, address: int, nbytes: int) -> None:
        # What torch.cuda._pin_memory_utils does: register memory in place, without moving it.
        code = int(
            torch.cuda.cudart().cudaHostRegister(address, nbytes, _CUDA_HOST_REGISTER_PORTABLE)
        )
        if code != 0:
            raise DeviceUnavailableError(
                f"cannot page-lock a batch slot of {nbytes} bytes: cudaHostRegister returned {code}"
            )

    def unpin(self, address: int) -> None:
        torch.cuda.cudart().cudaHostUnregister(address)

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.is_pinned()

    def pinned_empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def side_stream(self):
        return torch.cuda.stream(self._stream)

    def copy(self, host: torch.Tensor) -> torch.Tensor:
        return host.to(self.device, non_blocking=True)

    def record_event(self):
        event = torch.cuda.Event(blocking=True)  # synchronize() sleeps instead of spinning a core
        event.record(self._stream)
        return event

    def wait(self, event) -> None:
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
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.index >= torch.cuda.device_count():
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
        if mean is not None:
            mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
            if len(mean) != len(std) or not mean:
                raise InvalidArgumentError(
                    f"mean and std need one value per channel: {len(mean)} and {len(std)} given"
                )
            if any(not s > 0 for s in std):
                raise InvalidArgumentError(f"std must be positive, not {std}")
        if dtype is None and mean is not None:
            dtype = torch.float32
        if dtype is not None and not (dtype.is_floating_point or dtype == torch.uint8):
            raise InvalidArgumentError(f"dtype must be a floating type or torch.uint8, not {dtype}")
        if dtype == torch.uint8 and mean is not None:
            raise InvalidArgumentError("mean/std give floats: choose a floating dtype")
        self.mean, self.std, self.dtype = mean, std, dtype
        self.channels_last = channels_last
        self._constants: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def _mean_scale(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(what to subtract, what to multiply by): float32 on x's device, shaped to broadcast.

        (x/255 - mean)/std is computed as (x - 255*mean) * (1/(255*std)), each constant worked
        out in float64 and rounded once to float32.
        """
        key = (x.device, x.dtype, x.dim())
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

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        four_d = x.dim() == 4
        format = torch.channels_last if (four_d and self.channels_last) else torch.preserve_format
        if self.dtype is None or (self.dtype == x.dtype and self.mean is None):
            return x.contiguous(memory_format=format) if four_d and self.channels_last else x
        if self.mean is None:
            if self.dtype == torch.uint8 or not x.dtype == torch.uint8:
                return x.to(dtype=self.dtype, memory_format=format)
            y = x.to(dtype=torch.float32, memory_format=format)
            y.div_(255.0)  # as torchvision's ToTensor
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


def _replace(batch: Any, image: int | str, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`batch` with fn applied to its image tensor: the batch itself, or batch[image]."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
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
    items[image] = fn(element)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*items)
    return type(batch)(items)


class _StagingPool:
    """Pinned buffers for batches that do not come in pinned memory, reused by (shape, dtype)."""

    def __init__(self, backend, keep: int):
        self._backend = backend
        self._keep = keep
        self._free: collections.deque[torch.Tensor] = collections.deque()
        self.allocated = 0

    def take(self, like: torch.Tensor) -> torch.Tensor:
        for i, buffer in enumerate(self._free):
            if buffer.shape == like.shape and buffer.dtype == like.dtype:
                del self._free[i]
                return buffer
        self.allocated += 1
        return self._backend.pinned_empty(like.shape, like.dtype)

    def give(self, buffer: torch.Tensor) -> None:
        self._free.append(buffer)
        while len(self._free) > self._keep:
            self._free.popleft()  # a shape no longer seen


class _InFlight:
    __slots__ = ("batch", "outputs", "host", "staged", "copied", "ready", "state")

    def __init__(self):
        self.batch: Any = None
        self.outputs: list[torch.Tensor] = []  # the device tensors handed over
        self.host: list[torch.Tensor] = []  # pinned host tensors the copies read
        self.staged: list[torch.Tensor] = []  # of those, the staging pool's
        self.copied = self.ready = None
        self.state: Any = None


class _Pass(Iterator[Any]):
    """One iteration over the source: the in-flight window and the batches still being copied."""

    def __init__(self, feed: "DeviceFeed"):
        self._feed = feed
        self._source = iter(feed.source)
        # An iterator made for this pass (an ImageLoader's, a DataLoader's) is closed with it; a
        # generator or iterator passed in as the source is the caller's to close.
        self._owns_source = self._source is not feed.source
        self._in_flight: collections.deque[_InFlight] = collections.deque()
        self._retiring: collections.deque[_InFlight] = collections.deque()
        self._exhausted = False
        self._error: Exception | None = None  # from the source, raised after the batches before it
        self.handed_over = 0

    def __iter__(self) -> "_Pass":
        return self

    def __next__(self) -> Any:
        feed = self._feed
        self._retire()
        while not self._exhausted and len(self._in_flight) < feed.prefetch:
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
            self._in_flight.append(feed._launch(batch, state))
        if not self._in_flight:
            error, self._error = self._error, None
            self.close()
            feed._pass_ended(self)
            if error is not None:
                raise error
            raise StopIteration
        entry = self._in_flight.popleft()
        feed._backend.wait(entry.ready)  # the training stream waits on the GPU, not the host
        for tensor in entry.outputs:
            feed._backend.hand_over(tensor)
        self._retiring.append(entry)
        self.handed_over += 1
        feed.batches += 1
        feed._last_state = entry.state
        batch, entry.batch, entry.outputs = entry.batch, None, []
        return batch

    def _retire(self) -> None:
        """Give back the host memory of every batch whose copy has finished."""
        while self._retiring and self._retiring[0].copied.query():
            self._feed._release(self._retiring.popleft())
        while len(self._retiring) > _MAX_RETIRING:
            entry = self._retiring.popleft()
            t0 = time.perf_counter()
            entry.copied.synchronize()
            self._feed.host_wait_s += time.perf_counter() - t0
            self._feed._release(entry)

    def close(self) -> None:
        """Wait for the copies still running, then give back all host memory."""
        for queue in (self._retiring, self._in_flight):
            while queue:
                entry = queue.popleft()
                entry.copied.synchronize()
                self._feed._release(entry)
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
        image: int | str = 0,
        backend: Any = None,
        source_pinned: bool = False,
        source_state: Callable[[], Any] | None = None,
    ):
        if prefetch < 1:
            raise InvalidArgumentError(f"prefetch must be >= 1, not {prefetch}")
        self.source = source
        self._backend = backend if backend is not None else device_backend(device)
        self.device = self._backend.device
        self.normalize = Normalize(mean, std, dtype, channels_last)
        self.prefetch = prefetch
        self.image = image
        self._source_pinned = source_pinned
        if source_state is None and callable(getattr(source, "state_dict", None)):
            source_state = source.state_dict
        self._source_state = source_state
        self._staging = _StagingPool(self._backend, keep=2 * (prefetch + _MAX_RETIRING + 1))
        # Weak: the pass's iterator holds the source (an ImageLoader holds this feed), and a cycle
        # would let the garbage collector close a loader in the middle of its pass.
        self._pass: weakref.ref[_Pass] | None = None
        self._last_state: Any = None
        # Counters: batches handed over, bytes copied straight from pinned memory and through
        # staging, host seconds spent waiting on a copy.
        self.batches = 0
        self.direct_bytes = 0
        self.staged_bytes = 0
        self.host_wait_s = 0.0

    # --- the loader-like surface -----------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        self.close()  # a pass abandoned with `break` gives its memory back now
        self._last_state = None
        new_pass = _Pass(self)
        self._pass = weakref.ref(new_pass)
        return new_pass

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]

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

        def pinned(tensor: torch.Tensor) -> torch.Tensor:
            nbytes = tensor.numel() * tensor.element_size()
            if tensor.device.type != "cpu" or self._source_pinned or backend.is_pinned(tensor):
                self.direct_bytes += nbytes
                host = tensor
            else:
                host = self._staging.take(tensor)
                host.copy_(tensor)
                entry.staged.append(host)
                self.staged_bytes += nbytes
            entry.host.append(host)
            return host

        try:
            with backend.side_stream():
                moved = _map_tensors(batch, lambda t: backend.copy(pinned(t)))
                entry.copied = backend.record_event()
                moved = _replace(moved, self.image, self.normalize)
                entry.ready = backend.record_event()
        except BaseException:
            if entry.host:  # copies may be running: the memory they read must outlive them
                with backend.side_stream():
                    backend.record_event().synchronize()
                self._release(entry)
            raise
        entry.batch = moved
        _map_tensors(moved, entry.outputs.append)
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
    image: int | str = 0,
) -> DeviceFeed:
    """Wrap any iterable of CPU batches (a torch DataLoader, an ImageLoader) so that its batches
    arrive on ``device``, copied on a side stream ``prefetch`` batches ahead.

    A batch is a tensor, or a tuple, list or dict of them (nested structures too); every tensor is
    moved, anything else passes through. ``batch[image]`` (the batch itself if it is a tensor) is
    the image tensor: it is converted to ``dtype`` and, given ``mean`` and ``std`` (in [0, 1] units;
    uint8 images are scaled by 1/255 first), normalised on the device. 4-D images come out
    channels_last unless ``channels_last=False``. Without ``dtype``, ``mean`` and ``std`` the
    images are moved unchanged.

    Tensors already in pinned memory (``DataLoader(pin_memory=True)``) are copied directly; others
    are first copied into reused pinned staging buffers on the calling thread (``stats()`` counts
    both). ``device="cpu"`` is the same path with nothing to copy.

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
