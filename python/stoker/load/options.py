"""A loader's options, each checked once: `check_options` turns a Loader's arguments into
`LoaderOptions` (resolved defaults, a clear error for each bad value) before anything is opened.
Also the rules that resolve an option when a pass starts (ranks, the default order, the CPU
budget) and the opening of what a path names (a pack, shards, a token file)."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import _core, faults
from ..errors import InvalidArgumentError
from ..machine import usable_cores
from ..packing.attach import attached_fields
from .grouping import check_grouping_options

if TYPE_CHECKING:
    import torch

    from .chain import Preset
    from .fields import Field

# Shards per window of shuffle="block": declared once, in the engine (pipeline/sampler.h).
DEFAULT_SHUFFLE_WINDOW: int = _core.LoaderOptions().shuffle_window
SHUFFLE_MODES = {
    False: _core.ShuffleMode.none,
    "global": _core.ShuffleMode.global_,
    "block": _core.ShuffleMode.block,
}
ON_ERROR = ("raise", "skip", "warn", "replace")


@dataclasses.dataclass(frozen=True)
class LoaderOptions:
    """A Loader's arguments, checked and resolved (`check_options`)."""

    batch_size: int
    train: bool
    shuffle: bool | str  # False, "global" or "block"
    shuffle_window: int
    seed: int
    drop_last: bool
    threads: int | str  # a count, or "auto"
    cpu_budget: int | None
    prefetch: int
    rank: int | None  # as given: resolved when each pass starts (resolve_ranks)
    world_size: int | None
    return_index: bool
    on_error: str
    max_errors: tuple[int, float]  # (count, fraction); -1: no limit
    quarantine: str | None
    missing: str
    verify_crc: bool
    read_latency_us: int
    device: "str | torch.device | None"
    dtype: "torch.dtype | None"
    mean: Sequence[float] | None
    std: Sequence[float] | None
    device_prefetch: int
    cache_dir: str | os.PathLike | None
    cache_limit: int | None
    resident: bool
    augment: Any
    map: Callable[..., Any] | None
    map_threads: int | None
    record: str | os.PathLike | None
    remote_workers: Any  # a pool spec (stoker.RayWorkers), or None
    buckets: Any  # stoker.AspectBuckets, or None
    group_by: Callable[[Any], Any] | None
    same_shape_across_ranks: bool
    leftovers: str | None  # "carry", "drop" or "partial" with grouping (resolved); else None

    @property
    def grouped(self) -> bool:
        return self.leftovers is not None


