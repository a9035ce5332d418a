"""What trainers expect of a loader beyond iterating it, shared by every stoker loader (Loader,
ImageLoader, Mix): a ``sampler`` whose ``set_epoch`` they call, and pickling to the loader's
arguments and position, so that it crosses into the processes of ``ddp_spawn``,
``torch.multiprocessing.spawn`` or a notebook's launcher (docs/INTEGRATIONS.md)."""

from __future__ import annotations

from typing import Any, Callable, Protocol


class _SetsEpoch(Protocol):
    def set_epoch(self, epoch: int) -> None: ...


class EpochSetter:
    """``loader.sampler``: Lightning calls ``dataloader.sampler.set_epoch(epoch)`` at the start of
    every epoch (for torch's DistributedSampler). A stoker loader has no sampler object; this
    forwards the call to the loader's own ``set_epoch``, so that its order and augmentation
    follow the trainer's epoch even when the trainer stops a pass early (``limit_train_batches``,
    ``max_steps``)."""

    def __init__(self, loader: _SetsEpoch):
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    def __repr__(self) -> str:
        return f"EpochSetter({type(self._loader).__name__})"


def rebuild(make: Callable[..., Any], kwargs: dict[str, Any], state: dict[str, Any] | None) -> Any:
    """What an unpickled loader is: ``make(**kwargs)``, moved to ``state`` (a ``state_dict()``
    taken when it was pickled; None for a loader without one)."""
    loader = make(**kwargs)
    if state is not None:
        loader.load_state_dict(state)
    return loader
