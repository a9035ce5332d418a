"""ImageLoader: batches of decoded, augmented images from a stoker pack or WebDataset shards."""

from __future__ import annotations

import atexit
import glob
import os
import warnings
import weakref
from typing import Any, Iterator, Sequence

from . import _core
from .errors import InvalidArgumentError, StokerWarning, error_class

_STATE_VERSION = 1

# Loaders still open when the interpreter exits are closed first, so that no worker thread is
# still decoding while Python tears itself down.
_open_loaders: "weakref.WeakSet[ImageLoader]" = weakref.WeakSet()


@atexit.register
def _close_open_loaders() -> None:
    for loader in list(_open_loaders):
        loader.close()


def _error_budget(max_errors: int | float | None) -> tuple[int, float]:
    """(count, fraction) for the engine; -1 means no limit."""
    if max_errors is None:
        return -1, -1.0
    if isinstance(max_errors, bool) or not isinstance(max_errors, (int, float)):
        raise InvalidArgumentError(
            f"max_errors must be an int, a float or None, not {max_errors!r}"
        )
    if isinstance(max_errors, float):
        if not 0.0 <= max_errors < 1.0:
            raise InvalidArgumentError(
                f"max_errors as a fraction of the epoch must be in [0, 1), not {max_errors}"
            )
        return -1, max_errors
    if max_errors < 0:
        raise InvalidArgumentError(f"max_errors must be >= 0, not {max_errors}")
    return max_errors, -1.0


def open_dataset(path: str | os.PathLike | Sequence[str | os.PathLike]) -> "_core.Dataset":
    """A pack folder, one .tar, a folder of .tar shards, a glob like 'shards/*.tar', or a list."""
    if isinstance(path, (list, tuple)):
        return _core.Dataset.open_tars([os.fspath(p) for p in path])
    path = os.fspath(path)
    if any(c in path for c in "*?[") and not os.path.exists(path):
        tars = sorted(glob.glob(path))
        if not tars:
            raise InvalidArgumentError(f"no files match {path!r}")
        return _core.Dataset.open_tars(tars)
    return _core.Dataset.open(path)


def _distributed_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return (
                dist.get_rank() if rank is None else rank,
                dist.get_world_size() if world_size is None else world_size,
            )
    except ImportError:
        pass
    env_rank, env_world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    return (env_rank if rank is None else rank, env_world if world_size is None else world_size)


