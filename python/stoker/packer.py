"""Packing: an ImageFolder tree, a CSV or JSON Lines table of members, or COCO instances into
WebDataset-compatible tar shards + indexes (pack format version 2: docs/FORMAT.md)."""

from __future__ import annotations

import collections
import concurrent.futures as futures
import csv
import functools
import io
import itertools
import json
import logging
import math
import os
import shutil
import struct
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import _core
from .errors import InvalidArgumentError, StokerError, StokerInternalError

FORMAT_NAME = "stoker-pack"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
SOURCES = "sources.tsv"

# torchvision.datasets.folder.IMG_EXTENSIONS: the files an ImageFolder lists, in its order.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# Member names: what their last part says they hold (format::is_image_member_name in C++).
IMAGE_MEMBER_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
MASK_STEMS = ("seg", "mask")  # "seg.png", "mask.png", "sem_seg.png": a mask, not an image
BOXES_STEMS = ("boxes", "bbox", "bboxes")  # "boxes.npy"
FIELD_KINDS = ("image", "mask", "label", "array", "boxes", "json", "text", "bytes")
FILE_KINDS = ("image", "mask", "array", "boxes")  # a table gives these as file paths only
LABEL_COLUMNS = ("cls", "label")
KEY_COLUMNS = ("key", "__key__")
PATH_HEADERS = ("path", "file", "filename")
MAX_MEMBER_NAME = 91  # a tar name is at most 100 bytes: the 8-digit key, '.', the member name

log = logging.getLogger("stoker")


@dataclass
class PackResult:
    out: Path
    num_samples: int
    num_shards: int
    bytes: int
    seconds: float
    classes: list[str]
    failed: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    reencoded: int = 0
    fields: list[dict[str, Any]] = field(default_factory=list)  # the manifest's schema

    def __str__(self) -> str:
        s = (
            f"packed {self.num_samples} samples into {self.num_shards} shard(s) "
            f"({self.bytes / 1e6:.1f} MB) at {self.out} in {self.seconds:.1f} s"
        )
        if self.reencoded:
            s += f"; {self.reencoded} rewritten (max_side or restart markers)"
        if self.failed:
            s += f"; {len(self.failed)} file(s) could not be read:"
            for path, reason in self.failed[:20]:
                s += f"\n  {path}: {reason}"
            if len(self.failed) > 20:
                s += f"\n  ... and {len(self.failed) - 20} more (see manifest.json)"
        return s


