"""What the doctor needs of a loader, one adapter per kind of loader.

``adapter_for(loader)`` is the only place in the doctor that asks which kind a loader is; the
rest of the doctor speaks to the adapter it returns. Each adapter answers:

- its batches, pass after pass (``passes``), for timing it, and how to ``close`` it;
- its own counters and stage times where it keeps them (``stats``), else ``None``: the doctor
  then reads the process's counters, and ``workers`` says how many processes load;
- its knob of parallelism, as a data-bound loop is told to raise it (``knob``);
- which of the doctor's data experiments it can run (``experiments``), and how to build a trial
  loader with a setting changed (``trial``, ``trying``).

The kinds, the first that fits:

- ``StokerLoaderAdapter``, a stoker Loader (ImageLoader, TokenLoader...): the engine's stage
  times (``loader.stats()``); knob ``threads`` (or ``cpu_budget``); experiments threads, decode,
  map, resident, and for an ImageLoader repack; trials built from the loader's arguments.
- ``DataLoaderAdapter``, a torch DataLoader: process counters; knob and experiment
  ``num_workers``; trials on the same dataset, sampler and collate.
- ``IterableAdapter``, any other iterable of batches: process counters; no experiment, no trial.

The loader module is imported here only (inside functions, and for type checking): the rest of
the doctor does not depend on it.
"""

from __future__ import annotations

import contextlib
import copy
from typing import TYPE_CHECKING, Any, Generator, Iterator, TypeVar, overload

if TYPE_CHECKING:
    from ..load.loader import Loader

# The data experiments (experiments.py) an adapter may list.
WORKERS = "workers"  # a sibling DataLoader with more worker processes
THREADS = "threads"  # a sibling stoker loader with more threads
REPACK = "repack"  # a few samples packed again (max_side, jpeg, raw), at the loader's size
DECODE = "decode"  # decode="gpu" and decode="auto" on the loader's device
MAP = "map"  # the loader without its map= stage
RESIDENT = "resident"  # the dataset held in host memory
REMOTE = "remote_workers"  # workers on other machines: sized from the rates, not a trial

A = TypeVar("A", bound="IterableAdapter")


class IterableAdapter:
    """Any iterable of batches: timed pass after pass, understood through the process's
    counters, never rebuilt."""

    knob = "num_workers"  # what a data-bound loop is told to raise

    def __init__(self, loader: Any):
        self.loader = loader

    @property
    def experiments(self) -> frozenset[str]:
        """The data experiments (experiments.py) this loader can run."""
        return frozenset()

    @property
    def rebuildable(self) -> bool:
        """Whether ``trial`` can build a sibling loader."""
        return False

    def passes(self) -> Generator[Any, None, None]:
        """The loader's batches, pass after pass: a phase may need more batches than one pass
        has. Ends at the first pass that gives none."""
        while True:
            empty = True
            for batch in self.loader:
                empty = False
                yield batch
            if empty:
                return

    def stats(self) -> dict[str, Any] | None:
        """The loader's own counters and stage times; None where it keeps none."""
        return None

    @property
    def workers(self) -> int | None:
        """Worker processes, for a loader that says how many (0: loading runs in the training
        process's thread)."""
        return getattr(self.loader, "num_workers", None)

    @property
    def dataset(self) -> Any:
        """The loader's dataset, where it has one (a stoker pack tells what the page cache holds
        of its files)."""
        return getattr(self.loader, "dataset", None)

    def trial(self, **changes: Any) -> Any:
        """A new loader of the same kind on the same data, with `changes` to its settings."""
        raise TypeError(f"the doctor cannot rebuild a {type(self.loader).__name__}")

    @contextlib.contextmanager
    def trying(self, **changes: Any) -> Iterator[Any]:
        """``trial(**changes)``, closed on leaving."""
        trial = self.trial(**changes)
        try:
            yield trial
        finally:
            type(self)(trial).close()

    def close(self) -> None:
        """Ends the loader's workers and files, for a loader that has ``close()``."""
        close = getattr(self.loader, "close", None)
        if close is not None:
            close()


class DataLoaderAdapter(IterableAdapter):
    """A torch DataLoader: rebuilt on the same dataset, sampler and collate with another
    ``num_workers``."""

    @property
    def experiments(self) -> frozenset[str]:
        return frozenset({WORKERS})

    @property
    def workers(self) -> int:
        return self.loader.num_workers

    @property
    def rebuildable(self) -> bool:
        # An IterableDataset, or batch_size=None, has no batch sampler to hand a sibling.
        return self.loader.batch_sampler is not None

    def trial(self, **changes: Any) -> Any:
        from torch.utils.data import DataLoader

        loader = self.loader
        kwargs = dict(
            batch_sampler=loader.batch_sampler,
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
        )
        return DataLoader(loader.dataset, **(kwargs | changes))


