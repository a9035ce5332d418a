"""Which Parquet files a loader's path names, listed once per job: a local file, folder (every
``.parquet`` under it) or glob, a list of them, or URLs: ``http(s)://`` files (braces expand
over their names; an HTTP server has no glob) or a folder (the files its index page links to),
``s3://`` / ``gs://`` files, folders and globs listed through fsspec (sizes and ETags from the
listing), and ``hf://datasets/ORG/NAME[@REV][/PATH]`` resolved to the Hub's files at one commit
(stoker.remote.hf). Under torch.distributed, rank 0 lists and the other ranks take its list."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError
from ..remote.urls import _url_path, braceexpand, is_url, redact, url_filesystem

SUFFIX = ".parquet"


@dataclass(frozen=True)
class ParquetFile:
    """One file: `name` in messages and shard names, `where` its path or URL, `size` in bytes
    and `etag` its version where the listing says (else the first request learns them)."""

    name: str
    where: str
    size: int | None = None
    etag: str | None = None

    @property
    def local(self) -> bool:
        return not is_url(self.where)


def is_parquet(path: object) -> bool:
    """Whether a loader's path names Parquet: ``.parquet`` files or a glob of them, a local
    folder holding them and no pack manifest, or an ``hf://`` dataset."""
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        if text.startswith("hf://"):
            return True
        if text.split("?", 1)[0].rstrip("/").endswith(SUFFIX):
            return True
        if is_url(text):
            return False
        p = Path(text)
        if p.is_dir():
            return (
                not (p / "manifest.json").exists() and next(p.rglob("*" + SUFFIX), None) is not None
            )
        return False
    if isinstance(path, Sequence) and path:
        return all(is_parquet(p) for p in path)
    return False


def list_files(
    spec: Any, endpoint: str | None = None, cache_dir: Path | None = None
) -> list[ParquetFile]:
    """The files `spec` names, in order (each spec's files sorted by name); under
    torch.distributed rank 0 lists them and broadcasts the list."""
    return _on_rank0(lambda: _list(spec, endpoint, cache_dir))


def _list(spec: Any, endpoint: str | None, cache_dir: Path | None) -> list[ParquetFile]:
    specs = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    files: list[ParquetFile] = []
    for s in specs:
        text = os.fspath(s)
        if text.startswith("hf://"):
            files += _hub(text, endpoint, cache_dir)
        elif is_url(text):
            files += _urls(text)
        else:
            files += _local(text)
    if not files:
        raise InvalidArgumentError(f"{redact(str(spec))[:200]}: no .parquet files there")
    names = [f.name for f in files]
    if len(set(names)) != len(names):  # names key the cache and the messages: the full ones
        files = [ParquetFile(f.where if f.local else redact(f.where), f.where, f.size, f.etag)
                 for f in files]  # fmt: skip
    return files


def _local(text: str) -> list[ParquetFile]:
    p = Path(text)
    if p.is_dir():
        found = sorted(p.rglob("*" + SUFFIX))
        return [ParquetFile(str(f.relative_to(p)), str(f), f.stat().st_size) for f in found]
    if any(c in text for c in "*?["):
        found = sorted(Path(f) for f in glob.glob(text, recursive=True) if f.endswith(SUFFIX))
        return [ParquetFile(f.name, str(f), f.stat().st_size) for f in found]
    if not p.is_file():
        raise InvalidArgumentError(f"{text}: no such file or folder")
    return [ParquetFile(p.name, str(p), p.stat().st_size)]


def _urls(url: str) -> list[ParquetFile]:
    scheme = url.split("://", 1)[0].lower()
    path = _url_path(url)
    if scheme in ("http", "https"):
        urls = braceexpand(url) if "{" in path else [url]
        if any(any(c in _url_path(u) for c in "*?[") for u in urls):
            raise InvalidArgumentError(
                f"{redact(url)}: an HTTP server's files cannot be globbed: name them (braces "
                "expand: train-{00000..00009}.parquet), list them, or give their folder"
            )
        if len(urls) == 1 and not path.split("?", 1)[0].endswith(SUFFIX):
            return _http_folder(url)
        return [ParquetFile(u.rsplit("/", 1)[-1].split("?", 1)[0], u) for u in urls]
    fs, root = url_filesystem(url)
    if any(c in root for c in "*?["):
        found = fs.glob(root, detail=True)
    elif root.endswith(SUFFIX):
        found = {root: fs.info(root)}
    else:
        found = fs.find(root, detail=True)
    out = []
    for name in sorted(found):
        info = found[name]
        if not str(name).endswith(SUFFIX) or info.get("type") == "directory":
            continue
        etag = info.get("ETag") or info.get("etag") or info.get("md5Hash")
        version = str(etag).strip('"') if etag else None
        out.append(ParquetFile(str(name).rsplit("/", 1)[-1], fs.unstrip_protocol(name),
                               int(info["size"]), version))  # fmt: skip
    return out


def _http_folder(url: str) -> list[ParquetFile]:
    """The .parquet files an HTTP folder's index page links to (nginx's autoindex, a static
    site's listing): one GET, through fsspec's HTTP backend."""
    fs, _ = url_filesystem(url)
    try:
        links = fs.ls(url.rstrip("/") + "/", detail=False)
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"{redact(url)}: no listing of the folder ({e})") from None
    found = sorted({str(u) for u in links if str(u).split("?", 1)[0].endswith(SUFFIX)})
    return [ParquetFile(u.rsplit("/", 1)[-1].split("?", 1)[0], u) for u in found]


def _hub(url: str, endpoint: str | None, cache_dir: Path | None) -> list[ParquetFile]:
    from ..remote import hf

    listing = hf.resolve(url, endpoint=endpoint, cache_dir=cache_dir)
    return [ParquetFile(f.path, f.url, f.size, f.etag) for f in listing.files]


def _on_rank0(fn: Any) -> Any:
    """fn() on rank 0, its result broadcast to the other ranks (fn() everywhere when there is
    no process group)."""
    try:
        import torch.distributed as dist

        shared = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    except ImportError:
        shared = False
    if not shared:
        return fn()
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", fn())
        except Exception as e:  # noqa: BLE001 - every rank raises it, not only rank 0
            box[0] = ("error", e)
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise value
    return value
