"""WebDataset shards: ``.tar`` files (or ``.tar.gz``) whose files are ``KEY.MEMBER``, a sample's
files adjacent. Members are kept under their names (``cls`` is the label), checked as their names
say; images are prepared as from any source (max_side, restart markers, codec)."""

from __future__ import annotations

import functools
import glob
import tarfile
from collections.abc import Iterator
from pathlib import Path

from ...errors import InvalidArgumentError
from ..members import Options, label_value
from ..source import (
    Job,
    Sample,
    SampleFailure,
    Source,
    failing_job,
    files_fingerprint,
    record_sample,
)

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
# Members WebDataset writers add that say nothing of the sample's content.
_SKIPPED = ("__key__", "__url__")


def _split(name: str) -> tuple[str, str]:
    """(key, member) of a tar file name: the key is everything before the first '.' of the base
    name (WebDataset's rule)."""
    folder, _, base = name.rpartition("/")
    stem, _, member = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), member


def shard_samples(path: Path) -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """(key, [(member, bytes)]) of each sample of one shard, streamed."""
    key: str | None = None
    members: list[tuple[str, bytes]] = []
    try:
        with tarfile.open(path, "r|*") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                k, member = _split(info.name)
                if not member or member in _SKIPPED:
                    continue
                if k != key and members:
                    yield key or "", members
                    members = []
                key = k
                f = tar.extractfile(info)
                members.append((member, f.read() if f is not None else b""))
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        raise SampleFailure(f"{path} (after key {key})", f"the tar is damaged: {e}") from e
    if members:
        yield key or "", members


def _samples_in(path: Path) -> int:
    """Samples in a shard, as jobs() gives them: the rest of a damaged shard counts as one."""
    n = 0
    try:
        for _ in shard_samples(path):
            n += 1
    except SampleFailure:
        n += 1
    return n


def tar_sample(members: list[tuple[str, bytes]], where: str, opts: Options) -> Sample:
    label = None
    values = []
    for name, data in members:
        if name == "cls":
            try:
                label = label_value(data)
            except ValueError as e:
                raise SampleFailure(where, f"cls: {e}") from e
        else:
            values.append((name, data))
    return record_sample(values, where, opts, label)


class WebDatasetShards(Source):
    format = "webdataset"

    def __init__(self, src: str | Path, opts: Options):
        text = str(src)
        if any(c in text for c in "*?["):
            paths = sorted(Path(p) for p in glob.glob(text))
        elif Path(text).is_dir():
            paths = sorted(p for p in Path(text).iterdir() if p.name.endswith(TAR_SUFFIXES))
        else:
            paths = [Path(text)]
        if not paths:
            raise InvalidArgumentError(f"{src}: no .tar shards")
        self.paths, self.opts = paths, opts
        self._counts: list[int] | None = None

    def _count(self) -> list[int]:
        if self._counts is None:
            self._counts = [_samples_in(p) for p in self.paths]
        return self._counts

    def __len__(self) -> int:
        return sum(self._count())

    def jobs(self, start: int = 0, stop: int | None = None) -> Iterator[Job]:
        position = 0
        for path in self.paths:
            if stop is not None and position >= stop:
                return
            if self._counts is not None:  # whole shards before `start` are not read
                n = self._counts[self.paths.index(path)]
                if position + n <= start:
                    position += n
                    continue
            samples = shard_samples(path)
            while True:
                try:
                    key, members = next(samples)
                except StopIteration:
                    break
                except SampleFailure as e:  # the rest of this shard: one failure
                    if position >= start and (stop is None or position < stop):
                        yield failing_job(e)
                    position += 1
                    break
                if position >= start and (stop is None or position < stop):
                    where = f"{path}:{key}"
                    yield Job(where, -1, key, functools.partial(tar_sample, members, where,
                                                                 self.opts))  # fmt: skip
                position += 1

    def fingerprint(self) -> str:
        return files_fingerprint(self.paths)