def list_image_folder(root: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """torchvision ImageFolder's samples and classes: classes sorted, files sorted per class."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if not classes:
        raise InvalidArgumentError(f"{root}: no class folders (expected ROOT/CLASS/IMAGE files)")
    samples = []
    for label, name in enumerate(classes):
        for dirpath, _, files in sorted(os.walk(root / name, followlinks=True)):
            for fname in sorted(files):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    samples.append((os.path.join(dirpath, fname), label))
    return samples, classes


def list_csv(path: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """Rows of `path,label`; an optional header; labels are integers or class names."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("#")]
    if rows and len(rows[0]) >= 2 and rows[0][0].strip().lower() in PATH_HEADERS:
        rows = rows[1:]
    if not rows:
        raise InvalidArgumentError(f"{path}: no rows")
    for i, r in enumerate(rows):
        if len(r) < 2:
            raise InvalidArgumentError(f"{path}: row {i + 1} is not 'path,label': {r!r}")
    base = path.parent
    labels = [r[1].strip() for r in rows]
    if all(lab.lstrip("-").isdigit() for lab in labels):
        ints = [int(lab) for lab in labels]
        if min(ints) < 0:
            raise InvalidArgumentError(f"{path}: labels must be >= 0")
        classes = [str(i) for i in range(max(ints) + 1)]
    else:
        classes = sorted(set(labels))
        index = {c: i for i, c in enumerate(classes)}
        ints = [index[lab] for lab in labels]
    return [(str(base / r[0].strip()), lab) for r, lab in zip(rows, ints, strict=True)], classes


def member_kind(name: str) -> str:
    """The schema kind of a member, from its name: an image extension is an image (a mask when
    it is a PNG named ``*seg.png`` or ``*mask.png``), ``*.npy`` an array (boxes when named
    ``boxes.npy``), ``cls`` a label, ``*.json`` JSON, ``*.txt`` text, anything else bytes."""
    stem, _, ext = name.lower().rpartition(".")
    if ext in IMAGE_MEMBER_EXTENSIONS:
        return "mask" if ext == "png" and stem.endswith(MASK_STEMS) else "image"
    if ext == "npy":
        return "boxes" if stem.rpartition(".")[2] in BOXES_STEMS else "array"
    return {"cls": "label", "json": "json", "txt": "text"}.get(ext, "bytes")


def _parse_size(size: int | str) -> int:
    if isinstance(size, int):
        return size
    s = size.strip().upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def _prepare_bytes(data: bytes, opts: "_Options"):
    """(bytes, format, width, height, rewritten) of an image as the pack stores it."""
    width, height = opts.size or (0, 0)
    return _core.prepare_image(
        data, opts.max_side, opts.quality, opts.restart_interval, opts.codec, width, height
    )


def _prepare(path: str, opts: "_Options"):
    with open(path, "rb") as f:
        data = f.read()
    return _prepare_bytes(data, opts)


def _reason(e: BaseException) -> str:
    return getattr(e, "reason", None) or str(e)


# --- what workers make of a source sample -------------------------------------------------------


@dataclass(frozen=True)
class _Options:
    max_side: int
    quality: int
    restart_interval: int
    codec: str = "source"  # "raw": decoded pixels (binary PPM), read without decoding
    size: tuple[int, int] | None = None  # (width, height) of every raw image


# One member's entry for the schema: (name, kind, dtype, shape).
_FieldInfo = tuple[str, str, "str | None", "list[int] | None"]


@dataclass
class _Sample:
    """One source sample made ready to write, on a worker thread."""

    members: list[tuple[str, bytes]]
    fields: list[_FieldInfo]
    rewritten: bool = False
    box_classes: list[int] = field(default_factory=list)  # COCO: the class of each box
    crowd: int = 0  # COCO: iscrowd annotations left out of the boxes


@dataclass
class _Job:
    source: str  # the file (or table row) the sample comes from, as failures name it
    label: int  # -1: none
    ref: str | None  # the source's own key (a table's key column, a COCO image id)
    make: Callable[[], _Sample]  # runs on a worker thread


class _SampleFailure(Exception):
    """A sample that cannot be packed: listed in `failed` as (where, reason), not raised."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


def _image_field(name: str, data: bytes, width: int, height: int) -> _FieldInfo:
    components = _core.image_info(data)["components"]  # the header only
    return (name, "image", "uint8", [height, width, components])


def _folder_sample(path: str, opts: _Options) -> _Sample:
    data, fmt, width, height, rewritten = _prepare(path, opts)
    return _Sample([(fmt, data)], [_image_field(fmt, data, width, height)], bool(rewritten))


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _mask_size(data: bytes) -> tuple[int, int]:
    """(height, width) of a PNG mask: grey or palette, at most 8 bits (decode::MaskDecoder's)."""
    if len(data) < 33 or data[:8] != _PNG_SIGNATURE or data[12:16] != b"IHDR":
        raise ValueError("a mask must be a PNG")
    width, height, depth, colour = struct.unpack(">IIBB", data[16:26])
    if colour not in (0, 3) or depth > 8:
        raise ValueError(
            f"a mask must be a grey or palette PNG of at most 8 bits per pixel "
            f"(this one has colour type {colour}, {depth} bits)"
        )
    _core.prepare_image(data, 0, 90, 0)  # proves that it decodes; rewrites nothing
    return height, width


def _npy_header(data: bytes) -> tuple[str, list[int]]:
    """dtype name and shape from a .npy header, with the data's size checked against them.
    Headers are read by numpy's parser (a literal, never a pickle); object arrays are refused."""
    import numpy as np

    f = io.BytesIO(data)
    try:
        major, minor = np.lib.format.read_magic(f)
        if major == 1:
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif major in (2, 3):  # 3.0 differs from 2.0 only in the header's text encoding (utf8)
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"version {major}.{minor}")
    except (ValueError, SyntaxError, TypeError) as e:
        raise ValueError(f"not a .npy array: {e}") from e
    if dtype.hasobject:
        raise ValueError("an object array (pickled Python objects) is never packed")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) - f.tell() != expected:
        raise ValueError(
            f"{len(data) - f.tell()} bytes of data, its header says {expected} "
            f"({dtype.name} {list(shape)})"
        )
    return dtype.name, list(shape)


def _member_data(
    name: str, kind: str, data: bytes, opts: _Options
) -> tuple[bytes, _FieldInfo, bool]:
    """Checks (and for images, prepares) one member's bytes: (bytes, schema entry, rewritten)."""
    if kind == "image":
        data, fmt, width, height, rewritten = _prepare_bytes(data, opts)
        if fmt == "ppm" and name.rpartition(".")[2] != "ppm":
            name = name.rpartition(".")[0] + ("." if "." in name else "") + "ppm"
        return data, _image_field(name, data, width, height), bool(rewritten)
    if kind == "mask":  # never re-encoded: a lossy or resampled mask changes its class ids
        return data, (name, kind, "uint8", list(_mask_size(data))), False
    if kind in ("array", "boxes"):
        dtype, shape = _npy_header(data)
        return data, (name, kind, dtype, shape), False
    if kind == "label":
        text = data.decode("ascii", errors="replace").strip()
        if not text.isdigit():
            raise ValueError(f"a label must be a decimal integer >= 0, not {text[:40]!r}")
        return data, (name, kind, "int64", []), False
    if kind == "json":
        json.loads(data)
    elif kind == "text":
        data.decode("utf-8")
    return data, (name, kind, None, None), False


