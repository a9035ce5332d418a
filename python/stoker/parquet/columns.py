"""Columns as fields: which Parquet column each of a loader's fields reads (named, or guessed
as ImageLoader guesses for folders), checked against the column's type before anything starts;
and a decoded row group's columns turned into what the engine's gate takes (one buffer of cells
per column, its offsets and validity), without a Python object per row.

A field's member names a column: a top-level one (``"image"``), or a nested one by dotted name
(``"meta.caption"``). Hugging Face's ``Image`` and ``Audio`` features (``struct<bytes, path>``)
are read as their ``bytes``. What a field kind takes:

- Image, Mask, Boxes, Bytes, Text, Json, Video, Audio: binary or string cells (encoded files,
  text); a null cell is an absent member (the loader's ``missing`` policy, or ``optional``).
- Label: an integer (Hugging Face's ``ClassLabel`` gives the loader's ``classes``).
- Array, Tokens: a number (shape ``()``) or a list of numbers (shape ``(n,)``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core
from ..errors import InvalidArgumentError
from ..packing.sources.parquet import (
    BINARY,
    LISTS,
    _feature_type,
    _features,
    _is,
    _is_file_struct,
    _storage,
)

__all__ = ["Column", "bind", "class_names", "flat", "gate_columns", "leaf_types", "_features"]

LABEL_NAMES = ("label", "labels", "class", "target", "cls", "category", "fine_label")
IMAGE_NAMES = ("image", "img", "jpg", "jpeg", "png", "webp", "picture", "photo")
TEXTS = ("string", "large_string", "string_view")


@dataclass(frozen=True)
class Column:
    """One column a loader reads: `member` is the name its fields give it (the engine's member
    name), `read` the top-level column pyarrow reads, `path` its leaf after flattening structs
    (``image.bytes``), `cell` how its cells reach the engine: "bytes", "number" or "list"."""

    member: str
    read: str
    path: str
    cell: str
    dtype: str = "uint8"  # numbers and lists: the element type (numpy's name)


def leaf_types(schema: Any) -> dict[str, Any]:
    """Every column of an Arrow schema by dotted name: top-level ones and each struct's fields
    (nested to any depth), with their types."""
    out: dict[str, Any] = {}

    def walk(name: str, t: Any) -> None:
        out[name] = t
        s = _storage(t)
        if _is(s, "struct"):
            for i in range(s.num_fields):
                walk(f"{name}.{s.field(i).name}", s.field(i).type)

    for f in schema:
        walk(f.name, f.type)
    return out


def _cell(column: str, t: Any) -> tuple[str, str, str]:
    """(cell kind, element dtype, leaf path) of a column of type `t`; "" where it has none."""
    s = _storage(t)
    if _is(s, "dictionary"):
        s = s.value_type
    if _is_file_struct(s):
        return "bytes", "uint8", f"{column}.bytes"
    if _is(s, *BINARY, *TEXTS):
        return "bytes", "uint8", column
    if _is(s, "integer", "floating", "boolean"):
        return "number", _numpy_dtype(s), column
    if _is(s, *LISTS):
        v = _storage(s.value_type)
        if _is(v, "integer", "floating", "boolean"):
            return "list", _numpy_dtype(v), column
    return "", "", column


def _numpy_dtype(t: Any) -> str:
    return "uint8" if _is(t, "boolean") else np.dtype(t.to_pandas_dtype()).name


def _wants(field: Any) -> tuple[str, ...]:
    """The cell kinds a field (stoker.load.fields: its `kind`) reads."""
    if field.kind == _core.FieldKind.label:
        return ("number",)
    if field.kind in (_core.FieldKind.array, _core.FieldKind.tokens):
        return ("number", "list")
    return ("bytes",)


def bind(
    fields: Mapping[str, Any],
    schema: Any,
    features: dict[str, Any],
    where: str,
    image_members: str,
) -> tuple[dict[str, Any], list[Column], dict[str, dict[str, Any]]]:
    """The loader's fields (stoker.load.fields) with each member set to the column it reads,
    the columns to read (once each), and a schema by member for Array's shape and dtype. An
    Image whose member is `image_members` (ImageLoader's default) and a Label's "cls" are
    guessed from the columns. Raises InvalidArgumentError naming `where` (the file), the column
    and its type for a column that is not there or that the field cannot read."""
    types = leaf_types(schema)
    bound: dict[str, Any] = {}
    columns: dict[str, Column] = {}
    for name, field in fields.items():
        column = _column_of(field, types, features, where, image_members)
        if column is None:  # an optional label with no label column: absent from every row
            bound[name] = field
            continue
        t = types[column]
        cell, dtype, path = _cell(column, t)
        if cell not in _wants(field):
            raise InvalidArgumentError(
                f"{where}: field {name!r} ({type(field).__name__}) cannot read column "
                f"{column!r} of type {t}: it reads "
                + " or ".join(
                    {"bytes": "binary or string", "number": "numbers", "list": "lists of numbers"}[
                        w
                    ]
                    for w in _wants(field)
                )  # fmt: skip
            )
        if field.kind == _core.FieldKind.label and not np.issubdtype(np.dtype(dtype), np.integer):
            raise InvalidArgumentError(
                f"{where}: field {name!r} (Label) cannot read column {column!r} of type {t}: a "
                "label is an integer"
            )
        top = column if column in schema.names else next(
            n for n in schema.names if column.startswith(n + "."))  # fmt: skip
        columns.setdefault(column, Column(column, top, path, cell, dtype))
        copied = copy.copy(field)
        copied.member = column
        bound[name] = copied
    schema_out: dict[str, dict[str, Any]] = {}
    for c in columns.values():
        if c.cell == "number":
            schema_out[c.member] = {"name": c.member, "dtype": c.dtype, "shape": []}
        elif c.cell == "list":
            s = _storage(types[c.member])
            size = getattr(s, "list_size", None)
            shape = None if size is None else [int(size)]
            schema_out[c.member] = {"name": c.member, "dtype": c.dtype, "shape": shape}
    return bound, list(columns.values()), schema_out


def _column_of(
    field: Any, types: dict[str, Any], features: dict[str, Any], where: str, image_members: str
) -> str | None:
    """The column a field reads: the first of its member's alternatives that the file has;
    ImageLoader's default members (``jpg;png;...``, ``cls``) guessed from the columns."""
    for alternative in field.member.split(";"):
        if alternative in types:
            return alternative
    if field.kind == _core.FieldKind.image and field.member == image_members:
        guess = _image_column(types, features)
        if guess is not None:
            return guess
    elif field.kind == _core.FieldKind.label and field.member == "cls":
        guess = _label_column(types, features)
        if guess is not None or field.optional:
            return guess
    shown = ", ".join(f"{c}: {t}" for c, t in types.items() if "." not in c)
    raise InvalidArgumentError(f"{where}: no column {field.member!r} (the file's columns: {shown})")


def _image_column(types: dict[str, Any], features: dict[str, Any]) -> str | None:
    top = [c for c in types if "." not in c]
    for test in (
        lambda c: _feature_type(features, c) == "Image",
        lambda c: _is_file_struct(_storage(types[c])) and c.lower() in IMAGE_NAMES,
        lambda c: _is(_storage(types[c]), *BINARY) and c.lower() in IMAGE_NAMES,
        lambda c: _is_file_struct(_storage(types[c])) and _feature_type(features, c) is None,
    ):
        for c in top:
            if test(c):
                return c
    return None


def _label_column(types: dict[str, Any], features: dict[str, Any]) -> str | None:
    top = [c for c in types if "." not in c]
    for c in top:
        if _feature_type(features, c) == "ClassLabel":
            return c
    for c in top:
        if c.lower() in LABEL_NAMES and _is(_storage(types[c]), "integer"):
            return c
    return None


def class_names(columns: list[Column], fields: Mapping[str, Any], features: dict) -> list[str]:
    """The class names of the first Label field's column, where it is a ClassLabel."""
    for field in fields.values():
        if field.kind == _core.FieldKind.label and field.member in {c.member for c in columns}:
            feature = features.get(field.member)
            if isinstance(feature, dict) and feature.get("_type") == "ClassLabel":
                return [str(n) for n in feature.get("names") or []]
    return []


# --- a decoded row group -> the gate ------------------------------------------------------------


def flat(table: Any) -> Any:
    """`table` with its struct columns flattened to dotted names (``image.bytes``), to any depth;
    a struct's null is its fields' null."""
    while any(_is(f.type, "struct") for f in table.schema):
        table = table.flatten()
    return table


def gate_columns(table: Any, columns: list[Column]) -> list[tuple[Any, ...]]:
    """A decoded row group (a pyarrow Table of the columns' `read` names) as ShardGate.ready_rows
    takes it: per column (member, cell, dtype, and its Arrow C Data Interface capsules), cast to
    large binary, its number type, or a large list of it (casts that copy only offsets, where
    any). The engine reads the buffers in place and releases them with the row group."""
    import pyarrow as pa  # type: ignore[import-untyped]

    flat_table = flat(table)
    out = []
    for c in columns:
        if c.path not in flat_table.column_names:
            raise InvalidArgumentError(f"column {c.member!r} is not in this row group")
        chunks = flat_table.column(c.path)
        if _is(chunks.type, "dictionary"):
            chunks = pa.chunked_array([k.dictionary_decode() for k in chunks.chunks],
                                      chunks.type.value_type)  # fmt: skip
        if c.cell == "bytes":  # 64-bit offsets before the chunks are joined: past 2 GiB too
            chunks = chunks.cast(pa.large_binary())
        array = chunks.combine_chunks()
        number = pa.from_numpy_dtype(np.dtype(c.dtype))
        if c.cell == "number":
            array = array.cast(number)
        elif c.cell == "list":
            array = array.cast(pa.large_list(number))
        out.append((c.member, c.cell, c.dtype, *array.__arrow_c_array__()))
    return out
