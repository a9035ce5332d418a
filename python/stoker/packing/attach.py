"""stoker.attach: a column added to a pack without rewriting its shards (cached VAE latents, text
embeddings, scores). The column is a sidecar beside the pack, ``attached/NAME/``: one tar shard
and index per pack shard, holding the same samples in the same order, each with one ``.npy``
member named NAME; ``attached.json`` lists the sidecars with the CRC32C of the manifest each was
made for and a fingerprint of its indexes. The engine opens them with the pack
(format/dataset.h): a loader reads NAME as one of the sample's members (``stoker.Array(NAME)``),
and a pack at a URL has its sidecars fetched through the same cache (docs/FORMAT.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .. import _core
from ..errors import InvalidArgumentError
from ._files import DTYPES, file_crc32c, progress_bar
from .writer import Schema

ATTACHED = "attached.json"
ATTACHED_FORMAT_VERSION = 1
_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,63}")
_LISTED = 5  # keys named in an error


@dataclasses.dataclass
class AttachResult:
    """What `stoker.attach` wrote: the sidecar's folder, its samples and bytes, and its
    fingerprint (of its indexes: the same values give the same one)."""

    name: str
    path: Path
    samples: int
    bytes: int
    fingerprint: str


def attach(pack: str | os.PathLike, name: str, source: Any, *, key_column: str = "key",
           value_column: str | None = None, overwrite: bool = False,
           progress: bool = True) -> AttachResult:  # fmt: skip
    """Adds the column `name` to the local pack `pack`, a value per sample by its key, written
    beside the pack (``attached/NAME/`` and ``attached.json``; the shards are not touched); a
    loader then reads it as it reads a member of the shards (``stoker.Array(name)``).

    ``source``: a mapping or a callable from a sample's key to its value (an array: numpy, torch
    or anything ``numpy.asarray`` takes; any shape and dtype but object, per sample), a folder of
    ``KEY.npy`` or ``KEY.pt`` files (KEY the sample's key, ``/`` a subfolder), or a Parquet file
    with a ``key_column`` and a ``value_column`` (lists, or ``.npy`` bytes; the only other column
    when not given). Every sample of the pack needs a value and every key of the source a
    sample: either missing is an error naming the keys. Attaching a name the pack has already
    (attached, or a member of its samples) is an error unless ``overwrite=True`` replaces an
    attached one. A pack at a URL: attach to the local copy and upload ``attached.json`` and
    ``attached/`` beside its manifest.
    """
    if "://" in os.fspath(pack):
        raise InvalidArgumentError(
            f"{pack}: attach to the pack's local copy, then upload {ATTACHED} and attached/ "
            "beside its manifest (a loader reading the URL fetches them through its cache)"
        )
    pack = Path(pack)
    if not (pack / "manifest.json").is_file():
        raise InvalidArgumentError(f"{pack}: not a stoker pack (no manifest.json)")
    manifest = json.loads((pack / "manifest.json").read_text())
    if manifest.get("format") != "stoker-pack":
        raise InvalidArgumentError(
            f"{pack}: sidecars attach to tar packs (stoker.pack), not {manifest.get('format')!r}"
        )
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.startswith("."):
        raise InvalidArgumentError(
            f"attach: name {name!r} must be 1-64 of A-Z a-z 0-9 _ - . (not starting with '.')"
        )
    with _locked(pack):  # one attach at a time per pack: each reads and writes the listing
        return _attach(pack, name, source, key_column, value_column, overwrite, progress)


def _attach(pack: Path, name: str, source: Any, key_column: str, value_column: str | None,
            overwrite: bool, progress: bool) -> AttachResult:  # fmt: skip
    folder = pack / "attached" / name
    for stale in (pack / "attached").glob(".*-*") if (pack / "attached").is_dir() else ():
        shutil.rmtree(stale, ignore_errors=True)  # what an attach that crashed left
    listed = _read_attached(pack)
    old = next((s for s in listed["sidecars"] if s["name"] == name), None)
    if old is not None and not overwrite:
        raise InvalidArgumentError(
            f"{pack}: {name!r} is attached already (overwrite=True replaces it)"
        )
    # The pack alone: a sidecar being replaced (even one made for another pack) is not opened.
    dataset = _core.Dataset.open(str(pack), sidecars=False)
    shards = [dataset.keys(s) for s in range(dataset.num_shards)]
    if any(name in dataset.member_names(s) for s in range(dataset.num_shards)):
        raise InvalidArgumentError(f"{pack}: its samples have a member {name!r} already")
    value_of, source_keys = _source(source, key_column, value_column)
    pack_keys = {k for keys in shards for k in keys}
    if source_keys is not None:
        missing = [k for keys in shards for k in keys if k not in source_keys]
        if missing:
            raise InvalidArgumentError(
                f"attach {name!r}: {len(missing)} of the pack's samples have no value in the "
                f"source: {missing[:_LISTED]}"
            )
        extra = sorted(k for k in source_keys if k not in pack_keys)
        if extra:
            raise InvalidArgumentError(
                f"attach {name!r}: {len(extra)} of the source's keys are no sample of {pack}: "
                f"{extra[:_LISTED]}"
            )

    tmp = pack / "attached" / f".{name}.partial-{os.getpid()}"
    tmp.mkdir(parents=True)
    entry: dict[str, Any] = {"name": name, "member": name,
                             "pack_manifest_crc32c": file_crc32c(pack / "manifest.json"),
                             "samples": len(dataset), "shards": []}  # fmt: skip
    digest = hashlib.sha256()
    total = 0
    schema = Schema()  # the values' dtype and shapes, as the manifest's fields record them
    try:
        with progress_bar(progress, len(dataset), "sample", f"attach {name}") as bar:
            for s, keys in enumerate(shards):
                stem = f"shard-{s:06d}"
                writer = _core.ShardWriter(str(tmp / f"{stem}.tar"), str(tmp / f"{stem}.idx"))
                for key in keys:
                    array = _array(value_of(key), name, key)
                    schema.add(name, "array", array.dtype.name, list(array.shape))
                    writer.add_sample(key, [(name, _npy(array))])
                    if bar is not None:
                        bar.update(1)
                writer.finish()
                for f in (tmp / f"{stem}.tar", tmp / f"{stem}.idx"):
                    _fsync(f)
                size = (tmp / f"{stem}.tar").stat().st_size
                total += size
                digest.update((tmp / f"{stem}.idx").read_bytes())
                entry["shards"].append({"tar": f"attached/{name}/{stem}.tar",
                                        "index": f"attached/{name}/{stem}.idx",
                                        "num_samples": len(keys), "bytes": size})  # fmt: skip
        entry["bytes"] = total
        entry["fingerprint"] = digest.hexdigest()[:16]
        entry["field"] = schema.to_list()[0] if len(dataset) else None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # Published: the old folder set aside, the new one in its place, then the listing; the
    # engine's checks on the whole (every sidecar opened with the pack); undone if they fail.
    aside = pack / "attached" / f".{name}.old-{os.getpid()}"
    if folder.exists():
        os.rename(folder, aside)
    os.rename(tmp, folder)
    before = json.loads(json.dumps(listed))
    listed["sidecars"] = [entry if s is old else s for s in listed["sidecars"]]
    if old is None:
        listed["sidecars"].append(entry)
    try:
        _write_attached(pack, listed)
        _core.Dataset.open(str(pack))
    except BaseException:
        _write_attached(pack, before)
        shutil.rmtree(folder, ignore_errors=True)
        if aside.exists():
            os.rename(aside, folder)
        raise
    shutil.rmtree(aside, ignore_errors=True)
    return AttachResult(name, folder, len(dataset), total, entry["fingerprint"])


@contextlib.contextmanager
def _locked(pack: Path) -> Iterator[None]:
    import fcntl

    with open(pack / ".attached.lock", "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def attached(pack: str | os.PathLike) -> list[dict[str, Any]]:
    """The sidecars attached to a local pack: each one's name, samples, bytes and fingerprint."""
    keep = ("name", "samples", "bytes", "fingerprint")
    return [{k: s.get(k) for k in keep} for s in _read_attached(Path(pack))["sidecars"]]


def _read_attached(pack: Path) -> dict[str, Any]:
    path = pack / ATTACHED
    if not path.exists():
        return {"format": "stoker-attached", "version": ATTACHED_FORMAT_VERSION, "sidecars": []}
    listed = json.loads(path.read_text())
    if not isinstance(listed, dict) or not isinstance(listed.get("sidecars"), list):
        raise InvalidArgumentError(f"{path}: not a list of stoker sidecars")
    return listed


def _write_attached(pack: Path, listed: dict[str, Any]) -> None:
    """attached.json replaced at once (a reader sees the old list or the new one); removed when
    the list is empty."""
    path = pack / ATTACHED
    if not listed["sidecars"]:
        path.unlink(missing_ok=True)
        return
    part = path.with_name(f".{ATTACHED}.part-{os.getpid()}")
    part.write_text(json.dumps(listed, indent=1) + "\n")
    _fsync(part)
    os.replace(part, path)


def _array(value: Any, name: str, key: str) -> np.ndarray:
    """The value as a little-endian array of a dtype the engine reads, or a clear error."""
    try:
        if hasattr(value, "detach"):  # a torch tensor
            value = value.detach().cpu().numpy()
        array = np.asarray(value)
    except (TypeError, ValueError) as e:  # bfloat16 tensors, ragged lists
        raise InvalidArgumentError(f"attach {name!r}: the value of {key!r}: {e}") from None
    if array.dtype.name not in DTYPES:
        raise InvalidArgumentError(
            f"attach {name!r}: the value of {key!r} is {array.dtype}, not a dtype stoker reads "
            f"({', '.join(DTYPES)})"
        )
    return array.astype(array.dtype.newbyteorder("<"), copy=False)


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, np.ascontiguousarray(array), allow_pickle=False)
    return out.getvalue()