# --- tables: CSV or JSON Lines, one sample a row, one member a column ---------------------------


@dataclass(frozen=True)
class _Column:
    name: str  # the member's name
    kind: str
    paths: bool  # the values name files (relative to the table's folder)


def _is_member_table(header: list[str], base: Path) -> bool:
    """A CSV whose first row names members, rather than the `path,label` list (with a header
    starting with path/file/filename, or none)."""
    header = [c.strip() for c in header]
    first = header[0]
    if first.lower() in PATH_HEADERS or (base / first).is_file():
        return False
    return all(
        c.strip() and "/" not in c and "\\" not in c and not c.strip().isdigit() for c in header
    )


def _read_table(path: Path) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    """(columns, [(line, {column: value})]): CSV cells are strings, JSON Lines values any JSON;
    an empty cell, a null or a missing key is a member the row does not have."""
    rows: list[tuple[int, dict[str, Any]]] = []
    if path.suffix.lower() == ".jsonl":
        columns: dict[str, None] = {}
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InvalidArgumentError(f"{path}:{line_no}: not JSON: {e}") from None
                if not isinstance(row, dict):
                    raise InvalidArgumentError(f"{path}:{line_no}: a row must be a JSON object")
                columns.update(dict.fromkeys(row))
                rows.append((line_no, {k: v for k, v in row.items() if v is not None}))
        return list(columns), rows
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header: list[str] | None = None
        for cells in reader:
            if not cells or cells[0].startswith("#"):
                continue
            if header is None:
                header = [c.strip() for c in cells]
                continue
            if len(cells) > len(header):
                raise InvalidArgumentError(
                    f"{path}:{reader.line_num}: {len(cells)} cells, the header has {len(header)}"
                )
            rows.append((reader.line_num, {c: v for c, v in zip(header, cells) if v.strip()}))
    return header or [], rows


def _table_labels(path: Path, values: list[Any]) -> tuple[list[int], list[str]]:
    """Integers (classes "0".."max"), or class names (ids in sorted order); none: -1."""
    present = [v for v in values if v is not None]
    if not present:
        return [-1] * len(values), []
    for v in present:
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise InvalidArgumentError(f"{path}: a label must be an integer or a name, not {v!r}")
    texts = [None if v is None else str(v).strip() for v in values]
    if all(t.lstrip("-").isdigit() for t in texts if t is not None):
        ints = [-1 if t is None else int(t) for t in texts]
        if any(t is not None and i < 0 for t, i in zip(texts, ints, strict=True)):
            raise InvalidArgumentError(f"{path}: labels must be >= 0")
        return ints, [str(i) for i in range(max(ints) + 1)]
    classes = sorted({t for t in texts if t is not None})
    index = {c: i for i, c in enumerate(classes)}
    return [-1 if t is None else index[t] for t in texts], classes


def _check_member_name(table: Path, name: str) -> None:
    if (
        not name
        or name.startswith(".")
        or "/" in name
        or len(name.encode()) > MAX_MEMBER_NAME
        or any(c.isspace() or not c.isprintable() for c in name)
    ):
        raise InvalidArgumentError(
            f"{table}: column {name!r} is not a member name (printable, no spaces or '/', not "
            f"starting with '.', at most {MAX_MEMBER_NAME} bytes: 'jpg', 'seg.png', 'json')"
        )


def _table_jobs(table: Path, opts: _Options) -> tuple[list[_Job], list[str]]:
    columns, rows = _read_table(table)
    if not rows:
        raise InvalidArgumentError(f"{table}: no rows")
    for name in columns:
        _check_member_name(table, name)
    label_columns = [c for c in columns if c in LABEL_COLUMNS]
    key_columns = [c for c in columns if c in KEY_COLUMNS]
    if len(label_columns) > 1 or len(key_columns) > 1:
        raise InvalidArgumentError(
            f"{table}: at most one label column (cls or label) and one key column (key or "
            f"__key__), not {label_columns + key_columns}"
        )
    names = [c for c in columns if c not in LABEL_COLUMNS + KEY_COLUMNS]
    if not names and not label_columns:
        raise InvalidArgumentError(f"{table}: no member columns")
    label_column = label_columns[0] if label_columns else None
    cells = [row.get(label_column) if label_column else None for _, row in rows]
    labels, classes = _table_labels(table, cells)
    base = table.parent

    def names_files(name: str) -> bool:
        # Any value naming a file makes the column a path column: the rows whose file is
        # missing then fail, rather than storing the path itself as the member.
        return any(
            isinstance(r.get(name), str) and (base / r[name].strip()).is_file() for _, r in rows
        )

    spec = []
    for name in names:
        kind = member_kind(name)
        spec.append(_Column(name, kind, kind in FILE_KINDS or names_files(name)))
    if opts.max_side and any(c.kind in ("json", "array", "boxes") for c in spec):
        log.warning(
            "%s: max_side shrinks the images only; coordinates in json and .npy members are "
            "stored as they are, in the source images' pixels",
            table,
        )
    text_cells = table.suffix.lower() != ".jsonl"
    jobs = []
    for (line, row), label in zip(rows, labels, strict=True):
        values = [(c, row[c.name]) for c in spec if c.name in row]
        row_ref = f"{table}:{line}"
        first_path = next((v for c, v in values if c.paths and isinstance(v, str)), None)
        source = str(base / first_path.strip()) if first_path is not None else row_ref
        ref = str(row.get(key_columns[0], "")) if key_columns else None
        make = functools.partial(_table_sample, values, label >= 0, base, row_ref, text_cells, opts)
        jobs.append(_Job(source, label, ref, make))
    return jobs, classes


