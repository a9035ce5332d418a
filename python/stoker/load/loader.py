"""Loader (typed fields) and ImageLoader (its image-classification preset): batches decoded and
augmented by the C++ engine from a stoker pack or WebDataset shards.

A Loader checks its options once (stoker.load.options), opens its data, and composes the chain of
stages a pass goes through (stoker.load.chain, stoker.load.stages); its methods are what a
DataLoader user expects (len, iteration, set_epoch, state_dict, stats) and replay (sample_ids,
batch_at). A preset (ImageLoader, TokenLoader) is the Loader with some options set and its own
layout of a batch (stoker.load.layout)."""

from __future__ import annotations

import atexit
import contextlib
import os
import traceback
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from .closing import without_waiting
from ..errors import InvalidArgumentError, step_out_of_range
from .fields import Array, CenterCrop, Field, Image, Label, RandomResizedCrop
from .chain import Chain, Preset, build, plan
from .layout import ImageLabelLayout
from .options import (DEFAULT_SHUFFLE_WINDOW, check_options, default_cpu_budget, open_data,
                      open_dataset, read_schema, resolve_ranks, resolve_shuffle,
                      without_output_files)  # fmt: skip
from .stages import length_hint
from .stages.engine import upgrade_state
from ..loader_protocol import EpochSetter, rebuild
from ..parquet import is_parquet
from ..remote import is_remote

if TYPE_CHECKING:
    from .buckets import AspectBuckets, VideoBuckets
    from .workers import RayWorkers
    from collections.abc import Mapping

    import torch

__all__ = [
    "DEFAULT_SHUFFLE_WINDOW",
    "ImageLoader",
    "Loader",
    "default_cpu_budget",
    "open_dataset",
    "read_schema",
    "resolve_ranks",
    "resolve_shuffle",
    "upgrade_state",
    "without_output_files",
]

# Loaders still open when the interpreter exits are closed first, so that no worker thread is
# still decoding while Python tears itself down.
_open_loaders: "weakref.WeakSet[Loader]" = weakref.WeakSet()


@atexit.register
def _close_open_loaders() -> None:
    for loader in list(_open_loaders):
        loader.close()