class StokerLoaderAdapter(IterableAdapter):
    """A stoker loader (Loader, and its presets ImageLoader, TokenLoader...): the engine's own
    stage times, and trial loaders built from its arguments."""

    knob = "threads (or cpu_budget)"
    loader: Loader

    @property
    def experiments(self) -> frozenset[str]:
        from ..load.loader import ImageLoader

        found = {THREADS, DECODE, MAP, RESIDENT, REMOTE}
        if isinstance(self.loader, ImageLoader):  # images at its size; a Loader's may be anything
            found.add(REPACK)
        return frozenset(found)

    @property
    def rebuildable(self) -> bool:
        return True

    def stats(self) -> dict[str, Any]:
        return self.loader.stats()

    @property
    def threads(self) -> int:
        return self.loader._engine.max_threads

    @property
    def autotune(self) -> bool:
        return bool(self.loader.autotune)

    @property
    def resident(self) -> bool:
        return bool(self.loader.resident)

    @property
    def remote(self) -> bool:
        """Whether its shards come from object storage."""
        return "remote" in self.loader.stats()

    @property
    def device(self) -> Any:
        return self.loader.device

    @property
    def batch_bytes(self) -> int:
        """Bytes of one batch as the host pipeline makes it (what a remote worker sends)."""
        workers = self.loader.stats().get("workers")
        if workers:
            made = sum(w["steps"] for w in workers["workers"])
            if made:
                return int(workers["bytes"] / made)
        return int(self.loader._engine.slot_bytes)

    def worker_rate(self) -> tuple[float, int] | None:
        """Samples/s of one of its remote workers and their threads (the median worker's),
        or None where it has none that made steps."""
        import statistics

        workers = self.loader.stats().get("workers")
        rates = [w for w in workers["workers"] if w["steps"]] if workers else []
        if not rates:
            return None
        return (statistics.median(w["samples_per_second"] for w in rates),
                int(statistics.median(w["threads"] for w in rates)))  # fmt: skip

    @property
    def size(self) -> int:
        return self.loader.size  # type: ignore[attr-defined]  # an ImageLoader's output side

    @property
    def batch_size(self) -> int:
        return self.loader.batch_size

    @property
    def image(self) -> tuple[str, str] | None:
        """The name and ``decode`` of the loader's one image field (one that follows no other),
        or None where it has none or several."""
        from ..load.fields import Image

        fields = self.loader.fields
        images = [(n, f) for n, f in fields.items() if isinstance(f, Image) and f.follow is None]
        if len(images) != 1:
            return None
        name, image = images[0]
        return name, image.decode

    def _arguments(self) -> dict[str, Any]:
        # A trial must not write the user's quarantine report or record.
        from ..load.loader import without_output_files

        return without_output_files(self.loader._init_kwargs)

    def trial(self, **changes: Any) -> Any:
        """A loader of the same type with the same arguments and `changes`, its batches left on
        the host as the pipeline makes them (the experiments time the host pipeline), and warning
        about no sample the loader already warned about."""
        kwargs = self._arguments()
        kwargs.update(on_error="skip" if kwargs["on_error"] != "raise" else "raise")
        kwargs.update(changes)
        kwargs["device"] = None
        for k in ("dtype", "mean", "std"):
            kwargs[k] = None
        return type(self.loader)(**kwargs)

    def decode_trial(self, mode: str) -> Any:
        """The loader as it is, device included, with its image field's ``decode=mode``."""
        image = self.image
        assert image is not None, "a loader without one image field"
        kwargs = self._arguments()
        if type(self.loader).__name__ == "ImageLoader" or "fields" not in kwargs:
            kwargs["decode"] = mode
        else:
            fields = dict(kwargs["fields"])
            fields[image[0]] = copy.copy(fields[image[0]])
            fields[image[0]].decode = mode
            kwargs["fields"] = fields
        return type(self.loader)(**kwargs)


@overload
def adapter_for(loader: Any) -> IterableAdapter: ...
@overload
def adapter_for(loader: Any, kind: type[A]) -> A: ...


def adapter_for(loader: Any, kind: type[IterableAdapter] | None = None) -> IterableAdapter:
    """The adapter of `loader` (an adapter is its own). With `kind`, an experiment that only
    that kind lists says so: another kind of loader is a TypeError."""
    if isinstance(loader, IterableAdapter):
        adapter = loader
    else:
        adapter = _kind_of(loader)(loader)
    if kind is not None and not isinstance(adapter, kind):
        raise TypeError(f"{kind.__name__} for a {type(adapter.loader).__name__}")
    return adapter


def _kind_of(loader: Any) -> type[IterableAdapter]:
    from ..load.loader import Loader

    if isinstance(loader, Loader):  # ImageLoader, TokenLoader... too
        return StokerLoaderAdapter
    try:
        from torch.utils.data import DataLoader
    except ImportError:
        return IterableAdapter
    if isinstance(loader, DataLoader):
        return DataLoaderAdapter
    return IterableAdapter
