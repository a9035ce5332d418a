"""Packs and WebDataset shards in object storage: ``s3://``, ``gs://``, ``http(s)://`` or any
fsspec URL.

A remote pack is read through a local cache folder. Its manifest and shard indexes (small) are
fetched when it is opened; each shard (a .tar) is fetched whole when the pass needs it, into the
same folder, and the C++ engine reads it there as a local file (`_core.ShardGate` is where the
engine's threads wait for a shard and where the fetcher hands it over).

Foreign WebDataset shards (a ``.tar`` URL, WebDataset's brace notation
``s3://b/train-{000000..000099}.tar``, a glob, a list of URLs, or a folder URL with ``.tar`` files
and no manifest) have no index: the first open on a machine fetches each shard once, indexes it
(every member's CRC32C included) and keeps the indexes in the cache folder with a manifest made
for them, so that from then on they are read exactly like a pack. A shard whose size or ETag
changes at the source is indexed again.

The cache folder:
- a download goes to ``NAME.part-PID`` and becomes ``NAME`` by rename only once its size and
  every member's CRC32C (from the index) are right, so a reader never sees a partial shard; a
  part whose process was killed is deleted by the next one to open the folder or make room;
- it holds at most ``cache_limit`` bytes of shards (finished and in progress: a download reserves
  its full size before it starts). To make room, shards that no process on the machine has
  asked to keep are deleted first; this process's own, least soon needed, next;
- processes on one machine (the ranks of a job) share it: a shard is fetched by one of them, the
  others wait for it (an flock per shard), and each process holds a shared flock on the shards
  it keeps, so that another does not delete them;
- a deleted shard that a reader still has open is read to the end: the engine keeps each
  fetched shard open until it is evicted from the gate, so deleting a file never breaks a read
  (the kernel frees its space when the last reader closes it).

Credentials come the way fsspec and its backends take them (environment variables, config
files, instance roles); stoker has no option for them, and the URLs in its messages have any
``user:password@`` removed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _core, plain_get
from .errors import CorruptDataError, InvalidArgumentError, ShardIOError, StokerError

DEFAULT_CACHE_LIMIT = 64 * 2**30  # bytes of shards a cache folder holds
MAX_MANIFEST_BYTES = 256 * 2**20  # a manifest or index larger than this is refused
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_PART = re.compile(r"(.+)\.part-\d+(?:-\d+)?")  # NAME.part-PID or NAME.part-PID-TID


def _part_of(name: str) -> str | None:
    """The file a download in progress (``NAME.part-PID[-TID]``) becomes; None for others (a
    shard may itself be called ``x.part-1.tar``)."""
    match = _PART.fullmatch(name)
    return match.group(1) if match else None


# Where fsspec backends give an object's version (S3's ETag, HTTP's, GCS's generation, a date).
_VERSION_KEYS = ("ETag", "etag", "generation", "LastModified", "last_modified", "mtime", "updated")


def is_url(path: object) -> bool:
    """Whether `path` is a URL (any ``scheme://``)."""
    return isinstance(path, str) and bool(_URL.match(path))


def is_remote(path: object) -> bool:
    """Whether a loader's `path` is remote: a URL, or a list of shard URLs (a list mixing URLs and
    local paths is an error)."""
    if isinstance(path, str):
        return is_url(path)
    if isinstance(path, os.PathLike) or not isinstance(path, Sequence):
        return False
    urls = [is_url(p) for p in path]
    if any(urls) and not all(urls):
        raise InvalidArgumentError("a list of shards is all URLs or all local paths, not both")
    return bool(urls) and all(urls)


def _url_path(url: str) -> str:
    """The part of `url` after ``scheme://host``: where brace and glob characters mean something
    (a host may be ``[::1]``)."""
    rest = url.split("://", 1)[1]
    return rest.split("/", 1)[1] if "/" in rest else ""


def _names_shards(spec: str | Sequence[str]) -> bool:
    """Whether `spec` names WebDataset shards rather than a pack folder."""
    if not isinstance(spec, str):
        return True
    path = _url_path(spec).split("?", 1)[0]
    return path.endswith((".tar", ".tgz", ".tar.gz")) or any(c in path for c in "{*?[")


def redact(text: str) -> str:
    """`text` with the ``user:password@`` of every URL in it removed (for messages and logs)."""
    return re.sub(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@", r"\1", text)


def default_cache_dir() -> Path:
    """``$STOKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/stoker``, else ``~/.cache/stoker``."""
    if os.environ.get("STOKER_CACHE_DIR"):
        return Path(os.environ["STOKER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stoker"


@dataclass(frozen=True)
class Retry:
    """How a failed fetch is retried: `tries` in all, waiting `backoff` seconds after the first
    failure, doubling up to `max_backoff`."""

    tries: int = 10  # waits 47.5 s in all: an object store restarting takes 20-30 s (SeaweedFS)
    backoff: float = 0.5
    max_backoff: float = 8.0

    def run(
        self, what: str, fn: Callable[[], Any], permanent: tuple[type[BaseException], ...] = ()
    ) -> Any:
        """fn(), tried again on any exception but those in `permanent`; then ShardIOError."""
        delay = self.backoff
        for attempt in range(1, self.tries + 1):
            try:
                return fn()
            except permanent:
                raise
            except Exception as e:  # noqa: BLE001 - network stacks raise anything; retried
                if attempt == self.tries:
                    why = redact(f"{type(e).__name__}: {e}")
                    raise ShardIOError(f"{what}: {why} ({self.tries} tries)", reason=why) from None
                time.sleep(delay)
                delay = min(delay * 2, self.max_backoff)
        raise AssertionError("unreachable")


DEFAULT_RETRY = Retry()

# Not worth a retry: we may not read it, or it is not what it should be. (A shard the manifest
# lists that is "not found" is retried: fsspec's HTTP backend says FileNotFoundError for a server
# that does not answer too.)
_PERMANENT: tuple[type[BaseException], ...] = (
    PermissionError,
    InvalidArgumentError,
    CorruptDataError,
)


@dataclass(frozen=True)
class _Shard:
    """One data file fetched whole: a tar pack's or foreign shard's .tar, an array pack's column
    file, a token pack's file. Its position in RemotePack.shards is its gate entry."""

    tar: str  # its file name in the cache folder
    index: str  # a tar's index ("": an array or token pack's file, checked against the manifest)
    bytes: int
    url: str  # the fsspec path it is fetched from
    shown: str  # its URL in messages (credentials removed)
    num_samples: int = -1  # foreign shards: from the index made for it
    etag: str = ""  # foreign shards: the source's version of it, when the server says


class _Locked:
    """An flock on `path` (created if needed), released on exit."""

    def __init__(self, path: Path, mode: int):
        self.path, self.mode, self.fd = path, mode, -1

    def __enter__(self) -> _Locked:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(self.fd, self.mode)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing releases the lock


def _unlocked(path: Path) -> bool:
    """Whether nobody holds an flock on `path` now (created if needed): taken and released at
    once. A lock this process holds through another descriptor counts as held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True  # released with the descriptor
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


class RemotePack:
    """A pack at `url`, or WebDataset shards (module docstring), read through the cache folder
    ``cache_dir/<name>-<hash of url>``.

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
        import fsspec  # type: ignore[import-untyped]  # torch needs it too; imported only here

        spec = url.rstrip("/") if isinstance(url, str) else [str(u) for u in url]
        if not spec:
            raise InvalidArgumentError("no shard URLs given")
        self.url = spec if isinstance(spec, str) else spec[0]
        self.shown = redact(self.url) + ("" if isinstance(spec, str) else f" (+{len(spec) - 1})")
        self.retry = retry or DEFAULT_RETRY
        self.cache_limit = DEFAULT_CACHE_LIMIT if cache_limit is None else int(cache_limit)
        if self.cache_limit <= 0:
            raise InvalidArgumentError(
                f"cache_limit must be a positive number of bytes, not {cache_limit}"
            )
        if prefetch_shards < 0 or fetch_threads < 1:
            raise InvalidArgumentError("need prefetch_shards >= 0 and fetch_threads >= 1")
        self.prefetch_shards, self.fetch_threads = prefetch_shards, fetch_threads
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        name = re.sub(r"[^A-Za-z0-9._-]", "_", self.url.rsplit("/", 1)[-1])[:64] or "pack"
        whole = spec if isinstance(spec, str) else "\n".join(spec)
        digest = hashlib.sha256(whole.encode()).hexdigest()[:16]
        self.folder = Path(cache_dir or default_cache_dir()) / f"{name}-{digest}"
        self.folder.mkdir(parents=True, exist_ok=True)
        with _Locked(self.folder / ".cache.lock", fcntl.LOCK_EX):
            self._remove_dead_parts()  # what a process killed mid-download left

        self.gate: Any = None  # the dataset's, once it is open
        self._keep: dict[int, int] = {}  # shard -> fd holding a shared flock on its .keep file
        self._lock = threading.Lock()  # guards _keep
        self._stop = threading.Event()
        self.fetched = 0  # shards this process downloaded
        self.fetched_bytes = 0
        self.shards: list[_Shard] = []
        if _names_shards(spec):
            self.shards = self._foreign_metadata(self._expand(spec))
        else:
            self.shards = self._pack_or_folder_metadata()
        self._check_limit()
        self.dataset = _core.Dataset.open_fetched(
            str(self.folder), seq_len=int((dataset_options or {}).get("seq_len", 0))
        )
        self.gate = self.dataset.gate
        self._threads: list[threading.Thread] = []
        self._plan: Callable[[], Sequence[int]] = lambda: ()
        self._claimed: set[int] = set()  # shards a fetcher thread of this process is on
        self._claim_lock = threading.Lock()
        self._pid = os.getpid()

    # --- metadata -------------------------------------------------------------------------------
    def _fetch_small(self, name: str) -> bytes:
        """A manifest or index: fetched once per cache folder (any process), kept."""
        local = self.folder / name
        with _Locked(self.folder / f".{name}.lock", fcntl.LOCK_EX):
            if local.exists():
                return local.read_bytes()
            remote = f"{self.root}/{name}"

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
            part = local.with_name(f"{name}.part-{os.getpid()}")
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
        if not tars:
            raise ShardIOError(
                f"{self.shown}: no manifest.json (not a stoker pack) and no .tar shards",
                reason="no manifest.json",
            )
        return self._foreign_metadata([self.fs.unstrip_protocol(p) for p in tars])

    def _made_here(self) -> bool:
        """Whether the cache folder's manifest.json was made here, for foreign shards."""
        try:
            return json.loads((self.folder / "manifest.json").read_bytes()).get("foreign") is True
        except (OSError, ValueError, AttributeError):
            return False

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
        with ThreadPoolExecutor(8, "stoker-index") as pool:  # the indexes: 8 requests at a time
            list(pool.map(self._fetch_small, [s.index for s in shards if s.index]))
        return shards

    # --- foreign WebDataset shards --------------------------------------------------------------
    def _expand(self, spec: str | Sequence[str]) -> list[str]:
        """The shard URLs `spec` names, in order: a list as given, WebDataset's brace notation
        expanded, a glob listed and sorted."""
        if not isinstance(spec, str):
            return list(spec)
        path = _url_path(spec).split("?", 1)[0]
        if "{" in path:
            from braceexpand import braceexpand  # stoker[remote]

            return list(braceexpand(spec))
        if any(c in path for c in "*?["):
            found = self._retrying(f"listing {self.shown}", lambda: self.fs.glob(self.root))
            if not found:
                raise InvalidArgumentError(f"no shards match {self.shown}")
            return [self.fs.unstrip_protocol(p) for p in sorted(found)]
        return [spec]

    def _check_limit(self) -> None:
        largest = max(s.bytes for s in self.shards)
        if largest > self.cache_limit:
            raise InvalidArgumentError(
                f"cache_limit ({self.cache_limit:,} bytes) is smaller than the largest shard of "
                f"{self.shown} ({largest:,} bytes)"
            )

    def _foreign_metadata(self, urls: list[str]) -> list[_Shard]:
        """The shards at `urls`, each indexed in the cache folder (fetched and indexed first
        where it is not), and the manifest made there that opens them as a pack."""
        import fsspec

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

    def _retrying(
        self, what: str, fn: Callable[[], Any], permanent: tuple[type[BaseException], ...] = ()
    ) -> Any:
        try:
            return self.retry.run(what, fn, _PERMANENT + permanent)
        except _PERMANENT + permanent as e:
            if isinstance(e, StokerError):
                raise
            why = redact(f"{type(e).__name__}: {e}")
            if isinstance(e, FileNotFoundError):
                why += " (not there, or the server did not answer)"
            raise ShardIOError(f"{what}: {why}", reason=why) from None

    # --- the fetcher ----------------------------------------------------------------------------
    def start(self, plan: Callable[[], Sequence[int]]) -> None:
        """Start fetching: what readers wait for first, then the first `prefetch_shards` of
        `plan()`. Idempotent; the plan may change between calls."""
        self._plan = plan
        if self._pid != os.getpid():  # a forked child: the parent's fetcher threads are not here
            self._pid = os.getpid()
            self._threads, self._claimed = [], set()
            self._lock, self._claim_lock = threading.Lock(), threading.Lock()
            self._keep = {}  # the fds are the parent's too: its locks stay its own
        if self._threads:
            return
        for i in range(self.fetch_threads):
            t = threading.Thread(target=self._run, name=f"stoker-fetch-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        self._stop.set()
        self.gate.close()
        for t in self._threads:
            if t is not threading.current_thread():  # a loader collected on its own fetcher
                t.join(timeout=30)
        self._threads.clear()
        with self._lock:
            for fd in self._keep.values():
                os.close(fd)
            self._keep.clear()

    def _wanted(self, wait_ms: int) -> list[int]:
        """What readers wait for, the next `prefetch_shards` of the plan, and, when some of those
        are already here, as many more of the plan's shards that are not (so that fetching ahead
        does not stop where the pass reads cached shards, e.g. at a shuffle window's edge)."""
        requested = list(self.gate.wait_for_requests(wait_ms))
        upcoming = [s for s in self._plan() if s not in requested]
        near = upcoming[: self.prefetch_shards]
        room = sum(self.gate.is_ready(s) for s in near)
        later = [s for s in upcoming[self.prefetch_shards :] if not self.gate.is_ready(s)]
        return requested + near + later[:room]

    def _run(self) -> None:
        claimed = self._claimed
        fetched = True
        while not self._stop.is_set():
            try:
                # Straight on after a download (the next is wanted now: waiting here for a reader's
                # request left the link idle 0.1 s a shard); idle, until a reader asks or 0.1 s.
                wanted = self._wanted(0 if fetched else 100)
            except StokerError:
                return  # the gate was closed
            if self._stop.is_set():  # closed while asking (the plan may have closed it)
                return
            self._set_keep(wanted)
            requested = set(self.gate.wait_for_requests(0))
            fetched = False
            for shard in wanted:
                with self._claim_lock:  # one fetcher thread per shard
                    if shard in claimed or self.gate.is_ready(shard):
                        continue
                    claimed.add(shard)
                try:
                    # A shard fetched ahead never waits for room, nor evicts what the pass reads
                    # next. One a reader waits for may evict anything but the other shards that
                    # readers wait for: a reader with the file open reads on (module docstring),
                    # and one that needs it again asks again.
                    waited_for = shard in requested
                    path = self.fetch(shard, keep=None if waited_for else set(wanted))
                    if path is None:
                        continue
                    fetched = True
                    self.gate.ready(shard, str(path))
                except StokerError as e:
                    self.gate.failed(shard, str(e))
                except Exception as e:  # noqa: BLE001 - the gate must hear of any failure
                    self.gate.failed(shard, f"{self.shards[shard].shown}: {e!r}")
                finally:
                    with self._claim_lock:
                        claimed.discard(shard)
                break  # re-read the requests: a reader may be waiting for another shard now
            if not fetched:  # all wanted shards are here or on the way: do not spin
                self._stop.wait(0.05)

    def _set_keep(self, wanted: Sequence[int]) -> None:
        """Hold a shared flock on each wanted shard's .keep file, and only on those."""
        with self._lock:
            if self._stop.is_set():  # closed (perhaps from this very thread): keep nothing
                return
            for shard in [s for s in self._keep if s not in wanted]:
                os.close(self._keep.pop(shard))
            for shard in wanted:
                if shard not in self._keep:
                    fd = os.open(self._keep_path(shard), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    self._keep[shard] = fd

    def _keep_path(self, shard: int) -> Path:
        return self.folder / f".{self.shards[shard].tar}.keep"

    # --- one shard ------------------------------------------------------------------------------
    def fetch(self, shard: int, keep: set[int] | None = None) -> Path | None:
        """The shard's local file: fetched, checked and renamed into place unless another
        process did so first. Raises ShardIOError (naming the URL) once its tries are spent,
        CorruptDataError if what arrives is not what the index describes, twice in a row.

        `keep=None` (a shard readers wait for): waits for room, making it from any shard but
        those readers wait for at that moment. With a `keep` set (fetching ahead): never waits
        and never evicts those; None when there is no room now."""
        s = self.shards[shard]
        final = self.folder / s.tar
        with _Locked(self.folder / f".{s.tar}.lock", fcntl.LOCK_EX):  # one download per machine
            if final.exists() and final.stat().st_size == s.bytes:
                return final

            def protect() -> set[int]:  # re-read at every try: what readers wait for changes
                return (set(self.gate.wait_for_requests(0)) if keep is None else keep) | {shard}

            return self._download_locked(
                s,
                protect,
                keep is None,
                lambda part: self.dataset.verify_file(shard, str(part)),
                corrupt_refetch=True,
            )

    def _download_locked(
        self,
        s: _Shard,
        protect: Callable[[], set[int]],
        wait: bool,
        check: Callable[[Path], None],
        corrupt_refetch: bool = False,
    ) -> Path | None:
        """With the shard's lock held: room reserved for it (None when there is none and not
        `wait`), the shard downloaded to a .part file, `check(part)`, and the part renamed into
        place. With `corrupt_refetch`, a download that fails its check is fetched once more."""
        final = self.folder / s.tar
        part = self.folder / f"{s.tar}.part-{os.getpid()}-{threading.get_ident()}"
        if not self._reserve(part, s.bytes, protect, wait):
            return None
        try:
            for attempt in range(2 if corrupt_refetch else 1):
                self._retrying(f"fetching {s.shown}", lambda: self._download(s.url, part, s.bytes))
                try:
                    check(part)
                    break
                except StokerError as e:
                    if not corrupt_refetch:
                        raise
                    if attempt == 1:
                        raise CorruptDataError(
                            f"{s.shown}: fetched twice, corrupt both times: {e}",
                            shard=s.tar,
                            reason=str(e),
                        ) from e
            # Under the cache lock: a _used() that listed the part and then stats it after the
            # rename would miss the shard, and let another download in over the limit.
            with _Locked(self.folder / ".cache.lock", fcntl.LOCK_EX):
                os.replace(part, final)
        finally:
            part.unlink(missing_ok=True)
        self.fetched += 1
        self.fetched_bytes += s.bytes
        return final

    def _download(self, url: str, part: Path, expected: int) -> None:
        plain = plain_get.object_url(self.fs, url)
        try:
            if plain is not None:  # one GET, streamed (plain_get: a quarter of fsspec's CPU)
                plain_get.get_into(plain, part, expected, self._stop)
                return
            # Elsewhere one ranged GET per 16 MiB read, no read-ahead cache: 1.23 ms of CPU per
            # MiB from SeaweedFS against 1.82 for 8 MiB reads through fsspec's default cache.
            block = 16 * 2**20
            with self.fs.open(url, "rb", block_size=block, cache_type="none") as src:
                plain_get.copy_into(src, part, expected, self._stop, block)
        except InterruptedError:
            raise InvalidArgumentError("the loader was closed") from None  # not retried

    # --- the limit ------------------------------------------------------------------------------
    def _remove_dead_parts(self, held: str | None = None, own: Path | None = None) -> None:
        """Delete the downloads in progress (``NAME.part-...``) whose writer is gone: a process
        killed mid-download leaves its part, which would hold disk and count against the limit
        for ever. A part is only ever written by a holder of its file's lock (``.NAME.lock``),
        until it is renamed or deleted: a part whose lock can be taken now has no writer. `held`:
        the file whose lock the caller holds (its parts other than `own` are dead). Call with the
        cache lock held."""
        for entry in os.scandir(self.folder):
            name = _part_of(entry.name)
            if name is None or name.startswith("."):
                continue
            if name == held:
                dead = own is None or entry.name != own.name
            else:
                dead = _unlocked(self.folder / f".{name}.lock")
            if dead:
                Path(entry.path).unlink(missing_ok=True)

    def _used(self) -> int:
        total = 0
        # Data files: the pack's (names) and any .tar (foreign shards, while being indexed, are
        # not in self.shards yet); downloads in progress (NAME.part-...) count at their size.
        names = {s.tar for s in self.shards}
        for entry in os.scandir(self.folder):
            base = _part_of(entry.name) or entry.name
            if base in names or base.endswith(".tar"):
                try:
                    total += entry.stat().st_size
                except FileNotFoundError:
                    pass
        return total

    def _reserve(
        self,
        part: Path,
        size: int,
        protect: Callable[[], set[int]],
        wait: bool,
        timeout: float = 600.0,
    ) -> bool:
        """Create `part` at its full `size` once the cache has room for it, deleting shards to
        make room: those nobody keeps first, then this process's own not in `protect`. Without
        `wait`, False at once when there is no room."""
        deadline = time.monotonic() + timeout
        while True:
            with _Locked(self.folder / ".cache.lock", fcntl.LOCK_EX):
                self._remove_dead_parts(held=_part_of(part.name), own=part)
                used = self._used()
                for shard in self._eviction_order(protect()):
                    if used + size <= self.cache_limit:
                        break
                    used -= self._evict(shard)
                if used + size <= self.cache_limit:
                    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                    try:
                        if size:
                            os.posix_fallocate(fd, 0, size)
                    finally:
                        os.close(fd)
                    return True
            if not wait:
                return False
            if time.monotonic() > deadline or self._stop.is_set():
                raise ShardIOError(
                    f"{self.shown}: no room for a {size:,}-byte shard in {self.folder} within "
                    f"cache_limit={self.cache_limit:,}: the shards in it are kept by processes "
                    "sharing the cache (raise cache_limit)"
                )
            time.sleep(0.2)  # another process will release or finish one

    def _eviction_order(self, protect: set[int]) -> list[int]:
        present = [i for i, s in enumerate(self.shards) if (self.folder / s.tar).exists()]
        with self._lock:
            mine = set(self._keep)
        nobody = [i for i in present if i not in mine and not self._kept_elsewhere(i)]
        own = [i for i in present if i in mine and i not in protect]
        return nobody + own[::-1]

    def _kept_elsewhere(self, shard: int) -> bool:
        return not _unlocked(self._keep_path(shard))

    def _evict(self, shard: int) -> int:
        """Delete the shard's file (readers that have it open read on). Returns the bytes."""
        path = self.folder / self.shards[shard].tar
        if self.gate is not None:  # None while foreign shards are indexed on open
            self.gate.evict(shard)
        try:
            size = path.stat().st_size
            path.unlink()
            return size
        except FileNotFoundError:
            return 0

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
