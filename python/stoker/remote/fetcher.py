"""The fetcher threads of a remote pack: they fetch what the pass's readers wait for first, then
what its plan needs next, and hold a shared flock on the shards the pass still needs so that
no process sharing the cache evicts them."""

from __future__ import annotations

import fcntl
import os
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import faults
from ..errors import InvalidArgumentError, StokerError
from .cache import DEFAULT_CACHE_LIMIT, ShardCache
from .retry import DEFAULT_RETRY, Retry


class Fetcher(ShardCache):
    """RemotePack's fetcher threads (`start`, `close`)."""

    prefetch_shards: int
    fetch_threads: int
    _threads: list[threading.Thread]
    _plan: Callable[[], Sequence[int]]
    _claimed: set[int]  # shards a fetcher thread of this process is on
    _claim_lock: threading.Lock
    _pid: int

    def _init_fetching(self, retry: Retry | None, cache_limit: int | None, prefetch_shards: int,
                       fetch_threads: int) -> None:  # fmt: skip
        """The cache's and the fetcher threads' state, the options checked (RemotePack's and
        ParquetPack's constructors)."""
        self.retry = retry or DEFAULT_RETRY
        self.cache_limit = DEFAULT_CACHE_LIMIT if cache_limit is None else int(cache_limit)
        if self.cache_limit <= 0:
            raise InvalidArgumentError(
                f"cache_limit must be a positive number of bytes, not {cache_limit}"
            )
        if prefetch_shards < 0 or fetch_threads < 1:
            raise InvalidArgumentError("need prefetch_shards >= 0 and fetch_threads >= 1")
        self.prefetch_shards, self.fetch_threads = prefetch_shards, fetch_threads
        self.gate: Any = None  # the dataset's, once it is open
        self._keep = {}  # shard -> fd holding a shared flock on its .keep file
        self._lock = threading.Lock()  # guards _keep
        self._stop = threading.Event()
        self._claimed = set()  # shards a fetcher thread of this process is on
        self._claim_lock = threading.Lock()
        self.fetched = 0  # shards this process downloaded
        self.fetched_bytes = 0
        self.shards = []
        self._threads = []
        self._plan = lambda: ()
        self._pid = os.getpid()

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
            faults.point("thread", t.name, RuntimeError)
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

    def _in_flight(self) -> set[int]:
        with self._claim_lock:
            return set(self._claimed)

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
        try:
            self._fetch_while_open()
        except BaseException as e:  # a fault of the fetcher itself: no reader waits on in vain
            if self._stop.is_set():
                return
            text = "".join(traceback.format_exception(e)).rstrip()
            why = (f"fetcher thread {threading.current_thread().name} failed: "
                   f"{type(e).__name__}: {e}\n{text}")  # fmt: skip
            try:
                for shard in range(len(self.shards)):
                    if not self.gate.is_ready(shard):
                        self.gate.failed(shard, why)
            except StokerError:
                pass  # the gate was closed meanwhile

    def _fetch_while_open(self) -> None:
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
                self._set_keep(wanted)  # another thread may have dropped its lock meanwhile
                path = None
                try:
                    # A shard fetched ahead never waits for room, nor evicts what the pass reads
                    # next. One a reader waits for may evict anything but the other shards that
                    # readers wait for: a reader with the file open reads on (stoker.remote's
                    # docstring), and one that needs it again asks again.
                    waited_for = shard in requested
                    if not waited_for and shard not in self._plan():
                        # `wanted` is a moment old: the pass has moved past the shard since (and
                        # another thread may have dropped it as done), so it is not fetched again.
                        continue
                    path = self.fetch(shard, keep=None if waited_for else set(wanted))
                    if path is None:
                        continue
                    fetched = True
                    self._hand_over(shard, path)
                except StokerError as e:
                    if path is not None and not path.exists():
                        continue  # evicted before the gate opened it: readers ask again
                    self.gate.failed(shard, str(e))
                except Exception as e:  # noqa: BLE001 - the gate must hear of any failure
                    self.gate.failed(shard, f"{self.shards[shard].shown}: {e!r}")
                finally:
                    with self._claim_lock:
                        claimed.discard(shard)
                break  # re-read the requests: a reader may be waiting for another shard now
            if not fetched:  # all wanted shards are here or on the way: do not spin
                self._stop.wait(0.05)

    def _hand_over(self, shard: int, path: Path) -> None:
        """Give the gate the shard's file: readers waiting for it go on."""
        self.gate.ready(shard, str(path))

    def _set_keep(self, wanted: Sequence[int]) -> None:
        """Hold a shared flock on each wanted shard's .keep file and on those a fetcher thread
        is on, and only on those. (The threads see the requests at different moments: one that
        no longer wants a shard must not drop the lock another is fetching it under, or another
        process may evict it between its check and its open.)"""
        with self._lock:
            if self._stop.is_set():  # closed (perhaps from this very thread): keep nothing
                return
            with self._claim_lock:
                wanted = [*wanted, *self._claimed]
            for shard in [s for s in self._keep if s not in wanted]:
                os.close(self._keep.pop(shard))
            for shard in wanted:
                if shard not in self._keep:
                    fd = os.open(self._keep_path(shard), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    self._keep[shard] = fd
