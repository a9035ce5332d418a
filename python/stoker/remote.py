"""Packs in object storage: ``s3://``, ``gs://``, ``http(s)://`` or any fsspec URL.

A remote pack is read through a local cache folder. Its manifest and shard indexes (small) are
fetched when it is opened; each shard (a .tar) is fetched whole when the pass needs it, into the
same folder, and the C++ engine reads it there as a local file (`_core.ShardGate` is where the
engine's threads wait for a shard and where the fetcher hands it over).

The cache folder:
- a download goes to ``NAME.part-PID`` and becomes ``NAME`` by rename only once its size and
  every member's CRC32C (from the index) are right, so a reader never sees a partial shard;
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

import errno
import fcntl
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _core
from .errors import CorruptDataError, InvalidArgumentError, ShardIOError, StokerError

DEFAULT_CACHE_LIMIT = 64 * 2**30  # bytes of shards a cache folder holds
MAX_MANIFEST_BYTES = 256 * 2**20  # a manifest or index larger than this is refused
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: object) -> bool:
    """Whether `path` names a remote pack (any ``scheme://``)."""
    return isinstance(path, str) and bool(_URL.match(path))


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

    tries: int = 6
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
    tar: str
    index: str
    bytes: int


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


class RemotePack:
    """A pack at `url`, read through the cache folder ``cache_dir/<name>-<hash of url>``.

    `dataset` is the engine's view of it (`_core.Dataset.open_fetched`). `start(plan)` starts the
    fetcher; `plan()` returns the shards the pass will need next, soonest first.
    """

    def __init__(
        self,
        url: str,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        retry: Retry | None = None,
        prefetch_shards: int = 2,
        fetch_threads: int = 2,
    ):
        import fsspec  # type: ignore[import-untyped]  # torch needs it too; imported only here

        self.url = url.rstrip("/")
        self.shown = redact(self.url)
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
        digest = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.folder = Path(cache_dir or default_cache_dir()) / f"{name}-{digest}"
        self.folder.mkdir(parents=True, exist_ok=True)

        self.shards = self._fetch_metadata()
        largest = max(s.bytes for s in self.shards)
        if largest > self.cache_limit:
            raise InvalidArgumentError(
                f"cache_limit ({self.cache_limit:,} bytes) is smaller than the largest shard of "
                f"{self.shown} ({largest:,} bytes)"
            )
        self.dataset = _core.Dataset.open_fetched(str(self.folder))
        self.gate = self.dataset.gate
        self._keep: dict[int, int] = {}  # shard -> fd holding a shared flock on its .keep file
        self._lock = threading.Lock()  # guards _keep and _failures
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._plan: Callable[[], Sequence[int]] = lambda: ()
        self._claimed: set[int] = set()  # shards a fetcher thread of this process is on
        self._claim_lock = threading.Lock()
        self._pid = os.getpid()
        self.fetched = 0  # shards this process downloaded
        self.fetched_bytes = 0

    # --- metadata -------------------------------------------------------------------------------
    def _fetch_small(self, name: str) -> bytes:
        """A manifest or index: fetched once per cache folder (any process), kept."""
        local = self.folder / name
        with _Locked(self.folder / f".{name}.lock", fcntl.LOCK_EX):
            if local.exists():
                return local.read_bytes()
            remote = f"{self.root}/{name}"

            def get() -> bytes:
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

    def _fetch_metadata(self) -> list[_Shard]:
        raw = self._fetch_small("manifest.json")
        try:
            manifest = json.loads(raw)
            shards = [
                _Shard(str(s["tar"]), str(s["index"]), int(s["bytes"])) for s in manifest["shards"]
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
            self._fetch_small(s.index)
        return shards

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
            t.join(timeout=30)
        self._threads.clear()
        with self._lock:
            for fd in self._keep.values():
                os.close(fd)
            self._keep.clear()

    def _wanted(self) -> list[int]:
        requested = list(self.gate.wait_for_requests(100))
        upcoming = [s for s in self._plan() if s not in requested]
        return requested + upcoming[: self.prefetch_shards]

    def _run(self) -> None:
        claimed = self._claimed
        while not self._stop.is_set():
            try:
                wanted = self._wanted()
            except StokerError:
                return  # the gate was closed
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
                    self.gate.failed(shard, f"{self.shown}/{self.shards[shard].tar}: {e!r}")
                finally:
                    with self._claim_lock:
                        claimed.discard(shard)
                break  # re-read the requests: a reader may be waiting for another shard now
            if not fetched:  # all wanted shards are here or on the way: do not spin
                self._stop.wait(0.05)

    def _set_keep(self, wanted: Sequence[int]) -> None:
        """Hold a shared flock on each wanted shard's .keep file, and only on those."""
        with self._lock:
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
        url = f"{self.root}/{s.tar}"
        with _Locked(self.folder / f".{s.tar}.lock", fcntl.LOCK_EX):  # one download per machine
            if final.exists() and final.stat().st_size == s.bytes:
                return final
            part = self.folder / f"{s.tar}.part-{os.getpid()}-{threading.get_ident()}"
            if keep is None:  # re-read at every try: what readers wait for changes meanwhile
                room = self._reserve(
                    part, s.bytes, lambda: set(self.gate.wait_for_requests(0)) | {shard}, True
                )
            else:
                room = self._reserve(part, s.bytes, lambda: keep | {shard}, False)
            if not room:
                return None
            try:
                for check in range(2):  # a corrupt download is fetched once more
                    self._retrying(
                        f"fetching {self.shown}/{s.tar}", lambda: self._download(url, part, s.bytes)
                    )
                    try:
                        self.dataset.verify_shard(shard, str(part))
                        break
                    except StokerError as e:
                        if check == 1:
                            raise CorruptDataError(
                                f"{self.shown}/{s.tar}: fetched twice, corrupt both times: {e}",
                                shard=s.tar,
                                reason=str(e),
                            ) from e
                os.replace(part, final)
            finally:
                part.unlink(missing_ok=True)
            self.fetched += 1
            self.fetched_bytes += s.bytes
            return final

    def _download(self, url: str, part: Path, expected: int) -> None:
        with self.fs.open(url, "rb", block_size=8 * 2**20) as src, open(part, "r+b") as dst:
            written = 0
            while True:
                if self._stop.is_set():
                    raise InvalidArgumentError("the loader was closed")  # not retried
                chunk = src.read(8 * 2**20)
                if not chunk:
                    break
                written += len(chunk)
                if written > expected:
                    raise OSError(
                        errno.EFBIG, f"more than the {expected:,} bytes the manifest gives"
                    )
                dst.write(chunk)
            if written != expected:
                raise OSError(
                    errno.EIO, f"{written:,} bytes arrived, the manifest gives {expected:,}"
                )

    # --- the limit ------------------------------------------------------------------------------
    def _used(self) -> int:
        total = 0
        for entry in os.scandir(self.folder):
            if entry.name.endswith(".tar") or ".tar.part-" in entry.name:
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
        fd = os.open(self._keep_path(shard), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def _evict(self, shard: int) -> int:
        """Delete the shard's file (readers that have it open read on). Returns the bytes."""
        path = self.folder / self.shards[shard].tar
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
