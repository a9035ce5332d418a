"""HDF5 files: datasets whose first dimension is the sample, one row per sample.

Without ``members``, every dataset (nested ones by path, ``group/name``) whose first dimension is
the file's sample count takes part: encoded images (variable-length uint8, opaque, or bytes rows
that start as an image does) become image members (``{ext}`` for the first, ``NAME.{ext}`` the
others), an integer ``label``/``labels``/``target``/``targets``/``y``/``cls`` dataset the label
(its names from a ``classes``/``class_names`` attribute on it or on the file), numbers ``NAME.npy``
members and strings ``NAME.txt``. A file of numbers only is written as an array pack (`columns`),
its rows read from the file a chunk at a time.

h5py is read on one thread: `jobs()` (the writer's own thread) reads rows a chunk at a time and
`make()` (a writer thread) turns them into members. The file is opened per process, on first use:
the source pickles as its path and choices.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CorruptDataError, InvalidArgumentError
from ..members import Options, check_member_name, default_name, image_format, member_kind
from ..source import (
    Job,
    SampleFailure,
    Source,
    failing_job,
    files_fingerprint,
    record_sample,
)

LABEL_NAMES = ("label", "labels", "target", "targets", "y", "cls")
CLASS_NAMES = ("classes", "class_names")
_CHUNK_ROWS = 256  # rows read at a time, at most...
_CHUNK_BYTES = 32 << 20  # ...and about this many bytes of them
_SNIFF_ROWS = 4  # rows looked at to tell encoded images from other bytes

log = logging.getLogger("stoker")


def _h5py() -> Any:
    try:
        import h5py  # type: ignore[import-untyped]
    except ImportError:
        raise InvalidArgumentError("reading HDF5 files needs h5py (pip install h5py)") from None
    return h5py


@dataclass(frozen=True)
class Dataset:
    """What the source knows of one dataset of the file."""

    path: str
    shape: tuple[int, ...]
    dtype: str  # as errors show it
    rows: str  # how a row reads: "bytes", "string", "array", "vlen" (numbers), "" (not at all)
    integer: bool
    row_bytes: int  # a fixed-size row's bytes; 0 when rows vary

    def __str__(self) -> str:
        return f"{self.path} {self.shape} {self.dtype}"


@dataclass(frozen=True)
class Member:
    name: str  # the member's name ("{ext}": the image's own extension)
    dataset: str
    as_bytes: bool  # rows are passed as bytes (encoded images, strings), not arrays


def _describe(h5py: Any, path: str, ds: Any) -> Dataset:
    dt = ds.dtype
    string, vlen = h5py.check_string_dtype(dt), h5py.check_vlen_dtype(dt)
    if string is not None:
        rows, name = "string", f"{'vlen ' if string.length is None else ''}{string.encoding} text"
    elif vlen is not None:
        vlen = np.dtype(vlen)
        rows = "bytes" if vlen == np.uint8 else ("vlen" if vlen.kind in "biuf" else "")
        name = f"vlen {vlen}"
    elif dt.kind == "V" and dt.fields is None and dt.subdtype is None:
        rows, name = "bytes", f"opaque {dt.itemsize} bytes"
    else:
        rows, name = ("array" if dt.kind in "biuf" else ""), str(dt)
    fixed = rows == "array" or dt.kind == "V" or (string is not None and string.length)
    row_bytes = int(np.prod(ds.shape[1:], dtype=np.int64)) * dt.itemsize if fixed else 0
    return Dataset(path, tuple(ds.shape), name, rows, rows == "array" and dt.kind in "iu",
                   row_bytes)  # fmt: skip


def _row_bytes(value: Any) -> bytes:
    """A row of encoded bytes as bytes: a vlen uint8 or fixed uint8 row, an opaque value, a
    string's bytes."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return np.asarray(value).tobytes()


def _sniff_images(ds: Any) -> bool:
    """Whether a bytes dataset's first rows are encoded images."""
    head = ds[: min(_SNIFF_ROWS, ds.shape[0])]
    return any(image_format(_row_bytes(v)) is not None for v in head)


def _is_label(d: Dataset) -> bool:
    return d.integer and len(d.shape) in (1, 2) and d.shape[1:] in ((), (1,))