def _value_bytes(kind: str, value: Any, text_cells: bool) -> bytes:
    if kind in FILE_KINDS:
        raise ValueError(f"expected the path of a file, not {value!r}")
    if kind == "json":
        if text_cells:  # a CSV cell holds JSON text: stored as it is, once it parses
            json.loads(value)
            return value.encode()
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, ensure_ascii=False).encode()  # a JSON number, list, ...: its text


def _table_sample(
    values: list[tuple[_Column, Any]],
    has_label: bool,
    base: Path,
    row_ref: str,
    text_cells: bool,
    opts: _Options,
) -> _Sample:
    if not values and not has_label:
        raise _SampleFailure(row_ref, "the row has neither members nor a label")
    sample = _Sample([], [])
    for column, value in values:
        where = row_ref
        try:
            if column.paths:
                if not isinstance(value, str):
                    raise ValueError(f"expected the path of a file, not {value!r}")
                where = str(base / value.strip())
                with open(where, "rb") as f:
                    data = f.read()
            else:
                data = _value_bytes(column.kind, value, text_cells)
            data, info, rewritten = _member_data(column.name, column.kind, data, opts)
        except (StokerError, OSError, ValueError) as e:
            raise _SampleFailure(where, f"{column.name}: {_reason(e)}") from e
        sample.members.append((info[0], data))  # an image stored raw is KEY.<...>ppm
        sample.fields.append(info)
        sample.rewritten |= rewritten
    return sample


# --- COCO instances ------------------------------------------------------------------------------


def _coco_jobs(annotations: Path, images: Path, opts: _Options) -> tuple[list[_Job], Any]:
    from . import coco

    instances = coco.read_instances(annotations)
    jobs = []
    for image in instances.images:
        path = str(images / image["file_name"])
        anns = instances.annotations.get(image["id"], [])
        make = functools.partial(_coco_sample, path, image, anns, instances.class_of, opts)
        jobs.append(_Job(path, -1, str(image["id"]), make))
    return jobs, instances


def _coco_sample(
    path: str, image: dict, anns: list[dict], class_of: dict[int, int], opts: _Options
) -> _Sample:
    from . import coco

    try:
        with open(path, "rb") as f:
            data = f.read()
        info = _core.image_info(data)
        width, height = image["width"], image["height"]
        if (info["width"], info["height"]) != (width, height):
            raise ValueError(
                f"the image is {info['width']}x{info['height']}, "
                f"its COCO entry says {width}x{height}"
            )
        data, fmt, new_width, new_height, rewritten = _prepare_bytes(data, opts)
        mask = coco.rasterize(anns, height, width, class_of)
        boxes, crowd = coco.box_list(anns, class_of, new_width / width, new_height / height)
        if (new_width, new_height) != (width, height):
            mask = coco.resize_nearest(mask, new_width, new_height)
        png = coco.encode_png(mask)
    except (StokerError, OSError, ValueError) as e:
        raise _SampleFailure(path, _reason(e)) from e
    n = len(boxes)
    return _Sample(
        [(fmt, data), ("json", coco.boxes_json(boxes)), ("seg.png", png)],
        [
            _image_field("jpg", data, new_width, new_height),
            ("json", "boxes", "float64", [n, 4]),
            ("seg.png", "mask", "uint8", [new_height, new_width]),
        ],
        bool(rewritten),
        box_classes=[b["category_id"] for b in boxes],
        crowd=crowd,
    )


# --- the schema ---------------------------------------------------------------------------------


class _Schema:
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

    def merge(self, later: _Schema) -> None:
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


# --- the pack -----------------------------------------------------------------------------------


