"""Batches of one group each: ``buckets=`` (an image's aspect bucket) and ``group_by=`` (any key
of a sample's index entry, with a batch size per key, as Megatron-Energon's
batch_group_criterion) become the engine's grouping (pipeline/batch_plan.h): a group per sample,
a batch size per group, and with buckets each group's image size. Worked out once, when the
loader is built, from the pack's index; the image sizes are read once for packs whose index
records none (kept beside the index, and in this process)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import _core
from ..errors import InvalidArgumentError
from .buckets import AspectBuckets, VideoBuckets

LEFTOVERS = {"carry": _core.Leftovers.carry, "drop": _core.Leftovers.drop,
             "partial": _core.Leftovers.partial}  # fmt: skip


@dataclasses.dataclass
class GroupPlan:
    """What the engine is given, and what the loader reports of it."""

    grouping: Any  # _core.GroupingOptions
    keys: list[Any]  # each group's key: a bucket's (height, width), or group_by's key
    batch_sizes: list[int]
    counts: list[int]  # samples per group
    image_sizes: list[tuple[int, int]]  # per group, with buckets; [] otherwise
    image_field: str  # the Image or Video field whose size a group sets ("" without buckets)
    fingerprint: str  # what a state must have been taken with to resume mid-epoch
    unknown_sizes: int = 0  # images whose size is unknown (placed in the squarest bucket)
    frames: list[int] = dataclasses.field(default_factory=list)  # per group, video buckets'
    excluded: int = 0  # samples in no group (video buckets: filling none, or not kept)

    def describe(self) -> list[dict[str, Any]]:
        rows = zip(self.keys, self.batch_sizes, self.counts, strict=True)
        return [{"key": k, "batch_size": b, "samples": n} for k, b, n in rows]


def bucket_field(fields: dict[str, Any], buckets: Any = None) -> str:
    """The Image field buckets size: "image", else the only Image that follows no field; the
    Video field VideoBuckets size: "video", else the only Video."""
    from .fields import Image, Video

    if isinstance(buckets, VideoBuckets):
        videos = [n for n, f in fields.items() if isinstance(f, Video)]
        if "video" in videos:
            return "video"
        if len(videos) != 1:
            raise InvalidArgumentError(
                "VideoBuckets size one Video field: name it 'video', or give only one (this "
                f"loader has {videos or 'none'})"
            )
        return videos[0]
    bases = [n for n, f in fields.items() if isinstance(f, Image) and f.follow is None]
    if "image" in bases:
        return "image"
    if len(bases) != 1:
        raise InvalidArgumentError(
            "buckets= sizes one Image field: name it 'image', or give only one Image that "
            f"follows no other field (this loader has {bases or 'none'})"
        )
    return bases[0]


def plan(dataset: Any, fields: dict[str, Any], batch_size: int, buckets: Any,
         group_by: Callable[[Any], Any] | None, leftovers: str,
         same_shape: bool, remote: Any = None) -> GroupPlan:  # fmt: skip
    import numpy as np

    image_field, image_sizes, frames = "", [], []
    unknown = 0
    keys: list[Any]
    described: Any
    if isinstance(buckets, VideoBuckets):
        image_field = bucket_field(fields, buckets)
        group_of = buckets.assign(_video_facts(dataset, fields[image_field], remote))
        keys = list(buckets.buckets)
        batch_sizes = buckets.batch_sizes(batch_size)
        image_sizes = list(buckets.sizes)
        frames = [t for _, _, t in buckets.buckets]
        described = buckets._fingerprint()
    elif buckets is not None:
        image_field = bucket_field(fields)
        hw = sample_sizes(dataset, fields[image_field].member.split(";"))
        group_of = buckets.assign(hw)
        unknown = int(((hw[:, 0] <= 0) | (hw[:, 1] <= 0)).sum())
        keys = list(buckets.sizes)
        batch_sizes = buckets.batch_sizes(batch_size)
        image_sizes = list(buckets.sizes)
        described = buckets._fingerprint()
    else:
        assert group_by is not None
        group_of, keys, batch_sizes = _groups_by(dataset, group_by, batch_size)
        described = [repr(k) for k in keys]
    counts = np.bincount(group_of[group_of >= 0], minlength=len(keys)).tolist()
    digest = hashlib.sha1(np.ascontiguousarray(group_of, dtype=np.int32).tobytes())
    digest.update(json.dumps([described, batch_sizes, leftovers, same_shape]).encode())
    grouping = _core.GroupingOptions(np.ascontiguousarray(group_of, dtype=np.int32),
                                     [int(b) for b in batch_sizes], bool(same_shape),
                                     LEFTOVERS[leftovers])  # fmt: skip
    return GroupPlan(grouping, keys, [int(b) for b in batch_sizes], counts, image_sizes,
                     image_field, digest.hexdigest()[:16], unknown, frames,
                     int((group_of < 0).sum()))  # fmt: skip


def _video_facts(dataset: Any, field: Any, remote: Any) -> Any:
    """The pack's video facts (stoker.video_facts: read once, kept beside the manifest; a pack
    at a URL: its videos.npz, fetched through the cache), for the Video field's member."""
    from pathlib import Path

    from ..packing.videos import VIDEOS_FILE, load_facts, video_facts

    folder = Path(remote.folder if remote is not None else os.fspath(dataset.path))
    manifest = folder / "manifest.json"
    videos = []
    if manifest.is_file():
        videos = [f.get("name") for f in json.loads(manifest.read_text()).get("fields") or []
                  if isinstance(f, dict) and f.get("kind") == "video"]  # fmt: skip
    member = field.member.split(";")[0]
    if len(videos) > 1 and member != videos[0]:
        raise InvalidArgumentError(
            f"VideoBuckets place videos by the facts of each sample's first video member "
            f"({videos[0]!r} in this pack), not {member!r}: bucket by {videos[0]!r}"
        )
    facts: Any
    if remote is None:
        facts = video_facts(folder)
    else:
        where = remote.fetch_beside(VIDEOS_FILE)
        facts = None if where is None else load_facts(folder, len(dataset))
        if facts is None:
            raise InvalidArgumentError(
                f"VideoBuckets place videos by the pack's video facts: {remote.shown} has no "
                f"{VIDEOS_FILE} made for its manifest. Run stoker.video_facts on the local copy "
                f"once (it writes {VIDEOS_FILE} beside the manifest) and upload it"
            )
    if len(facts) != len(dataset):
        raise InvalidArgumentError(
            f"VideoBuckets: the pack's video facts hold {len(facts)} videos, this loader reads "
            f"{len(dataset)} samples (a part of a pack's shards): load the whole pack"
        )
    return facts


