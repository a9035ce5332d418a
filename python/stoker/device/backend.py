"""The CUDA calls of the GPU feed, behind one interface the feed runs against.

``_CudaBackend`` makes every CUDA call of the feed (page-locking in place, the side stream, the
copies, events, waits, ``record_stream``), each under ``torch.cuda.device`` of the feed's device
(docs/GPU.md, contract 1), and clears the error a refused page-lock leaves behind (contract 5).
``_HostBackend`` is the same interface on the CPU: no copy, no stream, events complete at once.
``device_backend`` picks one for a device, or says clearly why it cannot work.
"""

from __future__ import annotations

import contextlib
import ctypes
import warnings
from typing import Callable, Iterable

import torch

from .. import faults
from ..errors import DeviceUnavailableError, InvalidArgumentError, StokerWarning

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

    # A stage thread's own stream (stage_thread.py): on the host there is none.
    def new_stream(self) -> None:
        return None

    def on_stream(self, stream):
        return contextlib.nullcontext()

    def stream_waits(self, stream, event) -> None:
        pass

    def event_on(self, stream):
        return _DONE

    def read_on(self, tensor: torch.Tensor, stream) -> None:
        pass

    def synchronize(self, stream) -> None:
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
            faults.point("stream", f"a side stream on {self.device}", RuntimeError)
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
        faults.point("page_lock", f"{nbytes} bytes at {address:#x}", RuntimeError)
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

    # A stage thread's own stream (stage_thread.py). The thread holds guard() around these.
    def new_stream(self) -> torch.cuda.Stream:
        faults.point("stream", f"a device stage's stream on {self.device}", RuntimeError)
        return torch.cuda.Stream(self.device)

    def on_stream(self, stream: torch.cuda.Stream):
        """`stream` current in the calling thread, on the feed's device."""
        return torch.cuda.stream(stream)

    def stream_waits(self, stream: torch.cuda.Stream, event) -> None:
        stream.wait_event(event)

    def event_on(self, stream: torch.cuda.Stream):
        return self._event_on(stream)

    def read_on(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        """`stream` reads `tensor`, allocated on another stream: its memory must not be reused
        before that stream's work on it is done."""
        tensor.record_stream(stream)

    def synchronize(self, stream: torch.cuda.Stream) -> None:
        self._event_on(stream).synchronize()


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
