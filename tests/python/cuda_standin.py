"""A stand-in for what torch.cuda asks of the CUDA runtime, on a machine without a GPU, so that
the feed's real CUDA backend (stoker.device._CudaBackend) runs against it in every `make test`.

torch's own Python layer is kept: `torch.cuda.device` and `torch.cuda.stream` are torch's classes.
What is replaced is what they call into (torch._C), with the semantics of c10/cuda and of the CUDA
runtime that matter to a feed:

- Devices and contexts. Each thread has a current device; `cudaSetDevice` on a device creates
  its primary context (CUDA 12+), as c10's SetDevice does when the device changes. torch's
  `_exchange_device` (entering `torch.cuda.device`) sets the device; `_maybe_exchange_device`
  (leaving it) sets it back only where a context exists, else defers it; `set_stream` (leaving
  `torch.cuda.stream(s)` among others) sets the device of the stream it restores. Every call is
  logged with the device current when it was made.
- Streams that run late. Work queued on a stream completes only when the stream runs: the side
  streams run as far as they can whenever an event is queried (a copy engine is quick), the
  training stream ("main") only when the host waits on one of its events (a GPU running behind
  the host). `wait_event` makes a stream's later work wait for another's.
- Copies that read their source when they run, as DMA does: each copy keeps a snapshot of its
  source's bytes, and a source found changed when the copy runs counts as a corrupted copy.
  `Tensor.copy_` into a tensor on a GPU (a view of one included) from page-locked host memory
  with non_blocking=True is such a copy too. Its source let go by Python before the copy ran
  counts as freed early where the memory was page-locked by cudaHostRegister (its owner, an
  engine's pool, reuses it at once), not where it is torch's pinned allocator's (which holds a
  block until the copies that recorded their stream on it have run); from pageable memory, or
  blocking, the host waits for the copy. A
  `copy_` from one tensor on a GPU to another on the same GPU is queued on the current stream
  and reads its source when it runs too: a block its owner lets go before (`let_go`, as an
  allocator's pool does on cudaFreeAsync) counts as freed early.
- The caching allocator's view of `record_stream`: a block freed by Python stays held until
  every stream it was recorded on has run past the point where it was freed.
- Page-locking: cudaHostRegister/Unregister succeed or fail as told, and a failure leaves the
  thread's "last error" set, as the runtime does, until cudaGetLastError clears it.

Tensors "on a GPU" are CPU tensors marked with their device (`on_device`); `Tensor.device` reports
it.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

_real_device = torch._C.TensorBase.device
_real_to = torch.Tensor.to
_real_empty = torch.empty
_real_empty_like = torch.empty_like
_real_copy_ = torch.Tensor.copy_


def _dma_view(tensor: torch.Tensor) -> torch.Tensor:
    """What a DMA engine reads for a copy from the host: the bytes at the tensor's address (a
    uint8 view of them, not owning them), not the tensor."""
    nbytes = tensor.numel() * tensor.element_size()
    if not nbytes:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(tensor.data_ptr()),
                            dtype=torch.uint8)  # fmt: skip


@dataclass
class Call:
    what: str
    device: int  # the device current (cudaGetDevice) when the call was made
    stream: str = ""  # the name of the stream it was queued on
    detail: Any = None
    on: Any = None  # that stream


class Stream:
    def __init__(self, cuda: "StandInCuda", device_index: int, name: str, runs_on_query: bool):
        self.cuda = cuda
        self.device_index = device_index
        self.device = torch.device("cuda", device_index)
        self.device_type = 1
        self.name = name
        self.stream_id = id(self)
        self.cuda_stream = id(self)  # the cudaStream_t a library is handed
        self.runs_on_query = runs_on_query
        self.queued = 0  # operations queued so far
        self.done = 0  # of those, completed
        self._waits: list[tuple[int, Event]] = []  # (first position that waits, event)
        # (position, raw, snapshot, what the copy keeps alive until it runs)
        self._copies: list[tuple[int, torch.Tensor, torch.Tensor, Any]] = []

    def __repr__(self) -> str:
        return f"<stream {self.name} on cuda:{self.device_index}>"

    def enqueue(self, what: str, detail: Any = None) -> int:
        self.queued += 1
        self.cuda.log_call(what, on=self, detail=detail)
        return self.queued

    def wait_event(self, event: "Event") -> None:
        self.cuda.log_call("wait_event", on=self, detail=event)
        if event.stream is not None:
            self._waits.append((self.queued + 1, event))

    def wait_stream(self, other: "Stream") -> None:
        self.wait_event(other.record_event())

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event or Event(self.cuda)
        event.record(self)
        return event

    def blocked_at(self) -> int:
        """How far this stream can run without waiting for work not yet done elsewhere."""
        for position, event in self._waits:
            if not event.query_quietly():
                return position - 1
        return self.queued

    def run(self, upto: int, force: bool) -> None:
        """Complete the work queued through `upto`; with `force`, run what it waits for first."""
        if upto <= self.done:
            return
        if force:
            for position, event in self._waits:
                if position <= upto:
                    event.stream.run(event.position, force=True)
        else:
            upto = min(upto, self.blocked_at())
        for _, raw, snapshot, _ in [c for c in self._copies if c[0] <= upto]:
            self.cuda.copies_run += 1
            if not torch.equal(raw, snapshot):
                self.cuda.corrupted += 1
        self._copies = [c for c in self._copies if c[0] > upto]
        self.done = max(self.done, upto)


class Event:
    def __init__(self, cuda: "StandInCuda"):
        self.cuda = cuda
        self.stream: Stream | None = None
        self.position = 0

    def record(self, stream: Stream | None = None) -> None:
        stream = stream or self.cuda.current_stream()
        self.stream = stream
        self.position = stream.enqueue("record", detail=self)

    def query_quietly(self) -> bool:
        return self.stream is None or self.stream.done >= self.position

    def query(self) -> bool:
        if self.stream is None:
            return True
        for stream in self.cuda.streams:
            if stream.runs_on_query:
                stream.run(stream.queued, force=False)
        return self.query_quietly()

    def synchronize(self) -> None:
        if self.stream is not None:
            self.cuda.host_waits.append(self.stream.name)
            self.stream.run(self.position, force=True)


class _Thread(threading.local):
    def __init__(self):
        self.current = 0  # what cudaGetDevice returns
        self.target = -1  # a device c10 has deferred setting (MaybeSetDevice without a context)
        self.streams: dict[int, Stream] = {}  # the current stream of each device


@dataclass
class _Block:
    streams: list[Stream] = field(default_factory=list)
    freed_at: dict[int, int] | None = None  # stream id -> its queued count when freed


class StandInCuda:
    def __init__(self, devices: int = 2):
        self.devices = devices
        self.log: list[Call] = []
        self.contexts: set[int] = set()
        self.streams: list[Stream] = []
        self._thread = _Thread()
        self._default = {d: self._stream(d, "main", runs_on_query=False) for d in range(devices)}
        self.register_result = 0
        self.unregister_result = 0
        self.registered: dict[int, int] = {}  # address -> bytes
        self.last_error = threading.local()
        self.corrupted = 0
        self.copies_run = 0
        self.freed_early = 0  # sources of copy_ let go before their copy ran
        self._reads: list[tuple[Stream, int, int]] = []  # (stream, position, storage address)
        self._device_storage: dict[int, int] = {}  # storage address -> device, views included
        self.host_waits: list[str] = []
        self._blocks: dict[int, _Block] = {}

    # --- what c10/cuda and the runtime do ----------------------------------------------------
    def _stream(self, device: int, name: str, runs_on_query: bool) -> Stream:
        stream = Stream(self, device, name, runs_on_query)
        self.streams.append(stream)
        return stream

    def log_call(self, what: str, on: "Stream | None" = None, detail: Any = None) -> None:
        name = on.name if on is not None else ""
        self.log.append(Call(what, self._thread.current, name, detail, on))

    def _runtime_call(self) -> None:
        """A runtime call works in the current device's context, creating it if needed."""
        self.contexts.add(self._thread.current)

    def _cuda_set_device(self, device: int) -> None:
        self._thread.current = device
        self.contexts.add(device)  # CUDA 12+: cudaSetDevice initialises the primary context
        self.log_call("cudaSetDevice", detail=device)

    def get_device(self) -> int:  # c10::cuda::GetDevice
        return self._thread.target if self._thread.target >= 0 else self._thread.current

    def set_device(self, device) -> None:  # c10::cuda::SetDevice
        device = device.index if isinstance(device, torch.device) else int(device)
        self._thread.target = -1
        if device != self._thread.current:
            self._cuda_set_device(device)

    def _exchange_device(self, device: int) -> int:  # c10::cuda::ExchangeDevice
        if device < 0:
            return -1
        current, self._thread.target = self._thread.target, -1
        if current < 0:
            current = self._thread.current
            if device == current:
                return current
        self._cuda_set_device(device)
        return current

    def _maybe_exchange_device(self, device: int) -> int:  # c10::cuda::MaybeExchangeDevice
        if device < 0:
            return -1
        current = self._thread.current
        if device == current:
            return current
        if device in self.contexts:
            self.set_device(device)
        else:
            self._thread.target = device
        return current

    def _set_stream(self, stream: Stream) -> None:  # THCPModule_setStream_wrap
        if self.get_device() != stream.device_index:
            self.set_device(stream.device_index)
        self._thread.streams[stream.device_index] = stream

    def current_stream(self, device=None) -> Stream:
        if isinstance(device, int):
            index = device
        else:
            index = None if device is None else torch.device(device).index
        if index is None:
            index = self.get_device()
        return self._thread.streams.get(index, self._default[index])

    def Event(self, enable_timing=False, blocking=False, interprocess=False) -> Event:  # noqa: N802
        """torch.cuda.Event, as the feed makes them."""
        # A spinning synchronize() would take a core from the decoders.
        assert blocking, "events must block, not spin"
        return Event(self)

    # --- memory ------------------------------------------------------------------------------
    def on_device(self, tensor: torch.Tensor, index: int) -> torch.Tensor:
        tensor._standin_device = torch.device("cuda", index)
        if tensor.numel():
            self._device_storage[tensor.untyped_storage().data_ptr()] = index
        return tensor

    def device_index(self, tensor: torch.Tensor) -> int | None:
        """The GPU a tensor, or the tensor a view was taken of, is on (None: the host)."""
        marked = getattr(tensor, "_standin_device", None)
        if marked is not None:
            return marked.index
        if not tensor.numel():
            return None
        return self._device_storage.get(tensor.untyped_storage().data_ptr())

    def copy_between(self, index: int, source: torch.Tensor) -> None:
        """`target.copy_(source)`, both on GPU `index`: queued on its current stream, reading
        the source when it runs."""
        stream = self.current_stream(index)
        position = stream.enqueue("copy", detail={"to": index, "from": index})
        self._reads.append((stream, position, source.untyped_storage().data_ptr()))

    def let_go(self, block: torch.Tensor) -> None:
        """An allocator's block handed back for reuse (cudaFreeAsync): any copy queued to read
        it that has not run yet will read whatever is written there next."""
        address = block.untyped_storage().data_ptr()
        self._reads = [r for r in self._reads if r[0].done < r[1]]
        self.freed_early += sum(1 for _, _, a in self._reads if a == address)

    def copy_into(self, target: torch.Tensor, source: torch.Tensor, non_blocking: bool) -> None:
        """`target.copy_(source)` with `target` on a GPU and `source` on the host: queued on the
        target device's current stream; from page-locked memory without blocking, it reads the
        source when it runs (see the module's docstring)."""
        index = self.device_index(target)
        stream = self.current_stream(index)
        pinned = self.is_pinned(source)
        detail = {"to": index, "non_blocking": non_blocking, "pinned": pinned}
        position = stream.enqueue("copy", detail=detail)
        if not (pinned and non_blocking) or not source.numel():
            stream.run(position, force=True)  # the host waits for it
            return
        raw = _dma_view(source)
        owner = source._base if source._base is not None else source
        # torch's pinned allocator holds the block until the copy has run
        torch_pinned = getattr(owner, "_standin_pinned", False)
        stream._copies.append((position, raw, raw.clone(), owner if torch_pinned else None))
        if torch_pinned:
            return

        def let_go(stream=stream, position=position):
            if stream.done < position:
                self.freed_early += 1

        weakref.finalize(owner, let_go)

    def _pin(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor._standin_pinned = True
        return tensor

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        if getattr(tensor, "_standin_pinned", False):
            return True
        address = tensor.data_ptr()
        return any(a <= address < a + n for a, n in self.registered.items())

    def copy(
        self, tensor: torch.Tensor, device: torch.device, non_blocking: bool, copy: bool
    ) -> torch.Tensor:
        """`tensor.to(device)`, as ATen's copy kernels order it (aten/src/ATen/native/cuda/Copy.cu):
        from the host or on one GPU, on the target's current stream; from another GPU, on the
        source GPU's current stream, between barriers with the target's current stream."""
        target = device.index if device.index is not None else self.get_device()
        source = getattr(tensor, "_standin_device", None)
        if source == torch.device("cuda", target) and not copy:
            return tensor  # already there: torch returns the tensor itself
        stream = self.current_stream(target)
        pinned = source is None and self.is_pinned(tensor)
        detail = {"to": target, "non_blocking": non_blocking, "pinned": pinned}
        if source is not None and source.index != target:
            source_stream = self.current_stream(source.index)
            source_stream.wait_event(stream.record_event())
            source_stream.enqueue("copy", detail=detail)
            stream.wait_event(source_stream.record_event())
            return self.on_device(tensor.clone(), target)
        position = stream.enqueue("copy", detail=detail)
        if source is None:
            raw = _dma_view(tensor)
            stream._copies.append((position, raw, raw.clone(), None))
        return self.on_device(tensor.clone(), target)

    def record_stream(self, tensor: torch.Tensor, stream: Stream) -> None:
        self.log_call("record_stream", on=stream, detail=tensor.data_ptr())
        key = getattr(tensor, "_standin_block", None)
        if key is None:
            key = tensor._standin_block = len(self._blocks)
            self._blocks[key] = _Block()
            weakref.finalize(tensor, self._freed, key)
        self._blocks[key].streams.append(stream)

    def _freed(self, key: int) -> None:
        block = self._blocks[key]
        block.freed_at = {id(s): s.queued for s in block.streams}

    def held_blocks(self, stream_name: str) -> int:
        """Blocks recorded on that stream the allocator cannot reuse yet: alive, or freed while
        work queued on one of their streams has not run."""
        held = 0
        for block in self._blocks.values():
            if not any(s.name == stream_name for s in block.streams):
                continue
            if block.freed_at is None or any(s.done < block.freed_at[id(s)] for s in block.streams):
                held += 1
        return held

    # --- the runtime's page-locking and errors ----------------------------------------------
    def cudaHostRegister(self, address: int, nbytes: int, flags: int) -> int:  # noqa: N802
        self._runtime_call()
        self.log_call("cudaHostRegister", detail=(address, nbytes, flags))
        if self.register_result:
            self.last_error.code = self.register_result
            return self.register_result
        self.registered[address] = nbytes
        return 0

    def cudaHostUnregister(self, address: int) -> int:  # noqa: N802
        self._runtime_call()
        self.log_call("cudaHostUnregister", detail=address)
        if self.unregister_result:
            self.last_error.code = self.unregister_result
            return self.unregister_result
        del self.registered[address]
        return 0

    def cudaGetLastError(self) -> int:  # noqa: N802
        code, self.last_error.code = getattr(self.last_error, "code", 0), 0
        return code

    def pending_error(self) -> int:
        return getattr(self.last_error, "code", 0)

    # --- installing it -----------------------------------------------------------------------
    def install(self, monkeypatch) -> "StandInCuda":
        cuda = self
        from stoker.device import backend as device_module

        class StandInStream(Stream):
            def __new__(cls, device=None, priority=0, **kwargs):
                if isinstance(device, int):
                    device = torch.device("cuda", device)
                index = cuda.get_device() if device is None else torch.device(device).index
                cuda.contexts.add(index)  # torch creates it under a guard of its device
                stream = cuda._stream(index, "side", runs_on_query=True)
                cuda.log_call("stream_create", on=stream, detail=index)
                return stream

        class Cudart:
            cudaHostRegister = staticmethod(cuda.cudaHostRegister)
            cudaHostUnregister = staticmethod(cuda.cudaHostUnregister)

        def to(tensor, *args, **kwargs):
            device = kwargs.get("device")
            for a in args:
                if isinstance(a, (str, torch.device)) and torch.device(a).type == "cuda":
                    device = a
            if device is not None and torch.device(device).type == "cuda":
                return cuda.copy(
                    tensor,
                    torch.device(device),
                    kwargs.get("non_blocking", False),
                    kwargs.get("copy", False),
                )
            return _real_to(tensor, *args, **kwargs)

        def pinned(make):
            def make_pinned(*args, pin_memory=False, **kwargs):
                tensor = make(*args, **kwargs)
                if pin_memory:
                    cuda._runtime_call()
                    cuda.log_call("pinned_alloc")
                    cuda._pin(tensor)
                return tensor

            return make_pinned

        def device_of(tensor):
            return getattr(tensor, "_standin_device", None) or _real_device.__get__(tensor)

        patches = {
            "is_available": lambda: True,
            "device_count": lambda: cuda.devices,
            "current_device": cuda.get_device,
            "set_device": cuda.set_device,
            "_exchange_device": cuda._exchange_device,
            "_maybe_exchange_device": cuda._maybe_exchange_device,
            "set_stream": cuda._set_stream,
            "current_stream": cuda.current_stream,
            "Stream": StandInStream,
            "Event": cuda.Event,
            "cudart": lambda: Cudart(),
            "_lazy_init": lambda: None,
        }
        for name, value in patches.items():
            monkeypatch.setattr(torch.cuda, name, value)
        monkeypatch.setattr(torch.Tensor, "to", to)

        def copy_(target, source, non_blocking=False):
            if isinstance(source, torch.Tensor):
                to, of = cuda.device_index(target), cuda.device_index(source)
                if to is not None and of is None:
                    cuda.copy_into(target, source, non_blocking)
                elif of is not None and to in (None, of):
                    # (a target the stand-in cannot place, a view of a buffer torch.empty
                    # made "on" the GPU, is taken to be on the source's GPU)
                    cuda.copy_between(of, source)
            return _real_copy_(target, source, non_blocking)

        monkeypatch.setattr(torch.Tensor, "copy_", copy_)
        monkeypatch.setattr(torch.Tensor, "device", property(device_of))
        monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t: cuda.is_pinned(t))
        monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: cuda._pin(t.clone()))
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: cuda.record_stream(t, s))
        monkeypatch.setattr(torch, "empty", pinned(_real_empty))
        monkeypatch.setattr(torch, "empty_like", pinned(_real_empty_like))
        get_last_error = lambda: [cuda.cudaGetLastError]  # noqa: E731
        # raising=False: the stand-in also runs against a feed without it, to show tests fail.
        monkeypatch.setattr(
            device_module, "_cuda_runtime_get_last_error", get_last_error, raising=False
        )
        return self

    # --- reading the log ---------------------------------------------------------------------
    def calls(self, *what: str) -> list[Call]:
        return [c for c in self.log if not what or c.what in what]
