"""A table of members: a ``.csv`` with a header or ``.jsonl`` (one JSON object a row), one sample a
row, one member a column named as the member (``jpg``, ``seg.png``, ``boxes.npy``, ``json``,
``txt``). A column whose values name files (relative to the table's folder) stores each file;
other columns store their value. ``cls``/``label`` is the label, ``key``/``__key__`` is recorded
in sources.tsv."""

from __future__ import annotations

import csv
import functools
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InvalidArgumentError, StokerError
from ..members import Options, check_member_name, member_data, member_kind
from ..source import Job, Sample, SampleFailure, Source, files_fingerprint, reason
from .folder import PATH_HEADERS

FILE_KINDS = ("image", "mask", "array", "boxes")  # a table gives these as file paths only
LABEL_COLUMNS = ("cls", "label")
KEY_COLUMNS = ("key", "__key__")

log = logging.getLogger("stoker")


@dataclass(frozen=True)
class Column:
    name: str  # the member's name
    kind: str
    paths: bool  # the values name files (relative to the table's folder)


def is_member_table(path: Path) -> bool:
    """A JSON Lines file, or a CSV whose first row names members rather than the `path,label`
    list (with a header starting with path/file/filename, or none)."""
    if path.suffix.lower() == ".jsonl":
        return True
    with open(path, newline="", encoding="utf-8") as f:
        header = next((r for r in csv.reader(f) if r and not r[0].startswith("#")), None)
    if not header:
        return False
    header = [c.strip() for c in header]
    first = header[0]
    if first.lower() in PATH_HEADERS or (path.parent / first).is_file():
        return False
    return all(
        c.strip() and "/" not in c and "\\" not in c and not c.strip().isdigit() for c in header
    )


def read_table(path: Path) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
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


def table_labels(path: Path, values: list[Any]) -> tuple[list[int], list[str]]:
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


def row_sample(
    values: list[tuple[Column, Any]],
    has_label: bool,
    base: Path,
    row_ref: str,
    text_cells: bool,
    opts: Options,
) -> Sample:
    if not values and not has_label:
        raise SampleFailure(row_ref, "the row has neither members nor a label")
    sample = Sample([], [])
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
            data, info, rewritten = member_data(column.name, column.kind, data, opts)
        except (StokerError, OSError, ValueError) as e:
            raise SampleFailure(where, f"{column.name}: {reason(e)}") from e
        sample.members.append((info[0], data))  # an image stored raw is KEY.<...>ppm
        sample.fields.append(info)
        sample.rewritten |= rewritten
    return sample


class Table(Source):
    format = "table"

    def __init__(self, table: Path, opts: Options):
        self.table, self.opts = table, opts
        columns, rows = read_table(table)
        if not rows:
            raise InvalidArgumentError(f"{table}: no rows")
        for name in columns:
            check_member_name(name, f"{table}: column")
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
        self.labels, self.classes = table_labels(table, cells)
        base = table.parent

        def names_files(name: str) -> bool:
            # Any value naming a file makes the column a path column: the rows whose file is
            # missing then fail, rather than storing the path itself as the member.
            return any(
                isinstance(r.get(name), str) and (base / r[name].strip()).is_file() for _, r in rows
            )

        self.spec = []
        for name in names:
            kind = member_kind(name)
            self.spec.append(Column(name, kind, kind in FILE_KINDS or names_files(name)))
        if opts.max_side and any(c.kind in ("json", "array", "boxes") for c in self.spec):
            log.warning(
                "%s: max_side shrinks the images only; coordinates in json and .npy members are "
                "stored as they are, in the source images' pixels",
                table,
            )
        self.rows = rows
        self.key_column = key_columns[0] if key_columns else None

    def __len__(self) -> int:
        return len(self.rows)

    def jobs(self, start: int = 0, stop: int | None = None) -> Iterator[Job]:
        base = self.table.parent
        text_cells = self.table.suffix.lower() != ".jsonl"
        for (line, row), label in zip(self.rows[start:stop], self.labels[start:stop]):
            values = [(c, row[c.name]) for c in self.spec if c.name in row]
            row_ref = f"{self.table}:{line}"
            first_path = next((v for c, v in values if c.paths and isinstance(v, str)), None)
            where = str(base / first_path.strip()) if first_path is not None else row_ref
            ref = str(row.get(self.key_column, "")) if self.key_column else None
            make = functools.partial(
                row_sample, values, label >= 0, base, row_ref, text_cells, self.opts
            )
            yield Job(where, label, ref, make)

    def fingerprint(self) -> str:
        return files_fingerprint([self.table])
