"""TFRecord files of ``tf.train.Example`` records, read without TensorFlow.

A TFRecord file is a sequence of records, each framed as::

    uint64 length | uint32 masked CRC32C of the length | data[length] | uint32 masked CRC32C of data

(little-endian), the whole file optionally GZIP- or ZLIB-compressed. Both CRCs are checked: a bad
length CRC (or a length running past the end) means the rest of the file cannot be framed, so it
is one failure (`SourceDamaged`); a bad data CRC spoils only its record. Every length is
untrusted: bounded by the file's size (uncompressed) or read in bounded chunks (compressed).

Each record's data is a ``tf.train.Example``, parsed here by a small protobuf reader (Example ->
Features -> map<string, Feature> -> BytesList | FloatList | Int64List). TensorFlow's ImageNet
conventions are the default: ``image/encoded`` is the image (kept byte for byte) and
``image/class/label`` the label, as stored (the TF ImageNet records count from 1, 0 being
"background"); ``image/filename`` is recorded in sources.tsv. Records without ``image/encoded``
keep every feature: byte strings that are images become images, other byte strings text (or
bytes), numbers ``.npy`` arrays. ``members={"jpg": "image/encoded", "bbox.npy":
"image/object/bbox/xmin"}`` picks features explicitly; ``label=`` names the label's feature.
"""

from __future__ import annotations

import functools
import glob
import gzip
import os
import struct
import zlib
from array import array
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from ..._core import crc32c
from ...errors import InvalidArgumentError
from ..members import (
    Options,
    check_member_name,
    default_name,
    image_format,
    label_value,
    member_kind,
)
from ..source import (
    Job,
    Sample,
    SampleFailure,
    Source,
    SourceDamaged,
    failing_job,
    files_fingerprint,
    record_sample,
)

IMAGE_FEATURE = "image/encoded"
LABEL_FEATURES = ("image/class/label", "label")
NAME_FEATURE = "image/filename"
COMPRESSIONS = ("none", "gzip", "zlib")
MAX_RECORD = 1 << 30  # a longer record is taken for a damaged length
_CHUNK = 16 << 20  # compressed records are read this much at a time
_MASK_DELTA = 0xA282EAD8


