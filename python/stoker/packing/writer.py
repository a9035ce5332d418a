"""The one writer: a source's jobs, prepared on a thread pool and written in order into tar
shards + indexes (a "part"), checkpointed shard by shard so that an interrupted pack resumes;
parts renumbered when samples before them failed, and merged into one pack's shards, sources.tsv
and the manifest's sample entries (pack format version 2: docs/FORMAT.md)."""

from __future__ import annotations

import collections
import concurrent.futures as futures
import os
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import _core
from ..errors import CorruptDataError, StokerError, StokerInternalError
from .members import FieldInfo
from .source import Job, SampleFailure, Skipped, Source, failing_job, reason

SOURCES = "sources.tsv"


class Schema:
    """The manifest's "fields": each member name as it first appeared, its kind, dtype (None
    where samples differ) and the smallest and largest shape seen, dimension by dimension (None
    where samples differ in rank)."""

    def __init__(self) -> None:
        self._fields: dict[str, dict[str, Any]] = {}
        self._ragged: set[str] = set()

    def add(self, name: str, kind: str, dtype: str | None, shape: list[int] | None) -> None:
        f = self._fields.get(name)
        if f is None:
            self._fields[name] = {
                "name": name,
                "kind": kind,
                "dtype": dtype,
                "min_shape": shape,
                "max_shape": shape,
                "count": 1,
            }
            return
        f["count"] += 1
        if f["dtype"] != dtype:
            f["dtype"] = None
        lo, hi = f["min_shape"], f["max_shape"]
        if name in self._ragged or (lo is None and shape is None):
            return
        if lo is None or shape is None or len(lo) != len(shape):
            self._ragged.add(name)
            f["min_shape"] = f["max_shape"] = None
            return
        f["min_shape"] = [min(a, b) for a, b in zip(lo, shape, strict=True)]
        f["max_shape"] = [max(a, b) for a, b in zip(hi, shape, strict=True)]

    def merge(self, later: Schema) -> None:
        """Folds in the schema of the samples that follow these: the same result as adding
        each of them here, one by one."""
        for name, g in later._fields.items():
            f = self._fields.get(name)
            if f is None:
                self._fields[name] = dict(g)
                if name in later._ragged:
                    self._ragged.add(name)
                continue
            f["count"] += g["count"]
            if f["dtype"] != g["dtype"]:
                f["dtype"] = None
            if name in self._ragged:
                continue
            lo, other = f["min_shape"], g["min_shape"]
            if (
                name in later._ragged
                or (lo is None) != (other is None)
                or (lo is not None and len(lo) != len(other))
            ):
                self._ragged.add(name)
                f["min_shape"] = f["max_shape"] = None
            elif lo is not None:
                f["min_shape"] = [min(a, b) for a, b in zip(lo, other, strict=True)]
                f["max_shape"] = [max(a, b) for a, b in zip(f["max_shape"], g["max_shape"])]

    def to_list(self) -> list[dict[str, Any]]:
        return list(self._fields.values())

    def to_json(self) -> dict[str, Any]:
        return {"fields": [dict(f) for f in self._fields.values()], "ragged": sorted(self._ragged)}

    @classmethod
    def from_json(cls, state: dict[str, Any]) -> Schema:
        schema = cls()
        schema._fields = {f["name"]: dict(f) for f in state["fields"]}
        schema._ragged = set(state["ragged"])
        return schema


@dataclass
class Part:
    """What writing one contiguous range of a source made: its shards (in the pack folder,
    named from the part's prefix, in sample order) and what the manifest needs from it. A
    local pack is one part; a Ray pack one part per task."""

    start: int  # the key of its first sample, as written
    shards: list[dict[str, Any]]  # tar, index, num_samples, bytes
    num_samples: int
    failed: list[tuple[str, str]]  # (where, reason), in source order
    counts: list[int]  # per class (grows with the labels seen)
    schema: Schema
    reencoded: int
    crowd: int
    sources: str  # file in the folder: its sources.tsv lines without the key column
    records: int = 0  # source records consumed: the samples written and those that failed
    done: bool = False

    def to_json(self) -> dict[str, Any]:
        state = asdict(replace(self, schema=Schema()))
        state["schema"] = self.schema.to_json()
        state["failed"] = [list(f) for f in self.failed]
        return state

    @classmethod
    def from_json(cls, state: dict[str, Any]) -> Part:
        state = dict(state)
        state["schema"] = Schema.from_json(state["schema"])
        state["failed"] = [tuple(f) for f in state["failed"]]
        return cls(**state)


def _count(counts: list[int], label: int) -> None:
    if label >= len(counts):
        counts.extend([0] * (label + 1 - len(counts)))
    counts[label] += 1


