"""Foreign WebDataset shards read as a pack (stoker.remote's docstring): the URLs a brace
pattern, glob or list names; each shard fetched and indexed once per cache folder, again when
its size or ETag changes at the source; and the manifest made for them."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .. import _core
from ..errors import CorruptDataError, InvalidArgumentError, ShardIOError, StokerError
from .cache import ShardCache, _Locked, _Shard
from .urls import _url_path, braceexpand, is_url, redact

# Where fsspec backends give an object's version (S3's ETag, HTTP's, GCS's generation, a date).
_VERSION_KEYS = ("ETag", "etag", "generation", "LastModified", "last_modified", "mtime", "updated")


class ForeignShards(ShardCache):
    """RemotePack's metadata for WebDataset shards: `_foreign_metadata(urls)` indexes them in the
    cache folder and writes the manifest that opens them as a pack."""

    url: str
    root: str
    fetch_threads: int

    def _made_here(self) -> bool:
        """Whether the cache folder's manifest.json was made here, for foreign shards."""
        try:
            return json.loads((self.folder / "manifest.json").read_bytes()).get("foreign") is True
        except (OSError, ValueError, AttributeError):
            return False

    def _expand(self, spec: str | Sequence[str]) -> list[str]:
        """The shard URLs `spec` names, in order: a list as given, WebDataset's brace notation
        expanded, a glob listed and sorted."""
        if not isinstance(spec, str):
            return list(spec)
        path = _url_path(spec).split("?", 1)[0]
        if "{" in path:
            return braceexpand(spec)
        if any(c in path for c in "*?["):
            found = self._retrying(f"listing {self.shown}", lambda: self.fs.glob(self.root))
            if not found:
                raise InvalidArgumentError(f"no shards match {self.shown}")
            return [self.fs.unstrip_protocol(p) for p in sorted(found)]
        return [spec]

    def _foreign_metadata(self, urls: list[str]) -> list[_Shard]:
        """The shards at `urls`, each indexed in the cache folder (fetched and indexed first
        where it is not), and the manifest made there that opens them as a pack."""
        import fsspec  # type: ignore[import-untyped]

        protocol = fsspec.core.split_protocol(self.url)[0]
        for u in urls:
            if not is_url(u) or fsspec.core.split_protocol(u)[0] != protocol:
                raise InvalidArgumentError(
                    f"{redact(u)}: the shards of one loader are all {protocol}:// URLs"
                )
            if u.split("?", 1)[0].endswith((".tgz", ".gz")):
                raise InvalidArgumentError(
                    f"{redact(u)}: a compressed tar cannot be read in place (its members have no "
                    "fixed offsets): decompress it, or pack the samples with `stoker pack`"
                )
        paths = [self.fs._strip_protocol(u) for u in urls]
        infos = self._stat(paths, urls)
        names = [
            (re.sub(r"[^A-Za-z0-9._-]", "_", p.split("?", 1)[0].rsplit("/", 1)[-1]).lstrip(".")
             or "shard").removesuffix(".tar") + ".tar"
            for p in paths
        ]  # fmt: skip
        if len(set(names)) < len(names):  # shards of several folders: one name each
            names = [f"{i:06d}-{n}" for i, n in enumerate(names)]
        self.shards = []
        for name, path, url, info in zip(names, paths, urls, infos, strict=True):
            etag = str(next((info[k] for k in _VERSION_KEYS if info.get(k) not in (None, "")), ""))
            size = int(info["size"])
            version = hashlib.sha256(f"{size}|{etag}".encode()).hexdigest()[:12]
            index = f"{name.removesuffix('.tar')}.{version}.idx"
            self.shards.append(_Shard(name, index, size, path, redact(url), etag=etag))
        self._check_limit()
        self._forget_changed()
        missing = [s for s in self.shards if not (self.folder / s.index).exists()]
        if missing:
            from tqdm.auto import tqdm

            with (
                tqdm(
                    total=len(missing),
                    desc=f"stoker: indexing the shards of {self.shown}",
                    unit="shard",
                    disable=None,  # a terminal only
                ) as bar,
                ThreadPoolExecutor(max(4, self.fetch_threads), "stoker-index") as pool,
            ):
                for _ in pool.map(self._index_foreign, missing):
                    bar.update()
        counts = [self._count(s) for s in self.shards]
        self.shards = [
            _Shard(s.tar, s.index, s.bytes, s.url, s.shown, n, s.etag)
            for s, n in zip(self.shards, counts, strict=True)
        ]
        manifest = {
            "format": "stoker-pack",
            "version": 2,
            "foreign": True,  # made here, for WebDataset shards (stoker.remote)
            "classes": [],
            "num_samples": sum(counts),
            "shards": [
                {"tar": s.tar, "index": s.index, "num_samples": s.num_samples, "bytes": s.bytes,
                 "url": s.shown, "etag": s.etag}
                for s in self.shards
            ],
        }  # fmt: skip
        data = json.dumps(manifest, indent=1).encode()
        local = self.folder / "manifest.json"
        with _Locked(self.folder / ".manifest.json.lock", fcntl.LOCK_EX):
            if not local.exists() or local.read_bytes() != data:
                part = local.with_name(f"manifest.json.part-{os.getpid()}")
                part.write_bytes(data)
                os.replace(part, local)
        return self.shards

    def _stat(self, paths: list[str], urls: list[str]) -> list[dict[str, Any]]:
        """Each shard's size (and ETag where the server gives one): a listing of their folders
        where that works (one request each), else one request per shard, 8 at a time."""
        listed: dict[str, dict[str, Any]] = {}
        parents = sorted({p.rsplit("/", 1)[0] for p in paths})
        protocol = str(self.url.split("://", 1)[0]).lower()
        if len(parents) <= 8 and not protocol.startswith("http"):  # no sizes in HTML listings
            for parent in parents:
                try:
                    listed.update((e["name"], e) for e in self.fs.ls(parent, detail=True))
                except Exception:  # noqa: BLE001 - each shard is asked about on its own below
                    pass

        def info(i: int) -> dict[str, Any]:
            entry = listed.get(paths[i])
            if entry is None or entry.get("size") is None:
                entry = self._retrying(
                    f"reading the size of {redact(urls[i])}",
                    lambda: self.fs.info(paths[i]),
                    permanent=(FileNotFoundError,),
                )
            if entry.get("size") is None:
                raise ShardIOError(f"{redact(urls[i])}: the server does not give its size")
            return entry

        with ThreadPoolExecutor(8, "stoker-stat") as pool:
            return list(pool.map(info, range(len(paths))))

    def _forget_changed(self) -> None:
        """Delete cached shards whose source changed since the manifest made here listed them."""
        if not self._made_here():
            return
        try:
            before = {
                s["tar"]: s["index"]
                for s in json.loads((self.folder / "manifest.json").read_bytes())["shards"]
            }
        except (OSError, ValueError, KeyError, TypeError):
            return
        for s in self.shards:
            if before.get(s.tar, s.index) != s.index:
                with _Locked(self.folder / f".{s.tar}.lock", fcntl.LOCK_EX):
                    (self.folder / s.tar).unlink(missing_ok=True)
                    (self.folder / str(before[s.tar])).unlink(missing_ok=True)

    def _index_foreign(self, s: _Shard) -> None:
        """Fetch the shard (kept in the cache: the pass reads it soon) and write its index."""
        final, index = self.folder / s.tar, self.folder / s.index
        with _Locked(self.folder / f".{s.tar}.lock", fcntl.LOCK_EX):  # once per machine
            if index.exists():
                return
            if final.exists() and final.stat().st_size == s.bytes:
                self._write_foreign_index(s, final)
                return
            self._download_locked(s, set, True, lambda part: self._write_foreign_index(s, part))

    def _write_foreign_index(self, s: _Shard, tar: Path) -> None:
        try:
            _core.write_foreign_shard_index(str(tar), str(self.folder / s.index))
        except StokerError as e:
            raise CorruptDataError(
                f"{s.shown}: not a WebDataset tar stoker can read: {e.reason}",
                shard=s.tar,
                key=e.key,
                reason=e.reason,
            ) from None

    def _count(self, s: _Shard) -> int:
        """The samples of the shard's index (made again if it is damaged)."""
        for attempt in range(2):
            try:
                return _core.shard_index_samples(str(self.folder / s.index), s.bytes)
            except StokerError:
                if attempt:
                    raise
                (self.folder / s.index).unlink(missing_ok=True)
                self._index_foreign(s)
        raise AssertionError("unreachable")