class ImageLoader:
    """Iterates ``(images, labels)`` batches, like a torch DataLoader over an image dataset.

    ``images`` is a ``torch.uint8`` tensor of shape ``[B, 3, size, size]`` in channels_last
    memory format (the bytes are NHWC), made by C++ threads straight into a reusable buffer and
    handed to torch without a copy. It stays valid for as long as you hold it. ``labels`` is
    ``torch.int64`` of shape ``[B]``; with ``return_index=True`` a third tensor gives each sample's
    position in pack order.

    ``train=True``: torchvision's RandomResizedCrop(size) + RandomHorizontalFlip.
    ``train=False``: Resize(round(size * 256 / 224)) + CenterCrop(size).
    Augmentation draws depend only on (seed, epoch, sample): the same batches whatever ``threads``.

    Bad samples: ``on_error="raise"`` (default) raises the sample's error (a
    ``CorruptDataError``, ``UnsupportedFormatError``, ``ShardIOError`` or ``ResourceLimitError``
    naming shard and key); ``"skip"`` leaves it out of its batch and lists it in ``stats()``;
    ``"warn"`` skips and also issues a ``StokerWarning``. ``max_errors`` (a count, or a float
    fraction of the epoch's samples) bounds the skips of one pass: past it,
    ``ErrorBudgetExceededError``. ``quarantine="bad.json"`` writes the skipped samples to a report
    at the end of every pass and on ``close()``. ``max_pixels``, ``max_scans`` (progressive JPEG)
    and ``max_decode_memory`` (bytes one image may take in the decoder) bound what a hostile file
    can cost; past them, ``ResourceLimitError``.

    Each ``for`` loop is one pass over this rank's share of the data. A finished pass advances the
    epoch; ``set_epoch`` chooses it explicitly. ``state_dict()`` taken mid-pass and restored with
    ``load_state_dict()`` resumes with exactly the remaining batches.
    """

    def __init__(
        self,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        batch_size: int,
        size: int = 224,
        train: bool = True,
        shuffle: bool | None = None,
        seed: int = 0,
        drop_last: bool = False,
        threads: int | None = None,
        prefetch: int = 2,
        rank: int | None = None,
        world_size: int | None = None,
        return_index: bool = False,
        on_error: str = "raise",
        max_errors: int | float | None = None,
        quarantine: str | os.PathLike | None = None,
        resize_size: int | None = None,
        verify_crc: bool = False,
        max_pixels: int = 1 << 28,
        max_scans: int = 256,
        max_decode_memory: int = 512 << 20,
        fast_upsampling: bool = False,
        exact_progressive: bool = False,
        dct_scaling: bool = True,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        flip_probability: float = 0.5,
    ):
        if on_error not in ("raise", "skip", "warn"):
            raise InvalidArgumentError(
                f"on_error must be 'raise', 'skip' or 'warn', not {on_error!r}"
            )
        max_count, max_fraction = _error_budget(max_errors)
        if batch_size <= 0:
            raise InvalidArgumentError(f"batch_size must be positive, not {batch_size}")
        if threads is not None and threads <= 0:
            raise InvalidArgumentError(f"threads must be positive or None, not {threads}")
        if seed < 0:
            raise InvalidArgumentError("seed must be >= 0")
        rank, world_size = _distributed_defaults(rank, world_size)
        self.batch_size = batch_size
        self.size = size
        self.train = train
        self.shuffle = train if shuffle is None else shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank, self.world_size = rank, world_size
        self.return_index = return_index
        self.on_error = on_error
        self.quarantine = os.fspath(quarantine) if quarantine is not None else None
        self.dataset = open_dataset(path)
        self._engine = _core.Loader(
            self.dataset,
            batch_size=batch_size,
            size=size,
            train=train,
            shuffle=self.shuffle,
            seed=seed,
            drop_last=drop_last,
            threads=threads or 0,
            prefetch=prefetch,
            rank=rank,
            world_size=world_size,
            skip_errors=on_error != "raise",
            max_errors=max_count,
            max_error_fraction=max_fraction,
            resize_size=resize_size or 0,
            verify_crc=verify_crc,
            max_pixels=max_pixels,
            max_scans=max_scans,
            max_decode_memory=max_decode_memory,
            fast_upsampling=fast_upsampling,
            exact_progressive=exact_progressive,
            dct_scaling=dct_scaling,
            scale_min=scale[0],
            scale_max=scale[1],
            ratio_min=ratio[0],
            ratio_max=ratio[1],
            flip_probability=flip_probability,
        )
        self.threads = self._engine.threads
        self._closed = False
        self._last_address = 0
        self._warned = 0  # skipped samples already warned about
        _open_loaders.add(self)

    # --- the DataLoader-like surface -------------------------------------------------------
    def __len__(self) -> int:
        return self._engine.num_batches

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        if self._closed:
            raise InvalidArgumentError("the loader is closed")
        self._engine.begin()
        return self._batches()

    def _batches(self) -> Iterator[tuple[Any, ...]]:
        while True:
            try:
                item = self._engine.next()
            finally:
                if self.on_error == "warn":
                    self._warn_skipped()
            if item is None:
                self._write_quarantine()
                return
            images, labels, indices, address = item
            self._last_address = address
            # NHWC bytes viewed as NCHW: torch's channels_last layout, no copy.
            images = images.permute(0, 3, 1, 2)
            yield (images, labels, indices) if self.return_index else (images, labels)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next pass (its shuffle and augmentation draws)."""
        self._engine.set_epoch(epoch)

    @property
    def num_samples(self) -> int:
        """Samples this rank sees per epoch (padded to equal counts across ranks)."""
        return self._engine.samples_per_rank

    @property
    def classes(self) -> list[str]:
        return list(self.dataset.classes)

    def state_dict(self) -> dict[str, Any]:
        epoch, batches_done = self._engine.state()
        return {
            "version": _STATE_VERSION,
            "epoch": epoch,
            "batches_done": batches_done,
            "seed": self.seed,
            "num_samples": len(self.dataset),
            "batch_size": self.batch_size,
            "rank": self.rank,
            "world_size": self.world_size,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != _STATE_VERSION:
            raise InvalidArgumentError(f"unknown loader state version {state.get('version')!r}")
        for name, mine in (
            ("seed", self.seed),
            ("num_samples", len(self.dataset)),
            ("batch_size", self.batch_size),
            ("world_size", self.world_size),
            ("shuffle", self.shuffle),
        ):
            if state[name] != mine:
                raise InvalidArgumentError(
                    f"cannot resume: the state has {name}={state[name]!r}, this loader {mine!r}"
                )
        self._engine.load_state(state["epoch"], state["batches_done"])

    def stats(self) -> dict[str, Any]:
        """Samples delivered and skipped, and seconds per stage.

        ``skipped`` counts the loader's whole life, ``pass_skipped`` the pass in progress (what
        ``max_errors`` limits). ``skipped_samples`` lists the first 10,000 with ``index`` (in pack
        order), ``shard``, ``key``, ``error`` (the exception class's name) and ``reason``. Stage
        times are summed over worker threads (read, decode, transform, collate); ``wait`` is the
        time the training loop spent waiting for a batch.
        """
        stats = self._engine.stats()
        for sample in stats["skipped_samples"]:
            sample["error"] = error_class(sample.pop("code")).__name__
        return stats

    def _warn_skipped(self) -> None:
        for sample in self._engine.skipped_since(self._warned):
            self._warned += 1
            warnings.warn(
                f"stoker skipped {sample['shard']}: sample {sample['key']!r}: "
                f"{error_class(sample['code']).__name__}: {sample['reason']}",
                StokerWarning,
                stacklevel=4,
            )

    def _write_quarantine(self) -> None:
        if self.quarantine is None:
            return
        from .quarantine import write_report

        stats = self.stats()
        write_report(
            self.quarantine,
            source=os.fspath(self.dataset.path),
            kind="loader",
            checked=stats["samples"] + stats["skipped"],
            failures=stats["skipped_samples"],
        )

    def close(self) -> None:
        """Stop the worker threads. Batches already handed out stay valid."""
        if not self._closed:
            self._closed = True
            self._engine.close()
            _open_loaders.discard(self)
            self._write_quarantine()

    def __enter__(self) -> "ImageLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (
            f"ImageLoader({self.dataset.path!r}, samples={len(self.dataset)}, "
            f"batch_size={self.batch_size}, size={self.size}, train={self.train}, "
            f"threads={self.threads}, rank={self.rank}/{self.world_size})"
        )