def write_part(
    folder: str,
    prefix: str,
    source: Source,
    start: int,
    limit: int,
    threads: int,
    on_error: str = "skip",
    on_progress: Callable[[int, int], Any] | None = None,
    resume: Part | None = None,
    checkpoint: Callable[[Part], Any] | None = None,
) -> Part:
    """Prepares `source`'s jobs on `threads` threads and writes them, in order, into shards
    FOLDER/PREFIX000000.tar (+ .idx), PREFIX000001... of about `limit` bytes, keyed from
    `start` on. Records that fail are listed (on_error="skip") or raised as a CorruptDataError
    naming them (on_error="raise"). `resume`: the part as a previous run checkpointed it, its
    later files removed and its records not read again. `checkpoint(part)` runs after each
    shard is closed; `on_progress(1, bytes written so far)` after each record. On an error the shard
    being written is deleted."""
    base = Path(folder)
    if resume is not None:
        part = resume
        _discard_after(base, prefix, part)
    else:
        for f in base.glob(f"{prefix}*"):  # what an interrupted run of this part left
            f.unlink()
        part = Part(start, [], 0, [], [], Schema(), 0, 0, f"{prefix}{SOURCES}")
        (base / part.sources).write_text("")
    writer = None
    closed_bytes = sum(s["bytes"] for s in part.shards)

    def close_shard(records: int) -> None:
        nonlocal writer, closed_bytes
        if writer is not None:
            writer.finish()
            part.shards[-1]["num_samples"] = writer.num_samples
            part.shards[-1]["bytes"] = writer.bytes_written
            closed_bytes += writer.bytes_written
            writer = None
            sources.flush()
            os.fsync(sources.fileno())
            part.records = records
            if checkpoint is not None:
                checkpoint(part)

    records = part.records
    try:
        with (
            open(base / part.sources, "a") as sources,
            futures.ThreadPoolExecutor(threads) as pool,
        ):
            # A bounded window of work in flight keeps memory flat and the output in order.
            window: collections.deque[tuple[Job, futures.Future]] = collections.deque()
            todo = source.jobs(part.records)
            exhausted = False
            while True:
                while not exhausted and len(window) < 4 * threads:
                    try:
                        job = next(todo)
                    except StopIteration:
                        exhausted = True
                        break
                    except SampleFailure as e:  # the source could not list its next record
                        job, exhausted = failing_job(e), True
                    window.append((job, pool.submit(job.make)))
                if not window:
                    break
                job, fut = window.popleft()
                records += job.records
                try:
                    sample = fut.result()
                except Skipped:
                    pass  # left out on purpose: neither written nor listed
                except (SampleFailure, StokerError, OSError) as e:
                    where = e.where if isinstance(e, SampleFailure) else job.where
                    if on_error == "raise":
                        raise CorruptDataError(f"{where}: {reason(e)}", reason=reason(e),
                                               shard=where) from e  # fmt: skip
                    part.failed.append((where, reason(e)))
                else:
                    label = sample.label if sample.label is not None else job.label
                    if writer is None:
                        name = f"{prefix}{len(part.shards):06d}"
                        part.shards.append({"tar": f"{name}.tar", "index": f"{name}.idx"})
                        writer = _core.ShardWriter(
                            str(base / f"{name}.tar"), str(base / f"{name}.idx")
                        )
                    writer.add_sample(f"{part.start + part.num_samples:08d}", sample.members,
                                      label)  # fmt: skip
                    row = [str(label), job.where.replace("\t", " ").replace("\n", " ")]
                    ref = sample.ref if sample.ref is not None else job.ref
                    if ref is not None:
                        row.append(ref.replace("\t", " ").replace("\n", " "))
                    sources.write("\t".join(row) + "\n")
                    part.num_samples += 1
                    schema_label: list[FieldInfo] = []
                    if label >= 0:
                        _count(part.counts, label)
                        schema_label = [("cls", "label", "int64", [])]
                    for info in sample.fields + schema_label:
                        part.schema.add(*info)
                    for c in sample.box_classes:
                        _count(part.counts, c)
                    part.crowd += sample.crowd
                    part.reencoded += sample.rewritten
                    if writer.bytes_written >= limit:
                        close_shard(records)
                if on_progress is not None:
                    on_progress(1, closed_bytes + (writer.bytes_written if writer else 0))
            close_shard(records)
        part.records = records
        part.done = True
        if checkpoint is not None:
            checkpoint(part)
    except BaseException:
        if writer is not None:
            del writer  # the C++ writer deletes its unfinished shard
        raise
    finally:
        source.close()
    return part


