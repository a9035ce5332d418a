"""Loader (typed fields) and ImageLoader (its image-classification preset): batches decoded and
augmented by the C++ engine from a stoker pack or WebDataset shards."""

from __future__ import annotations

import atexit
import glob
import json
import os
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generator, Iterator, Sequence

from . import _core
from .errors import (
    DeviceUnavailableError,
    InvalidArgumentError,
    StokerWarning,
    error_class,
    step_out_of_range,
)
from .fields import (
    Array,
    Bytes,
    CenterCrop,
    Field,
    Image,
    Label,
    RandomResizedCrop,
    _params,
)
from .loader_protocol import EpochSetter, rebuild
from .machine import usable_cores
from .remote import RemotePack, is_remote

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

# 2: the epoch's position is `samples_consumed`, counted over all ranks (a state resumes at any
# world size); 1 counted this rank's `batches_done` (and resumed only at its world size).
_STATE_VERSION = 2

# Shards per window of shuffle="block": declared once, in the engine (pipeline/sampler.h).
DEFAULT_SHUFFLE_WINDOW: int = _core.LoaderOptions().shuffle_window
_SHUFFLE_MODES = {
    False: _core.ShuffleMode.none,
    "global": _core.ShuffleMode.global_,
    "block": _core.ShuffleMode.block,
}

# Loaders still open when the interpreter exits are closed first, so that no worker thread is
# still decoding while Python tears itself down.
_open_loaders: "weakref.WeakSet[Loader]" = weakref.WeakSet()


