"""device=: the host chain's batches copied to the device on a side stream, `device_prefetch`
ahead, by stoker.device's feed; there the device stages run on each batch (decode="gpu"'s
decoding, augment=) before the images are converted to `dtype` and normalised. With
decode="gpu"/"auto" those run on a thread and stream of their own (device.stage_thread), off the
training thread.

The feed holds the pass weakly and the pass holds the loader strongly, so that a loop over a
temporary loader keeps it alive to the last batch in flight, and the garbage collector never
closes a loader mid-pass (docs/GPU.md, "Lifetimes")."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from . import Stage, length_hint


class DeviceFeedStage(Stage):
    """The last stage with a device: iterating it iterates the feed, which pulls the host
    chain (`source`) and runs `device_stages` on each batch on the device."""

    def __init__(self, source: Stage, owner: Any, backend: Any, options: Any, image: Any,
                 device_stages: list[Stage], decode: Any = None):  # fmt: skip
        import torch

        from ...device import DeviceFeed
        from ...device.stage_thread import StageThread

        super().__init__(source)
        self.device_stages = device_stages
        self.thread, self.decode = None, decode
        if decode is not None:  # decode="gpu"'s device stage: its decoder owned by the thread
            self.thread = StageThread(backend, depth=options.device_prefetch,
                                      name="stoker-gpu-decode", on_start=decode.start_pass,
                                      on_stop=decode.end_pass)  # fmt: skip
        host = _HostSide(owner, source)
        self.feed = DeviceFeed(
            host,
            backend.device,  # mean, std, dtype, device_prefetch: checked by check_options
            mean=options.mean,
            std=options.std,
            dtype=options.dtype if options.dtype is not None else torch.float32,
            prefetch=options.device_prefetch,
            image=image,
            backend=backend,
            source_leases_memory=True,  # a slot is reused only once the feed lets it go
            source_state=source.state_dict,
            # a function of the stages, not a method of this stage: the feed it is given to is
            # this stage's, and a reference cycle would outlive close() until a collection
            augment=_in_turn(device_stages) if device_stages else None,
            stage_thread=self.thread,
        )

    def __iter__(self) -> Iterator[Any]:
        return iter(self.feed)

    def state_dict(self) -> dict[str, Any]:
        return self.feed.state_dict()  # as of the last batch handed out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.feed.load_state_dict(state)  # ends the pass in flight, then the host chain's

    def stats(self, into: dict[str, Any]) -> None:
        super().stats(into)
        into["device"] = dict(self.feed.stats(), **into.get("device", {}))
        for stage in self.device_stages:  # their own figures (they have no source)
            stage.stats(into)
        if self.thread is not None:
            into["device"]["stage_thread"] = self.thread.stats()

    def close(self) -> None:
        self.feed.close()  # stops the stage thread, waits for the copies still reading the slots
        if self.decode is not None:
            self.decode.close()


def _in_turn(stages: list[Stage]) -> Any:
    """The device stages applied to a batch one after another."""

    def apply(batch: Any) -> Any:
        for stage in stages:
            batch = stage.apply(batch)
        return batch

    return apply


class _HostSide:
    """What the device feed iterates: the host chain's batches, in the engine's (page-locked)
    slots. Holds the loader weakly, so that the loader, not a reference cycle, decides when it
    closes."""

    def __init__(self, owner: Any, host: Stage):
        self._owner = weakref.ref(owner)
        self._host = host

    def _get(self) -> Any:
        owner = self._owner()
        if owner is None:
            from ...errors import InvalidArgumentError

            raise InvalidArgumentError("the loader is gone")
        return owner

    def __iter__(self) -> "_HostPass":
        return _HostPass(self._get(), self._host)

    def __len__(self) -> int:
        return len(self._get())

    def set_epoch(self, epoch: int) -> None:
        self._get().set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self._host.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._host.load_state_dict(state)


class _HostPass:
    """One pass of host batches for the device feed. Holds the loader for as long as the feed's
    pass holds it: past the last batch taken, while batches are still in flight."""

    def __init__(self, owner: Any, host: Stage):
        self.owner = owner
        self._batches = iter(host)

    def __iter__(self) -> "_HostPass":
        return self

    def __next__(self) -> Any:
        return next(self._batches)

    def __length_hint__(self) -> int:
        return length_hint(self._batches)

    def close(self) -> None:
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()