class Loader:
    """Iterates batches of typed fields, like a torch DataLoader over any dataset of samples.

    ``fields`` maps batch keys to field kinds (``stoker.Image``, ``Mask``, ``Boxes``, ``Label``,
    ``Array``, ``Bytes``, ``Text``, ``Json``), each reading one member of a sample
    (WebDataset's ``KEY.<member>`` files)::

        loader = stoker.Loader("packs/coco", batch_size=32, train=True, fields={
            "image": stoker.Image("jpg", size=(640, 640), geometry=stoker.Letterbox(), hflip=0.5),
            "mask": stoker.Mask("seg.png", follow="image"),
            "boxes": stoker.Boxes("json", follow="image", max_boxes=100),
            "label": stoker.Label("cls"),
        })
        for batch in loader:  # a dict: tensors, dicts of tensors, lists for Bytes/Text/Json
            ...

    C++ threads decode every field of a sample straight into the batch's buffers (one block per
    batch, handed to torch without a copy); an Image draws its random geometry once per sample
    and the fields that ``follow`` it (masks, boxes, other images) get exactly the same one.

    A sample without a member a field asks for: ``missing="error"`` (default) makes it a failed
    sample (``on_error`` then raises or skips it, naming shard, key and member);
    ``missing="skip"`` leaves it out and counts it in ``stats()["missing"]``. A field with
    ``optional=True`` gives its empty value instead.

    An array pack (``stoker.pack_arrays``) is read the same way, a field per column: an Image of
    a uint8 column takes its rows as pixels (geometry, flips, no decoding), a Label an integer
    column, an Array any column. ``resident=True`` reads the whole dataset into memory once
    (refused, with both sizes, if it does not fit): host memory, where the engine reads it; or,
    with ``device="cuda"`` and an array pack, GPU memory, where each batch is a gather and the
    Image's whole-pixel geometry (RandomCrop, flips) as tensor operations, with no host work per
    sample. Either way the batches are the ones read from disk, bit for bit.

    ``augment=[op, ...]`` (stoker.augment: ColorJitter, RandAugment, TimmRandAugment,
    RandomErasing..., and last at most one MixUp) transforms the Image field named "image" (or
    the only one) of each batch, each sample with its own parameters drawn from (seed, epoch,
    its index): on the host, or with ``device=`` on the feed's stream before the batch is
    normalised. MixUp turns the Label field into soft targets. docs/AUGMENT.md.

    ``map=fn`` runs per-sample Python on the decoded fields (a dict of numpy arrays: images
    HxWxC, a view of the batch; ``fn(sample, rng)`` also gets a numpy Generator keyed by (seed,
    epoch, index)) on ``map_threads`` threads (default: one per core) before ``augment``, the
    fields it returns written back in place (same shapes): for albumentations-style code. Its
    time is ``stats()["seconds"]["map"]``; the doctor names it when it bounds the job.

    ``remote_workers=stoker.RayWorkers(count, threads)`` makes the batches on the CPU machines of
    a Ray cluster: each worker builds this loader from its arguments and makes whole batches of
    this rank's share, bit for bit these, with the same states, records and errors; ``threads``
    then counts this process's threads working alongside (0: none). A worker lost has its steps
    made again elsewhere; ``stats()["workers"]`` gives each worker's rate, the bytes it sent and
    the trainer's wait (docs/DISTRIBUTED.md).

    Batches of many shapes: ``buckets=stoker.AspectBuckets(area=1024 * 1024)`` gives each
    image the bucket nearest its aspect (from the pack's index), crops it there (random along
    the slack when training, centred otherwise) and makes every batch of one bucket, its images
    ``[B, 3, h, w]`` at that bucket's size (its ``batch_size``, or ``batch_pixels``' worth).
    ``buckets=stoker.VideoBuckets([(h, w, frames), ...], fps=8)``: the same for clips.
    ``group_by=fn`` groups any loader's samples by ``fn(entry)`` (stoker.load.grouping's
    SampleEntry: sizes, member bytes, a ``.npy`` length, metadata), which gives a key or
    ``(key, batch_size)``. Either way batches depend only on (seed, epoch, rank, step), every
    rank gets as many, ``same_shape_across_ranks=True`` gives every rank's step the same group,
    and an epoch's leftovers are ``"carry"``-ed into the next (training's default),
    ``"drop"``-ped or made ``"partial"`` batches (evaluation's), never mixed
    (``stats()["leftovers"]``, ``groups``; docs/BUCKETS.md).

    Replay: ``sample_ids(epoch, step)`` says which samples a step hands each rank and
    ``batch_at(epoch, step)`` gives that batch again, bit for bit, in one batch's time
    (``stoker.show`` draws it). ``record="steps.jsonl"`` appends a JSON line per batch handed
    out: its epoch, step, rank and the samples' pack indices and keys (stoker.load.record).

    Everything else is ImageLoader's contract: ``len``, ``set_epoch``, ``shuffle`` (``None``,
    ``False``, ``True``/``"global"`` or ``"block"`` with ``shuffle_window`` shards),
    ``state_dict`` (exact resume, at any world size), ``on_error``/``max_errors``/``quarantine``,
    ``rank``/``world_size``,
    ``threads="auto"``, ``stats()``; with ``device=``, every tensor of the batch moves and the
    images (only) are converted to ``dtype`` and normalised with ``mean``/``std``. Batches depend
    only on (seed, epoch): the same whatever ``threads``.
    """

    def __init__(
        self,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        batch_size: int,
        fields: "Mapping[str, Field]",
        train: bool = True,
        shuffle: bool | str | None = None,
        shuffle_window: int = DEFAULT_SHUFFLE_WINDOW,
        seed: int = 0,
        drop_last: bool = False,
        threads: int | str | None = "auto",
        cpu_budget: int | None = None,
        prefetch: int = 2,
        rank: int | None = None,
        world_size: int | None = None,
        return_index: bool = False,
        on_error: str = "raise",
        max_errors: int | float | None = None,
        quarantine: str | os.PathLike | None = None,
        missing: str = "error",
        verify_crc: bool = False,
        simulated_read_latency: float = 0.0,
        device: "str | torch.device | None" = None,
        dtype: "torch.dtype | None" = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        device_prefetch: int = 2,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | None = None,
        resident: bool = False,
        augment: Any = None,
        map: Callable[..., Any] | None = None,
        map_threads: int | None = None,
        record: str | os.PathLike | None = None,
        remote_workers: "RayWorkers | None" = None,
        buckets: "AspectBuckets | VideoBuckets | None" = None,
        group_by: Callable[[Any], Any] | None = None,
        same_shape_across_ranks: bool = False,
        leftovers: str | None = None,
        _preset: Preset | None = None,
    ):
        given = {k: v for k, v in locals().items() if k not in ("self", "__class__", "_preset")}
        if not hasattr(self, "_init_kwargs"):
            self._init_kwargs = given  # what rebuilds it (pickling, batch_at, the doctor)
        # Until it is built, close() (and __del__, on a loader whose construction failed) has
        # nothing to do: what a step acquired is released by the stack below.
        self._closed, self._resources = True, contextlib.ExitStack()
        options = check_options(fields, is_remote(path) or is_parquet(path), **{
            k: v for k, v in given.items() if k not in ("path", "fields")})  # fmt: skip
        preset = _preset or Preset()
        self._options = options
        self.batch_size, self.train, self.seed = options.batch_size, options.train, options.seed
        self.shuffle, self.shuffle_window = options.shuffle, options.shuffle_window
        self.drop_last, self.return_index = options.drop_last, options.return_index
        self.on_error, self.quarantine = options.on_error, options.quarantine
        self.resident, self.autotune = options.resident, options.threads == "auto"
        torch_on_cpu = type(self)._resident_torch_on_cpu
        planned = plan(options, dict(fields), torch_on_cpu)  # the last checks: nothing acquired yet
        # A transaction: each step's resources enter the stack as they are acquired; a failure
        # closes them, last first, and the original error propagates.
        with contextlib.ExitStack() as stack:
            self._remote, dataset, self.schema, fields = open_data(path, options, preset, stack,
                                                                    fields)  # fmt: skip
            self.fields = {name: f._resolve(self.schema) if isinstance(f, Array) else f
                           for name, f in fields.items()}  # fmt: skip
            self._chain: Chain
            self._chain, self.dataset = build(self, options, planned, self.fields, dataset,
                                              self._remote, preset, stack)  # fmt: skip
            self._resources = stack.pop_all()
        self._closed = False
        self._engine = self._chain.engine.engine
        _open_loaders.add(self)

    # Tests run the GPU's resident path with CPU tensors, to compare it with the engine's.
    _resident_torch_on_cpu = False
    # A loader whose construction failed (even before Loader.__init__, in a preset's own checks)
    # has nothing to close: close() and __del__ do nothing.
    _closed = True

    # --- the chain's parts that tests and tools look at --------------------------------------
    @property
    def _augment(self) -> Any:
        return self._chain.augment

    @property
    def _map(self) -> Any:
        return self._chain.map

    @property
    def _on_device(self) -> Any:
        return self._chain.held

    @property
    def _pinned_slots(self) -> set[int]:
        return self._chain.pins.pinned if self._chain.pins is not None else set()

    @property
    def _normalize(self) -> Any:
        """What converts the batch's images on the device (None: uint8 on the host)."""
        return self._chain.normalize

    @property
    def _last_address(self) -> int:
        return self._chain.engine.last_address

    @property
    def device(self) -> "torch.device | None":
        """Where batches go (``None``: host tensors). For a bare ``"cuda"``, the current device
        when the last pass started."""
        return None if self._chain.backend is None else self._chain.backend.device

    @property
    def threads(self) -> int:
        """Worker threads working now (with ``threads="auto"``, what the tuner chose)."""
        return self._engine.threads

    def tuning(self) -> list[dict[str, Any]]:
        """With ``threads="auto"``: each tuning interval, with its setting (``threads``,
        ``prefetch``), what was measured (``samples_per_second``, the consumer's
        ``wait_fraction``, the workers' ``busy_fraction``) and the setting chosen next."""
        return self._engine.tuning()

    @property
    def groups(self) -> list[dict[str, Any]] | None:
        """With ``buckets=`` or ``group_by=``: each group's ``key`` (a bucket's (height,
        width, [frames]), or group_by's key), ``batch_size`` and ``samples``; else None."""
        plan = self._chain.groups
        return None if plan is None else plan.describe()

    @property
    def groups_excluded(self) -> int:
        """Samples in no group, left out of every epoch (VideoBuckets': filling none, or kept
        by none)."""
        return 0 if self._chain.groups is None else self._chain.groups.excluded

    # --- ranks ------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank as of now: the ``rank`` given, else torch.distributed's (once its
        process group exists), else ``RANK``. The next pass runs at it."""
        return self._chain.engine.sync_ranks()[0]

    @property
    def world_size(self) -> int:
        """The number of ranks as of now (as ``rank``)."""
        return self._chain.engine.sync_ranks()[1]

    # --- the DataLoader-like surface -------------------------------------------------------
    def __len__(self) -> int:
        """Batches of a whole epoch on this rank, for the ranks as they are when it is called
        (``rank``, ``world_size``): a loader built before ``init_process_group`` answers for
        the job's ranks once the group exists. Every rank gets the same number."""
        self._chain.engine.sync_ranks()
        return self._engine.num_batches

    @property
    def sampler(self) -> "EpochSetter":
        """What trainers that call ``loader.sampler.set_epoch(epoch)`` (Lightning) reach: it
        sets this loader's epoch, as ``set_epoch`` does."""
        return EpochSetter(self)

    def __iter__(self) -> Iterator[Any]:
        """One pass: this rank's share of an epoch, from its start or a loaded state. The pass
        keeps its loader alive: `for batch in Loader(...)` reads to the end."""
        return _Pass(self, iter(self._chain.top))

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next pass (its shuffle and augmentation draws)."""
        self._engine.set_epoch(epoch)

    @property
    def num_samples(self) -> int:
        """Samples this rank sees per epoch (padded to equal counts across ranks), for the
        ranks as they are now."""
        self._chain.engine.sync_ranks()
        return self._engine.samples_per_rank

    @property
    def classes(self) -> list[str]:
        return list(self.dataset.classes)

    def sample_ids(
        self, epoch: int, step: int, rank: int | None = None
    ) -> list[dict[str, Any]] | dict[int, list[dict[str, Any]]]:
        """Which samples batch `step` of `epoch` hands a rank, computed, not read: each one's
        ``index`` (pack order), ``shard`` and ``key``, in the batch's order (before any that
        fails to decode is skipped). `rank`: of this loader's world size; None gives every
        rank's, ``{rank: [...]}``. Steps count from the epoch's start; a step past its last
        batch raises StepOutOfRangeError (an IndexError) giving the epoch's length. Costs the
        epoch's order (O(samples)), whatever the step."""
        self._chain.engine.sync_ranks()
        world = self._engine.options.world_size
        self._check_step(epoch, step)
        ranks = list(range(world)) if rank is None else [rank]
        out: dict[int, list[dict[str, Any]]] = {}
        for r in ranks:
            ids = self._engine.step_samples(int(epoch), int(step), int(r), world)
            out[r] = [self._sample_id(i) for i in ids]
        return out if rank is None else out[ranks[0]]

    def _sample_id(self, index: int) -> dict[str, Any]:
        record = self.dataset.record(index)
        return {"index": index, "shard": record.get("shard", ""), "key": record.get("key", "")}

    def batch_at(self, epoch: int, step: int) -> Any:
        """Batch `step` of `epoch` on this rank, bit for bit as a pass from the epoch's start
        hands it out (the same samples, crops, flips and augmentation: every draw is keyed by
        the sample), in about one batch's time whatever the step: a loader built like this one,
        positioned at the step, takes one batch. Past the epoch's last batch,
        StepOutOfRangeError (an IndexError) giving the epoch's length."""
        return self._replay(epoch, step)

    def _check_step(self, epoch: int, step: int) -> None:
        steps = self._engine.num_batches
        if self._chain.groups is not None:  # an epoch's count: under "carry", its own
            plan: Any = self._engine.epoch_plan(int(epoch), self._engine.options.world_size)
            steps = plan["steps"]
        if not 0 <= step < steps:
            raise step_out_of_range(epoch, step, steps, self._engine.options.world_size)

    def _replay(self, epoch: int, step: int, **changes: Any) -> Any:
        """batch_at's batch, from a twin of this loader built with `changes` (for `show`:
        return_index=True)."""
        self._chain.engine.sync_ranks()
        options = self._engine.options
        self._check_step(epoch, step)
        kwargs = without_output_files(self._init_kwargs)  # not the pass's files
        kwargs.update(rank=options.rank, world_size=options.world_size, **changes)
        twin = type(self)(**kwargs)
        try:
            consumed = min(step * self.batch_size * options.world_size, len(self.dataset))
            twin._engine.load_state(int(epoch), consumed, int(step))  # taken before it
            return next(iter(twin))
        finally:
            twin.close()  # the batch handed out stays valid

    def state_dict(self) -> dict[str, Any]:
        """Where the training loop stands: resuming from it gives exactly the batches not yet
        handed out (with a device, not those in flight on the GPU)."""
        return self._chain.top.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._chain.top.load_state_dict(state)

    def stats(self) -> dict[str, Any]:
        """Samples delivered and skipped, and seconds per stage.

        ``skipped`` counts the loader's whole life, ``pass_skipped`` the pass in progress (what
        ``max_errors`` limits). ``skipped_samples`` lists the first 10,000 with ``index`` (in pack
        order), ``shard``, ``key``, ``error`` (the exception class's name) and ``reason``. Stage
        times are summed over worker threads (read, decode, transform, collate); ``wait`` is the
        time the training loop spent waiting for a batch. ``dct_scales`` counts the images the host
        decoded at each DCT scale ({1: ..., 2: ..., 4: ..., 8: ...}; PNG, WebP and raw pixels at 1):
        whether the outputs are small enough for the decoder to skip pixels. ``scan_index``:
        the JPEGs without restart markers indexed so far for cut decoding (``images``) and the
        memory their indexes take (``bytes``, up to ``scan_index_memory``). With a device,
        ``device`` counts the batches handed over, bytes copied from page-locked slots and through
        staging (all of them where page-locking was refused), the page-locked slots, and the host's
        seconds waiting on copies or on the training stream (``host_wait_s``). Each stage of the
        chain adds its own: ``remote`` (a pack at a URL), ``seconds["map"]``, ``decode``
        (decode="gpu"/"auto"), ``workers`` (remote_workers=: each worker's node, pid, steps,
        samples, bytes and samples/s while busy; the workers lost and the steps made again; the
        trainer's wait, also in ``seconds["wait"]``; the stage times are the workers').
        """
        stats: dict[str, Any] = {}
        self._chain.top.stats(stats)
        return stats

    def close(self) -> None:
        """Stop the worker threads (and the remote workers, fetchers, the feed: everything the
        loader started), last started first. Batches already handed out stay valid."""
        if not self._closed:
            self._closed = True
            try:
                self._resources.close()  # the feed first (its copies read the slots), then down
            except BaseException as e:
                _without_cycles(e)
                raise
            finally:
                _open_loaders.discard(self)

    def __enter__(self) -> "Loader":
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        """A loader pickles to its arguments and its position, never its threads, buffers or
        open files: unpickled (in this process or another: ``ddp_spawn``, ``mp.spawn``, a
        notebook), it is built again from the arguments and continues from the position, the
        batches it gives those this one would have given. Ranks not given are resolved there,
        when its passes start."""
        return (rebuild, (type(self), self._init_kwargs, self.state_dict()))

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            with without_waiting():  # collected anywhere: stop the threads, never join them
                self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        fields = ", ".join(f"{k!r}: {v!r}" for k, v in self.fields.items())
        return (
            f"{type(self).__name__}({self.dataset.path!r}, samples={len(self.dataset)}, "
            f"batch_size={self.batch_size}, train={self.train}, fields={{{fields}}}, "
            f"threads={self.threads}, rank={self.rank}/{self.world_size}"
            + ("" if self.device is None else f", device={str(self.device)!r}")
            + ")"
        )


