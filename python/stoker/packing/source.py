"""The interface every source of samples implements, and what its samples become.

A source lists its records in a fixed order and yields one `Job` per record, lazily, from any
position: `jobs(start, stop)`. A job's `make` runs on one of the writer's threads (reading a
file, checking and preparing its members) and returns the `Sample` to write, or raises
`SampleFailure` naming where the record is and what is wrong with it. The writer
(writer.py) turns jobs into shards; the packer (packer.py) splits a source into ranges for
resume and for Ray. A new format is one module in sources/ and one test file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..errors import StokerError
from .members import FieldInfo, Options, member_data, member_kind, value_bytes


@dataclass
class Sample:
    """One record made ready to write, on a writer thread."""

    members: list[tuple[str, bytes]]
    fields: list[FieldInfo]
    rewritten: bool = False
    label: int | None = None  # where only the record's value says it (else the job's)
    box_classes: list[int] = field(default_factory=list)  # COCO: the class of each box
    crowd: int = 0  # COCO: iscrowd annotations left out of the boxes
    ref: str | None = None  # the source's own name for it, where only the record says it


@dataclass
class Job:
    where: str  # the file, row, record or key it comes from, as a failure names it
    label: int  # -1: none (or given by the Sample)
    ref: str | None  # the source's own key (a table's key column, a COCO image id, a LMDB key)
    make: Callable[[], Sample]  # runs on a writer thread
    records: int = 1  # the source's records it stands for (a damaged range failing as one)


class SampleFailure(Exception):
    """A record that cannot be packed: (where, reason), skipped and listed under
    on_error="skip", raised (as a CorruptDataError naming both) under on_error="raise"."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


class Skipped(SampleFailure):
    """A record the source leaves out on purpose (LMDB's record=fn returned None): counted as
    read, neither written nor listed."""


class SourceDamaged(SampleFailure):
    """What is left of a file cannot be read (a bad framing CRC, a truncated file): its remaining
    records are skipped as one failure, or raised. `records`: how many of the source's records
    (its positions) that failure stands for."""

    def __init__(self, where: str, reason: str, records: int = 1):
        super().__init__(where, reason)
        self.records = records


def failing_job(e: SampleFailure) -> Job:
    """A job standing for what a source could not read (the rest of a damaged file): it fails
    when made, as one record."""

    def make() -> Sample:
        raise e

    return Job(e.where, -1, None, make, getattr(e, "records", 1))


def reason(e: BaseException) -> str:
    return getattr(e, "reason", None) or str(e) or type(e).__name__


class Source:
    """A dataset to pack, as records in a fixed order."""

    format: ClassVar[str] = ""  # the manifest's source_format
    unit: ClassVar[str] = "sample"  # the progress bar's unit
    classes: list[str] | None = None  # label names; None: integer labels, named "0".."max"
    extra: dict[str, Any] = {}  # more manifest entries (COCO's category_ids)
    # Fixed-shape arrays only (HDF5 arrays, a .pt file): name -> array-like (len, shape, dtype,
    # slicing), written as an array pack by stoker.pack_arrays instead of jobs.
    columns: Mapping[str, Any] | None = None

    def __len__(self) -> int:
        """The number of records (a source that can only count by reading them all says so by
        raising TypeError: its progress has no total, and it is not split by range)."""
        raise TypeError(f"{type(self).__name__} has no length")

    def jobs(self, start: int = 0, stop: int | None = None) -> Iterator[Job]:
        """One job per record from `start` to `stop` (the end), in order."""
        raise NotImplementedError

    def fingerprint(self) -> str | None:
        """What identifies the records (paths, sizes, modification times): an interrupted pack of
        the same source resumes; None: it never does."""
        return None

    def partitions(self, n: int) -> list[tuple[int, Source]]:
        """Up to `n` contiguous parts, each (its first record's position, the part): by range
        where the length is known, else the source whole."""
        try:
            total = len(self)
        except TypeError:
            return [(0, self)]
        n = max(1, min(n, total))
        bounds = [total * i // n for i in range(n + 1)]
        return [(a, RangeOf(self, a, b)) for a, b in zip(bounds, bounds[1:]) if b > a]

    def close(self) -> None:
        pass


class RangeOf(Source):
    """Records [start, stop) of a source, itself a source (what a Ray task or a resumed pack
    reads)."""

    def __init__(self, source: Source, start: int, stop: int):
        self.source, self.start, self.stop = source, start, stop
        self.classes = source.classes
        self.extra = source.extra

    @property
    def format(self) -> str:  # type: ignore[override]
        return self.source.format

    def __len__(self) -> int:
        return self.stop - self.start

    def jobs(self, start: int = 0, stop: int | None = None) -> Iterator[Job]:
        end = self.stop if stop is None else min(self.stop, self.start + stop)
        return self.source.jobs(self.start + start, end)

    def close(self) -> None:
        self.source.close()


def files_fingerprint(paths: Sequence[str | os.PathLike], *extra: Any) -> str:
    """A digest of files' paths, sizes and modification times (and of `extra`)."""
    h = hashlib.sha256()
    for p in paths:
        st = os.stat(p)
        h.update(f"{os.fspath(p)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    h.update(json.dumps(extra, default=repr, sort_keys=True).encode())
    return h.hexdigest()


def record_sample(
    values: Sequence[tuple[str, Any]], where: str, opts: Options, label: Any = None
) -> Sample:
    """A record's (member name, value) pairs made into members: each value converted
    (members.value_bytes), then checked and prepared (members.member_data). A value under
    ``cls`` is the label."""
    sample = Sample([], [])
    if label is not None:
        values = [*values, ("cls", label)]
    for name, value in values:
        try:
            if member_kind(name) == "label":
                from .members import label_value

                sample.label = label_value(value)
                continue
            name, data = value_bytes(name, value, opts)
            data, info, rewritten = member_data(name, member_kind(name), data, opts)
        except (StokerError, OSError, ValueError, TypeError, UnicodeDecodeError) as e:
            raise SampleFailure(where, f"{name.replace('{ext}', 'image')}: {reason(e)}") from e
        sample.members.append((info[0], data))
        sample.fields.append(info)
        sample.rewritten |= rewritten
    if not sample.members and sample.label is None:
        raise SampleFailure(where, "the record has neither members nor a label")
    return sample


def expand_home(path: str | os.PathLike) -> Path:
    return Path(os.path.expanduser(os.fspath(path)))