def _discard_after(base: Path, prefix: str, part: Part) -> None:
    """A resumed part: the shards after its checkpoint (and any unfinished one) removed, and its
    sources file cut back to the samples the checkpoint holds."""
    kept = {s[k] for s in part.shards for k in ("tar", "index")}
    for f in base.glob(f"{prefix}*"):
        if f.name not in kept and f.name != part.sources:
            f.unlink()
    with open(base / part.sources, "rb+") as listing:
        lines = listing.read().split(b"\n")
        listing.seek(0)
        listing.truncate()
        if part.num_samples:
            listing.write(b"\n".join(lines[: part.num_samples]) + b"\n")


def tar_samples(path: Path) -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """(key, [(member name, bytes)]) of each sample of a shard stoker wrote, in order: its
    files are KEY.MEMBER, a sample's files adjacent, names as written (not lower-cased)."""
    key = ""
    members: list[tuple[str, bytes]] = []
    with tarfile.open(path) as tar:
        for info in tar:
            k, _, name = info.name.partition(".")
            if k != key and members:
                yield key, members
                members = []
            key = k
            f = tar.extractfile(info)
            if f is None:
                raise StokerInternalError(f"{path}: {info.name} is not a regular file")
            members.append((name, f.read()))
    if members:
        yield key, members


def rekey_part(folder: str, part: Part, start: int) -> Part:
    """Rewrites a part's shards with keys from `start` on: the samples before it that failed
    were only known once every part was written. Member bytes and labels are copied (the
    label back from the KEY.cls the writer added), nothing is prepared again."""
    base = Path(folder)
    key = start
    shards = []
    for shard in part.shards:
        tar, idx = base / shard["tar"], base / shard["index"]
        new_tar, new_idx = tar.with_name(f".rekey-{tar.name}"), idx.with_name(f".rekey-{idx.name}")
        writer = _core.ShardWriter(str(new_tar), str(new_idx))
        for _, members in tar_samples(tar):
            label = -1
            kept = []
            for name, data in members:
                if name == "cls":  # a part's own samples never have a member named cls
                    label = int(data)
                else:
                    kept.append((name, data))
            writer.add_sample(f"{key:08d}", kept, label)
            key += 1
        writer.finish()
        os.replace(new_tar, tar)
        os.replace(new_idx, idx)
        shards.append({**shard, "num_samples": writer.num_samples, "bytes": writer.bytes_written})
    if key - start != part.num_samples:
        raise StokerInternalError(
            f"{folder}: the part from key {part.start} holds {key - start} samples, "
            f"{part.num_samples} were written"
        )
    return replace(part, start=start, shards=shards)


def part_starts(parts: list[Part]) -> list[int]:
    """The key each part's first sample has in the whole pack."""
    starts, n = [], 0
    for part in parts:
        starts.append(n)
        n += part.num_samples
    return starts


@dataclass
class Merged:
    num_samples: int
    class_counts: list[int]
    fields: list[dict[str, Any]]
    shards: list[dict[str, Any]]
    bytes: int
    failed: list[tuple[str, str]] = field(default_factory=list)
    crowd: int = 0
    reencoded: int = 0


def merge_parts(folder: Path, parts: list[Part], num_classes: int) -> Merged:
    """Renames the parts' shards shard-000000... in order, writes sources.tsv, and returns what
    the manifest needs from the samples."""
    shards: list[dict[str, Any]] = []
    counts = [0] * num_classes
    schema = Schema()
    merged = Merged(0, counts, [], shards, 0)
    with open(folder / SOURCES, "w") as sources:
        for part, start in zip(parts, part_starts(parts), strict=True):
            assert part.start == start, "a part was written with the wrong keys"
            for shard in part.shards:
                name = f"shard-{len(shards):06d}"
                renamed = {**shard, "tar": f"{name}.tar", "index": f"{name}.idx"}
                for k in ("tar", "index"):
                    if shard[k] != renamed[k]:
                        os.rename(folder / shard[k], folder / renamed[k])
                shards.append(renamed)
            with open(folder / part.sources) as lines:
                for i, line in enumerate(lines):
                    sources.write(f"{start + i:08d}\t{line}")
            os.unlink(folder / part.sources)
            for label, n in enumerate(part.counts):
                if label >= len(counts):
                    counts.extend([0] * (label + 1 - len(counts)))
                counts[label] += n
            schema.merge(part.schema)
            merged.failed += part.failed
            merged.reencoded += part.reencoded
            merged.crowd += part.crowd
            merged.num_samples += part.num_samples
    merged.fields = schema.to_list()
    merged.bytes = sum(s["bytes"] for s in shards)
    return merged