def attached_fields(pack: str | os.PathLike) -> list[dict[str, Any]]:
    """The attached columns' schemas, as the manifest's "fields" record a member's (name,
    kind, dtype, smallest and largest shape): what a loader's fields take their shape from."""
    try:
        listed = _read_attached(Path(pack))
    except (OSError, ValueError, InvalidArgumentError):
        return []  # the engine names what is wrong with it when the pack opens
    return [s["field"] for s in listed["sidecars"] if isinstance(s.get("field"), dict)]


def _source(source: Any, key_column: str,
            value_column: str | None) -> tuple[Callable[[str], Any], set[str] | None]:  # fmt: skip
    """A value per key, and the source's keys (None for a callable: it has no list)."""
    if isinstance(source, Mapping):
        return (lambda key: source[key]), set(source)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            return _folder(path)
        if path.suffix == ".parquet" and path.is_file():
            return _parquet(path, key_column, value_column)
        raise InvalidArgumentError(
            f"attach: {path} is neither a folder of KEY.npy or KEY.pt files nor a .parquet file"
        )
    if callable(source):

        def call(key: str) -> Any:
            try:
                return source(key)
            except KeyError:
                raise InvalidArgumentError(
                    f"attach: the source has no value for the sample {key!r}"
                ) from None

        return call, None
    raise InvalidArgumentError(
        "attach: source is a mapping or a callable from key to array, a folder of KEY.npy or "
        f"KEY.pt files, or a Parquet file, not {type(source).__name__}"
    )