# --- image sizes ----------------------------------------------------------------------------------

_sizes_cache: dict[tuple[Any, ...], Any] = {}
_sizes_lock = threading.Lock()
# Where the sizes of a dataset the engine cannot read them for come from, by id(dataset):
# Parquet's row groups (ParquetPack.image_sizes, registered while its loader is open).
size_readers: dict[int, Callable[[list[str]], Any]] = {}


def sample_sizes(dataset: Any, members: list[str], progress: bool = True) -> Any:
    """Each sample's image (height, width): int64 [n, 2], of the first of `members` it has
    ((0, 0): none, or unknown). From the index; a pack whose index records none has them read
    from its images' headers once (a progress bar over its shards where that takes a while),
    kept in a sizes file beside each index and, for this process, in memory."""
    import numpy as np

    shards = dataset.num_shards
    files = tuple(int(sum(f["bytes"] for f in dataset.shard_files(s))) for s in range(shards))
    key = (os.fspath(dataset.path), tuple(members), len(dataset), files)
    with _sizes_lock:
        if key in _sizes_cache:
            return _sizes_cache[key]
    if shards == 0:
        return np.zeros((0, 2), np.int64)
    reader = size_readers.get(id(dataset))
    if reader is not None:
        sizes = reader(members)
        with _sizes_lock:
            _sizes_cache[key] = sizes
        return sizes
    first, source = dataset.image_sizes(0, members)
    parts = [first]
    if shards > 1:
        def one(s: int) -> Any:
            return dataset.image_sizes(s, members)[0]

        # Read from the images (not the index): shards in parallel (the reads release the GIL).
        threads = min(shards - 1, os.cpu_count() or 1) if source == "headers" else 1
        with ThreadPoolExecutor(threads) as pool:
            done: Any = pool.map(one, range(1, shards))
            if source == "headers" and progress and shards > 8:
                from tqdm import tqdm

                done = tqdm(done, total=shards - 1, desc="image sizes (once)", unit="shard")
            parts.extend(done)
    sizes = np.concatenate(parts) if len(parts) > 1 else first
    with _sizes_lock:
        _sizes_cache[key] = sizes
    return sizes


# --- group_by -------------------------------------------------------------------------------------