def without_output_files(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A loader's arguments with the files it writes (quarantine report, record) left out: for
    a loader built from another's arguments for a trial or a replay (batch_at, the doctor)."""
    return {k: None if k in ("quarantine", "record") else v for k, v in kwargs.items()}


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


def open_dataset(
    path: str | os.PathLike | Sequence[str | os.PathLike], **options: Any
) -> "_core.Dataset":
    """A pack folder (image, array or token pack), one .tar, a folder of .tar shards, a glob like
    'shards/*.tar', or a list; a token file (.bin, .npy). ``options``: what token data needs
    (``seq_len``, ``token_dtype``)."""
    if not isinstance(path, (str, os.PathLike)):
        return _core.Dataset.open_tars([str(os.fspath(p)) for p in path])
    where = str(os.fspath(path))
    if any(c in where for c in "*?[") and not os.path.exists(where):
        tars = sorted(glob.glob(where))
        if not tars:
            raise InvalidArgumentError(f"no files match {where!r}")
        return _core.Dataset.open_tars(tars)
    return _core.Dataset.open(where, **options)


def read_schema(path: str | os.PathLike | Sequence[str | os.PathLike]) -> dict[str, dict]:
    """A pack's field schema (manifest "fields", by member name); {} for foreign shards."""
    if not isinstance(path, (str, os.PathLike)):
        return {}
    manifest = os.path.join(str(os.fspath(path)), "manifest.json")
    if not os.path.isfile(manifest):
        return {}
    with open(manifest, encoding="utf-8") as f:
        fields = json.load(f).get("fields") or []
    return {f["name"]: f for f in fields if isinstance(f, dict) and "name" in f}


def resolve_shuffle(shuffle: bool | str | None, train: bool, remote: bool = False) -> bool | str:
    """``False``, ``"global"`` or ``"block"`` from a loader's ``shuffle`` argument.

    The one place where a loader's default order is chosen: ``None`` is ``"global"`` for
    training on a local pack, ``"block"`` on a remote one (its shards are fetched whole, and a
    global order would want every shard at once), and pack order otherwise."""
    if shuffle is None:
        return ("block" if remote else "global") if train else False
    if shuffle is True:
        return "global"
    if shuffle is False or shuffle in ("global", "block"):
        return shuffle
    raise InvalidArgumentError(
        f"shuffle must be True, False, None, 'global' or 'block', not {shuffle!r}"
    )


def default_cpu_budget() -> int:
    """Cores threads="auto" may use: all but one, to leave the training process room, on
    machines with 3 or more (with fewer there is no room to leave)."""
    cores = usable_cores()
    return cores - 1 if cores >= 3 else cores


def resolve_ranks(
    rank: int | None, world_size: int | None, *, strict: bool = True
) -> tuple[int, int]:
    """``(rank, world_size)`` as of now: those given, else torch.distributed's once its process
    group exists, else the launcher's environment (``RANK`` and ``WORLD_SIZE``; on one node,
    ``LOCAL_RANK`` where a launcher sets no ``RANK``, as Lightning's does).

    Called when each pass starts, not when a loader is built: under Lightning's DDP launch the
    script builds its loader before any process group or variable exists. With ``strict``, an
    environment that gives a world size but no way to tell this process's rank is refused
    rather than guessed."""
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
    env_world = int(os.environ.get("WORLD_SIZE", 1))
    if "RANK" in os.environ:
        env_rank = int(os.environ["RANK"])
    elif "LOCAL_RANK" in os.environ and os.environ.get("NODE_RANK", "0") == "0":
        env_rank = int(os.environ["LOCAL_RANK"])
    elif rank is None and (world_size or env_world) > 1 and strict:
        raise InvalidArgumentError(
            f"cannot tell this process's rank: the environment gives WORLD_SIZE={env_world} but "
            "no RANK, and torch.distributed has no process group yet. Start the pass after "
            "init_process_group (trainers do), or give rank= and world_size="
        )
    else:
        env_rank = 0
    return (env_rank if rank is None else rank, env_world if world_size is None else world_size)


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

    Replay: ``sample_ids(epoch, step)`` says which samples a step hands each rank and
    ``batch_at(epoch, step)`` gives that batch again, bit for bit, in one batch's time
    (``stoker.show`` draws it). ``record="steps.jsonl"`` appends a JSON line per batch handed
    out: its epoch, step, rank and the samples' pack indices and keys (stoker.record).

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
    ):
        if not hasattr(self, "_init_kwargs"):
            self._init_kwargs = {
                k: v for k, v in locals().items() if k not in ("self", "__class__")
            }
        if on_error not in ("raise", "skip", "warn", "replace"):
            raise InvalidArgumentError(
                f"on_error must be 'raise', 'skip', 'warn' or 'replace', not {on_error!r}"
            )
        if missing not in ("error", "skip"):
            raise InvalidArgumentError(f"missing must be 'error' or 'skip', not {missing!r}")
        max_count, max_fraction = _error_budget(max_errors)
        if batch_size <= 0:
            raise InvalidArgumentError(f"batch_size must be positive, not {batch_size}")
        if threads is None:
            threads = "auto"
        if threads != "auto" and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads <= 0
        ):
            raise InvalidArgumentError(f"threads must be 'auto' or a positive int, not {threads!r}")
        if cpu_budget is not None and (threads != "auto" or cpu_budget <= 0):
            raise InvalidArgumentError(
                "cpu_budget (a positive number of cores) bounds threads='auto' only"
            )
        if simulated_read_latency < 0:
            raise InvalidArgumentError("simulated_read_latency must be >= 0 seconds")
        if seed < 0:
            raise InvalidArgumentError("seed must be >= 0")
        shuffle = resolve_shuffle(shuffle, train, remote=is_remote(path))
        if (
            isinstance(shuffle_window, bool)
            or not isinstance(shuffle_window, int)
            or (shuffle_window <= 0)
        ):
            raise InvalidArgumentError(
                f"shuffle_window must be a positive number of shards, not {shuffle_window!r}"
            )
        if not fields:
            raise InvalidArgumentError("fields: give at least one, e.g. {'image': stoker.Image()}")
        for name, f in fields.items():
            if not isinstance(f, Field):
                raise InvalidArgumentError(
                    f"fields[{name!r}] must be a stoker field (Image, Mask, Boxes, Label, Array, "
                    f"Bytes, Text, Json), not {type(f).__name__}"
                )
        if device is None and (dtype is not None or mean is not None or std is not None):
            raise InvalidArgumentError(
                "dtype, mean and std are applied by the device feed: give device='cuda' "
                "(or device='cpu' for the host)"
            )
        backend = None
        if device is not None:
            from .device import device_backend

            backend = device_backend(device)  # a clear error now if there is no GPU
        # Given ranks are kept; the others are resolved again whenever a pass starts or len() is
        # asked (resolve_ranks): these are only where the engine starts.
        self._given_ranks = (rank, world_size)
        rank, world_size = resolve_ranks(rank, world_size, strict=False)
        self.batch_size = batch_size
        self.train = train
        self.shuffle: bool | str = shuffle
        self.shuffle_window = shuffle_window
        self.seed = seed
        self.drop_last = drop_last
        self.return_index = return_index
        self.on_error = on_error
        self.quarantine = os.fspath(quarantine) if quarantine is not None else None
        self._recorder: Any = None
        if record is not None:
            from .record import StepRecorder

            self._recorder = StepRecorder(record)
        self._remote: RemotePack | None = None
        self._gate_entries: list[list[int]] | None = None
        if is_remote(path):
            assert not isinstance(path, os.PathLike)  # is_remote: a URL or a list of them
            urls = path if isinstance(path, str) else [os.fspath(p) for p in path]
            self._remote = RemotePack(
                urls,
                cache_dir=cache_dir,
                cache_limit=cache_limit,
                dataset_options=self._dataset_options(),
            )
            self.dataset = self._remote.dataset
            self.schema = read_schema(self._remote.folder)
        else:
            if cache_dir is not None or cache_limit is not None:
                raise InvalidArgumentError("cache_dir and cache_limit are for packs at a URL")
            self.dataset = open_dataset(path, **self._dataset_options())
            self.schema = read_schema(path)
        self.fields = {
            name: f._resolve(self.schema) if isinstance(f, Array) else f
            for name, f in fields.items()
        }
        image_keys = tuple(n for n, f in self.fields.items() if isinstance(f, Image))
        self._map: Any = None
        if map is not None:
            from .map_stage import MapStage

            workers = map_threads if map_threads is not None else (os.cpu_count() or 1)
            self._map = MapStage(map, workers, seed, set(image_keys))
        elif map_threads is not None:
            raise InvalidArgumentError("map_threads= goes with map=")
        self._augment: Any = None
        self._augment_epoch = 0
        if augment is not None:
            self._augment, self._augment_keys = self._augment_plan(augment, resident, backend)
        # decode="gpu"/"auto": the feed's stage decoding on the device, and "auto"'s split.
        self._decode_stage: Any = None
        self._decode_key = ""
        self._decode_split: Any = None
        self._decode_note = ""  # why decode="auto" decodes on the host only
        gpu = [n for n, f in self.fields.items() if isinstance(f, Image) and f.decode != "host"]
        if gpu:
            self._decode_stage = self._gpu_decode_plan(gpu, resident, backend)
            self._decode_key = gpu[0] if self._decode_stage is not None else ""
        self._backend: Any = backend
        # Slots that stay at one address (keep_slots) can stay page-locked.
        self._pin_slots = backend is not None and backend.pins_host_memory
        self._feed = None
        # resident=True: the data files in host memory, read by the engine; on a GPU, tensors
        # there, the engine making only each batch's indices (stoker.resident).
        self.resident = bool(resident)
        self._on_device: Any = None  # the GPU path's holder, made once the engine exists
        on_gpu = backend is not None and (
            backend.device.type == "cuda" or type(self)._resident_torch_on_cpu
        )
        if resident:
            from . import resident as resident_data

            if self._remote is not None:
                raise InvalidArgumentError(
                    "resident=True holds a local pack in memory; a pack at a URL is read "
                    "through its cache (cache_dir)"
                )
            if not on_gpu:
                available, total = resident_data.host_memory()
                resident_data.check_fits(self.dataset.resident_bytes, "host", available, total)
                self.dataset = self.dataset.resident()
        self._normalize: Any = None
        if resident and on_gpu:
            import torch

            from .device import Normalize

            self._pin_slots = False  # float32 unless told, as the device feed converts
            self._normalize = Normalize(mean, std, dtype if dtype is not None else torch.float32)
        elif backend is not None:
            import torch

            from .device import DeviceFeed

            host = _HostSide(self)
            self._feed = DeviceFeed(
                host,
                backend.device,  # mean, std, dtype and device_prefetch are checked here
                mean=mean,
                std=std,
                dtype=dtype if dtype is not None else torch.float32,
                prefetch=device_prefetch,
                image=self._feed_image_keys(image_keys),
                backend=backend,
                source_leases_memory=True,  # a slot is reused only once the feed lets it go
                source_state=host.state_dict,
                augment=host.on_device if self._augment or self._decode_stage else None,
            )
        options = _core.LoaderOptions()
        options.batch_size = batch_size
        specs = [f._spec(name, train) for name, f in self.fields.items()]
        self._augment_in_workers = 0
        # map= runs before augment= on the batch: with it, every op stays on the batch too.
        on_host = backend is None or backend.device.type == "cpu"
        if self._augment is not None and on_host and self._map is None:
            # On the host, the ops that have a worker form run in the workers, on each image as
            # it is decoded: the training thread runs only the rest (and the mix).
            image = self._augment_keys[0]
            if getattr(self.fields[image], "channels", 3) == 3:
                at = list(self.fields).index(image)
                o = specs[at].image
                o.augment = self._augment.engine_steps(o.height, o.width)
                self._augment_in_workers = self._augment.in_workers
        for spec in specs:  # decode="auto" without a device decoder decodes on the host
            if spec.name == self._decode_key:
                spec.image.device_decode = True
                spec.image.device_max_scale_denom = self._decode_stage.decoder.max_scale_denom
            elif spec.kind == _core.FieldKind.image:
                spec.image.device_decode = False
        options.fields = specs
        options.missing = getattr(_core.MissingPolicy, missing)
        options.shuffle = _SHUFFLE_MODES[shuffle]
        options.shuffle_window = shuffle_window
        options.seed = seed
        options.drop_last = drop_last
        if threads == "auto":
            options.threads = default_cpu_budget() if cpu_budget is None else cpu_budget
        else:
            assert isinstance(threads, int)  # checked above
            options.threads = threads
        options.autotune = threads == "auto"
        options.read_latency_us = round(simulated_read_latency * 1e6)
        options.prefetch = prefetch
        options.rank = rank
        options.world_size = world_size
        options.on_error = {
            "raise": _core.ErrorPolicy.raise_,
            "replace": _core.ErrorPolicy.replace,
        }.get(on_error, _core.ErrorPolicy.skip)
        options.max_errors = max_count
        options.max_error_fraction = max_fraction
        options.verify_crc = verify_crc
        options.keep_slots = self._pin_slots
        options.load_samples = not (resident and on_gpu)
        self._engine = _core.Loader(self.dataset, options)
        if self._decode_split is not None:
            self._engine.device_share = self._decode_split.share
        if resident and on_gpu:
            assert backend is not None  # on_gpu says so
            self._on_device = self._hold_on_device(backend.device)
        # How next()'s flat outputs become the batch: per field, its outputs' positions.
        outputs = self._engine.outputs
        self._plan = [
            (name, f, [k for k, (field, _) in enumerate(outputs) if field == name])
            for name, f in self.fields.items()
        ]
        self._blob_fields = list(self._engine.blob_fields)
        self.autotune = threads == "auto"
        self._pinned_slots: set[int] = set()
        self._closed = False
        self._last_address = 0
        self._warned = 0  # skipped samples already warned about
        _open_loaders.add(self)

    def _feed_image_keys(self, image_keys: tuple[str, ...]) -> Any:
        """Which elements of a batch the device feed normalises."""
        return image_keys

    def _dataset_options(self) -> dict[str, Any]:
        """What opening this loader's data takes beyond its path (token data: its window)."""
        return {}

    # Tests run the GPU's resident path with CPU tensors, to compare it with the engine's.
    _resident_torch_on_cpu = False

    def _hold_on_device(self, device: Any) -> Any:
        from .resident import DeviceColumns

        return DeviceColumns(self, device)

    def _device_batch(self, indices: Any) -> dict[str, Any]:
        """The batch of `indices` from the data held on the device."""
        epoch = self._engine.state()[0]
        batch = self._on_device.batch(indices, epoch)
        for name, f in self.fields.items():
            if isinstance(f, Image) and self._normalize is not None:
                batch[name] = self._normalize(batch[name])
        return batch

    def _format(self, batch: dict[str, Any], indices: Any) -> Any:
        """The batch as this loader hands it out (with its indices while `augment` needs them:
        _augmented takes them out again)."""
        if self.return_index or self._augment is not None:
            batch["index"] = indices
        return batch

    def _gpu_decode_plan(self, names: list[str], resident: bool, backend: Any) -> Any:
        """decode="gpu"/"auto" checked against the loader: the stage that decodes on its device
        (None where decode="auto" finds no device decoder: the host decodes everything)."""
        from . import gpu_decode

        if len(names) > 1:
            raise InvalidArgumentError(
                f"decode='gpu' or 'auto' is for one Image field of a loader, not {len(names)}"
            )
        field = self.fields[names[0]]
        assert isinstance(field, Image)
        if resident:
            raise InvalidArgumentError(
                f"decode={field.decode!r} reads encoded files: not with resident=True"
            )
        if self._map is not None:
            raise InvalidArgumentError(
                f"decode={field.decode!r} decodes on the device, after map= would see the "
                "images: not both"
            )
        if field.decode == "auto" and backend is None:
            self._decode_note = "decode='auto' splits work with a GPU: give device='cuda'"
            return None
        if backend is None:
            raise InvalidArgumentError(
                "decode='gpu' decodes on the device the batches go to: give device='cuda'"
            )
        try:
            decoder = gpu_decode.decoder_for(backend.device)
        except DeviceUnavailableError as e:
            if field.decode == "gpu":
                raise
            self._decode_note = f"decode='auto' decodes on the host: {e}"
            return None
        geometry = field.geometry
        fill = int(getattr(geometry, "fill", 0) or 0)
        if field.decode == "auto":
            self._decode_split = gpu_decode.HostDeviceSplit()
        height, width = field.size
        return gpu_decode.DeviceDecodeStage(
            decoder, height=height, width=width, channels=field.channels, fill=fill
        )

    def _on_device_batch(self, batch: Any) -> Any:
        """What the feed runs on each batch once it is on the device, on its side stream:
        decode="gpu"'s decoding into the batch (the device's failures decoded again on the
        host, or dropped or replaced as on_error says), then augment=."""
        if self._decode_stage is not None:
            images = batch[0] if isinstance(batch, tuple) else batch[self._decode_key]
            failed = self._decode_stage(images)
            if failed:
                batch = self._decoded_on_host(batch, failed)
        return self._augmented(batch) if self._augment is not None else batch

    def _decoded_on_host(self, batch: Any, failed: list[tuple[int, int, int]]) -> Any:
        """The batch with the rows the device failed on (row, sample, epoch) decoded by the
        engine on the host: their pixels, or under on_error the host's outcome for them
        (raised; left out; a substitute, every field of its row replaced)."""
        left_out = []
        for row, sample, epoch in failed:
            host: Any = self._engine.decode_on_host(sample, epoch, row)
            if host is None:
                left_out.append(row)
                continue
            outputs, blobs, indices, _, _ = host
            one = self._format(self._assemble(outputs, blobs), indices)
            _replace_row(batch, one, row)
        if left_out:
            keep = [i for i in range(_rows(batch)) if i not in set(left_out)]
            batch = _keep_rows(batch, keep)
        return batch

    def _augment_plan(self, augment: Any, resident: bool, backend: Any) -> tuple[Any, Any]:
        """augment= checked against the fields: (the pipeline, (image field, label field))."""
        from .augment.pipeline import Pipeline

        pipeline = Pipeline(augment)
        if resident and backend is not None and backend.device.type == "cuda":
            raise InvalidArgumentError(
                "augment= with resident=True on a GPU is not supported yet: its batches are "
                "gathered there already normalised"
            )
        images = [n for n, f in self.fields.items() if isinstance(f, Image)]
        name = "image" if "image" in images else (images[0] if len(images) == 1 else None)
        if name is None:
            raise InvalidArgumentError(
                "augment= transforms an Image field: name it 'image' (the loader has "
                f"{len(images)} Image fields)"
            )
        followers = [n for n, f in self.fields.items() if getattr(f, "follow", None) == name]
        if followers:
            raise InvalidArgumentError(
                f"augment= does not move the fields that follow {name!r} ({', '.join(followers)})"
                " yet: their pixels and boxes would no longer match the image's"
            )
        labels = [n for n, f in self.fields.items() if isinstance(f, Label)]
        label = labels[0] if len(labels) == 1 else None
        if pipeline.mix is not None and label is None:
            raise InvalidArgumentError("augment=: MixUp needs one Label field for its targets")
        return pipeline, (name, label)

    def _augmented(self, batch: Any) -> Any:
        """The batch with `augment` applied where it is (the host, or the device feed's stream
        before normalising), its indices kept only if asked for."""
        from .augment.keyed import KeyedDraws

        image, label = self._augment_keys
        indices = batch["index"] if self.return_index else batch.pop("index")
        draws = KeyedDraws(self.seed, self._augment_epoch, indices)
        labels = batch[label] if label is not None else None
        batch[image], mixed = self._augment(batch[image], labels, draws)
        if label is not None:
            batch[label] = mixed
        return batch

    @property
    def device(self) -> "torch.device | None":
        """Where batches go (``None``: host tensors). For a bare ``"cuda"``, the current device
        when the last pass started."""
        return None if self._backend is None else self._backend.device

    @property
    def threads(self) -> int:
        """Worker threads working now (with ``threads="auto"``, what the tuner chose)."""
        return self._engine.threads

    def tuning(self) -> list[dict[str, Any]]:
        """With ``threads="auto"``: each tuning interval, with its setting (``threads``,
        ``prefetch``), what was measured (``samples_per_second``, the consumer's
        ``wait_fraction``, the workers' ``busy_fraction``) and the setting chosen next."""
        return self._engine.tuning()

    # --- ranks ------------------------------------------------------------------------------
    def _sync_ranks(self, strict: bool = False) -> tuple[int, int]:
        """Resolve the ranks now and give them to the engine, for the passes begun from now on
        (a pass in progress keeps its own)."""
        rank, world_size = resolve_ranks(*self._given_ranks, strict=strict)
        self._engine.set_ranks(rank, world_size)
        return rank, world_size

    @property
    def rank(self) -> int:
        """This process's rank as of now: the ``rank`` given, else torch.distributed's (once its
        process group exists), else ``RANK``. The next pass runs at it."""
        return self._sync_ranks()[0]

    @property
    def world_size(self) -> int:
        """The number of ranks as of now (as ``rank``)."""
        return self._sync_ranks()[1]

    # --- the DataLoader-like surface -------------------------------------------------------
    def __len__(self) -> int:
        """Batches of a whole epoch on this rank, for the ranks as they are when it is called
        (``rank``, ``world_size``): a loader built before ``init_process_group`` answers for
        the job's ranks once the group exists. Every rank gets the same number."""
        self._sync_ranks()
        return self._engine.num_batches

    @property
    def sampler(self) -> "EpochSetter":
        """What trainers that call ``loader.sampler.set_epoch(epoch)`` (Lightning) reach: it
        sets this loader's epoch, as ``set_epoch`` does."""
        return EpochSetter(self)

    def __iter__(self) -> Iterator[Any]:
        if self._feed is not None:
            return iter(self._feed)  # which calls _host_pass
        return self._host_pass()

    def _host_pass(self) -> Generator[Any, None, None]:
        if self._closed:
            raise InvalidArgumentError("the loader is closed")
        self._sync_ranks(strict=True)
        if self._remote is not None:
            # Weakly: the fetcher's threads must not keep an abandoned loader (and so themselves)
            # alive; once it is collected, its close() stops them.
            plan = weakref.WeakMethod(self._upcoming_shards)
            self._remote.start(lambda: method() if (method := plan()) is not None else ())
        self._engine.begin()
        self._augment_epoch, consumed, _ = self._engine.state()
        if self._recorder is not None:
            o = self._engine.options
            step = consumed // (self.batch_size * o.world_size)
            self._recorder.begin(self._augment_epoch, step, o.rank, o.world_size)
        if self._decode_stage is not None:
            self._decode_stage.clear()  # what an abandoned pass queued
        return self._batches()

    def _upcoming_shards(self) -> Sequence[int]:
        """The shards this pass reads next, soonest first (what a remote pack fetches ahead)."""
        assert self._remote is not None
        # Past the shards read next, as far as a shuffle window: the fetcher looks beyond those
        # already cached for the next ones to fetch (RemotePack._wanted).
        ahead = self._remote.prefetch_shards + self.threads + self.shuffle_window
        shards = self._engine.upcoming_shards(ahead)
        if self._gate_entries is None:  # the fetcher fetches files: each shard's, in order
            d = self.dataset
            self._gate_entries = [
                [int(f["gate_entry"]) for f in d.shard_files(s)] for s in range(d.num_shards)
            ]
        return [entry for shard in shards for entry in self._gate_entries[shard]]

    def _batches(self) -> Generator[Any, None, None]:
        while True:
            try:
                item: Any = self._engine.next()
            finally:
                if self.on_error == "warn":
                    self._warn_skipped()
            if item is None:
                self._write_quarantine()
                return
            outputs, blobs, indices, address, _ = item
            self._last_address = address
            if self._recorder is not None:
                self._recorder.write_samples(indices, self.dataset)
            if self._on_device is not None:
                on_device = self._device_batch(indices)
                yield self._format(on_device, indices.to(self._on_device.device))
                continue
            if self._pin_slots and address not in self._pinned_slots:
                # A slot seen for the first time: page-lock it, once (keep_slots keeps it).
                if self._backend.pin(address, self._engine.slot_bytes):
                    self._pinned_slots.add(address)
                else:  # refused (and warned about): the feed stages this slot and all others
                    self._pin_slots = False
            batch = self._assemble(outputs, blobs)
            if self._decode_stage is not None:
                self._queue_for_device(outputs, blobs, indices)
            if self._map is not None:
                batch = self._map(batch, indices, self._augment_epoch)
            formatted = self._format(batch, indices)
            if self._augment is not None and self._feed is None:  # else on the feed's stream
                formatted = self._augmented(formatted)
            yield formatted

    def _assemble(self, outputs: list[Any], blobs: list[Any]) -> dict[str, Any]:
        """The engine's flat outputs of a batch as a dict of fields."""
        batch: dict[str, Any] = {}
        for name, f, positions in self._plan:
            if isinstance(f, Bytes):
                batch[name] = f._convert(blobs[self._blob_fields.index(name)])
                continue
            batch[name] = f._assemble([outputs[k] for k in positions])
            if isinstance(f, Image) and f.return_params:
                batch[name + "_params"] = _params(outputs[positions[1]])
        return batch

    def _queue_for_device(self, outputs: list[Any], blobs: list[Any], indices: Any) -> None:
        """decode="gpu"/"auto": the batch's handed-over files for the device stage, and
        decode="auto"'s split brought up to date."""
        stage = self._decode_stage
        positions = next(p for name, _, p in self._plan if name == self._decode_key)
        encoded = blobs[self._blob_fields.index(self._decode_key)]
        stage.queue(encoded, outputs[positions[2]], outputs[positions[3]], indices,
                    self._augment_epoch)  # fmt: skip
        if self._decode_split is not None:
            from .gpu_decode.split import _Totals

            seconds = self._engine.stats()["seconds"]
            totals = _Totals(
                host_seconds=seconds["read"] + seconds["decode"] + seconds["transform"],
                host_images=stage.host_decoded,
                device_seconds=stage.device_seconds,
                device_images=stage.timed_images,
            )
            self._engine.device_share = self._decode_split.update(totals, self._engine.threads)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next pass (its shuffle and augmentation draws)."""
        self._engine.set_epoch(epoch)

    @property
    def num_samples(self) -> int:
        """Samples this rank sees per epoch (padded to equal counts across ranks), for the
        ranks as they are now."""
        self._sync_ranks()
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
        self._sync_ranks()
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
        if not 0 <= step < steps:
            raise step_out_of_range(epoch, step, steps, self._engine.options.world_size)

    def _replay(self, epoch: int, step: int, **changes: Any) -> Any:
        """batch_at's batch, from a twin of this loader built with `changes` (for `show`:
        return_index=True)."""
        self._sync_ranks()
        options = self._engine.options
        self._check_step(epoch, step)
        kwargs = without_output_files(self._init_kwargs)  # not the pass's files
        kwargs.update(rank=options.rank, world_size=options.world_size, **changes)
        twin = type(self)(**kwargs)
        try:
            consumed = min(step * self.batch_size * options.world_size, len(self.dataset))
            twin._engine.load_state(int(epoch), consumed)  # what the ranks took before it
            return next(iter(twin))
        finally:
            twin.close()  # the batch handed out stays valid

    def state_dict(self) -> dict[str, Any]:
        """Where the training loop stands: resuming from it gives exactly the batches not yet
        handed out (with a device, not those in flight on the GPU)."""
        if self._feed is not None:
            return self._feed.state_dict()
        return self._host_state_dict()

    def _host_state_dict(self) -> dict[str, Any]:
        epoch, samples_consumed, batches_done = self._engine.state()
        options = self._engine.options
        return {
            "version": _STATE_VERSION,
            "epoch": epoch,
            # Positions of the epoch's order the ranks have consumed together: what a resume
            # reads, at any world size.
            "samples_consumed": samples_consumed,
            "batches_done": batches_done,  # this rank's, at this world size: informative
            "seed": self.seed,
            "num_samples": len(self.dataset),
            "batch_size": self.batch_size,
            "rank": options.rank,  # the ranks batches_done was counted at
            "world_size": options.world_size,
            "shuffle": self.shuffle,
            "shuffle_window": self.shuffle_window,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._feed is not None:
            self._feed.load_state_dict(state)  # ends the pass in flight, then _load_host_state
        else:
            self._load_host_state(state)

    def _load_host_state(self, state: dict[str, Any]) -> None:
        state = _upgrade_state(state)
        # What the epoch's order depends on must match; the world size need not (the order does
        # not depend on it, and samples_consumed counts every rank's samples).
        checks = [
            ("seed", self.seed),
            ("num_samples", len(self.dataset)),
            ("batch_size", self.batch_size),
            ("shuffle", self.shuffle),
        ]
        if self.shuffle == "block":
            checks.append(("shuffle_window", self.shuffle_window))
        for name, mine in checks:
            if state[name] != mine:
                raise InvalidArgumentError(
                    f"cannot resume: the state has {name}={state[name]!r}, this loader {mine!r}"
                )
        self._engine.load_state(state["epoch"], state["samples_consumed"])

    def stats(self) -> dict[str, Any]:
        """Samples delivered and skipped, and seconds per stage.

        ``skipped`` counts the loader's whole life, ``pass_skipped`` the pass in progress (what
        ``max_errors`` limits). ``skipped_samples`` lists the first 10,000 with ``index`` (in pack
        order), ``shard``, ``key``, ``error`` (the exception class's name) and ``reason``. Stage
        times are summed over worker threads (read, decode, transform, collate); ``wait`` is the
        time the training loop spent waiting for a batch. With a device, ``device`` counts the
        batches handed over, bytes copied from page-locked slots and through staging (all of
        them where page-locking was refused), the page-locked slots, and the host's seconds
        waiting on copies or on the training stream (``host_wait_s``).
        """
        stats = self._engine.stats()
        if self._remote is not None:
            stats["remote"] = self._remote.stats()
        for sample in stats["skipped_samples"]:
            sample["error"] = error_class(sample.pop("code")).__name__
        if self._feed is not None:
            stats["device"] = dict(self._feed.stats(), pinned_slots=len(self._pinned_slots))
        if self._map is not None:
            stats["seconds"]["map"] = self._map.seconds
        stage = self._decode_stage
        if stage is not None:  # decode="gpu"/"auto": where the images were decoded
            stats["decode"] = {
                "device": stage.device_decoded,
                "host": stage.host_decoded + stage.device_failed,
                "device_failed": stage.device_failed,  # decoded again on the host
                "device_seconds": stage.device_seconds,  # the device's own, on timed_images
                "timed_images": stage.timed_images,
            }
            if self._decode_split is not None:
                split = self._decode_split
                stats["decode"].update(
                    share=self._engine.device_share,
                    host_rate=split.host_rate,
                    device_rate=split.device_rate,
                )
        elif self._decode_note:
            stats["decode"] = {"device": 0, "note": self._decode_note}
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
            if self._feed is not None:
                self._feed.close()  # waits for the copies still reading the slots
            self._engine.close()
            if self._map is not None:
                self._map.close()
            if self._remote is not None:
                self._remote.close()
            for address in self._pinned_slots:
                try:
                    self._backend.unpin(address)
                except Exception:  # CUDA may already be shutting down at exit
                    pass
            self._pinned_slots.clear()
            if self._recorder is not None:
                self._recorder.close()
            _open_loaders.discard(self)
            self._write_quarantine()

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


def _upgrade_state(state: dict[str, Any]) -> dict[str, Any]:
    """A state of any version this loader reads, as the current version."""
    version = state.get("version")
    if version == _STATE_VERSION:
        return state
    if version == 1:
        # Version 1's order was today's "global" (or pack order) dealt the same way, and its
        # ranks moved in step: batches_done batches on each of world_size ranks.
        consumed = state["batches_done"] * state["batch_size"] * state["world_size"]
        return dict(
            state,
            version=_STATE_VERSION,
            samples_consumed=min(consumed, state["num_samples"]),
            shuffle="global" if state["shuffle"] else False,
            shuffle_window=DEFAULT_SHUFFLE_WINDOW,
        )
    raise InvalidArgumentError(f"unknown loader state version {version!r}")


class ImageLoader(Loader):
    """Iterates ``(images, labels)`` batches, like a torch DataLoader over an image dataset: the
    image-classification preset of :class:`Loader` (an ``Image`` and an optional ``Label``).

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

    Bad samples: ``on_error="raise"`` (default) raises the sample's error (a
    ``CorruptDataError``, ``UnsupportedFormatError``, ``ShardIOError`` or ``ResourceLimitError``
    naming shard and key); ``"skip"`` leaves it out of its batch (one sample shorter) and
    lists it in ``stats()``; ``"warn"`` skips and also issues a ``StokerWarning``;
    ``"replace"`` puts a substitute in its place, drawn from the failed sample's shard keyed by
    (seed, epoch, the failed sample): every batch keeps its size on every rank (torch.compile,
    CUDA graphs, FSDP), the same whatever the threads and after a resume; ``stats()`` lists the
    failure
    with its ``substitute``. ``max_errors`` (a count, or a float fraction of the epoch's
    samples) bounds the failures of one pass, replaced or skipped: past it,
    ``ErrorBudgetExceededError``. ``quarantine="bad.json"`` writes the skipped samples to a report
    at the end of every pass and on ``close()``. ``max_pixels``, ``max_scans`` (progressive JPEG)
    and ``max_decode_memory`` (bytes one image may take in the decoder) bound what a hostile file
    can cost; past them, ``ResourceLimitError``. ``fast_idct=True`` decodes JPEGs with libjpeg's
    fast integer IDCT (JDCT_IFAST) instead of its accurate one: outputs about 44 dB PSNR from the
    default's on imagenet-sample (docs/BENCHMARKS.md, "Where the time goes", says what it gains).

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
    ):
        # What stoker.diagnose needs to build a sibling loader that differs in one option.
        self._init_kwargs = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= 8192:
            raise InvalidArgumentError(f"size must be an int in 1-8192, not {size!r}")
        self.size = size
        image = Image(
            size=size,
            geometry=RandomResizedCrop(scale, ratio) if train else CenterCrop(resize_size),
            hflip=flip_probability if train else 0.0,
            dct_scaling=dct_scaling,
            max_pixels=max_pixels,
            max_scans=max_scans,
            max_decode_memory=max_decode_memory,
            fast_upsampling=fast_upsampling,
            fast_idct=fast_idct,
            exact_progressive=exact_progressive,
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
        )

    def _feed_image_keys(self, image_keys: tuple[str, ...]) -> Any:
        return 0  # batches are (images, labels[, indices]) tuples

    def _format(self, batch: dict[str, Any], indices: Any) -> Any:
        images, labels = batch["image"], batch["label"]
        if self.return_index or self._augment is not None:
            return (images, labels, indices)
        return (images, labels)

    def _augmented(self, batch: Any) -> Any:
        from .augment.keyed import KeyedDraws

        images, labels, indices = batch
        draws = KeyedDraws(self.seed, self._augment_epoch, indices)
        images, labels = self._augment(images, labels, draws)
        return (images, labels, indices) if self.return_index else (images, labels)

    def __repr__(self) -> str:
        return (
            f"ImageLoader({self.dataset.path!r}, samples={len(self.dataset)}, "
            f"batch_size={self.batch_size}, size={self.size}, train={self.train}, "
            f"threads={self.threads}, rank={self.rank}/{self.world_size}"
            + ("" if self.device is None else f", device={str(self.device)!r}")
            + ")"
        )