def _remove_stale_partials(out: Path) -> None:
    """Removes what packs into `out` killed before they finished left behind (their process is
    gone); a pack still running elsewhere keeps its folder."""
    for partial in out.parent.glob(f".{out.name}.partial-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(partial, ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


def _plan(
    src: Path, images: Path | None, opts: _Options
) -> tuple[str, list[_Job], list[str], dict[str, Any]]:
    """(source format, jobs, classes, extra manifest entries) for a source."""
    suffix = src.suffix.lower()
    if images is not None and not (src.is_file() and suffix == ".json"):
        raise InvalidArgumentError(f"{src}: images= goes with a COCO instances .json file only")
    if src.is_dir():
        samples, classes = list_image_folder(src)
        fmt = "imagefolder"
    elif src.is_file() and suffix == ".json":
        if images is None:
            raise InvalidArgumentError(
                f"{src}: a .json source is COCO instances: pass images= (the folder its "
                "file_name entries are in)"
            )
        if not images.is_dir():
            raise InvalidArgumentError(f"{images}: not a folder")
        jobs, instances = _coco_jobs(src, images, opts)
        return "coco", jobs, instances.names, {"category_ids": instances.ids}
    elif src.is_file() and suffix == ".jsonl":
        jobs, classes = _table_jobs(src, opts)
        return "table", jobs, classes, {}
    elif src.is_file() and suffix == ".csv":
        with open(src, newline="", encoding="utf-8") as f:
            header = next((r for r in csv.reader(f) if r and not r[0].startswith("#")), None)
        if header and _is_member_table(header, src.parent):
            jobs, classes = _table_jobs(src, opts)
            return "table", jobs, classes, {}
        samples, classes = list_csv(src)
        fmt = "csv"
    else:
        raise InvalidArgumentError(
            f"{src}: expected an ImageFolder directory, a .csv or .jsonl table, or a COCO "
            "instances .json file"
        )
    if not samples:
        raise InvalidArgumentError(f"{src}: no image files found")
    jobs = [
        _Job(path, label, None, functools.partial(_folder_sample, path, opts))
        for path, label in samples
    ]
    return fmt, jobs, classes, {}


# --- a contiguous range of samples written into shards, and the ranges merged into one pack ------


@dataclass
class _Part:
    """What writing one contiguous range of the plan made: its shards (in the pack folder,
    named from the part's prefix, in sample order) and what the manifest needs from it. A
    local pack is one part; a Ray pack one part per task (pack_ray.py)."""

    start: int  # the key of its first sample, as written
    shards: list[dict[str, Any]]  # tar, index, num_samples, bytes
    num_samples: int
    failed: list[tuple[str, str]]  # (path, reason), in source order
    counts: list[int]  # per class
    schema: _Schema
    reencoded: int
    crowd: int
    sources: str  # file in the folder: its sources.tsv lines without the key column


def _write_part(
    folder: str,
    prefix: str,
    jobs: list[_Job],
    start: int,
    num_classes: int,
    limit: int,
    threads: int,
    on_sample: Callable[[], Any] | None = None,
) -> _Part:
    """Prepares `jobs` on `threads` threads and writes them, in order, into shards
    FOLDER/PREFIX000000.tar (+ .idx), PREFIX000001... of about `limit` bytes, keyed from
    `start` on. Samples that fail are listed, not written; any other error propagates (the
    shard being written is deleted)."""
    base = Path(folder)
    part = _Part(start, [], 0, [], [0] * num_classes, _Schema(), 0, 0, f"{prefix}{SOURCES}")
    writer = None

    def close_shard() -> None:
        nonlocal writer
        if writer is not None:
            writer.finish()
            part.shards[-1]["num_samples"] = writer.num_samples
            part.shards[-1]["bytes"] = writer.bytes_written
            writer = None

    try:
        with (
            open(base / part.sources, "w") as sources,
            futures.ThreadPoolExecutor(threads) as pool,
        ):
            # A bounded window of work in flight keeps memory flat and the output in order.
            window: collections.deque = collections.deque()
            todo = iter(jobs)
            while True:
                while len(window) < 4 * threads:
                    job = next(todo, None)
                    if job is None:
                        break
                    window.append((job, pool.submit(job.make)))
                if not window:
                    break
                job, fut = window.popleft()
                try:
                    sample = fut.result()
                except _SampleFailure as e:
                    part.failed.append((e.where, e.reason))
                except (StokerError, OSError) as e:
                    part.failed.append((job.source, _reason(e)))
                else:
                    if writer is None:
                        name = f"{prefix}{len(part.shards):06d}"
                        part.shards.append({"tar": f"{name}.tar", "index": f"{name}.idx"})
                        writer = _core.ShardWriter(
                            str(base / f"{name}.tar"), str(base / f"{name}.idx")
                        )
                    writer.add_sample(f"{start + part.num_samples:08d}", sample.members, job.label)
                    row = [str(job.label), job.source]
                    if job.ref is not None:
                        row.append(job.ref)
                    sources.write("\t".join(row) + "\n")
                    part.num_samples += 1
                    schema_label: list[_FieldInfo] = []
                    if job.label >= 0:
                        part.counts[job.label] += 1
                        schema_label = [("cls", "label", "int64", [])]
                    for info in sample.fields + schema_label:
                        part.schema.add(*info)
                    for c in sample.box_classes:
                        part.counts[c] += 1
                    part.crowd += sample.crowd
                    part.reencoded += sample.rewritten
                    if writer.bytes_written >= limit:
                        close_shard()
                if on_sample is not None:
                    on_sample()
        close_shard()
    except BaseException:
        if writer is not None:
            del writer  # the C++ writer deletes its unfinished shard
        raise
    return part


def _tar_samples(path: Path) -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
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


def _rekey_part(folder: str, part: _Part, start: int) -> _Part:
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
        for _, members in _tar_samples(tar):
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


def _part_starts(parts: list[_Part]) -> list[int]:
    """The key each part's first sample has in the whole pack."""
    starts, n = [], 0
    for part in parts:
        starts.append(n)
        n += part.num_samples
    return starts


def _merge_parts(folder: Path, parts: list[_Part], num_classes: int) -> dict[str, Any]:
    """Renames the parts' shards shard-000000... in order, writes sources.tsv, and returns the
    manifest entries that come from the samples: num_samples, class_counts, fields, shards,
    bytes, failed, and crowd_annotations and reencoded (for the caller)."""
    shards: list[dict[str, Any]] = []
    counts = [0] * num_classes
    schema = _Schema()
    failed: list[tuple[str, str]] = []
    reencoded = crowd = 0
    with open(folder / SOURCES, "w") as sources:
        for part, start in zip(parts, _part_starts(parts), strict=True):
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
            counts = [a + b for a, b in zip(counts, part.counts, strict=True)]
            schema.merge(part.schema)
            failed += part.failed
            reencoded += part.reencoded
            crowd += part.crowd
    return {
        "num_samples": sum(p.num_samples for p in parts),
        "class_counts": counts,
        "fields": schema.to_list(),
        "shards": shards,
        "bytes": sum(s["bytes"] for s in shards),
        "failed": failed,
        "crowd_annotations": crowd,
        "reencoded": reencoded,
    }


def pack(
    src: str | os.PathLike,
    out: str | os.PathLike,
    *,
    images: str | os.PathLike | None = None,
    max_side: int | None = None,
    shard_size: int | str = "256MB",
    quality: int = 90,
    restart_interval: int | None = 1,
    threads: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    engine: str = "local",
    ray_address: str | None = None,
    tasks: int | None = None,
    codec: str = "source",
    size: tuple[int, int] | None = None,
) -> PackResult:
    """Pack a dataset into shards at ``out``. ``src`` is one of:

    - an ImageFolder tree (``ROOT/CLASS/IMAGE``): sample order and labels are torchvision
      ImageFolder's; each sample is ``KEY.jpg`` (or ``.png``, ``.webp``) + ``KEY.cls``;
    - a ``.csv`` of ``path,label`` rows (a header starting with path/file/filename, or none);
      labels are integers or class names (ids in sorted order);
    - a table, ``.csv`` with a header or ``.jsonl`` (one JSON object a row): each column is a
      member named by the column (``jpg``, ``seg.png``, ``boxes.npy``, ``json``, ``txt``, any
      name). A column whose values name files (relative to the table's folder) stores each
      file; images (``jpg``/``jpeg``/``png``/``webp``), masks (``*seg.png``/``*mask.png``:
      grey or palette PNGs, stored as they are) and ``.npy`` arrays must be files. Other
      columns store their value: for ``*json`` its JSON text (a CSV cell must hold JSON; a JSON
      Lines value may be any JSON), otherwise its UTF-8 text. A ``cls`` or ``label`` column
      (integers or class names, as above) is the label, stored as ``KEY.cls``; a ``key`` or
      ``__key__`` column is recorded in sources.tsv. Empty cells and nulls are members the
      row does not have;
    - a COCO instances ``.json`` with ``images=`` the folder its ``file_name`` entries are in
      (CLI: ``stoker pack --coco ANN.json --images DIR OUT``). Each image becomes ``KEY.jpg``
      (the file), ``KEY.json`` (``[{"bbox": [x, y, w, h], "category_id": i}, ...]`` of its
      annotations, ``i`` the index into the manifest's ``classes``, which lists category names
      in id order; ``category_ids[i]`` is COCO's id) and ``KEY.seg.png`` (8-bit grey, the
      image's size: ``i + 1`` where annotation ``i`` covers a pixel, later annotations over
      earlier ones, 0 background). ``iscrowd`` annotations are painted in the mask but left
      out of the boxes (the manifest counts them as ``crowd_annotations``). Images with no
      annotations are kept. ``class_counts`` counts boxes per class. Needs Pillow.

    Keys are positions (``00000000``...); sources.tsv maps each to its source. Each shard is a
    WebDataset tar with a sidecar index; ``manifest.json`` (with ``fields``: each member's
    kind, dtype, smallest and largest shape, and the samples that have it) is written last and
    the folder appears at ``out`` in one rename, so an interrupted pack leaves nothing that
    loads. ``max_side`` shrinks larger images once, now, instead of every epoch (COCO boxes and
    masks follow; a table's masks keep their size, which the loader maps onto, and coordinates
    in its json and .npy members are not rescaled). ``restart_interval`` (in MCUs; the default
    1 is finest; None or 0 keeps files byte for byte) rewrites baseline JPEGs losslessly with
    restart markers, so the loader entropy-decodes only the part of each image a crop covers:
    decoded pixels are unchanged, files grow about 5%, and training crops of ImageNet-sized
    files decode 1.4x faster. Samples that cannot be read (a missing or broken file, a value
    that is not what its column needs) are listed (path and reason) in the result and the
    manifest, not packed.

    ``codec="raw"`` stores decoded pixels instead of the source files (the seed notes' "store
    BMP", FFCV's raw mode): each image becomes ``KEY.ppm``, a binary PPM the loader reads with
    no decoding, shrunk to ``max_side`` first, or resized to ``size=(height, width)`` (every
    image at one size, aspect ratio not kept). A machine short of CPU trades disk for decoding:
    a 256-pixel RGB image is 192 KB raw against ~20 KB as a JPEG.

    ``engine="ray"`` packs on a Ray cluster: the samples are split into ``tasks`` contiguous
    ranges (by default one per ``threads`` of the cluster's CPUs), each written by a Ray task
    into its own shards; the pack is the local pack's sample for sample (keys, labels, member
    bytes, order; only the shard boundaries differ). ``ray_address`` goes to ``ray.init``:
    None uses the Ray this process is connected to, else ``RAY_ADDRESS``, else the cluster
    last started on this machine, else a new local one; ``"HOST:PORT"`` a head node. Every
    node must see ``src`` and ``out``'s folder at the same paths (a shared file system) and
    have the same stoker installed. ``threads`` is then per task (default 1), and each task
    reserves that many CPUs. Needs ``pip install 'stoker[ray]'``.
    See docs/PACKING_RAY.md.
    """
    t0 = time.perf_counter()
    src, out = Path(src), Path(out)
    if engine not in ("local", "ray"):
        raise InvalidArgumentError(f"engine must be 'local' or 'ray', not {engine!r}")
    if engine == "local" and (ray_address is not None or tasks is not None):
        raise InvalidArgumentError("ray_address= and tasks= go with engine='ray'")
    if tasks is not None and tasks < 1:
        raise InvalidArgumentError(f"tasks must be at least 1, not {tasks}")
    if codec not in ("source", "raw"):
        raise InvalidArgumentError(f"codec must be 'source' or 'raw', not {codec!r}")
    if size is not None:
        if codec != "raw":
            raise InvalidArgumentError("size= stores every image at one size: with codec='raw'")
        if (
            not isinstance(size, (tuple, list))
            or len(size) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in size)
        ):
            raise InvalidArgumentError(f"size must be (height, width), not {size!r}")
    raw_size = None if size is None else (int(size[1]), int(size[0]))  # (width, height)
    opts = _Options(max_side or 0, quality, restart_interval or 0, codec, raw_size)
    source_format, jobs, classes, extra = _plan(
        src, Path(images) if images is not None else None, opts
    )
    if out.exists():
        if not overwrite and (not out.is_dir() or any(out.iterdir())):
            raise InvalidArgumentError(f"{out} already exists (pass overwrite=True to replace it)")
    limit = _parse_size(shard_size)
    if limit < 1 << 16:
        raise InvalidArgumentError("shard_size must be at least 64 KiB")

    _remove_stale_partials(out)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    bar = None
    try:
        if engine == "ray":
            parts = _ray_parts(
                tmp, jobs, len(classes), limit, threads or 1, tasks, ray_address, progress, src
            )
        else:
            if progress:
                from tqdm.auto import tqdm

                unit = "img" if source_format in ("imagefolder", "csv") else "sample"
                bar = tqdm(total=len(jobs), unit=unit, desc=f"packing {src.name}")
            on_sample = bar.update if bar is not None else None
            threads = threads or os.cpu_count() or 1
            parts = [
                _write_part(str(tmp), "shard-", jobs, 0, len(classes), limit, threads, on_sample)
            ]
        merged = _merge_parts(tmp, parts, len(classes))
        failed = merged["failed"]
        if merged["num_samples"] == 0:
            raise InvalidArgumentError(
                f"{src}: none of the {len(jobs)} samples could be read; "
                f"first error: {failed[0][0]}: {failed[0][1]}"
            )
        manifest = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "num_samples": merged["num_samples"],
            "source_format": source_format,
            "classes": classes,
            "class_counts": merged["class_counts"],
            **extra,
            **(
                {"crowd_annotations": merged["crowd_annotations"]}
                if source_format == "coco"
                else {}
            ),
            "fields": merged["fields"],
            "shards": merged["shards"],
            "bytes": merged["bytes"],
            "max_side": max_side,
            "restart_interval": restart_interval if codec == "source" else None,
            "codec": codec,
            **({"size": list(size)} if size is not None else {}),
            "source": str(src),
            "failed": [{"path": p, "reason": r} for p, r in failed],
        }
        with open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if bar is not None:
            bar.close()
    return PackResult(
        out,
        merged["num_samples"],
        len(merged["shards"]),
        merged["bytes"],
        time.perf_counter() - t0,
        classes,
        failed,
        merged["reencoded"],
        manifest["fields"],
    )


