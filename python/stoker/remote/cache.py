"""The shared bounded cache folder of a remote pack (stoker.remote's docstring says how it is
shared): its flocks, its downloads in progress (``NAME.part-PID[-TID]``), one shard fetched into
it (room reserved, downloaded to a part, checked, renamed into place), and room made in it by
evicting shards. `ShardCache` is RemotePack's base: the fetcher threads and the indexing of
foreign shards fetch through it."""

from __future__ import annotations

import fcntl
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _core, faults
from ..errors import CorruptDataError, InvalidArgumentError, ShardIOError, StokerError
from . import plain_get
from .retry import _PERMANENT, Retry
from .urls import redact

DEFAULT_CACHE_LIMIT = 64 * 2**30  # bytes of shards a cache folder holds
_PART = re.compile(r"(.+)\.part-\d+(?:-\d+)?")  # NAME.part-PID or NAME.part-PID-TID


def _part_of(name: str) -> str | None:
    """The file a download in progress (``NAME.part-PID[-TID]``) becomes; None for others (a
    shard may itself be called ``x.part-1.tar``)."""
    match = _PART.fullmatch(name)
    return match.group(1) if match else None


def default_cache_dir() -> Path:
    """``$STOKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/stoker``, else ``~/.cache/stoker``."""
    if os.environ.get("STOKER_CACHE_DIR"):
        return Path(os.environ["STOKER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stoker"


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
    # Where its bytes start in the source file: a Parquet row group's columns are a range of
    # their file, kept at the same offset of the cache file (the rest of which is a hole).
    offset: int = 0


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


class ShardCache:
    """A remote pack's cache folder and the shards fetched into it (RemotePack sets the state
    declared here when it opens the pack)."""

    shown: str  # the URL in messages (credentials removed)
    fs: Any  # the fsspec file system the shards are fetched from
    folder: Path
    cache_limit: int
    retry: Retry
    shards: list[_Shard]
    dataset: _core.Dataset
    gate: Any
    fetched: int  # shards this process downloaded
    fetched_bytes: int
    _keep: dict[int, int]  # shard -> fd holding a shared flock on its .keep file
    _lock: threading.Lock  # guards _keep
    _stop: threading.Event

    def _check_limit(self) -> None:
        largest = max(s.bytes for s in self.shards)
        if largest > self.cache_limit:
            raise InvalidArgumentError(
                f"cache_limit ({self.cache_limit:,} bytes) is smaller than the largest shard of "
                f"{self.shown} ({largest:,} bytes)"
            )

    def _retrying(
        self, what: str, fn: Callable[[], Any], permanent: tuple[type[BaseException], ...] = ()
    ) -> Any:
        try:
            return self.retry.run(what, fn, _PERMANENT + permanent, self._stop)
        except InterruptedError:  # closed while reading, or while waiting to try again
            raise InvalidArgumentError("the loader was closed") from None
        except _PERMANENT + permanent as e:
            if isinstance(e, StokerError):
                raise
            why = redact(f"{type(e).__name__}: {e}")
            if isinstance(e, FileNotFoundError):
                why += " (not there, or the server did not answer)"
            raise ShardIOError(f"{what}: {why}", reason=why) from None

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
            try:
                if final.stat().st_size == s.offset + s.bytes:
                    return final
            except FileNotFoundError:  # not here, or evicted by another process just now
                pass

            def protect() -> set[int]:  # re-read at every try: what readers wait for changes
                return (set(self.gate.wait_for_requests(0)) if keep is None else keep) | {shard}

            return self._download_locked(
                s, protect, keep is None, lambda part: self._check_fetched(shard, part),
                corrupt_refetch=True,
            )  # fmt: skip

    def _check_fetched(self, shard: int, part: Path) -> None:
        """A fetched shard checked against what the pack says of it (Dataset.verify_file)."""
        self.dataset.verify_file(shard, str(part))

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
        if not self._reserve(part, s.bytes, protect, wait, offset=s.offset):
            return None
        try:
            faults.point("shard_fetch", s.shown, ShardIOError)  # given up on, past the retries
            for attempt in range(2 if corrupt_refetch else 1):
                self._retrying(f"fetching {s.shown}", lambda: self._download_shard(s, part))
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

    def _download_shard(self, s: _Shard, part: Path) -> None:
        """The shard's bytes written over `part` (made at its size by _reserve)."""
        self._download(s.url, part, s.bytes)

    def _download(self, url: str, part: Path, expected: int) -> None:
        plain = plain_get.object_url(self.fs, url)
        if plain is not None:  # one GET, streamed (plain_get: a quarter of fsspec's CPU)
            plain_get.get_into(plain, part, expected, self._stop)
            return
        # Elsewhere one ranged GET per 16 MiB read, no read-ahead cache: 1.23 ms of CPU per MiB
        # from SeaweedFS against 1.82 for 8 MiB reads through fsspec's default cache.
        block = 16 * 2**20
        with self.fs.open(url, "rb", block_size=block, cache_type="none") as src:
            plain_get.copy_into(src, part, expected, self._stop, block)

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
        # A Parquet row group's file holds its bytes after a hole as long as their offset.
        offsets = {s.tar: s.offset for s in self.shards}
        for entry in os.scandir(self.folder):
            base = _part_of(entry.name) or entry.name
            if base in offsets or base.endswith(".tar"):
                try:
                    total += max(0, entry.stat().st_size - offsets.get(base, 0))
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
        offset: int = 0,
    ) -> bool:
        """Create `part` at its full `size` once the cache has room for it, deleting shards to
        make room: those nobody keeps first, then this process's own not in `protect`. Without
        `wait`, False at once when there is no room."""
        deadline = time.monotonic() + timeout
        while True:
            if self._stop.is_set():  # a closed loader's thread evicts nothing more
                raise InvalidArgumentError("the loader was closed")
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
                            os.posix_fallocate(fd, offset, size)
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

    def _in_flight(self) -> set[int]:
        """Shards a thread of this process is fetching now (Fetcher's claims): one may be on the
        disk and not yet in the gate, and must not be deleted before the gate opens it."""
        return set()

    def _eviction_order(self, protect: set[int]) -> list[int]:
        busy = self._in_flight()
        present = [
            i for i, s in enumerate(self.shards) if i not in busy and (self.folder / s.tar).exists()
        ]
        with self._lock:
            mine = set(self._keep)
        nobody = [i for i in present if i not in mine and not self._kept_elsewhere(i)]
        own = [i for i in present if i in mine and i not in protect and not self._kept_elsewhere(i)]
        return nobody + own[::-1]

    def _kept_elsewhere(self, shard: int) -> bool:
        """Whether another holder keeps the shard: another process, or another loader of this
        one (a lock through another descriptor). Call with the cache lock held."""
        with self._lock:
            fd = self._keep.get(shard)
            if fd is None:
                return not _unlocked(self._keep_path(shard))
            # Our own shared lock blocks a test through a new descriptor: convert it instead.
            # Linux drops the old lock when a conversion fails, so it is taken again either way
            # (nobody waits for an exclusive lock on a .keep file: only this test takes one,
            # under the cache lock).
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return False
            except BlockingIOError:
                return True
            finally:
                fcntl.flock(fd, fcntl.LOCK_SH)

    # Whether evicting a shard's file drops it from the gate: the readers read the file (a
    # Parquet row group's readers read its decoded columns instead).
    _evict_from_gate = True

    def _evict(self, shard: int) -> int:
        """Delete the shard's file (readers that have it open read on). Returns its bytes, as
        _used counts them."""
        s = self.shards[shard]
        path = self.folder / s.tar
        if self._evict_from_gate and self.gate is not None:  # None while indexing on open
            self.gate.evict(shard)
        try:
            size = path.stat().st_size
            path.unlink()
            return max(0, size - s.offset)
        except FileNotFoundError:
            return 0
