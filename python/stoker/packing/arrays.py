"""stoker.pack_arrays: numpy arrays, memmaps, torch tensors or per-sample dicts into an array
pack: per shard, one .npy file per field holding that field's rows (docs/FORMAT.md, "Array
packs"). np.load(file, mmap_mode="r") reads any of them; stoker.Loader reads the pack."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..errors import InvalidArgumentError
from ._files import parse_size
from .result import PackResult
from ._files import (
    check_name,
    checked_dtype,
    file_crc32c,
    npy_header,
    pack_folder,
    progress_bar,
    write_manifest,
)

FORMAT_VERSION = 1
# Rows handed to the file at a time from an array source: bounded memory whatever its size.
_CHUNK_BYTES = 16 << 20


def _as_numpy(value: Any) -> Any:
    """A numpy array (or memmap) for an array-like: torch tensors without a copy where possible.
    An array-like that has a shape and a dtype and is sliced by rows (an h5py or zarr dataset)
    is kept as it is: its rows are read a chunk at a time, never all at once."""
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("torch"):
        return value.detach().cpu().numpy()
    if all(hasattr(value, a) for a in ("shape", "dtype", "__getitem__")) and value.shape:
        return value
    return np.asarray(value)


class _Field:
    def __init__(self, name: str, dtype: np.dtype, shape: tuple[int, ...]):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.row_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize

    def check(self, value: Any, where: str) -> np.ndarray:
        """One row, as this field stores it; a clear error for another shape or an unsafe
        dtype."""
        row = np.asarray(value)
        if row.shape != self.shape:
            raise InvalidArgumentError(
                f"{where}: field {self.name!r} has shape {row.shape}, the first sample's "
                f"{self.shape} (array packs hold fixed shapes: pad, or pack a tar with "
                "stoker.pack)"
            )
        if row.dtype != self.dtype and not np.can_cast(row.dtype, self.dtype, "same_kind"):
            raise InvalidArgumentError(
                f"{where}: field {self.name!r} is {row.dtype}, the first sample's {self.dtype}"
            )
        return row.astype(self.dtype, copy=False)

    def manifest(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "array", "dtype": self.dtype.name,
                "shape": list(self.shape)}  # fmt: skip


class _Shard:
    """One shard being written: a file per field, rows appended, headers fixed at the end."""

    def __init__(self, folder: Path, number: int, fields: list[_Field]):
        self.folder, self.fields, self.rows = folder, fields, 0
        self.names = [f"shard-{number:06d}.{f.name}.npy" for f in fields]
        self.files = [open(folder / name, "wb") for name in self.names]
        self.offsets = []
        for f, field in zip(self.files, fields):
            header = npy_header(field.dtype, (0, *field.shape))
            f.write(header)
            self.offsets.append(len(header))

    def append(self, columns: Sequence[np.ndarray]) -> None:
        """Rows of every field, the same number of each, in field order."""
        for f, column, field in zip(self.files, columns, self.fields):
            f.write(np.ascontiguousarray(column, dtype=field.dtype).tobytes())
        self.rows += len(columns[0])

    def finish(self) -> dict[str, Any]:
        files = []
        for f, name, field, offset in zip(self.files, self.names, self.fields, self.offsets):
            f.seek(0)
            header = npy_header(field.dtype, (self.rows, *field.shape))
            assert len(header) == offset
            f.write(header)
            f.close()
            path = self.folder / name
            files.append({"field": field.name, "file": name, "bytes": path.stat().st_size,
                          "crc32c": file_crc32c(path), "data_offset": offset})  # fmt: skip
        return {"num_samples": self.rows, "files": files}


def _fields_of(first: Mapping[str, Any]) -> list[_Field]:
    fields = []
    for name, value in first.items():
        check_name(name, "field")
        row = np.asarray(value)
        fields.append(_Field(name, checked_dtype(row.dtype, f"field {name!r}"), row.shape))
    if not fields:
        raise InvalidArgumentError("pack_arrays: give at least one field")
    return fields


def _chunks_of_arrays(
    arrays: Mapping[str, Any], fields: list[_Field], n: int
) -> Iterator[list[np.ndarray]]:
    """Rows of every field, a chunk at a time (memmaps and tensors are read chunk by chunk)."""
    per_chunk = max(1, _CHUNK_BYTES // max(1, sum(f.row_bytes for f in fields)))
    sources = [_as_numpy(arrays[f.name]) for f in fields]
    for start in range(0, n, per_chunk):
        yield [np.asarray(s[start : start + per_chunk]) for s in sources]


def _chunks_of_samples(
    samples: Iterator[Mapping[str, Any]], fields: list[_Field], start: int
) -> Iterator[list[np.ndarray]]:
    names = [f.name for f in fields]
    rows_per_chunk = max(1, _CHUNK_BYTES // max(1, sum(f.row_bytes for f in fields)))
    index = start
    while True:
        batch = list(itertools.islice(samples, rows_per_chunk))
        if not batch:
            return
        columns: list[list[np.ndarray]] = [[] for _ in fields]
        for sample in batch:
            if not isinstance(sample, Mapping) or sorted(sample) != sorted(names):
                keys = sorted(sample) if isinstance(sample, Mapping) else type(sample).__name__
                raise InvalidArgumentError(
                    f"sample {index}: fields {keys}, the first sample's {sorted(names)}"
                )
            for column, field in zip(columns, fields):
                column.append(field.check(sample[field.name], f"sample {index}"))
            index += 1
        yield [np.stack(c) for c in columns]


def pack_arrays(
    data: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    out: str | os.PathLike,
    *,
    shard_size: int | str = "256MB",
    classes: Sequence[str] | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> PackResult:
    """Writes an array pack at `out`: fixed-shape fields stored column by column, one
    ``.npy`` file per field per shard, little-endian, C order.

    ``data`` is either a mapping of field name to an array whose first dimension is the sample
    (numpy arrays, memmaps, torch tensors: all of the same length), e.g. ``{"image": X,
    "label": y}``, or an iterable of per-sample dicts with the same fields and shapes. Either
    way the rows go to disk in chunks of about 16 MB, so a memmap larger than memory packs.
    Shards hold about ``shard_size`` bytes of rows. ``classes`` names the labels (kept in the
    manifest, as an image pack's). The pack is written beside `out` and renamed into place at
    the end: an interrupted pack leaves nothing at `out`.

    Read it with ``stoker.Loader(out, fields={"image": stoker.Image("image", ...),
    "label": stoker.Label("label"), "feat": stoker.Array("feat")})``: an Image field takes a
    uint8 ``(H, W, 3)``, ``(H, W, 1)`` or ``(H, W)`` column as pixels, with its geometry and
    flips, and no decoding.
    """
    return write_arrays(data, out, shard_size=shard_size, classes=classes, overwrite=overwrite,
                        progress=progress)  # fmt: skip


def write_arrays(
    data: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    out: str | os.PathLike,
    *,
    shard_size: int | str = "256MB",
    classes: Sequence[str] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    source_format: str | None = None,
) -> PackResult:
    """pack_arrays, for stoker.pack too: `source_format` (HDF5's, a .pt file's) goes in the
    manifest."""
    t0 = time.perf_counter()
    limit = parse_size(shard_size)
    if limit < 1:
        raise InvalidArgumentError("shard_size must be positive")
    out = Path(out)
    total: int | None
    if isinstance(data, Mapping):
        if not data:
            raise InvalidArgumentError("pack_arrays: give at least one field")
        arrays = {name: _as_numpy(value) for name, value in data.items()}
        for name, a in arrays.items():
            if not a.shape:
                raise InvalidArgumentError(f"pack_arrays: field {name!r} is one value, not rows")
        lengths = {name: int(a.shape[0]) for name, a in arrays.items()}
        if len(set(lengths.values())) != 1:
            raise InvalidArgumentError(
                f"pack_arrays: the fields have different numbers of samples: {lengths}"
            )
        total = next(iter(lengths.values()))
        fields = []
        for name, a in arrays.items():
            check_name(name, "field")
            fields.append(_Field(name, checked_dtype(a.dtype, f"field {name!r}"), a.shape[1:]))
        chunks: Iterator[list[np.ndarray]] = _chunks_of_arrays(arrays, fields, total)
    else:
        samples = iter(data)
        try:
            first = next(samples)
        except StopIteration:
            raise InvalidArgumentError("pack_arrays: the iterable gave no samples") from None
        if not isinstance(first, Mapping):
            raise InvalidArgumentError(
                f"pack_arrays: samples must be dicts of field -> array, not {type(first).__name__}"
            )
        fields = _fields_of(first)
        total = len(data) if hasattr(data, "__len__") else None  # type: ignore[arg-type]
        chunks = _chunks_of_samples(itertools.chain([first], samples), fields, 0)
    row_bytes = sum(f.row_bytes for f in fields)
    rows_per_shard = max(1, limit // max(1, row_bytes))

    shards: list[dict[str, Any]] = []
    with (
        pack_folder(out, overwrite) as folder,
        progress_bar(progress, total, "sample", f"packing arrays into {out.name}") as bar,
    ):
        shard: _Shard | None = None
        for chunk in chunks:
            at, n = 0, len(chunk[0])
            while at < n:
                if shard is None:
                    shard = _Shard(folder, len(shards), fields)
                take = min(n - at, rows_per_shard - shard.rows)
                shard.append([c[at : at + take] for c in chunk])
                at += take
                if shard.rows == rows_per_shard:
                    shards.append(shard.finish())
                    shard = None
            if bar is not None:
                bar.update(n)
        if shard is not None and shard.rows:
            shards.append(shard.finish())
        num_samples = sum(s["num_samples"] for s in shards)
        if num_samples == 0:
            raise InvalidArgumentError("pack_arrays: no samples to pack")
        manifest: dict[str, Any] = {
            "format": "stoker-arrays",
            "version": FORMAT_VERSION,
            "num_samples": num_samples,
            "fields": [f.manifest() for f in fields],
            "shards": shards,
            "bytes": sum(f["bytes"] for s in shards for f in s["files"]),
        }
        if classes is not None:
            manifest["classes"] = [str(c) for c in classes]
        if source_format is not None:
            manifest["source_format"] = source_format
        write_manifest(folder, manifest)
    return PackResult(
        out=out,
        num_samples=num_samples,
        num_shards=len(shards),
        bytes=manifest["bytes"],
        seconds=time.perf_counter() - t0,
        classes=list(manifest.get("classes", [])),
        fields=manifest["fields"],
    )
