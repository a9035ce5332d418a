"""LMDB: an environment folder holding ``data.mdb`` (or the ``data.mdb`` file itself), read-only
and without its lock file. One sample per key, in LMDB's (sorted) key order.

What a value holds, found from its first bytes:

- an encoded image (JPEG, PNG, WebP, or a format Pillow reads, stored as a PNG of the same
  pixels): the member ``jpg``/``png``/``webp``, the bytes kept as they are;
- a Caffe ``Datum`` (what Caffe's ``convert_imageset`` and DALI's Caffe reader use): its image,
  encoded (``encoded=true``) or raw CHW pixels (stored as a lossless PNG, BGR turned to RGB as
  Caffe stores OpenCV's channel order), and its label;
- a pickle (the ``(image bytes, label)`` tuples of many conversion scripts): refused, since
  unpickling runs code the data names, unless ``allow_pickle=True``; then a tuple or list is
  ``(image, label)``, a dict one member per key (``image``/``img`` the image, ``label``/
  ``target``/``cls``/``class`` the label, member names such as ``jpg`` or ``seg.png`` as they
  are, other keys named from their values: ``caption.txt``, ``emb.npy``, ``meta.json``...).

Keys that conversion scripts add beside the samples (`METADATA_KEYS`: ``__keys__``,
``__len__``, ``length``, ``num_samples``...) are left out when their value is not an image.

``label=`` gives labels: a mapping key -> label (keys as str or bytes; labels integers, or
class names, then numbered in sorted order), a function of the key (str) returning an int
(None: no label), or a ``.json`` file holding such a mapping. ``record=fn(key: bytes,
value: bytes)`` maps any other layout: it returns a dict of member name -> value (converted as
the name says: ``members.value_bytes``; ``"{ext}"`` is the image's own extension, ``cls`` the
label), or None to leave the key out (neither packed nor listed as failed).

Keys are read on the thread that lists the jobs, values are converted on the writer's threads.
A seek to a record walks the keys alone (values are not read) from the nearest key of a sparse
index (every `INDEX_STEP`-th key, remembered by any walk that passes it).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import pickle
import pickletools
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import CorruptDataError, InvalidArgumentError, StokerError
from ..members import (
    Options,
    check_member_name,
    default_name,
    encode_pixels,
    image_format,
    is_pixels,
    member_kind,
)
from ..source import (
    Job,
    Sample,
    SampleFailure,
    Skipped,
    Source,
    SourceDamaged,
    failing_job,
    files_fingerprint,
    record_sample,
)
from .table import table_labels

if TYPE_CHECKING:
    import lmdb

# Keys conversion scripts (folder2lmdb and its many copies, CRNN's text-recognition LMDBs) store
# beside the samples: never samples themselves, unless their value is an image.
METADATA_KEYS = frozenset(
    {
        b"__keys__",
        b"__len__",
        b"__length__",
        b"__meta__",
        b"__metadata__",
        b"__info__",
        b"keys",
        b"len",
        b"length",
        b"num_samples",
        b"num-samples",
        b"nSamples",
        b"meta",
        b"metadata",
    }
)
INDEX_STEP = 4096  # the sparse index remembers every INDEX_STEP-th record's key
MAX_READERS = 1024
LABEL_KEYS = ("label", "target", "cls", "class")  # an unpickled dict's label
IMAGE_KEYS = ("image", "img")  # an unpickled dict's image
# The first opcodes of protocol 0 and 1 pickles (protocols 2+ start with PROTO, b"\x80").
_OLD_PICKLE_STARTS = frozenset(b"()]}cNIJKLMFGSTUVX")


def _lmdb() -> Any:
    try:
        import lmdb
    except ImportError:
        raise InvalidArgumentError(
            "reading an LMDB needs the lmdb package (pip install lmdb)"
        ) from None
    return lmdb


def key_text(key: bytes) -> str:
    """A key as text (undecodable bytes kept as surrogates): what labels are looked up by and
    sources.tsv records."""
    return key.decode("utf-8", "surrogateescape")


def is_pickle(data: bytes) -> bool:
    """Whether `data` is a pickle, from its opcodes alone (nothing is unpickled): a protocol 2-5
    header, or a protocol 0/1 opcode stream that parses to its STOP at the last byte."""
    if len(data) >= 2 and data[0] == 0x80:
        return 2 <= data[1] <= 5
    if len(data) < 2 or data[0] not in _OLD_PICKLE_STARTS or data[-1:] != b".":
        return False
    try:
        end = -1
        for _, _, pos in pickletools.genops(data):
            end = pos if pos is not None else end
        return end == len(data) - 1
    except Exception:  # an opcode's argument that does not parse: not a pickle
        return False


# --- Caffe's Datum ----------------------------------------------------------------------------


@dataclass
class Datum:
    """caffe.proto's Datum: 1 channels, 2 height, 3 width, 4 data, 5 label, 6 float_data,
    7 encoded."""

    channels: int = 0
    height: int = 0
    width: int = 0
    data: bytes = b""
    label: int | None = None
    floats: int = 0
    encoded: bool = False


_DATUM_WIRE_TYPES = {1: (0,), 2: (0,), 3: (0,), 4: (2,), 5: (0,), 6: (5, 2), 7: (0,)}
# A Datum's first byte is one of its fields' tags (all fit in one byte).
_DATUM_FIRST_BYTES = frozenset((f << 3) | w for f, ws in _DATUM_WIRE_TYPES.items() for w in ws)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError(f"a varint at byte {pos} runs past the end")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ValueError(f"a varint longer than 10 bytes ends at byte {pos}")


def _int32(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def parse_datum(buf: bytes) -> Datum:
    """A Datum from its protobuf bytes, every length checked against what is left of `buf`
    before it is used; ValueError for anything else (an unknown field, a wrong wire type)."""
    d = Datum()
    pos, seen = 0, False
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        field, wire = tag >> 3, tag & 7
        if wire not in _DATUM_WIRE_TYPES.get(field, ()):
            raise ValueError(f"field {field} of wire type {wire} at byte {pos} is not a Datum's")
        if wire == 0:
            v, pos = _varint(buf, pos)
            if field == 1:
                d.channels = _int32(v)
            elif field == 2:
                d.height = _int32(v)
            elif field == 3:
                d.width = _int32(v)
            elif field == 5:
                d.label = _int32(v)
            else:
                d.encoded = v != 0
        elif wire == 5:
            if pos + 4 > len(buf):
                raise ValueError("a float_data value runs past the end")
            pos += 4
            d.floats += 1
        else:
            n, pos = _varint(buf, pos)
            if n > len(buf) - pos:
                raise ValueError(f"a field of {n} bytes at byte {pos}, {len(buf) - pos} are left")
            if field == 4:
                d.data = buf[pos : pos + n]
            elif n % 4:
                raise ValueError(f"packed float_data of {n} bytes, not a multiple of 4")
            else:
                d.floats += n // 4
            pos += n
        seen = True
    if not seen:
        raise ValueError("empty")
    return d


def datum_values(d: Datum, opts: Options) -> list[tuple[str, Any]]:
    """The image of a Datum: its encoded bytes, or its raw CHW pixels as a PNG."""
    if d.encoded:
        if not _readable_image(d.data):
            raise ValueError(
                f"an encoded Caffe Datum whose {len(d.data)} bytes of data are not an image "
                f"(starting {d.data[:16]!r})"
            )
        return [("{ext}", d.data)]
    if not d.data:
        what = f"{d.floats} float_data values" if d.floats else "no data"
        raise ValueError(f"a Caffe Datum of {what} holds no image: map it with record=fn")
    c, h, w = d.channels, d.height, d.width
    if c not in (1, 3, 4) or h <= 0 or w <= 0 or c * h * w != len(d.data):
        raise ValueError(
            f"a raw Caffe Datum of {len(d.data)} bytes of pixels, its shape says channels={c}, "
            f"height={h}, width={w}"
        )
    import numpy as np

    hwc = np.frombuffer(d.data, np.uint8).reshape(c, h, w).transpose(1, 2, 0)
    if c >= 3:  # Caffe stores OpenCV's BGR(A)
        hwc = hwc[:, :, [2, 1, 0, 3][:c]]
    return [("{ext}", encode_pixels(np.ascontiguousarray(hwc), "png", opts.quality))]


def _readable_image(data: bytes) -> bool:
    """An image stoker decodes, or one Pillow recognises (made a PNG by members.value_bytes)."""
    if image_format(data) is not None:
        return True
    try:
        from PIL import Image
    except ImportError:
        return False
    try:
        with Image.open(io.BytesIO(data)):  # the header only
            return True
    except Exception:  # Pillow raises many kinds for bytes that are no image
        return False


# --- values made members ---------------------------------------------------------------------


def _kind_of(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "image" if image_format(bytes(value[:16])) else "bytes"
    if isinstance(value, str):
        return "text"
    if is_pixels(value):
        return "image"
    if isinstance(value, (dict, list)):
        return "json"
    return "array"  # numbers, numpy and torch arrays


def unpickled_values(obj: Any) -> tuple[list[tuple[str, Any]], Any]:
    """(members, label) of an unpickled value: an image, (image, label), or a dict."""
    if isinstance(obj, (bytes, bytearray)) or is_pixels(obj):
        return [("{ext}", obj)], None
    if isinstance(obj, (tuple, list)) and 1 <= len(obj) <= 2:
        return [("{ext}", obj[0])], obj[1] if len(obj) == 2 else None
    if not isinstance(obj, Mapping):
        raise ValueError(
            f"an unpickled {type(obj).__name__} is none of an image, (image, label) or a dict: "
            "map it with record=fn"
        )
    values: list[tuple[str, Any]] = []
    label = None
    has_image = any(str(k).lower() in IMAGE_KEYS for k in obj)
    for k, v in obj.items():
        name = str(k)
        if name.lower() in LABEL_KEYS:
            label = v
        elif name.lower() in IMAGE_KEYS:
            values.append(("{ext}", v))
        elif v is None:
            continue
        elif member_kind(name) != "bytes":  # already a member name: jpg, seg.png, txt, feat.npy
            values.append((name, v))
        else:
            kind = _kind_of(v)
            first = kind == "image" and not has_image
            has_image |= first
            values.append((default_name(name, kind, first), v))
    return values, label


def _label_mapping(mapping: Mapping[Any, Any], what: str) -> tuple[dict[str, int], list[str]]:
    keys = [key_text(bytes(k)) if isinstance(k, (bytes, bytearray)) else str(k) for k in mapping]
    values = [v.item() if hasattr(v, "item") else v for v in mapping.values()]
    ints, classes = table_labels(Path(what), values)
    return dict(zip(keys, ints, strict=True)), classes


@dataclass
class _Opened:
    """An environment open in this process: lmdb opens a file once per process, so every
    source reading it shares it, the last to close it closing it. A forked child (a DataLoader
    worker, multiprocessing) cannot open it again and goes on with its parent's: read-only and
    lock-free, nothing of it but the mapping is shared, and the child's copy is its own."""

    env: lmdb.Environment
    metadata: frozenset[bytes]  # the METADATA_KEYS it holds
    pid: int
    users: int = 0