def check_options(fields: "Mapping[str, Field]", remote: bool, **given: Any) -> LoaderOptions:
    """`given`: a Loader's keyword arguments but its path and fields; `remote`: whether the
    path is a URL (its default order is "block")."""
    from .fields import Field

    on_error, missing = given["on_error"], given["missing"]
    if on_error not in ON_ERROR:
        raise InvalidArgumentError(
            f"on_error must be 'raise', 'skip', 'warn' or 'replace', not {on_error!r}"
        )
    if missing not in ("error", "skip"):
        raise InvalidArgumentError(f"missing must be 'error' or 'skip', not {missing!r}")
    if given["batch_size"] <= 0:
        raise InvalidArgumentError(f"batch_size must be positive, not {given['batch_size']}")
    threads = "auto" if given["threads"] is None else given["threads"]
    workers = given.get("remote_workers")
    least = 0 if workers is not None else 1  # 0: the remote workers make every batch
    if threads != "auto" and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < least
    ):
        raise InvalidArgumentError(
            f"threads must be 'auto' or a positive int (0 with remote_workers), not {threads!r}"
        )
    if workers is not None:
        _check_remote_workers(workers, given)
    budget = given["cpu_budget"]
    if budget is not None and (threads != "auto" or budget <= 0):
        raise InvalidArgumentError(
            "cpu_budget (a positive number of cores) bounds threads='auto' only"
        )
    if given["simulated_read_latency"] < 0:
        raise InvalidArgumentError("simulated_read_latency must be >= 0 seconds")
    if given["seed"] < 0:
        raise InvalidArgumentError("seed must be >= 0")
    window = given["shuffle_window"]
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise InvalidArgumentError(
            f"shuffle_window must be a positive number of shards, not {window!r}"
        )
    if not fields:
        raise InvalidArgumentError("fields: give at least one, e.g. {'image': stoker.Image()}")
    for name, f in fields.items():
        if not isinstance(f, Field):
            raise InvalidArgumentError(
                f"fields[{name!r}] must be a stoker field (Image, Mask, Boxes, Label, Array, "
                f"Bytes, Text, Json), not {type(f).__name__}"
            )
    if given["device"] is None and any(given[k] is not None for k in ("dtype", "mean", "std")):
        raise InvalidArgumentError(
            "dtype, mean and std are applied by the device feed: give device='cuda' "
            "(or device='cpu' for the host)"
        )
    if given["device"] is not None:
        _check_device_options(given)
    if (given["cache_dir"] is not None or given["cache_limit"] is not None) and not remote:
        raise InvalidArgumentError("cache_dir and cache_limit are for packs at a URL")
    if given["resident"] and remote:
        raise InvalidArgumentError(
            "resident=True holds a local pack in memory; a pack at a URL is read "
            "through its cache (cache_dir)"
        )
    _check_map(given["map"], given["map_threads"])
    leftovers = check_grouping_options(
        given.get("buckets"), given.get("group_by"), given.get("same_shape_across_ranks", False),
        given.get("leftovers"), given["drop_last"], given["train"])  # fmt: skip
    quarantine = given["quarantine"]
    return LoaderOptions(
        batch_size=given["batch_size"],
        train=given["train"],
        shuffle=resolve_shuffle(given["shuffle"], given["train"], remote=remote),
        shuffle_window=window,
        seed=given["seed"],
        drop_last=given["drop_last"],
        threads=threads,
        cpu_budget=budget,
        prefetch=given["prefetch"],
        rank=given["rank"],
        world_size=given["world_size"],
        return_index=given["return_index"],
        on_error=on_error,
        max_errors=_error_budget(given["max_errors"]),
        quarantine=os.fspath(quarantine) if quarantine is not None else None,
        missing=missing,
        verify_crc=given["verify_crc"],
        read_latency_us=round(given["simulated_read_latency"] * 1e6),
        device=given["device"],
        dtype=given["dtype"],
        mean=given["mean"],
        std=given["std"],
        device_prefetch=given["device_prefetch"],
        cache_dir=given["cache_dir"],
        cache_limit=given["cache_limit"],
        resident=bool(given["resident"]),
        augment=given["augment"],
        map=given["map"],
        map_threads=given["map_threads"],
        record=given["record"],
        remote_workers=workers,
        buckets=given.get("buckets"),
        group_by=given.get("group_by"),
        same_shape_across_ranks=bool(given.get("same_shape_across_ranks", False)),
        leftovers=leftovers,
    )


def _check_remote_workers(workers: Any, given: dict[str, Any]) -> None:
    if not callable(getattr(workers, "open", None)):
        raise InvalidArgumentError(
            f"remote_workers takes stoker.RayWorkers(count, threads), not {workers!r}"
        )
    if given["resident"]:
        raise InvalidArgumentError(
            "resident=True holds the data where the batches are made; with remote_workers "
            "they are made elsewhere: give one or the other"
        )


def _check_device_options(given: dict[str, Any]) -> None:
    """What the device feed converts with (mean, std, dtype: its Normalize's own checks) and how
    far ahead it copies, checked before any thread or CUDA object exists."""
    import torch

    from ..device import Normalize

    try:
        torch.device(given["device"])
    except (RuntimeError, TypeError) as e:
        raise InvalidArgumentError(
            f"device must be 'cuda', 'cuda:N' or 'cpu', not {given['device']!r}"
        ) from e
    prefetch = given["device_prefetch"]
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise InvalidArgumentError(f"device_prefetch must be an int >= 1, not {prefetch!r}")
    Normalize(given["mean"], given["std"], given["dtype"])