def _conventional_label(found: dict[str, Dataset], named: dict[str, str]) -> str | None:
    """The integer dataset named as a label is (label, labels, target...; the first of those
    names, the least nested), unless the members store it."""
    candidates = [
        d.path
        for d in found.values()
        if d.path.rpartition("/")[2].lower() in LABEL_NAMES
        and _is_label(d)
        and d.path not in named.values()
    ]
    if not candidates:
        return None
    return min(
        candidates, key=lambda p: (LABEL_NAMES.index(p.rpartition("/")[2].lower()), p.count("/"), p)
    )


def _names(value: Any, where: str) -> list[str]:
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str):  # JSON text of a list
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if value is None or isinstance(value, (str, dict)) or not hasattr(value, "__iter__"):
        raise InvalidArgumentError(f"{where}: class names must be a list of names")
    return [v.decode() if isinstance(v, bytes) else str(v) for v in value]


def open_file(path: Path) -> Any:
    """The file, open for reading, or a clear error naming it."""
    h5py = _h5py()
    if not path.is_file():
        raise InvalidArgumentError(f"{path}: no such file")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        try:
            signed = h5py.is_hdf5(path)
        except OSError:
            signed = False
        if not signed:
            raise InvalidArgumentError(f"{path}: not an HDF5 file ({e})") from None
        message = f"the HDF5 file is truncated or damaged: {e}"
        raise CorruptDataError(f"{path}: {message}", reason=message, shard=str(path)) from None


class LabelRows:
    """A label dataset as an int64 column of shape (N,), read a slice at a time."""

    def __init__(self, ds: Any):
        self.ds = ds
        self.shape = (ds.shape[0],)
        self.dtype = np.dtype(np.int64)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: Any) -> np.ndarray:
        return np.asarray(self.ds[rows]).reshape(-1).astype(np.int64)