def _folder(path: Path) -> tuple[Callable[[str], Any], set[str]]:
    files: dict[str, Path] = {}
    for f in sorted(path.rglob("*")):
        if f.suffix in (".npy", ".pt") and f.is_file():
            key = f.relative_to(path).with_suffix("").as_posix()
            if key in files:
                raise InvalidArgumentError(f"attach: {key!r} is both {files[key]} and {f}")
            files[key] = f

    def load(key: str) -> Any:
        f = files[key]
        if f.suffix == ".npy":
            return np.load(f, allow_pickle=False)
        import torch

        return torch.load(f, map_location="cpu", weights_only=True)

    return load, set(files)


def _parquet(path: Path, key_column: str,
             value_column: str | None) -> tuple[Callable[[str], Any], set[str]]:  # fmt: skip
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    columns = pq.read_schema(path).names
    if key_column not in columns:
        raise InvalidArgumentError(f"attach: {path} has no key column {key_column!r} ({columns})")
    if value_column is None:
        others = [c for c in columns if c != key_column]
        if len(others) != 1:
            raise InvalidArgumentError(
                f"attach: {path} has columns {others} beside {key_column!r}: name value_column"
            )
        value_column = others[0]
    elif value_column not in columns:
        raise InvalidArgumentError(f"attach: {path} has no column {value_column!r} ({columns})")
    table = pq.read_table(path, columns=[key_column, value_column])
    keys = [str(k) for k in table.column(key_column).to_pylist()]
    if len(set(keys)) != len(keys):
        raise InvalidArgumentError(f"attach: {path} gives a key twice")
    rows = {k: i for i, k in enumerate(keys)}
    values = table.column(value_column)

    def load(key: str) -> Any:
        value = values[rows[key]].as_py()
        if isinstance(value, bytes):  # a .npy file's bytes
            return np.load(io.BytesIO(value), allow_pickle=False)
        return np.asarray(value)

    return load, set(keys)