def _check_map(fn: Any, threads: Any) -> None:
    if fn is None:
        if threads is not None:
            raise InvalidArgumentError("map_threads= goes with map=")
        return
    if not callable(fn):
        raise InvalidArgumentError(f"map= takes a function of a sample, not {fn!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):  # fmt: skip
        raise InvalidArgumentError(f"map_threads must be an int >= 1, not {threads!r}")


def without_output_files(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A loader's arguments with the files it writes (quarantine report, record) and the
    workers it starts left out: for a loader built from another's arguments for a trial or a
    replay (batch_at, the doctor), which makes its few batches itself."""
    dropped = ("quarantine", "record", "remote_workers")
    out = {k: None if k in dropped else v for k, v in kwargs.items()}
    if out.get("threads") == 0:  # the workers made every batch: here the engine makes them
        out["threads"] = "auto"
    return out


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
    faults.point("file_open", manifest, OSError)
    with open(manifest, encoding="utf-8") as f:
        fields = json.load(f).get("fields") or []
    found = {f["name"]: f for f in fields if isinstance(f, dict) and "name" in f}
    for extra in attached_fields(os.fspath(path)):  # columns added by stoker.attach
        found.setdefault(extra.get("name"), extra)
    return found


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


def open_data(
    path: Any,
    options: Any,
    preset: "Preset",
    stack: contextlib.ExitStack,
    fields: "Mapping[str, Field]",
) -> tuple[Any, Any, dict[str, dict], "Mapping[str, Field]"]:
    """(the remote pack or Parquet files, or None; the engine's dataset; the pack's field
    schema; the fields, Parquet's naming the columns they read) of `path`; a remote pack's or
    Parquet's fetcher is entered into `stack`."""
    from ..parquet import is_parquet
    from ..remote import RemotePack, is_remote
    from ..remote.pack import ParquetFolderError
    from .fields import IMAGE_MEMBERS

    parquet = is_parquet(path)
    if not parquet and is_remote(path):
        assert not isinstance(path, os.PathLike)  # is_remote: a URL or a list of them
        urls = path if isinstance(path, str) else [os.fspath(p) for p in path]
        try:
            remote = RemotePack(urls, cache_dir=options.cache_dir, cache_limit=options.cache_limit,
                                dataset_options=preset.dataset_options)  # fmt: skip
        except ParquetFolderError:
            parquet = True  # a folder URL of Parquet files: read as they are
        else:
            stack.callback(remote.close)
            return remote, remote.dataset, read_schema(remote.folder), fields
    if parquet:
        from ..parquet.pack import ParquetPack  # pyarrow's: needed only now

        if options.resident:
            raise InvalidArgumentError(
                "resident=True holds a pack's files in memory: Parquet's "
                "row groups are decoded while read (pack it first)"
            )
        # A fetcher thread per core (2 to 8): a pass's first row groups are decoded at once
        # while the workers wait for them; later the threads mostly wait.
        cores = usable_cores()
        pack = ParquetPack(path, cache_dir=options.cache_dir, cache_limit=options.cache_limit,
                           fetch_threads=min(8, max(2, cores)))  # fmt: skip
        stack.callback(pack.close)
        bound, schema = pack.bind(fields, IMAGE_MEMBERS)
        # What a pass's workers read at once: the batches in flight can span two shuffle
        # windows (a window's last batches and the next's first), and those fetched ahead.
        pack.max_held = pack.prefetch_shards + cores + 2 * options.shuffle_window
        from .grouping import size_readers  # buckets= and group_by's sizes: the headers'

        size_readers[id(pack.dataset)] = pack.image_sizes
        stack.callback(size_readers.pop, id(pack.dataset), None)
        return pack, pack.dataset, schema, bound
    return None, open_dataset(path, **preset.dataset_options), read_schema(path), fields