def _ray_parts(
    folder: Path,
    jobs: list[_Job],
    num_classes: int,
    limit: int,
    threads: int,
    tasks: int | None,
    address: str | None,
    progress: bool,
    src: Path,
) -> list[_Part]:
    """The plan split into contiguous ranges, one Ray task each running _write_part (what a
    local pack runs) into the shared folder; then the parts after a failed sample rewritten
    with the keys it shifted."""
    from . import pack_ray

    with pack_ray.connect(address) as cpus:
        if threads > cpus:  # Ray would wait forever for a node that large
            raise InvalidArgumentError(
                f"threads={threads} per task, and the Ray cluster has {cpus} CPUs in all"
            )
        n = min(tasks or max(1, cpus // threads), len(jobs))
        bounds = [len(jobs) * i // n for i in range(n + 1)]
        calls = [
            (str(folder), f"part-{i:05d}-", jobs[a:b], a, num_classes, limit, threads)
            for i, (a, b) in enumerate(itertools.pairwise(bounds))
        ]
        parts = pack_ray.run_tasks(
            _write_part, calls, num_cpus=threads, progress=progress, desc=f"packing {src.name}"
        )
        # A part keys its samples from its first job's position: right unless samples before
        # it failed, which no task knew of while they ran.
        redo = [
            (i, start) for i, start in enumerate(_part_starts(parts)) if parts[i].start != start
        ]
        if redo:
            fixed = pack_ray.run_tasks(
                _rekey_part,
                [(str(folder), parts[i], start) for i, start in redo],
                num_cpus=1,
                progress=progress,
                desc="renumbering",
            )
            for (i, _), part in zip(redo, fixed, strict=True):
                parts[i] = part
    return parts


def inspect(path: str | os.PathLike) -> dict[str, Any]:
    """What a pack holds: format version, classes and counts, shards and their sizes, fields."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.exists():
        ds = _core.Dataset.open(str(path))  # foreign WebDataset shards: indexed now
        return {
            "format": "webdataset",
            "version": None,
            "num_samples": len(ds),
            "classes": [],
            "shards": ds.num_shards,
            "bytes": None,
        }
    with open(manifest_path) as f:
        m = json.load(f)
    if m.get("format") == "stoker-tokens":
        ds = _core.Dataset.open(str(path), seq_len=1)  # validates every file's size
        return {
            "format": m["format"],
            "version": m["version"],
            "num_samples": int(m["num_tokens"]),  # tokens: windows depend on the reader
            "num_tokens": int(m["num_tokens"]),
            "dtype": m["dtype"],
            "eos_id": m.get("eos_id"),
            "classes": [],
            "shards": len(m["shards"]),
            "bytes": m.get("bytes"),
            "shard_bytes": [s.get("bytes") for s in m["shards"]],
            "fields": [],
        }
    ds = _core.Dataset.open(str(path))  # validates every index (or column header) against its file
    if m.get("format") == "stoker-arrays":
        return {
            "format": m["format"],
            "version": m["version"],
            "num_samples": len(ds),
            "classes": m.get("classes", []),
            "shards": len(m["shards"]),
            "bytes": m.get("bytes"),
            "shard_bytes": [sum(f["bytes"] for f in s["files"]) for s in m["shards"]],
            "fields": m["fields"],
        }
    return {
        "format": m["format"],
        "version": m["version"],
        "num_samples": len(ds),
        "classes": m["classes"],
        "class_counts": m.get("class_counts"),
        "shards": len(m["shards"]),
        "bytes": m.get("bytes"),
        "shard_bytes": [s.get("bytes") for s in m["shards"]],
        "max_side": m.get("max_side"),
        "failed": len(m.get("failed", [])),
        "fields": m.get("fields", []),
    }