class ImageLoader(Loader):
    """Iterates ``(images, labels)`` batches, like a torch DataLoader over an image dataset: the
    image-classification preset of `Loader` (an ``Image`` and an optional ``Label``).

    ``images`` is a ``torch.uint8`` tensor of shape ``[B, 3, size, size]`` in channels_last
    memory format (the bytes are NHWC), made by C++ threads straight into a reusable buffer and
    handed to torch without a copy. It stays valid for as long as you hold it. ``labels`` is
    ``torch.int64`` of shape ``[B]`` (-1 for a sample without one); with ``return_index=True`` a
    third tensor gives each sample's position in pack order.

    ``train=True``: torchvision's RandomResizedCrop(size) + RandomHorizontalFlip.
    ``train=False``: Resize(round(size * 256 / 224)) + CenterCrop(size).
    Augmentation draws depend only on (seed, epoch, sample): the same batches whatever ``threads``.
    ``augment=[...]`` adds batch augmentations after the crop and flip (see Loader; with MixUp
    last, labels become soft targets ``[B, num_classes]``).

    ``threads="auto"`` (the default) lets the engine choose its thread count and prefetch depth
    while it runs: the highest throughput within ``cpu_budget`` cores (default: all but one on
    machines with 3 or more), shedding threads the training loop does not need
    (``tuning()`` shows each decision). ``threads=N`` fixes it.

    Bad samples stop training by default (a pack ``stoker.pack`` wrote was read whole once, so a
    failure now means the data changed): ``on_error="raise"`` raises the sample's error (a
    ``CorruptDataError``, ``UnsupportedFormatError``, ``ShardIOError`` or ``ResourceLimitError``
    naming shard and key); ``"skip"`` leaves it out of its batch (one sample shorter) and
    lists it in ``stats()``; ``"warn"`` skips and also issues a ``StokerWarning``;
    ``"replace"`` puts a substitute in its place, drawn from the failed sample's shard keyed by
    (seed, epoch, the failed sample): every batch keeps its size on every rank (torch.compile,
    CUDA graphs, FSDP), the same whatever the threads and after a resume; ``stats()`` lists the
    failure
    with its ``substitute``. ``max_errors`` (None by default: no limit; a count, or a float
    fraction of the epoch's samples) bounds the failures of one pass, replaced or skipped: past it,
    ``ErrorBudgetExceededError``. ``quarantine="bad.json"`` writes the skipped samples to a report
    at the end of every pass and on ``close()``. ``max_pixels``, ``max_scans`` (progressive JPEG)
    and ``max_decode_memory`` (bytes one image may take in the decoder) bound what a hostile file
    can cost; past them, ``ResourceLimitError``. ``fast_idct=True`` decodes JPEGs with libjpeg's
    fast integer IDCT (JDCT_IFAST) instead of its accurate one: outputs about 44 dB PSNR from the
    default's on imagenet-sample (docs/BENCHMARKS.md, "Where the time goes", says what it gains).
    A JPEG without restart markers (a Parquet file's, a foreign shard's) is indexed as its first
    epoch decodes it: where each of its MCU rows starts, up to about 7 KB an ImageNet image, kept
    in up to ``scan_index_memory`` bytes (0: none); later epochs then decode only the part a crop
    needs, as they do for the restart markers of stoker's own packs (docs/ARCHITECTURE.md, "Data
    flow of one image").

    ``device="cuda"``: batches arrive on the GPU, already converted to ``dtype`` (float32 unless
    given: ``torch.bfloat16``, ``torch.float16``...) and normalised with ``mean`` and ``std`` (in
    [0, 1] units, e.g. ``stoker.IMAGENET_MEAN``), ``[B, 3, size, size]`` channels_last. The batch
    slots are page-locked once and copied on a side stream ``device_prefetch`` batches ahead
    (docs/GPU.md, which states the contracts: which device and stream a batch is ready for,
    what the device holds). A bare ``"cuda"`` is the current device when each pass starts, so
    the loader may be built before ``torch.cuda.set_device(local_rank)``; every CUDA call is
    made on that device only. ``device="cpu"`` does the same conversion on the host. ``labels``
    and ``indices`` move with the images.

    Order: ``shuffle=None`` (the default) shuffles for training and keeps pack order otherwise;
    ``True`` or ``"global"`` is one permutation of every sample per epoch; ``"block"`` permutes
    the shards, groups them into windows of ``shuffle_window`` shards and permutes the samples
    within each window, so that all ranks together read from at most ``shuffle_window`` shards
    at a time (twice that across a window's edge), at a cost in mixing that docs/DISTRIBUTED.md
    measures. Either order depends only on (seed, epoch, shuffle, shuffle_window), never on the
    world size: rank ``r`` of ``W`` takes its positions ``r, r + W, r + 2W, ...``, padded by
    repeating the epoch's first ones so that every rank gets the same number of batches (as
    torch's DistributedSampler), or cut with ``drop_last``.

    ``buckets=stoker.AspectBuckets(...)``: images at native aspect, each batch of one bucket's
    size (``size`` is then unused); see Loader and docs/BUCKETS.md.

    Each ``for`` loop is one pass over this rank's share of the data. A finished pass advances the
    epoch; ``set_epoch`` chooses it explicitly. ``state_dict()`` taken mid-pass and restored with
    ``load_state_dict()`` resumes with exactly the remaining batches. It counts the samples all
    ranks have consumed together, so a job may resume at another world size: the rest of the
    epoch is split across the new ranks, no sample of it lost or repeated (docs/DISTRIBUTED.md).

    A pack at a URL (``"s3://bucket/packs/train"``, ``gs://``, ``http(s)://``, any fsspec URL) is
    read through a local cache folder, ``cache_dir`` (default ``~/.cache/stoker``), holding at
    most ``cache_limit`` bytes of shards (default 64 GiB); shards are fetched whole as the pass
    needs them, checked against the index, and shared by the processes on the machine. Such a
    pack shuffles with ``"block"`` by default. Credentials come from the environment, as fsspec
    takes them (docs/REMOTE.md).
    """

    def __init__(
        self,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        batch_size: int,
        size: int = 224,
        train: bool = True,
        shuffle: bool | str | None = None,
        shuffle_window: int = DEFAULT_SHUFFLE_WINDOW,
        seed: int = 0,
        drop_last: bool = False,
        threads: int | str | None = "auto",
        cpu_budget: int | None = None,
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
        fast_idct: bool = False,
        exact_progressive: bool = False,
        scan_index_memory: int = 256 << 20,
        dct_scaling: bool = True,
        decode: str = "host",
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        flip_probability: float = 0.5,
        simulated_read_latency: float = 0.0,
        device: "str | torch.device | None" = None,
        dtype: "torch.dtype | None" = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        device_prefetch: int = 2,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | None = None,
        resident: bool = False,
        augment: Any = None,
        map: Callable[..., Any] | None = None,
        map_threads: int | None = None,
        record: str | os.PathLike | None = None,
        remote_workers: "RayWorkers | None" = None,
        buckets: "AspectBuckets | None" = None,
        group_by: Callable[[Any], Any] | None = None,
        same_shape_across_ranks: bool = False,
        leftovers: str | None = None,
    ):
        # What stoker.diagnose needs to build a sibling loader that differs in one option.
        self._init_kwargs = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= 8192:
            raise InvalidArgumentError(f"size must be an int in 1-8192, not {size!r}")
        self.size = size
        image = Image(
            size=size,
            geometry=None if buckets is not None else (
                RandomResizedCrop(scale, ratio) if train else CenterCrop(resize_size)),  # fmt: skip
            hflip=flip_probability if train else 0.0,
            dct_scaling=dct_scaling,
            max_pixels=max_pixels,
            max_scans=max_scans,
            max_decode_memory=max_decode_memory,
            fast_upsampling=fast_upsampling,
            fast_idct=fast_idct,
            exact_progressive=exact_progressive,
            scan_index_memory=scan_index_memory,
            decode=decode,
        )
        super().__init__(
            path,
            batch_size=batch_size,
            fields={"image": image, "label": Label(optional=True)},
            train=train,
            shuffle=shuffle,
            shuffle_window=shuffle_window,
            seed=seed,
            drop_last=drop_last,
            threads=threads,
            cpu_budget=cpu_budget,
            prefetch=prefetch,
            rank=rank,
            world_size=world_size,
            return_index=return_index,
            on_error=on_error,
            max_errors=max_errors,
            quarantine=quarantine,
            verify_crc=verify_crc,
            simulated_read_latency=simulated_read_latency,
            device=device,
            dtype=dtype,
            mean=mean,
            std=std,
            device_prefetch=device_prefetch,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            resident=resident,
            augment=augment,
            map=map,
            map_threads=map_threads,
            record=record,
            remote_workers=remote_workers,
            buckets=buckets,
            group_by=group_by,
            same_shape_across_ranks=same_shape_across_ranks,
            leftovers=leftovers,
            _preset=Preset(layout=ImageLabelLayout()),
        )

    def __repr__(self) -> str:
        return (
            f"ImageLoader({self.dataset.path!r}, samples={len(self.dataset)}, "
            f"batch_size={self.batch_size}, size={self.size}, train={self.train}, "
            f"threads={self.threads}, rank={self.rank}/{self.world_size}"
            + ("" if self.device is None else f", device={str(self.device)!r}")
            + ")"
        )


class _Pass:
    """A loader's pass as the loop iterates it: the chain's, holding the loader (a loader
    collected mid-pass would close its engine under it)."""

    def __init__(self, loader: Loader, batches: Iterator[Any]):
        self.loader, self.batches = loader, batches

    def __iter__(self) -> "_Pass":
        return self

    def __next__(self) -> Any:
        try:
            return next(self.batches)
        except StopIteration:
            raise
        except BaseException as e:
            _without_cycles(e)
            raise

    def __length_hint__(self) -> int:
        return length_hint(self.batches)  # the engine's batches left (at most)

    def close(self) -> None:
        close = getattr(self.batches, "close", None)
        if close is not None:
            close()


def _without_cycles(error: BaseException) -> None:
    """The locals of stoker's frames that `error` passed through, cleared (those frames have
    ended): an error raised from where it was kept (a worker's, taken from the dispatcher's
    queue; one raised while an ExitStack closed) is held by a local of a frame in its own
    traceback, a cycle that would keep the loader's files open until the garbage collector
    runs. The traceback itself (files, lines, names) stays whole."""
    traceback.clear_frames(error.__traceback__)