def masked_crc(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC32C (the framing's checksum)."""
    crc = crc32c(bytes(data))
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


# --- the framing ------------------------------------------------------------------------------


class _ZlibReader:
    """A read(n) stream over a ZLIB-compressed file, decompressing at most 1 MiB at a time."""

    def __init__(self, f: IO[bytes]):
        self.f, self.z, self.buf = f, zlib.decompressobj(), bytearray()

    def read(self, n: int) -> bytes:
        while len(self.buf) < n and not self.z.eof:
            data = self.z.unconsumed_tail or self.f.read(1 << 16)
            if not data:
                break
            self.buf += self.z.decompress(data, 1 << 20)
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def close(self) -> None:
        self.f.close()


def _sniff(path: Path) -> str:
    """The compression of a file, from its first bytes: a file that frames as TFRecord is
    uncompressed; else GZIP's magic, else a ZLIB header; else none (and it fails to frame)."""
    with open(path, "rb") as f:
        head = f.read(12)
    if _frames(head):
        return "none"
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        return "zlib"
    return "none"


def _frames(head: bytes) -> bool:
    return len(head) == 12 and masked_crc(head[:8]) == struct.unpack("<I", head[8:])[0]


def _open(path: Path, compression: str) -> Any:
    f = open(path, "rb")  # noqa: SIM115 (handed to the reader, closed by its caller)
    if compression == "gzip":
        return gzip.GzipFile(fileobj=f, mode="rb")
    if compression == "zlib":
        return _ZlibReader(f)
    return f


def is_tfrecord(path: Path) -> bool:
    """Whether a file's first record frames as TFRecord (uncompressed, GZIP or ZLIB)."""
    try:
        compression = _sniff(path)
        reader = _open(path, compression)
        try:
            return _frames(reader.read(12))
        finally:
            reader.close()
    except (OSError, EOFError, zlib.error):
        return False


def _read_exactly(reader: Any, n: int) -> bytes:
    """n bytes (fewer at the end of the stream), never allocating more than the stream gives."""
    if n <= _CHUNK:
        return reader.read(n)
    parts, left = [], n
    while left:
        part = reader.read(min(left, _CHUNK))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


class _File:
    """Where one file's records start (in its uncompressed stream), and where it stops framing."""

    def __init__(self, path: Path, compression: str):
        self.path, self.compression = path, compression
        self.offsets = array("Q")
        self.damage: tuple[int, str] | None = None  # (byte offset, why) of the first bad frame
        self._scan()

    @property
    def records(self) -> int:
        """Its records, the unframable rest counted as one."""
        return len(self.offsets) + (self.damage is not None)

    def _scan(self) -> None:
        size = os.path.getsize(self.path) if self.compression == "none" else None
        pos = 0
        try:
            reader = _open(self.path, self.compression)
            try:
                while True:
                    if size is not None:
                        reader.seek(pos)
                    head = reader.read(12)
                    if not head:
                        return
                    length = _check_header(head)
                    end = pos + 12 + length + 4
                    if size is not None:
                        if end > size:
                            raise ValueError(
                                f"a record of {length} bytes runs past the end of the file "
                                f"({size} bytes): the file is truncated"
                            )
                    elif len(_read_exactly(reader, length + 4)) != length + 4:
                        raise ValueError("the file ends inside a record: it is truncated")
                    self.offsets.append(pos)
                    pos = end
            finally:
                reader.close()
        except (ValueError, OSError, EOFError, zlib.error) as e:
            self.damage = (pos, str(e) or type(e).__name__)

    def where(self, i: int) -> str:
        offset = self.offsets[i] if i < len(self.offsets) else self.damage[0]  # type: ignore[index]
        return f"{self.path}: record {i} (byte {offset})"


def _check_header(head: bytes) -> int:
    if len(head) < 12:
        raise ValueError(f"the file ends inside a record's header ({len(head)} of 12 bytes)")
    length, crc = struct.unpack("<QI", head)
    if masked_crc(head[:8]) != crc:
        raise ValueError("bad length CRC: the record's length is damaged")
    if length > MAX_RECORD:
        raise ValueError(f"a record of {length} bytes (more than {MAX_RECORD}): damaged")
    return length


# --- tf.train.Example -------------------------------------------------------------------------


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("a truncated or overlong varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: memoryview, pos: int, end: int) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a message's fields: an int for varints and fixed
    widths, (start, end) for length-delimited ones, bounded by the message."""
    value: Any
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
        elif wire == 2:
            n, pos = _varint(buf, pos, end)
            if n > end - pos:
                raise ValueError(f"a field of {n} bytes runs past its message")
            value, pos = (pos, pos + n), pos + n
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if pos + width > end:
                raise ValueError("a truncated fixed-width field")
            value, pos = bytes(buf[pos : pos + width]), pos + width
        else:
            raise ValueError(f"wire type {wire} is not in a tf.train.Example")
        yield number, wire, value


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _feature(buf: memoryview, start: int, end: int) -> tuple[str, list[Any]]:
    """(kind, values) of a Feature: "bytes" (a list of bytes), "float" or "int64" (a list of
    numbers); an empty Feature is ("none", [])."""
    for number, _, value in _fields(buf, start, end):
        if number not in (1, 2, 3) or not isinstance(value, tuple):
            continue
        values: list[Any] = []
        for n, wire, v in _fields(buf, *value):
            if n != 1:
                continue
            if number == 1 and isinstance(v, tuple):
                values.append(bytes(buf[v[0] : v[1]]))
            elif number == 2:
                if isinstance(v, tuple):  # packed
                    if (v[1] - v[0]) % 4:
                        raise ValueError("a packed float list of a size not a multiple of 4")
                    values.extend(struct.unpack(f"<{(v[1] - v[0]) // 4}f", buf[v[0] : v[1]]))
                elif wire == 5:
                    values.append(struct.unpack("<f", v)[0])
            elif number == 3:
                if isinstance(v, tuple):  # packed varints
                    p = v[0]
                    while p < v[1]:
                        x, p = _varint(buf, p, v[1])
                        values.append(_int64(x))
                elif wire == 0:
                    values.append(_int64(v))
        return {1: "bytes", 2: "float", 3: "int64"}[number], values
    return "none", []


def parse_example(data: bytes) -> dict[str, tuple[str, list[Any]]]:
    """A serialized tf.train.Example as {feature name: (kind, values)}."""
    buf = memoryview(data)
    features: dict[str, tuple[str, list[Any]]] = {}
    for number, _, span in _fields(buf, 0, len(buf)):
        if number != 1 or not isinstance(span, tuple):
            continue
        for n, _, entry in _fields(buf, *span):
            if n != 1 or not isinstance(entry, tuple):
                continue
            key, feature = None, (0, 0)
            for m, _, v in _fields(buf, *entry):
                if m == 1 and isinstance(v, tuple):
                    key = bytes(buf[v[0] : v[1]]).decode("utf-8")
                elif m == 2 and isinstance(v, tuple):
                    feature = v
            if key is None:
                raise ValueError("a feature without a name")
            features[key] = _feature(buf, *feature)
    return features


def _value(member: str, feature: str, kind: str, values: list[Any]) -> Any:
    """A feature's values as the member `member` takes them."""
    target = member_kind(member.replace("{ext}", "png"))
    if target in ("array", "boxes"):
        import numpy as np

        if kind == "bytes":
            raise ValueError(f"{feature} holds bytes, not numbers for an array")
        return np.asarray(values, dtype=np.float32 if kind == "float" else np.int64)
    if kind == "bytes" and len(values) == 1:
        return values[0]
    if target == "json":
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in values]
    if not values:
        raise ValueError(f"{feature} is empty")
    raise ValueError(
        f"{feature} holds {len(values)} {kind} values; name the member *.npy or *.json"
    )


def example_sample(
    data: bytes,
    crc: int,
    where: str,
    members: Mapping[str, str] | None,
    label: str | None,
    opts: Options,
) -> Sample:
    if masked_crc(data) != crc:
        raise SampleFailure(where, "bad data CRC: the record is damaged")
    try:
        features = parse_example(data)
    except (ValueError, UnicodeDecodeError, struct.error) as e:
        raise SampleFailure(where, f"not a tf.train.Example: {e}") from e
    chosen = dict(members) if members is not None else _defaults(features)
    values = []
    for member, feature in chosen.items():
        if feature not in features:
            raise SampleFailure(
                where, f"no feature {feature!r}; it has {', '.join(sorted(features)) or 'none'}"
            )
        kind, vals = features[feature]
        try:
            values.append((member, _value(member, feature, kind, vals)))
        except ValueError as e:
            raise SampleFailure(where, str(e)) from e
    label_name = (
        label
        if label is not None
        else next((f for f in LABEL_FEATURES if f in features and members is None), None)
    )
    label_of = None
    if label_name is not None:
        kind, vals = features.get(label_name, ("none", []))
        if kind != "int64" or len(vals) != 1:
            raise SampleFailure(where, f"the label {label_name!r} is not one integer")
        try:
            label_of = label_value(vals[0])
        except ValueError as e:
            raise SampleFailure(where, str(e)) from e
    sample = record_sample(values, where, opts, label_of)
    kind, vals = features.get(NAME_FEATURE, ("none", []))
    if kind == "bytes" and len(vals) == 1:
        sample.ref = vals[0].decode("utf-8", errors="replace")
    return sample


def _defaults(features: Mapping[str, tuple[str, list[Any]]]) -> dict[str, str]:
    """TensorFlow's ImageNet layout (the image alone, the label apart), else every feature."""
    if IMAGE_FEATURE in features:
        return {"{ext}": IMAGE_FEATURE}
    chosen: dict[str, str] = {}
    first_image = True
    for name, (kind, values) in features.items():
        if name in LABEL_FEATURES or kind == "none":
            continue
        if kind == "bytes" and len(values) == 1 and image_format(values[0]) is not None:
            member = default_name(name.replace("/", "_"), "image", first_image)
            first_image = False
        elif kind == "bytes":
            text = len(values) == 1 and _is_text(values[0])
            member = default_name(name.replace("/", "_"), "text" if text else "json")
        else:
            member = default_name(name.replace("/", "_"), "array")
        chosen[member] = name
    return chosen


def _is_text(value: bytes) -> bool:
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# --- the source -------------------------------------------------------------------------------


def _list_files(src: Path | str) -> list[Path]:
    text = os.fspath(src)
    if any(c in text for c in "*?["):
        files = [Path(p) for p in sorted(glob.glob(text)) if os.path.isfile(p)]
    elif os.path.isdir(text):
        entries = sorted(Path(text).iterdir())
        files = [
            p for p in entries if p.is_file() and (".tfrecord" in p.name or ".tfrec" in p.name)
        ]
        if not files:  # TF's own names: train-00000-of-01024
            files = [p for p in entries if p.is_file() and "-of-" in p.name]
    else:
        files = [Path(text)]
    if not files:
        raise InvalidArgumentError(f"{text}: no TFRecord files (*.tfrecord, *.tfrec, *-of-*)")
    return files


class TFRecordSource(Source):
    format = "tfrecord"

    def __init__(
        self,
        src: Path | str,
        opts: Options,
        members: Mapping[str, str] | None = None,
        label: str | None = None,
        compression: str | None = None,
    ):
        if compression is not None and compression.lower() not in COMPRESSIONS:
            raise InvalidArgumentError(
                f"compression must be one of {', '.join(COMPRESSIONS)}, not {compression!r}"
            )
        if members is not None:
            for name in members:
                check_member_name(name, f"{src}: members")
        self.files = _list_files(src)
        self.opts, self.members, self.label = opts, dict(members or {}) or None, label
        self.compression = compression.lower() if compression else None
        self._index: list[_File] | None = None

    def index(self) -> list[_File]:
        """Every file's record offsets, read once (lengths only: data is skipped, or only
        decompressed)."""
        if self._index is None:
            self._index = [_File(p, self.compression or _sniff(p)) for p in self.files]
        return self._index

    def __len__(self) -> int:
        return sum(f.records for f in self.index())

    def jobs(self, start: int = 0, stop: int | None = None) -> Iterator[Job]:
        first = 0
        for file in self.index():
            a, b = max(start - first, 0), file.records
            if stop is not None:
                b = min(b, stop - first)
            if a < b:
                yield from self._file_jobs(file, a, b)
            first += file.records
            if stop is not None and first >= stop:
                return

    def _file_jobs(self, file: _File, a: int, b: int) -> Iterator[Job]:
        make = functools.partial(example_sample, members=self.members, label=self.label,
                                 opts=self.opts)  # fmt: skip
        good = min(b, len(file.offsets))
        if a < good:
            reader = _open(file.path, file.compression)
            try:
                _skip_to(reader, file.offsets[a], file.compression)
                for i in range(a, good):
                    where = file.where(i)
                    try:
                        length = _check_header(reader.read(12))
                        body = _read_exactly(reader, length + 4)
                    except (ValueError, OSError, EOFError, zlib.error) as e:
                        raise SampleFailure(
                            where, f"the file changed since it was indexed: {e}"
                        ) from e
                    if len(body) != length + 4:
                        raise SampleFailure(where, "the file changed since it was indexed")
                    data, crc = body[:length], struct.unpack("<I", body[length:])[0]
                    yield Job(where, -1, None, functools.partial(make, data, crc, where))
            finally:
                reader.close()
        if b > len(file.offsets) and file.damage is not None:
            where = file.where(len(file.offsets))
            yield failing_job(SourceDamaged(where, f"{file.damage[1]}; the rest of the file is "
                                                   "unreadable"))  # fmt: skip

    def fingerprint(self) -> str:
        return files_fingerprint(self.files, self.members, self.label, self.compression)


def _skip_to(reader: Any, offset: int, compression: str) -> None:
    if compression == "none":
        reader.seek(offset)
        return
    while offset:
        n = len(reader.read(min(offset, _CHUNK)))
        if not n:
            raise EOFError("the file ends before its indexed records")
        offset -= n