_OPENED: dict[tuple[str, bool], _Opened] = {}
_OPENED_LOCK = threading.Lock()


def _acquire(path: Path, subdir: bool) -> _Opened:
    with _OPENED_LOCK:
        name = (os.path.realpath(path), subdir)
        opened = _OPENED.get(name)
        if opened is None:
            opened = _OPENED[name] = _Opened(*_open_env(path, subdir), os.getpid())
        opened.pid = os.getpid()  # a forked child's from now on
        opened.users += 1
        return opened


def _release(opened: _Opened) -> None:
    with _OPENED_LOCK:
        if opened.pid != os.getpid():
            return
        opened.users -= 1
        if opened.users <= 0:
            opened.env.close()
            name = next((k for k, v in _OPENED.items() if v is opened), None)
            if name is not None:
                del _OPENED[name]


def _open_env(path: Path, subdir: bool) -> tuple[lmdb.Environment, frozenset[bytes]]:
    """Opens read-only without a lock file, after checking that the file holds every page
    its meta page counts: a file cut short is mapped all the same, and reading past its end
    is a SIGBUS."""
    lmdb = _lmdb()
    try:
        env = lmdb.open(
            str(path.parent if subdir else path),
            subdir=subdir,
            readonly=True,
            lock=False,
            readahead=False,
            meminit=False,
            max_readers=MAX_READERS,
        )
    except lmdb.Error as e:
        cls: type[StokerError] = InvalidArgumentError
        if isinstance(e, (lmdb.InvalidError, lmdb.CorruptedError, lmdb.VersionMismatchError)):
            cls = CorruptDataError
        raise cls(f"{path}: cannot be opened as an LMDB: {e}", shard=str(path),
                  reason=str(e)) from None  # fmt: skip
    try:
        psize = env.stat()["psize"]
        need = (env.info()["last_pgno"] + 1) * psize
        size = os.path.getsize(path)
        if size < need:
            raise CorruptDataError(
                f"{path}: truncated: {size} bytes, its meta page says it holds "
                f"{need // psize} pages of {psize} bytes ({need} bytes)",
                shard=str(path),
                reason="truncated",
            )
        metadata = set()
        with env.begin() as txn:
            for key in METADATA_KEYS:
                try:
                    value = txn.get(key)
                except lmdb.Error:  # damage the walk over the keys reports where it is
                    continue
                if value is not None and image_format(value[:16]) is None:
                    metadata.add(key)
    except BaseException:
        env.close()
        raise
    return env, frozenset(metadata)


