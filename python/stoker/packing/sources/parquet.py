"""Parquet files and Hugging Face datasets: one sample a row, streamed with pyarrow in record
batches of bounded size (a Parquet file's row groups read a slice at a time, an Arrow file's
record batches memory-mapped), so a file of any size packs in flat memory.

A source is a Parquet file, a folder of them or a glob (an ``.arrow`` file too); a
``datasets.Dataset``, its ``save_to_disk`` folder, or its Parquet export. Hugging Face features
(the ``huggingface`` schema metadata, ``dataset_info.json`` or the object's own) say more than
the Arrow types: an ``Image`` is an image member (the first ``{ext}``, others
``{column}.{ext}``), a ``ClassLabel`` the label, its names the manifest's classes. Without them,
a ``struct<bytes, path>`` is an image, and a column named label/labels/cls/class the label.
Other columns: numbers and lists of numbers ``.npy``, strings ``.txt``, other nested values
``.json``, binary an image where it is one, else bytes. A key/__key__/id column is the record's
reference in sources.tsv.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

from ...errors import CorruptDataError, InvalidArgumentError
from ..members import Options, check_member_name, default_name, image_format, member_kind
from ..source import (
    Job,
    Sample,
    SampleFailure,
    Source,
    SourceDamaged,
    failing_job,
    files_fingerprint,
    reason,
    record_sample,
)

try:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - pyarrow comes with the datasets stoker packs
    raise InvalidArgumentError(
        "Parquet and Hugging Face sources need pyarrow (pip install pyarrow)"
    ) from None

# A record batch holds about this much (a row at least): images can be large, and a batch is
# alive while its rows' jobs are, two batches at most.
BATCH_BYTES = 32 << 20
READ_BUFFER = 1 << 20  # Parquet column chunks are read through buffers of this size
LABEL_COLUMNS = ("label", "labels", "cls", "class")
KEY_COLUMNS = ("key", "__key__", "id")
HF_METADATA = b"huggingface"

log = logging.getLogger("stoker")

# What a part of a source yields: (the batch's first row in the part, the batch), or the rows it
# cannot read, as one failure.
Batches = Iterator[Union[tuple[int, "pa.RecordBatch"], SourceDamaged]]


# --- parts: the files (or the Dataset object) a source's rows are in --------------------------


class _Part:
    name: str  # how `where` names it
    rows: int  # its records: its rows, and one more standing for what of it cannot be read
    schema: Any  # pa.Schema; None where the file cannot be read at all
    base: Path | None  # what an image's relative path is relative to
    path: Path | None = None
    broken: str | None = None  # why none of it can be read

    def batches(self, lo: int, hi: int, columns: list[str]) -> Batches:
        """Record batches of `columns` covering rows [lo, hi) (they may begin before lo)."""
        raise NotImplementedError


class _ParquetFile(_Part):
    """A Parquet file: its footer gives each row group's rows without reading any data, so
    any row is reached by reading only its row group."""

    def __init__(self, path: Path):
        self.path, self.name, self.base = path, str(path), path.parent
        self.groups: list[int] = []
        try:
            meta = pq.read_metadata(path)
            self.schema = meta.schema.to_arrow_schema()
            self.groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        except (pa.ArrowException, OSError) as e:
            self.schema, self.broken = None, f"not a readable Parquet file: {e}"
        self.rows = sum(self.groups) + (self.broken is not None)

    def batches(self, lo: int, hi: int, columns: list[str]) -> Batches:
        try:
            pf = pq.ParquetFile(self.path, pre_buffer=False, buffer_size=READ_BUFFER,
                                page_checksum_verification=True)  # fmt: skip
        except (pa.ArrowException, OSError) as e:
            yield SourceDamaged(self.name, f"cannot be opened: {e}")
            return
        with pf:
            first = 0
            for g, rows in enumerate(self.groups):
                end, row = first + rows, first
                if end > lo and first < hi:
                    size = _batch_rows(pf.metadata.row_group(g), columns)
                    try:
                        for batch in pf.iter_batches(size, row_groups=[g], columns=columns,
                                                     use_threads=False):  # fmt: skip
                            yield row, batch
                            row += batch.num_rows
                        if row != end:
                            raise ValueError(f"{row - first} rows, the footer says {rows}")
                    except (pa.ArrowException, OSError, ValueError) as e:
                        a, b = max(row, lo), min(end, hi)
                        if a < b:
                            yield SourceDamaged(
                                f"{self.name}: row group {g} (rows {a}-{b - 1})",
                                f"unreadable: {e}",
                                records=b - a,
                            )
                first = end
                if first >= hi:
                    break


def _batch_rows(group: Any, columns: list[str]) -> int:
    """Rows a batch of one row group holds to stay about BATCH_BYTES (from the footer's sizes
    of the columns read)."""
    size = sum(
        group.column(j).total_uncompressed_size
        for j in range(group.num_columns)
        if group.column(j).path_in_schema.split(".")[0] in columns
    )
    return max(1, min(group.num_rows, BATCH_BYTES * group.num_rows // max(size, 1)))


class _ArrowFile(_Part):
    """An Arrow IPC file (a Hugging Face cache or save_to_disk file is a stream, a Feather
    file the random-access format), memory-mapped: a batch is a view of the file, and skipping
    one reads nothing of its data."""

    def __init__(self, path: Path):
        self.path, self.name, self.base = path, str(path), path.parent
        self.schema = None
        rows = 0
        try:
            with pa.memory_map(str(path)) as mapped:
                reader = _ipc_reader(mapped)
                self.schema = reader.schema
                for batch in _ipc_batches(reader):
                    rows += batch.num_rows
        except (pa.ArrowException, OSError) as e:
            self.broken = f"not a readable Arrow file: {e}"
        self.rows = rows + (self.broken is not None)

    def batches(self, lo: int, hi: int, columns: list[str]) -> Batches:
        row = 0
        try:
            with pa.memory_map(str(self.path)) as mapped:
                for batch in _ipc_batches(_ipc_reader(mapped)):
                    if row + batch.num_rows > lo:
                        yield row, batch.select(columns)
                    row += batch.num_rows
                    if row >= hi:
                        return
        except (pa.ArrowException, OSError) as e:
            if lo <= row < hi:
                yield SourceDamaged(f"{self.name}: from row {row}", f"unreadable: {e}")


def _ipc_reader(mapped: Any) -> Any:
    if mapped.read(6) == b"ARROW1":
        mapped.seek(0)
        return pa.ipc.open_file(mapped)
    mapped.seek(0)
    return pa.ipc.open_stream(mapped)


def _ipc_batches(reader: Any) -> Iterator[Any]:
    if isinstance(reader, pa.ipc.RecordBatchFileReader):
        return (reader.get_batch(i) for i in range(reader.num_record_batches))
    return iter(reader)


class _DatasetRows(_Part):
    """A ``datasets.Dataset`` object, in its visible order (a shuffle's or select's indices
    applied): read in slices of about BATCH_BYTES."""

    def __init__(self, ds: Any):
        self.ds = ds
        files = [Path(f["filename"]) for f in ds.cache_files]
        self.base = files[0].parent if files else None
        self.name = "datasets.Dataset" + (f" in {self.base}" if self.base else "")
        self.rows = len(ds)
        self.schema = ds.data.schema

    def batches(self, lo: int, hi: int, columns: list[str]) -> Batches:
        table = self.ds.data.table.select(columns)
        row_bytes = table.nbytes / max(table.num_rows, 1)
        step = max(1, int(BATCH_BYTES // max(row_bytes, 1)))
        view = self.ds.with_format("arrow", columns=columns)
        for a in range(lo, hi, step):
            row = a
            for batch in view[a : min(a + step, hi)].to_batches():
                yield row, batch
                row += batch.num_rows


# --- columns: what each becomes -----------------------------------------------------------------


@dataclass(frozen=True)
class _Member:
    name: str  # the member's name ("{ext}": the encoded image's own extension)
    column: str
    cell: str  # how a cell becomes a value: "file", "numbers", "text" or "value"
    dtype: str | None = None  # the numpy dtype of "numbers"


@dataclass(frozen=True)
class _Label:
    column: str
    classes: tuple[str, ...] | None  # ClassLabel names; None: integers
    ids: Mapping[str, int] | None = None  # the column holds the class names: their ids


def _storage(t: Any) -> Any:
    return t.storage_type if isinstance(t, pa.ExtensionType) else t


def _is(t: Any, *kinds: str) -> bool:
    """Whether an Arrow type is one of `kinds` (pyarrow.types.is_<kind>; a kind this pyarrow
    does not know, such as binary_view before 16, is none)."""
    return any(getattr(pa.types, f"is_{k}", lambda _: False)(t) for k in kinds)


BINARY = ("binary", "large_binary", "fixed_size_binary", "binary_view")
LISTS = ("list", "large_list", "fixed_size_list", "list_view", "large_list_view")
TEXT = ("string", "large_string", "string_view", "temporal", "decimal")


def _is_file_struct(t: Any) -> bool:
    """Hugging Face's Image (and Audio...) storage: struct<bytes: binary, path: string>."""
    if not _is(t, "struct"):
        return False
    fields = {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
    return "bytes" in fields and set(fields) <= {"bytes", "path"} and _is(fields["bytes"], *BINARY)


def _has_binary(t: Any) -> bool:
    t = _storage(t)
    if _is(t, "struct"):
        return any(_has_binary(t.field(i).type) for i in range(t.num_fields))
    if _is(t, "map"):
        return _has_binary(t.key_type) or _has_binary(t.item_type)
    return _has_binary(t.value_type) if _is(t, *LISTS) else _is(t, *BINARY)


def _cell(t: Any) -> tuple[str, str | None]:
    """(how a cell of this Arrow type becomes a value, the numpy dtype of numbers)."""
    t = _storage(t)
    if _is(t, "dictionary"):
        t = t.value_type
    if _is_file_struct(t) or _is(t, *BINARY):
        return "file", None
    leaf = t
    while _is(leaf, *LISTS):
        leaf = _storage(leaf.value_type)
    if _is(leaf, "integer", "floating", "boolean"):
        return "numbers", np.dtype(leaf.to_pandas_dtype()).name
    if _is(t, *TEXT):
        return "text", None
    return "value", None


def _value(batch: Any, r: int, member: _Member, base: Path | None) -> Any:
    """A row's value of a member's column as record_sample takes it; None for a null."""
    array = batch.column(member.column)
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    value = array[r].as_py()
    if value is None:
        return None
    if member.cell == "file":
        if isinstance(value, dict):  # {"bytes": ..., "path": ...}: the file where no bytes
            data, path = value.get("bytes"), value.get("path")
            if data is None and path:
                file = Path(path)
                with open(file if file.is_absolute() or base is None else base / file, "rb") as f:
                    return f.read()
            return data
        return value
    if member.cell == "numbers":
        return np.asarray(value, dtype=member.dtype)
    if member.cell == "text" and not isinstance(value, str):
        return str(value)
    return value


def row_sample(
    batch: Any,
    r: int,
    members: tuple[_Member, ...],
    label: _Label | None,
    base: Path | None,
    where: str,
    opts: Options,
) -> Sample:
    """Row `r` of a record batch as a sample (on a writer thread). A null is a member the row
    does not have, but a null image fails."""
    values = []
    for m in members:
        try:
            value = _value(batch, r, m, base)
        except (OSError, ValueError, TypeError, pa.ArrowException) as e:
            raise SampleFailure(where, f"{m.column}: {reason(e)}") from e
        if value is not None or member_kind(m.name.replace("{ext}", "png")) in ("image", "mask"):
            values.append((m.name, value))
    return record_sample(values, where, opts, _label_value(batch, r, label, where))


def _label_value(batch: Any, r: int, label: _Label | None, where: str) -> int | None:
    if label is None:
        return None
    value = batch.column(label.column)[r].as_py()
    if value is None:
        return None
    if label.ids is not None:
        if str(value) not in label.ids:
            raise SampleFailure(where, f"{label.column}: {value!r} is not one of the classes")
        return label.ids[str(value)]
    if isinstance(value, bool) or not isinstance(value, int):
        raise SampleFailure(where, f"{label.column}: a label must be an integer, not {value!r}")
    if value < 0:  # a ClassLabel's -1: no label (a test split)
        return None
    if label.classes is not None and value >= len(label.classes):
        raise SampleFailure(
            where, f"{label.column}: label {value} is not one of the {len(label.classes)} classes"
        )
    return value


def _features(schema: Any) -> dict[str, Any]:
    """The Hugging Face features a Parquet or Arrow file's schema metadata carries ({} if
    none)."""
    raw = (schema.metadata or {}).get(HF_METADATA)
    if raw is None:
        return {}
    try:
        features = json.loads(raw)["info"]["features"]
    except (ValueError, KeyError, TypeError):
        return {}
    return features if isinstance(features, dict) else {}


def _feature_type(features: dict[str, Any], column: str) -> str | None:
    feature = features.get(column)
    return feature.get("_type") if isinstance(feature, dict) else None


# --- the sources ---------------------------------------------------------------------------------


class ParquetSource(Source):
    format = "parquet"

    def __init__(
        self,
        src: Any,
        opts: Options,
        members: Mapping[str, str] | None = None,
        label: str | None = None,
    ):
        self.src, self.opts = src, opts
        self.members_option, self.label_option = members, label
        self.parts = self._parts(src)
        self._plan(self._feature_dict())

    # The files (or the object) holding the rows; a subclass reads other sources.
    def _parts(self, src: Any) -> list[_Part]:
        return _file_parts(src)

    def _feature_dict(self) -> dict[str, Any]:
        for part in self.parts:
            if part.schema is not None:
                return _features(part.schema)
        return {}

    def _plan(self, features: dict[str, Any]) -> None:
        """Which columns become which members, which is the label and which the key."""
        readable = [p for p in self.parts if p.schema is not None]
        if not readable:
            broken = self.parts[0]
            raise CorruptDataError(f"{broken.name}: {broken.broken}", shard=broken.name)
        schema = readable[0].schema
        columns = list(schema.names)
        types = {name: schema.field(name).type for name in columns}

        def known(column: Any, what: str) -> str:
            if not isinstance(column, str) or column not in types:
                raise InvalidArgumentError(
                    f"{self.src!s:.200}: {what} names the column {column!r}; its columns are: "
                    + ", ".join(columns)
                )
            return column

        members: list[_Member] = []
        if self.members_option is not None:
            if not isinstance(self.members_option, Mapping) or not self.members_option:
                raise InvalidArgumentError(
                    "members must map member names to columns, e.g. {'jpg': 'image'}"
                )
            for name, column in self.members_option.items():
                check_member_name(name, f"{self.src!s:.200}: members")
                known(column, f"members[{name!r}]")
                members.append(_Member(name, column, *_cell(types[column])))
        label_column = None
        if self.label_option is not None:
            label_column = known(self.label_option, "label=")
        elif not any(member_kind(m.name) == "label" for m in members):
            label_column = self._default_label(columns, types, features)
        key = next((c for c in KEY_COLUMNS if c in types), None)
        if self.members_option is None:
            skipped = {label_column, "key", "__key__"}
            members = self._default_members(
                [c for c in columns if c not in skipped and not (c[:2] == c[-2:] == "__")],
                types,
                features,
            )
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(
                f"{self.src!s:.200}: two columns become the same member "
                f"({', '.join(sorted({n for n in names if names.count(n) > 1}))}): name them "
                "with members={'name': 'column', ...}"
            )
        self.label = self._label(label_column, types, features) if label_column else None
        self.classes = list(self.label.classes) if self.label and self.label.classes else None
        self.members = tuple(members)
        self.key = key
        wanted = [m.column for m in members] + [c for c in (label_column, key) if c]
        self.read_columns = list(dict.fromkeys(wanted))
        if not self.members and self.label is None:
            raise InvalidArgumentError(f"{self.src!s:.200}: no column to pack")
        for part in readable[1:]:
            missing = [c for c in self.read_columns if c not in part.schema.names]
            if missing:
                raise InvalidArgumentError(
                    f"{part.name}: no column {', '.join(missing)} (the first file has them); "
                    f"its columns are: {', '.join(part.schema.names)}"
                )

    def _default_label(
        self, columns: list[str], types: dict[str, Any], features: dict[str, Any]
    ) -> str | None:
        for c in columns:
            if _feature_type(features, c) == "ClassLabel":
                return c
        for c in columns:
            t = _storage(types[c])
            if c.lower() in LABEL_COLUMNS and _is(t, "integer", "string", "large_string"):
                return c
        return None

    def _label(self, column: str, types: dict[str, Any], features: dict[str, Any]) -> _Label:
        t = _storage(types[column])
        if _is(t, "dictionary"):
            t = t.value_type
        if _feature_type(features, column) == "ClassLabel":
            names = features[column].get("names")
            return _Label(column, tuple(str(n) for n in names) if names else None)
        if _is(t, "integer"):
            return _Label(column, None)
        if _is(t, "string", "large_string"):
            classes = tuple(sorted(self._values(column)))
            return _Label(column, classes, {c: i for i, c in enumerate(classes)})
        raise InvalidArgumentError(
            f"{self.src!s:.200}: the label column {column!r} holds {t}: a label is an integer, "
            "a class name or a ClassLabel"
        )

    def _values(self, column: str) -> set[str]:
        """The distinct values of one column (class names), read column by column."""
        values: set[str] = set()
        for part in self.parts:
            if part.schema is None:
                continue
            for item in part.batches(0, part.rows, [column]):
                if not isinstance(item, SampleFailure):
                    values.update(v for v in item[1].column(0).unique().to_pylist() if v)
        return values

    def _default_members(
        self, columns: list[str], types: dict[str, Any], features: dict[str, Any]
    ) -> list[_Member]:
        members, images = [], 0
        for c in columns:
            t = _storage(types[c])
            cell, dtype = _cell(t)
            feature = _feature_type(features, c)
            if feature == "Image" or (
                cell == "file" and feature in (None, "Value") and self._is_image(c, t)
            ):
                kind = "image"
            elif cell == "file":
                kind = "bytes"
            elif cell == "numbers":
                kind = "array"
            elif cell == "text":
                kind = "text"
            elif _is(t, "null"):
                continue
            elif _has_binary(t):
                log.warning("%s: column %r holds bytes in nested values, which JSON cannot: "
                            "left out", self.src, c)  # fmt: skip
                continue
            else:
                kind = "json"
            members.append(_Member(default_name(c, kind, images == 0), c, cell, dtype))
            images += kind == "image"
        return members

    def _is_image(self, column: str, t: Any) -> bool:
        """A struct<bytes, path> is an image; binary where its first values are one."""
        if _is_file_struct(t):
            return True
        part = next(p for p in self.parts if p.schema is not None)
        for item in part.batches(0, min(part.rows, 16), [column]):
            if isinstance(item, SampleFailure):
                return False
            for value in item[1].column(0).to_pylist():
                if value is not None:
                    return image_format(value) is not None
        return False

    def __len__(self) -> int:
        return sum(p.rows for p in self.parts)

    def jobs(self, start: int = 0, stop: int | None = None) -> Iterator[Job]:
        stop = len(self) if stop is None else min(stop, len(self))
        position = 0
        for part in self.parts:
            lo, hi = start - position, stop - position
            position += part.rows
            if hi <= 0:
                return
            if lo < part.rows:
                yield from self._part_jobs(part, max(lo, 0), min(hi, part.rows))

    def _part_jobs(self, part: _Part, lo: int, hi: int) -> Iterator[Job]:
        if part.schema is None:  # the whole file is unreadable: one failure
            yield failing_job(SourceDamaged(part.name, part.broken or "unreadable"))
            return
        for item in part.batches(lo, hi, self.read_columns):
            if isinstance(item, SampleFailure):
                yield failing_job(item)
                continue
            first, batch = item
            a, b = max(lo - first, 0), min(hi - first, batch.num_rows)
            keys = batch.column(self.key).to_pylist()[a:b] if self.key else [None] * (b - a)
            for r, key in zip(range(a, b), keys, strict=True):
                where = f"{part.name}: row {first + r}"
                make = functools.partial(row_sample, batch, r, self.members, self.label,
                                         part.base, where, self.opts)  # fmt: skip
                yield Job(where, -1, None if key is None else str(key), make)
            if first + batch.num_rows >= hi:
                return

    def _options(self) -> list[Any]:
        members = self.members_option
        return [dict(members) if members is not None else None, self.label_option]

    def fingerprint(self) -> str | None:
        paths = [p.path for p in self.parts if p.path is not None]
        return files_fingerprint(paths, *self._options())


def _file_parts(src: Any) -> list[_Part]:
    """A Parquet (or Arrow) file, a folder of them (sorted, recursively), or a glob."""
    text = str(src)
    if any(c in text for c in "*?["):
        paths = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
    elif (Path(text) / "state.json").is_file():
        paths = _saved_paths(Path(text))
    elif Path(text).is_dir():
        root = Path(text)
        paths = sorted(root.rglob("*.parquet")) or sorted(root.rglob("*.arrow"))
        paths = [p for p in paths if not any(s.startswith(".") for s in p.relative_to(root).parts)]
    elif Path(text).is_file():
        paths = [Path(text)]
    else:
        raise InvalidArgumentError(f"{text}: no such file or folder")
    if not paths:
        raise InvalidArgumentError(f"{text}: no .parquet or .arrow files")
    return [_ArrowFile(p) if p.suffix.lower() == ".arrow" else _ParquetFile(p) for p in paths]


def _saved_paths(folder: Path) -> list[Path]:
    """The Arrow files of a save_to_disk folder, in order, as its state.json lists them (the
    folder may hold cache files of later shuffles and maps too)."""
    try:
        state = json.loads((folder / "state.json").read_text())
        names = [f["filename"] for f in state["_data_files"]]
    except FileNotFoundError:
        names = []
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InvalidArgumentError(f"{folder}: state.json does not list its files: {e}") from None
    return [folder / n for n in names] or sorted(folder.glob("data-*.arrow"))


class HuggingFaceSource(ParquetSource):
    """A ``datasets.Dataset``, a ``save_to_disk`` folder, or Parquet/Arrow files of one."""

    format = "huggingface"

    def _parts(self, src: Any) -> list[_Part]:
        self.info: dict[str, Any] = {}
        if type(src).__module__.startswith("datasets"):
            if not hasattr(src, "cache_files") or not hasattr(src, "__len__"):
                raise InvalidArgumentError(
                    f"{type(src).__name__}: stoker.pack reads a datasets.Dataset (of a streamed "
                    "dataset, pack its files)"
                )
            self.info = {"features": src.features.to_dict()}
            return [_DatasetRows(src)]
        folder = Path(str(src))
        if (folder / "state.json").is_file() or (folder / "dataset_info.json").is_file():
            return self._saved(folder)
        return _file_parts(src)

    def _saved(self, folder: Path) -> list[_Part]:
        """A save_to_disk folder: its features from dataset_info.json."""
        try:
            if (folder / "dataset_info.json").is_file():
                self.info = json.loads((folder / "dataset_info.json").read_text())
        except (OSError, ValueError) as e:
            raise InvalidArgumentError(f"{folder}: dataset_info.json: {e}") from None
        paths = _saved_paths(folder)
        if not paths:
            raise InvalidArgumentError(
                f"{folder}: no state.json listing its .arrow files (a save_to_disk folder): pack "
                "a split's .arrow file, or its datasets.Dataset"
            )
        return [_ArrowFile(p) for p in paths]

    def _feature_dict(self) -> dict[str, Any]:
        features = self.info.get("features")
        return features if isinstance(features, dict) else super()._feature_dict()

    def fingerprint(self) -> str | None:
        part = self.parts[0]
        if isinstance(part, _DatasetRows):
            fp = getattr(part.ds, "_fingerprint", None)
            if fp is None:
                return None
            text = json.dumps([fp, len(part.ds), *self._options()], default=repr, sort_keys=True)
            return hashlib.sha256(text.encode()).hexdigest()
        return super().fingerprint()
