"""The index of Parquet files: each file's footer alone (never the file), parsed by pyarrow, and
each row group's rows and the byte range its columns occupy.

A local file's footer is read from the file. A remote one's is one range request for the file's
last 64 KiB (its size and ETag come with it), a second only for a footer larger than that; the
footer's bytes are kept in the cache folder under the file's size and ETag, so that a later open
on the machine whose listing gives both (s3://, gs://, hf://) makes no request at all, and a
file replaced at the source (another size or ETag) is indexed again."""

from __future__ import annotations

import fcntl
import hashlib
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CorruptDataError
from ..remote.cache import _Locked
from .files import ParquetFile

TAIL = 64 * 2**10  # bytes of a remote file's end read first: most footers fit
MAX_FOOTER = 256 * 2**20  # a footer larger than this is refused (a size read from the file)
MAGIC = b"PAR1"


@dataclass(frozen=True)
class Footer:
    """A file's parsed footer, and the file as the request that read it saw it."""

    file: ParquetFile  # with its size and ETag
    metadata: Any  # pyarrow.parquet.FileMetaData
    length: int  # the footer's bytes (with its length and magic)


def read_footers(files: list[ParquetFile], client: Any, folder: Path | None) -> list[Footer]:
    """Every file's footer, 8 requests at a time for remote files."""
    if all(f.local for f in files):
        return [_local(f) for f in files]
    with ThreadPoolExecutor(8, "stoker-index") as pool:
        return list(pool.map(lambda f: _local(f) if f.local else _remote(f, client, folder), files))


def _local(f: ParquetFile) -> Footer:
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    try:
        md = pq.read_metadata(f.where)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise CorruptDataError(f"{f.where}: not a Parquet file ({e})", shard=f.name) from None
    size = os.path.getsize(f.where)
    return Footer(ParquetFile(f.name, f.where, size, f.etag), md, int(md.serialized_size) + 8)


def _remote(f: ParquetFile, client: Any, folder: Path | None) -> Footer:
    """A remote file's footer: from the cache when the listing names its version and it is
    there (with the ETag the server gave for it, which range requests send back), else fetched
    and kept."""
    cached = _cache_path(folder, f)
    if cached is None:
        footer, seen = _fetch(f, client)
        return _parse(seen, footer)
    etag_file = cached.with_name(cached.name + ".etag")
    with _Locked(cached.with_name(cached.name + ".lock"), fcntl.LOCK_EX):  # once a machine
        if cached.exists() and etag_file.exists():
            seen = ParquetFile(f.name, f.where, f.size, etag_file.read_text() or None)
            return _parse(seen, cached.read_bytes())
        footer, seen = _fetch(f, client)
        for path, data in ((etag_file, (seen.etag or "").encode()), (cached, footer)):
            part = path.with_name(f"{path.name}.part-{os.getpid()}")
            part.write_bytes(data)
            os.replace(part, path)
        return _parse(seen, footer)


def _cache_path(folder: Path | None, f: ParquetFile) -> Path | None:
    """Where the footer of this version of the file is kept: only a version the listing names
    (size and ETag) can be looked up before a request."""
    if folder is None or f.size is None or not f.etag:
        return None
    key = hashlib.sha256(f"{f.where}\n{f.size}\n{f.etag}".encode()).hexdigest()[:16]
    return folder / f".footer-{key}"


def _fetch(f: ParquetFile, client: Any) -> tuple[bytes, ParquetFile]:
    """The footer's bytes (length and magic included) and the file with its size and ETag."""
    tail = client.tail(f.where, TAIL)
    seen = ParquetFile(f.name, f.where, tail.size, tail.etag or f.etag)
    if f.size is not None and tail.size != f.size:
        raise CorruptDataError(f"{f.name}: {tail.size:,} bytes where the listing said "
                               f"{f.size:,}: it changed at the source", shard=f.name)  # fmt: skip
    n = _footer_length(f, tail.data, tail.size)
    data = tail.data
    if n + 8 > len(data):
        head = client.range(f.where, tail.size - n - 8, tail.size - len(data), etag=seen.etag)
        data = head + data
    return data[-(n + 8) :], seen


def _footer_length(f: ParquetFile, tail: bytes, size: int) -> int:
    if len(tail) < 8 or tail[-4:] != MAGIC:
        raise CorruptDataError(f"{f.name}: not a Parquet file (no PAR1 at its end)", shard=f.name)
    (n,) = struct.unpack("<I", tail[-8:-4])
    if n + 12 > size or n > MAX_FOOTER:
        raise CorruptDataError(
            f"{f.name}: its footer says {n:,} bytes, in a file of {size:,}", shard=f.name
        )
    return n


def _parse(f: ParquetFile, footer: bytes) -> Footer:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        md = pq.read_metadata(pa.BufferReader(footer))
    except (OSError, ValueError) as e:
        raise CorruptDataError(f"{f.name}: its footer does not parse ({e})", shard=f.name) from None
    return Footer(f, md, len(footer))


@dataclass(frozen=True)
class RowGroup:
    """One row group of one file, as the index describes it."""

    file: int  # in the pack's files
    group: int  # in its file
    rows: int
    first_row: int  # in its file
    start: int  # the byte range of the columns read: [start, end)
    end: int


def row_groups(footers: list[Footer], columns: list[str]) -> list[RowGroup]:
    """Each file's row groups, in order, with the byte range of the leaves of `columns` (top-
    level names). A range outside the file's data is CorruptDataError naming the file."""
    out = []
    for i, footer in enumerate(footers):
        md, size = footer.metadata, footer.file.size
        assert size is not None
        first = 0
        for k in range(md.num_row_groups):
            rg = md.row_group(k)
            if rg.num_rows == 0:  # no pages to read (pyarrow writes their offsets as 0)
                out.append(RowGroup(i, k, 0, first, 4, 4))
                continue
            lo, hi = size, 0
            for j in range(rg.num_columns):
                c = rg.column(j)
                if c.path_in_schema.split(".", 1)[0] not in columns:
                    continue
                start = c.data_page_offset
                if c.has_dictionary_page and c.dictionary_page_offset:
                    start = min(start, c.dictionary_page_offset)
                lo, hi = min(lo, start), max(hi, start + c.total_compressed_size)
            if hi == 0:  # none of the columns in this file: nothing to read
                lo = hi = 4
            if not 4 <= lo <= hi <= size - footer.length:
                raise CorruptDataError(
                    f"{footer.file.name}: row group {k}'s columns are said to lie at "
                    f"[{lo:,}, {hi:,}) in a file of {size:,} bytes",
                    shard=footer.file.name,
                )
            out.append(RowGroup(i, k, int(rg.num_rows), first, lo, hi))
            first += int(rg.num_rows)
    return out
