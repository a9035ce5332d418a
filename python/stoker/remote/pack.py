"""RemotePack: a pack or WebDataset shards at a URL, opened through the cache folder (the
package's docstring says how), its manifest and indexes fetched on open, and the engine's
dataset over it."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .. import _core, faults
from ..errors import CorruptDataError, InvalidArgumentError, ShardIOError
from . import plain_get
from .cache import _Locked, _Shard, default_cache_dir
from .fetcher import Fetcher
from .foreign import ForeignShards
from .retry import DEFAULT_RETRY, Retry
from .urls import _names_shards, redact, url_filesystem

ATTACHED = "attached.json"  # the sidecars beside a manifest (stoker.attach; docs/FORMAT.md)
MAX_MANIFEST_BYTES = 256 * 2**20  # a manifest or index larger than this is refused


class ParquetFolderError(ShardIOError):
    """The folder at the URL holds Parquet files and no pack: the loader reads them as they are
    (stoker.parquet)."""


class RemotePack(ForeignShards, Fetcher):
    """A pack at `url`, or WebDataset shards (stoker.remote's docstring), read through the cache
    folder ``cache_dir/<name>-<hash of url>``.

    `dataset` is the engine's view of it (`_core.Dataset.open_fetched`). `start(plan)` starts the
    fetcher; `plan()` returns the shards the pass will need next, soonest first.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        retry: Retry | None = None,
        prefetch_shards: int = 2,
        fetch_threads: int = 2,
        dataset_options: dict[str, Any] | None = None,
    ):
        spec = url.rstrip("/") if isinstance(url, str) else [str(u) for u in url]
        if not spec:
            raise InvalidArgumentError("no shard URLs given")
        self.url = spec if isinstance(spec, str) else spec[0]
        self.shown = redact(self.url) + ("" if isinstance(spec, str) else f" (+{len(spec) - 1})")
        # DEFAULT_RETRY looked up here: tests set this module's for its packs.
        self._init_fetching(retry or DEFAULT_RETRY, cache_limit, prefetch_shards, fetch_threads)
        self.fs, self.root = url_filesystem(self.url)
        name = re.sub(r"[^A-Za-z0-9._-]", "_", self.url.rsplit("/", 1)[-1])[:64] or "pack"
        whole = spec if isinstance(spec, str) else "\n".join(spec)
        digest = hashlib.sha256(whole.encode()).hexdigest()[:16]
        self.folder = Path(cache_dir or default_cache_dir()) / f"{name}-{digest}"
        self.folder.mkdir(parents=True, exist_ok=True)
        with _Locked(self.folder / ".cache.lock", fcntl.LOCK_EX):
            self._remove_dead_parts()  # what a process killed mid-download left

        if _names_shards(spec):
            self.shards = self._foreign_metadata(self._expand(spec))
        else:
            self.shards = self._pack_or_folder_metadata()
        self._check_limit()
        self.dataset = _core.Dataset.open_fetched(
            str(self.folder), seq_len=int((dataset_options or {}).get("seq_len", 0))
        )
        self.gate = self.dataset.gate

    # --- metadata -------------------------------------------------------------------------------
    def _fetch_small(self, name: str, fresh: bool = False) -> bytes:
        """A manifest or index: fetched once per cache folder (any process), kept; `fresh`:
        fetched again (attached.json, which changes as columns are attached)."""
        local = self.folder / name  # a sidecar's index is in attached/NAME/
        local.parent.mkdir(parents=True, exist_ok=True)
        with _Locked(self.folder / f".{name.replace('/', '~')}.lock", fcntl.LOCK_EX):
            if local.exists() and not fresh:
                return local.read_bytes()
            remote = f"{self.root}/{name}"
            faults.point("shard_fetch", f"{self.shown}/{name}", ShardIOError)

            def get() -> bytes:
                url = plain_get.object_url(self.fs, remote)
                if url is not None:
                    data = plain_get.get_bytes(url, MAX_MANIFEST_BYTES + 1)
                    if len(data) > MAX_MANIFEST_BYTES:
                        raise CorruptDataError(f"{self.shown}/{name}: too large", shard=name)
                    return data
                size = self.fs.size(remote)
                if size is not None and size > MAX_MANIFEST_BYTES:
                    raise CorruptDataError(
                        f"{self.shown}/{name}: {size:,} bytes, more than {MAX_MANIFEST_BYTES:,}",
                        shard=name,
                    )
                with self.fs.open(remote, "rb") as f:
                    data = f.read(MAX_MANIFEST_BYTES + 1)
                if len(data) > MAX_MANIFEST_BYTES:
                    raise CorruptDataError(f"{self.shown}/{name}: too large", shard=name)
                return data

            data = self._retrying(
                f"fetching {self.shown}/{name}", get, permanent=(FileNotFoundError,)
            )
            part = local.with_name(f"{local.name}.part-{os.getpid()}")
            part.write_bytes(data)
            os.replace(part, local)
            return data

    def _pack_or_folder_metadata(self) -> list[_Shard]:
        """A pack's shards; or, for a folder with no manifest.json but .tar files, those."""
        error: ShardIOError | None = None
        if not self._made_here():  # a manifest made here for foreign shards: list them again
            try:
                return self._fetch_metadata()
            except ShardIOError as e:
                if "not there" not in str(e):
                    raise
                error = e
        try:
            listing = self.fs.ls(self.root, detail=False)
        except Exception:  # noqa: BLE001 - no listing either: the manifest's error says it
            if error is None:
                raise
            raise error from None
        tars = sorted(str(p) for p in listing if str(p).split("?", 1)[0].endswith(".tar"))
        if not tars and any(str(p).split("?", 1)[0].endswith(".parquet") for p in listing):
            raise ParquetFolderError(f"{self.shown}: Parquet files, not a pack")
        if not tars:
            raise ShardIOError(
                f"{self.shown}: no manifest.json (not a stoker pack) and no .tar shards",
                reason="no manifest.json",
            )
        return self._foreign_metadata([self.fs.unstrip_protocol(p) for p in tars])

    def _fetch_metadata(self) -> list[_Shard]:
        raw = self._fetch_small("manifest.json")

        def data_file(name: str, index: str, size: Any) -> _Shard:
            return _Shard(name, index, int(size), f"{self.root}/{name}", f"{self.shown}/{name}")

        try:
            manifest = json.loads(raw)
            kind = manifest.get("format")
            if kind == "stoker-arrays":  # every column file of every shard, in manifest order
                shards = [
                    data_file(str(f["file"]), "", f["bytes"])
                    for s in manifest["shards"]
                    for f in s["files"]
                ]
            elif kind == "stoker-tokens":
                shards = [data_file(str(s["file"]), "", s["bytes"]) for s in manifest["shards"]]
            else:
                shards = [
                    data_file(str(s["tar"]), str(s["index"]), s["bytes"])
                    for s in manifest["shards"]
                ]
        except (ValueError, KeyError, TypeError) as e:
            (self.folder / "manifest.json").unlink(missing_ok=True)  # refetched next time
            raise CorruptDataError(
                f"{self.shown}/manifest.json is not a stoker pack manifest with shard sizes: {e}",
                shard="manifest.json",
            ) from e
        if not shards:
            raise CorruptDataError(f"{self.shown}: the manifest lists no shards")
        for s in shards:
            if "/" in s.tar or "/" in s.index or s.bytes < 0:
                raise CorruptDataError(f"{self.shown}/manifest.json: bad shard entry {s}")
        if kind == "stoker-pack":  # its sidecars' shards (stoker.attach), after the pack's own
            shards += self._sidecar_files()
        faults.point("thread", "stoker-index", RuntimeError)
        with ThreadPoolExecutor(8, "stoker-index") as pool:  # the indexes: 8 requests at a time
            list(pool.map(self._fetch_small, [s.index for s in shards if s.index]))
        return shards

    def _fetch_optional(self, name: str, fresh: bool = False) -> bytes | None:
        """_fetch_small, or None where the pack has no such file (a 404, or the
        FileNotFoundError of fsspec's backends)."""
        try:
            return self._fetch_small(name, fresh)
        except FileNotFoundError:
            return None
        except ShardIOError as e:
            if "not there" in str(e):
                return None
            raise

    def fetch_beside(self, name: str) -> Path | None:
        """A small file beside the manifest (videos.npz), fetched once into the cache folder;
        None when the pack has none."""
        return None if self._fetch_optional(name) is None else self.folder / name

    def _sidecar_files(self) -> list[_Shard]:
        """The data files of the sidecars attached to the pack (attached.json beside the
        manifest, fetched with it; none there: none), in the engine's order (format/dataset.h):
        sidecar by sidecar, shard by shard. The indexes go where attached.json says (the engine
        reads them there); the data files, which the fetcher hands over by path, are kept in the
        cache folder itself as ``attached~NAME~shard-N.tar``, as its shards are."""
        before = self._fingerprints()
        try:
            raw = self._fetch_optional(ATTACHED, fresh=True)
        except PermissionError:  # 403: how a bucket that is not listed answers for no object
            raw = None
        except ShardIOError as e:
            if "403" not in str(e):
                raise
            raw = None
        if raw is None:
            (self.folder / ATTACHED).unlink(missing_ok=True)
            return []
        files = []
        try:
            for sidecar in json.loads(raw)["sidecars"]:
                name = str(sidecar["name"])
                if not re.fullmatch(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,63}", name):
                    raise ValueError(f"a sidecar named {name!r}")
                prefix = f"attached/{name}/"
                if before.get(name) != sidecar.get("fingerprint"):  # attached anew since
                    shutil.rmtree(self.folder / "attached" / name, ignore_errors=True)
                    for old in self.folder.glob(f"attached~{name}~*"):
                        old.unlink(missing_ok=True)
                for s in sidecar["shards"]:
                    tar, index, size = str(s["tar"]), str(s["index"]), int(s["bytes"])
                    for f in (tar, index):
                        rest = f[len(prefix):]
                        if (not f.startswith(prefix) or not rest or "/" in rest
                                or ".." in f or size < 0):  # fmt: skip
                            raise ValueError(f"a file outside {prefix}: {f}")
                    local = tar.replace("/", "~")
                    files.append(_Shard(local, index, size, f"{self.root}/{tar}",
                                        f"{self.shown}/{tar}"))  # fmt: skip
        except (ValueError, KeyError, TypeError) as e:
            (self.folder / ATTACHED).unlink(missing_ok=True)  # refetched next time
            raise CorruptDataError(f"{self.shown}/{ATTACHED}: not a list of sidecars: {e}",
                                   shard=ATTACHED) from e  # fmt: skip
        return files

    def _fingerprints(self) -> dict[str, Any]:
        """The sidecars this cache folder holds files of, by name: their fingerprints."""
        try:
            listed = json.loads((self.folder / ATTACHED).read_bytes())
            return {str(s["name"]): s.get("fingerprint") for s in listed["sidecars"]}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def stats(self) -> dict[str, Any]:
        return {
            "url": self.shown,
            "cache_dir": str(self.folder),
            "cache_limit": self.cache_limit,
            "cache_bytes": self._used(),
            "fetched": self.fetched,
            "fetched_bytes": self.fetched_bytes,
            **{f"gate_{k}": v for k, v in self.gate.stats().items()},
        }