class LmdbSource(Source):
    format = "lmdb"

    def __init__(
        self,
        src: str | os.PathLike,
        opts: Options,
        label: Any = None,
        record: Callable[[bytes, bytes], Mapping[str, Any] | None] | None = None,
        allow_pickle: bool | None = None,
    ):
        path = Path(src)
        if path.is_dir():
            self.path, self.subdir = path / "data.mdb", True
            if not self.path.is_file():
                raise InvalidArgumentError(f"{path}: not an LMDB environment (no data.mdb in it)")
        elif path.is_file():  # data.mdb: its folder, as lmdb opens it; other names on their own
            self.path, self.subdir = path, path.name == "data.mdb"
        else:
            raise InvalidArgumentError(f"{path}: no such LMDB file or folder")
        if record is not None and not callable(record):
            raise InvalidArgumentError(
                f"record must be a function fn(key, value) -> dict, not {type(record).__name__}"
            )
        self.opts, self.record, self.allow_pickle = opts, record, bool(allow_pickle)
        self.label_spec = label
        self.label_file: Path | None = None
        self._labels: dict[str, int] | None = None
        classes: list[str] = []
        if isinstance(label, (str, os.PathLike)):
            self.label_file = Path(os.path.expanduser(os.fspath(label)))
            if self.label_file.suffix.lower() != ".json" or not self.label_file.is_file():
                raise InvalidArgumentError(
                    f"label={os.fspath(label)!r}: an LMDB's labels are a mapping key -> label, a "
                    "function of the key, or a .json file of {key: label}, and this is no .json "
                    "file"
                )
        elif isinstance(label, Mapping):
            self._labels, classes = _label_mapping(label, "label=")
        elif label is not None and not callable(label):
            raise InvalidArgumentError(
                f"label= for an LMDB is a mapping key -> label, a function of the key or a .json "
                f"file, not a {type(label).__name__}"
            )
        if self.label_file is not None:
            self._labels, classes = self._read_label_file()
        # Class names number the labels in sorted order; integers need no names.
        self.classes = None if all(c.isdigit() for c in classes) else classes
        self._env: _Opened | None = None
        self._metadata: frozenset[bytes] = frozenset()
        self._index: list[bytes] = []
        self._check_first_value()

    # --- the environment, opened lazily, once per process ------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_env=None, _index=[])
        if self.label_file is not None:
            state["_labels"] = None  # read again from the file
        return state

    def _read_label_file(self) -> tuple[dict[str, int], list[str]]:
        assert self.label_file is not None
        try:
            mapping = json.loads(self.label_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise InvalidArgumentError(f"{self.label_file}: not a JSON file: {e}") from None
        if not isinstance(mapping, dict):
            raise InvalidArgumentError(
                f"{self.label_file}: the labels must be a JSON object {{key: label}}"
            )
        return _label_mapping(mapping, str(self.label_file))

    def _open(self) -> lmdb.Environment:
        if self._env is None or self._env.pid != os.getpid():
            self._env = _acquire(self.path, self.subdir)
            self._metadata = self._env.metadata
        return self._env.env

    def close(self) -> None:
        if self._env is not None:
            _release(self._env)
        self._env = None

    def _check_first_value(self) -> None:
        """Refuses pickled values before anything is packed, unless allowed or mapped."""
        if self.record is not None or self.allow_pickle:
            return
        env = self._open()
        lmdb = _lmdb()
        with env.begin() as txn:
            try:
                key, value = next(
                    (bytes(k), bytes(v)) for k, v in txn.cursor() if k not in self._metadata
                )
            except StopIteration:
                return
            except lmdb.Error as e:
                raise CorruptDataError(f"{self.path}: the LMDB is damaged at its first key: {e}",
                                       shard=str(self.path), reason=str(e)) from None  # fmt: skip
            if is_pickle(value):
                raise InvalidArgumentError(
                    f"{self.path}: its values are pickled Python objects (key "
                    f"{key_text(key)!r} starts {value[:8]!r}); stoker never unpickles data "
                    "unless allow_pickle=True, since unpickling runs code the data names. "
                    "Pass allow_pickle=True for data you trust, or record=fn(key, value) -> "
                    "dict of members to decode the values yourself"
                )

    # --- records ------------------------------------------------------------------------------

    def __len__(self) -> int:
        env = self._open()
        return env.stat()["entries"] - len(self._metadata)

    def jobs(self, start: int = 0, stop: int | None = None) -> Iterator[Job]:
        lmdb = _lmdb()
        opened = _acquire(self.path, self.subdir)  # its own: close() cannot end a walk
        try:
            with opened.env.begin() as txn:
                yield from self._walk(txn.cursor(), opened.metadata, start, stop, lmdb.Error)
        finally:
            _release(opened)

    def _walk(
        self,
        cursor: lmdb.Cursor,
        metadata: frozenset[bytes],
        start: int,
        stop: int | None,
        error: type[Exception],
    ) -> Iterator[Job]:
        """The jobs of records [start, stop): keys alone are read up to `start`, from the
        nearest key the sparse index holds."""
        key: bytes | None = None
        position = 0
        try:
            i = min(start // INDEX_STEP, len(self._index) - 1)
            if i > 0 and cursor.set_key(self._index[i]):
                position = i * INDEX_STEP
            keys = cursor.iternext(keys=True, values=False)
        except error as e:
            yield failing_job(SourceDamaged(f"{self.path}", f"the LMDB is damaged: {e}"))
            return
        while stop is None or position < stop:
            try:
                raw = next(keys, None)
                if raw is None:
                    return
                key = bytes(raw)  # bytes already (buffers=False): not copied
                if key in metadata:
                    continue
                if position == len(self._index) * INDEX_STEP:
                    self._index.append(key)
                value = bytes(cursor.value()) if position >= start else None
            except error as e:
                after = f"after key {key_text(key)!r}" if key is not None else "at its start"
                yield failing_job(SourceDamaged(f"{self.path}: {after}",
                                                f"the LMDB is damaged: {e}"))  # fmt: skip
                return
            if value is not None:
                text = key_text(key)
                yield Job(self._where(text), -1, text,
                          functools.partial(self._make, key, value))  # fmt: skip
            position += 1

    def _where(self, text: str) -> str:
        return f"{self.path}: key {text!r}"

    def _label(self, text: str, where: str) -> Any:
        if self.label_spec is None:
            return None
        if callable(self.label_spec) and not isinstance(self.label_spec, Mapping):
            try:
                return self.label_spec(text)
            except Exception as e:
                raise SampleFailure(where, f"label({text!r}) raised {type(e).__name__}: {e}") from e
        if self._labels is None:
            self._labels = self._read_label_file()[0]
        label = self._labels.get(text)
        if label is None:
            raise SampleFailure(where, f"the labels ({self.label_file or 'label='}) have no "
                                       "entry for this key")  # fmt: skip
        return label if label >= 0 else None

    def _make(self, key: bytes, value: bytes) -> Sample:
        where = self._where(key_text(key))
        if self.record is not None:
            try:
                mapped = self.record(key, value)
            except Exception as e:
                raise SampleFailure(where, f"record() raised {type(e).__name__}: {e}") from e
            if mapped is None:
                raise Skipped(where, "record() returned None")
            label = self._label(key_text(key), where)
            if not isinstance(mapped, Mapping):
                raise SampleFailure(
                    where, f"record() must return a dict of members or None, not {mapped!r:.60}"
                )
            try:
                values = [(check_member_name(str(n), "record()"), v) for n, v in mapped.items()]
            except StokerError as e:
                raise SampleFailure(where, str(e)) from None
            return record_sample(values, where, self.opts, label)
        label = self._label(key_text(key), where)
        try:
            values, own = self._decode(value)
        except (ValueError, TypeError, StokerError) as e:
            raise SampleFailure(where, str(e)) from e
        return record_sample(values, where, self.opts, own if label is None else label)

    def _decode(self, value: bytes) -> tuple[list[tuple[str, Any]], Any]:
        """(members, label) of a value, by its first bytes."""
        if is_pickle(value):
            if not self.allow_pickle:
                raise ValueError(
                    f"a pickled value (starting {value[:8]!r}) is never unpickled unless "
                    "allow_pickle=True (unpickling runs code the data names)"
                )
            try:
                obj = pickle.loads(value)
            except Exception as e:  # a missing class, a damaged pickle: any exception
                raise ValueError(f"the pickle cannot be loaded: {type(e).__name__}: {e}") from e
            return unpickled_values(obj)
        if image_format(value) is not None:
            return [("{ext}", value)], None
        datum_error = None
        if value[:1] and value[0] in _DATUM_FIRST_BYTES:
            try:
                datum = parse_datum(value)
            except ValueError as e:
                datum_error = str(e)
            else:
                label = datum.label if datum.label is not None and datum.label >= 0 else None
                return datum_values(datum, self.opts), label
        if _readable_image(value):
            return [("{ext}", value)], None
        raise ValueError(
            f"the value ({len(value)} bytes, starting {value[:16]!r}) is not an encoded image "
            "(JPEG, PNG, WebP or one Pillow reads), a Caffe Datum or a pickle"
            + (f" (as a Datum: {datum_error})" if datum_error else "")
            + "; map other layouts with record=fn(key, value) -> dict"
        )

    def fingerprint(self) -> str:
        paths = [self.path] + ([self.label_file] if self.label_file is not None else [])
        label: Any = None
        if self.label_file is None and self._labels is not None:
            digest = json.dumps(sorted(self._labels.items())).encode()
            label = hashlib.sha256(digest).hexdigest()
        elif callable(self.label_spec):
            label = _qualified_name(self.label_spec)
        record = None if self.record is None else _qualified_name(self.record)
        return files_fingerprint(paths, label, record, self.allow_pickle)


def _qualified_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