class _HostSide:
    """What the device feed iterates: the loader's own batches, in its (page-locked) slots. Holds
    the loader weakly, so that the loader, not a reference cycle, decides when it closes."""

    def __init__(self, loader: Loader):
        self._loader = weakref.ref(loader)

    def _get(self) -> Loader:
        loader = self._loader()
        if loader is None:
            raise InvalidArgumentError("the loader is gone")
        return loader

    def __iter__(self) -> "_HostPass":
        return _HostPass(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def set_epoch(self, epoch: int) -> None:
        self._get().set_epoch(epoch)

    def augmented(self, batch: Any) -> Any:
        """The loader's augmentation of a batch on the device."""
        return self._get()._augmented(batch)

    def on_device(self, batch: Any) -> Any:
        """The loader's work on a batch once on the device (the feed calls it): decode="gpu",
        then augment=."""
        return self._get()._on_device_batch(batch)

    def state_dict(self) -> dict[str, Any]:
        return self._get()._host_state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._get()._load_host_state(state)


class _HostPass:
    """One pass of host batches for the device feed. Holds the loader for as long as the feed's
    pass holds it: past the last batch taken, while batches are still in flight."""

    def __init__(self, loader: Loader):
        self.loader = loader
        self._batches = loader._host_pass()

    def __iter__(self) -> "_HostPass":
        return self

    def __next__(self) -> tuple[Any, ...]:
        return next(self._batches)

    def close(self) -> None:
        self._batches.close()


# --- rows of a batch (decode="gpu"'s failures) ----------------------------------------------
def _rows(batch: Any) -> int:
    """How many samples a batch (a tuple or dict of tensors, lists, nested dicts) holds."""
    import torch

    items = batch.values() if isinstance(batch, dict) else batch
    for item in items:
        if isinstance(item, torch.Tensor):
            return int(item.shape[0])
        if isinstance(item, dict):
            return _rows(item)
        if isinstance(item, list):
            return len(item)
    raise AssertionError("a batch without samples")


def _replace_row(batch: Any, one: Any, row: int) -> None:
    """Row `row` of every tensor and list of `batch` set from the one-sample batch `one` (the
    same structure, on the host)."""
    import torch

    pairs = zip(batch.values(), one.values(), strict=True) if isinstance(batch, dict) else zip(
        batch, one, strict=True)  # fmt: skip
    for mine, theirs in pairs:
        if isinstance(mine, torch.Tensor):
            mine[row].copy_(theirs[0], non_blocking=True)
        elif isinstance(mine, dict):
            _replace_row(mine, theirs, row)
        elif isinstance(mine, list):
            mine[row] = theirs[0]


def _keep_rows(batch: Any, keep: list[int]) -> Any:
    """`batch` with only rows `keep`, its tensors' memory format kept."""
    import torch

    index: dict[torch.device, torch.Tensor] = {}

    def kept(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            if item.device not in index:
                index[item.device] = torch.tensor(keep, dtype=torch.int64, device=item.device)
            out = item.index_select(0, index[item.device])
            if item.dim() == 4 and item.is_contiguous(memory_format=torch.channels_last):
                out = out.contiguous(memory_format=torch.channels_last)
            return out
        if isinstance(item, dict):
            return {k: kept(v) for k, v in item.items()}
        if isinstance(item, list):
            return [item[i] for i in keep]
        return item

    if isinstance(batch, dict):
        return kept(batch)
    return type(batch)(kept(item) for item in batch)