class SampleEntry:
    """A sample's index entry, what ``group_by`` is given: ``index`` (pack order), ``key``,
    ``shard``, ``label``, ``members`` (name -> bytes), ``size`` (the image's (height, width),
    or None) and ``sizes`` (each image member's); ``shape(member)`` reads an ``.npy`` member's
    header, ``length(member)`` its first dimension (a token sequence's length), ``read(member)``
    and ``json(member)`` a metadata member (each a read of the file)."""

    __slots__ = ("_dataset", "index", "_record")

    def __init__(self, dataset: Any, index: int):
        self._dataset, self.index = dataset, index
        self._record: dict[str, Any] | None = None

    @property
    def record(self) -> dict[str, Any]:
        if self._record is None:
            self._record = self._dataset.record(self.index)
        return self._record

    @property
    def key(self) -> str:
        return self.record["key"]

    @property
    def shard(self) -> str:
        return self.record["shard"]

    @property
    def label(self) -> int:
        return self.record["label"]

    @property
    def members(self) -> dict[str, int]:
        return {m["name"]: m["size"] for m in self.record["members"]}

    @property
    def sizes(self) -> dict[str, tuple[int, int]]:
        return {m["name"]: (m["height"], m["width"]) for m in self.record["members"]
                if "width" in m}  # fmt: skip

    @property
    def size(self) -> tuple[int, int] | None:
        """The first image member's (height, width); an index that records none (a pack
        written before it did) reads it from the image's header."""
        from .fields import IMAGE_MEMBERS

        for m in self.record["members"]:
            if "width" in m:
                return (m["height"], m["width"])
        names = IMAGE_MEMBERS.split(";")
        hw = sample_sizes(self._dataset, names)[self.index]
        return (int(hw[0]), int(hw[1])) if hw[0] > 0 else None

    def read(self, member: str) -> bytes:
        return self._dataset.read(self.index, member)

    def json(self, member: str = "json") -> Any:
        return json.loads(self.read(member))

    def shape(self, member: str) -> tuple[int, ...]:
        from ..packing.members import npy_header

        return tuple(npy_header(self.read(member))[1])

    def length(self, member: str) -> int:
        shape = self.shape(member)
        if not shape:
            raise InvalidArgumentError(f"{member} of {self.key!r} is a scalar: it has no length")
        return shape[0]

    def __repr__(self) -> str:
        return f"SampleEntry(index={self.index}, key={self.key!r}, members={self.members})"


def _groups_by(dataset: Any, fn: Callable[[Any], Any],
               batch_size: int) -> tuple[Any, list[Any], list[int]]:  # fmt: skip
    """A group per sample from group_by: its key, or (key, batch size or None)."""
    import numpy as np

    n = len(dataset)
    group_of = np.empty(n, np.int32)
    ids: dict[Any, int] = {}
    keys: list[Any] = []
    sizes: list[int] = []
    indices: Any = range(n)
    if n > 100_000:
        from tqdm import tqdm

        indices = tqdm(indices, desc="group_by", unit="sample")
    for i in indices:
        entry = SampleEntry(dataset, i)
        out = fn(entry)
        key, size = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
        size = batch_size if size is None else size
        try:
            group = ids.get(key)
        except TypeError:
            raise InvalidArgumentError(
                f"group_by gave {key!r} for sample {entry.key!r} (#{i}): a key must be hashable"
            ) from None
        if group is None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise InvalidArgumentError(
                    f"group_by gave batch size {size!r} for key {key!r}: a positive int"
                )
            group = ids[key] = len(keys)
            keys.append(key)
            sizes.append(size)
        elif size != sizes[group]:
            raise InvalidArgumentError(
                f"group_by gave key {key!r} batch size {size} for sample {entry.key!r} (#{i}) "
                f"and {sizes[group]} before: one batch size per key"
            )
        group_of[i] = group
    if not keys:
        raise InvalidArgumentError("group_by: the dataset has no samples")
    return group_of, keys, sizes


def check_grouping_options(buckets: Any, group_by: Any, same_shape: Any, leftovers: Any,
                           drop_last: bool, train: bool) -> str | None:  # fmt: skip
    """The leftover policy (None without grouping); a clear error for each bad value."""
    if buckets is not None and not isinstance(buckets, (AspectBuckets, VideoBuckets)):
        raise InvalidArgumentError(
            "buckets takes stoker.AspectBuckets(area=..., ...) or stoker.VideoBuckets([...], "
            f"fps=...), not {buckets!r}"
        )
    if group_by is not None and not callable(group_by):
        raise InvalidArgumentError(
            f"group_by takes a function of a sample's index entry giving its key, not {group_by!r}"
        )
    if buckets is not None and group_by is not None:
        raise InvalidArgumentError("give buckets= or group_by=, not both")
    if buckets is None and group_by is None:
        if same_shape or leftovers is not None:
            raise InvalidArgumentError(
                "same_shape_across_ranks and leftovers go with buckets= or group_by="
            )
        return None
    if not isinstance(same_shape, bool):
        raise InvalidArgumentError(f"same_shape_across_ranks must be a bool, not {same_shape!r}")
    if drop_last:
        raise InvalidArgumentError(
            "drop_last does not apply to grouped batches (every batch is a full one of its "
            "group): give leftovers='drop' to leave an epoch's leftovers out"
        )
    if leftovers is None:
        return "carry" if train else "partial"
    if leftovers not in LEFTOVERS:
        raise InvalidArgumentError(
            f"leftovers must be 'carry', 'drop' or 'partial', not {leftovers!r}"
        )
    return str(leftovers)