class Hdf5Source(Source):
    format = "hdf5"

    def __init__(
        self,
        src: str | os.PathLike,
        opts: Options,
        members: Mapping[str, str] | None = None,
        label: str | None = None,
    ):
        self.path, self.opts = Path(src), opts
        self._file: Any = None
        self._pid = 0
        h5py = _h5py()
        f = open_file(self.path)
        try:
            self._choose(h5py, f, members, label)
        except (OSError, RuntimeError, KeyError) as e:
            message = f"the HDF5 file is damaged: {e}"
            raise CorruptDataError(f"{self.path}: {message}", reason=message,
                                   shard=str(self.path)) from None  # fmt: skip
        finally:
            f.close()

    # --- what the file holds, and what becomes of it -----------------------------------------

    def _choose(self, h5py: Any, f: Any, members: Mapping[str, str] | None, label: str | None):
        found: dict[str, Dataset] = {}

        def visit(path: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset) and obj.shape:  # not scalars, not empty ones
                found[path] = _describe(h5py, path, obj)

        f.visititems(visit)
        if not found:
            raise InvalidArgumentError(f"{self.path}: the HDF5 file holds no datasets")

        def unknown(what: str) -> InvalidArgumentError:
            listing = "; ".join(str(d) for d in found.values())
            return InvalidArgumentError(f"{self.path}: no dataset {what!r} (it holds: {listing})")

        names = dict(members or {})
        for name, path in names.items():
            check_member_name(name, f"{self.path}: members")
            if path not in found:
                raise unknown(path)
            if member_kind(name) == "label":  # members={"cls": "labels"}
                if label is not None and label != path:
                    raise InvalidArgumentError(
                        f"{self.path}: members names {path!r} as the label, label= names "
                        f"{label!r}: name one"
                    )
                label = path
        names = {k: v for k, v in names.items() if member_kind(k) != "label"}
        label = label if label is not None else _conventional_label(found, names)
        if label is not None:
            if label not in found:
                raise unknown(label)
            if not _is_label(found[label]):
                raise InvalidArgumentError(
                    f"{self.path}: the label dataset {found[label]} must hold one integer a row"
                )
        self.label_dataset = label

        if label is not None:
            n = found[label].shape[0]
        elif names:
            n = found[next(iter(names.values()))].shape[0]
        else:  # the most common first dimension (the larger of equals)
            counts = Counter(d.shape[0] for d in found.values() if d.rows)
            if not counts:
                raise InvalidArgumentError(
                    f"{self.path}: no dataset of numbers, bytes or text (it holds: "
                    + "; ".join(str(d) for d in found.values())
                    + ")"
                )
            n = max(counts, key=lambda k: (counts[k], k))
        self.n = n
        self.members = self._named(found, names) if members else self._conventional(f, found)
        if not self.members and label is None:
            raise InvalidArgumentError(f"{self.path}: nothing to pack")
        self.classes = self._class_names(h5py, f) if label is not None else None
        # Numbers only, each a fixed shape: an array pack, its fields the members' names.
        self.array_pack = all(
            found[m.dataset].rows == "array" and not m.as_bytes
            and member_kind(m.name) in ("array", "boxes", "bytes")
            for m in self.members
        )  # fmt: skip
        self._check_names(found)
        self._fixed_bytes = sum(found[m.dataset].row_bytes for m in self.members)
        self._varying = {m.dataset for m in self.members if not found[m.dataset].row_bytes}
        self._varying_bytes = self._guess_varying_bytes(f)

    def _named(self, found: dict[str, Dataset], names: dict[str, str]) -> list[Member]:
        chosen = []
        for name, path in names.items():
            d = found[path]
            if d.shape[0] != self.n:
                raise InvalidArgumentError(
                    f"{self.path}: the datasets have different numbers of rows: "
                    + ", ".join(str(found[p]) for p in [*names.values(), self.label_dataset] if p)
                )
            kind = member_kind(name.replace("{ext}", "png"))
            numbers = d.rows in ("array", "vlen")
            if kind in ("image", "mask"):  # encoded rows (bytes, or a uint8 row each), or pixels
                as_bytes = d.rows in ("bytes", "string") or (
                    d.dtype == "uint8" and len(d.shape) == 2
                )
                fits = as_bytes or (d.dtype == "uint8" and len(d.shape) in (3, 4))
            else:
                as_bytes = d.rows in ("bytes", "string")
                fits = {
                    "array": numbers,
                    "boxes": numbers,
                    "text": d.rows == "string",
                    "json": bool(d.rows),
                    "bytes": as_bytes or d.rows == "array",
                }[kind]
            if not fits:
                raise InvalidArgumentError(
                    f"{self.path}: member {name!r} ({kind}) cannot hold dataset {d}"
                )
            chosen.append(Member(name, path, as_bytes))
        return chosen

    def _conventional(self, f: Any, found: dict[str, Dataset]) -> list[Member]:
        chosen, left_out = [], []
        first_image = True
        for d in found.values():
            if d.path == self.label_dataset:
                continue
            if d.shape[0] != self.n or not d.rows:
                left_out.append(str(d))
                continue
            if d.path.rpartition("/")[2].lower() in CLASS_NAMES and d.rows == "string":
                continue  # class names, not per-sample text
            encoded = d.rows == "bytes" or (
                (d.rows == "string" or (d.dtype == "uint8" and len(d.shape) == 2))
                and _sniff_images(f[d.path])
            )
            if encoded:
                kind = "image"
            else:
                kind = "text" if d.rows == "string" else "array"
            chosen.append(Member(default_name(d.path, kind, first_image), d.path,
                                 encoded or kind == "text"))  # fmt: skip
            first_image &= kind != "image"
        chosen.sort(key=lambda m: "{ext}" not in m.name)  # images first, in the file's order
        if left_out:
            log.info("%s: datasets left out (not %d rows of numbers, bytes or text): %s",
                     self.path, self.n, "; ".join(left_out))  # fmt: skip
        return chosen

    def _check_names(self, found: dict[str, Dataset]) -> None:
        """Each member a name of its own (each field, in an array pack, with the label's); in a
        tar pack, numbers under a name that stores bytes are refused (they need ``.npy``)."""
        seen: dict[str, str] = {}
        if self.array_pack and self.label_dataset is not None:
            seen["label"] = self.label_dataset
        for m in self.members:
            name = m.name.removesuffix(".npy") if self.array_pack else m.name
            if name in seen:
                raise InvalidArgumentError(
                    f"{self.path}: datasets {seen[name]!r} and {m.dataset!r} would both be "
                    f"{name!r}: name them with members={{name: dataset}}"
                )
            seen[name] = m.dataset
            if not self.array_pack and member_kind(m.name) == "bytes" and not m.as_bytes:
                raise InvalidArgumentError(
                    f"{self.path}: member {m.name!r} stores bytes; name it {m.name}.npy to store "
                    f"the numbers of dataset {found[m.dataset]}"
                )

    def _class_names(self, h5py: Any, f: Any) -> list[str] | None:
        holders = [f[self.label_dataset], f]
        for holder in holders:
            for key in CLASS_NAMES:
                if key in holder.attrs:
                    return _names(holder.attrs[key], f"{self.path}: {holder.name} attribute {key}")
        for key in CLASS_NAMES:
            obj = f.get(key)
            if isinstance(obj, h5py.Dataset) and obj.ndim == 1:
                return _names(obj[()], f"{self.path}: dataset {key}")
        return None

    def _guess_varying_bytes(self, f: Any) -> int:
        """Bytes of a row's variable-length values, from the first rows (for chunk sizes)."""
        total = 0
        for path in self._varying:
            head = f[path][: min(_SNIFF_ROWS, self.n)]
            total += sum(len(_row_bytes(v)) for v in head) // max(1, len(head))
        return total

    # --- the Source interface ------------------------------------------------------------------

    def __len__(self) -> int:
        return self.n

    def _handle(self) -> Any:
        if self._file is None or self._pid != os.getpid():
            self._file, self._pid = open_file(self.path), os.getpid()
        return self._file

    @property
    def columns(self) -> dict[str, Any] | None:  # type: ignore[override]
        """An array pack's columns (numbers only): field name -> the file's dataset, read by
        pack_arrays a chunk at a time."""
        if not self.array_pack:
            return None
        f = self._handle()
        columns = {m.name.removesuffix(".npy"): f[m.dataset] for m in self.members}
        if self.label_dataset is not None:
            columns["label"] = LabelRows(f[self.label_dataset])
        return columns

    def _read(self, path: str, start: int, stop: int) -> list[Any]:
        """Rows [start, stop) of a dataset; a row that cannot be read is its SampleFailure."""
        ds = self._handle()[path]
        try:
            return list(ds[start:stop])
        except (OSError, RuntimeError, ValueError):  # find the rows that cannot be read
            rows: list[Any] = []
            for i in range(start, stop):
                try:
                    rows.append(ds[i])
                except (OSError, RuntimeError, ValueError) as e:
                    rows.append(SampleFailure(f"{self.path}: {path} row {i}",
                                              f"cannot be read: {e}"))  # fmt: skip
            return rows

    def jobs(self, start: int = 0, stop: int | None = None) -> Iterator[Job]:
        stop = self.n if stop is None else min(stop, self.n)
        first = self.members[0].dataset if self.members else self.label_dataset
        row_bytes = self._fixed_bytes + self._varying_bytes
        at = start
        while at < stop:
            per_chunk = max(1, min(_CHUNK_ROWS, _CHUNK_BYTES // max(1, row_bytes)))
            end = min(stop, at + per_chunk)
            columns = [self._read(m.dataset, at, end) for m in self.members]
            labels = self._read(self.label_dataset, at, end) if self.label_dataset else None
            read = 0
            for j, i in enumerate(range(at, end)):
                values: list[tuple[str, Any]] = []
                failure = None
                for m, column in zip(self.members, columns):
                    value = column[j]
                    if isinstance(value, SampleFailure):
                        failure = failure or value
                    else:
                        value = _row_bytes(value) if m.as_bytes else value
                        if m.dataset in self._varying:
                            read += len(value) if m.as_bytes else np.asarray(value).nbytes
                        values.append((m.name, value))
                label = None
                if labels is not None:
                    label = labels[j]
                    if isinstance(label, SampleFailure):
                        failure = failure or label
                    else:
                        label = np.asarray(label).reshape(())
                if failure is not None:
                    yield failing_job(failure)
                    continue
                where = f"{self.path}: {first} row {i}"
                yield Job(where, -1, None, functools.partial(record_sample, values, where,
                                                             self.opts, label))  # fmt: skip
            if self._varying:  # what the rows just read held, for the next chunk's size
                row_bytes = self._fixed_bytes + read // max(1, end - at)
            at = end

    def fingerprint(self) -> str:
        return files_fingerprint(
            [self.path], [(m.name, m.dataset) for m in self.members], self.label_dataset
        )

    def close(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_file": None, "_pid": 0}
