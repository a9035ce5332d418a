"""Where every request stoker.remote.ranges sends to one host waits its turn, so that a job's
readers stay polite to the server however many threads and processes they are: at most
`max_concurrent` requests in flight to the host, at most `requests_per_second` sent by this
process, and none while the server has asked for a pause (HTTP 429 or 503 with a time to wait).

The concurrency cap and the pause are machine-wide for every process given the same `state_dir`
(the ranks of a job share their cache folder): a request in flight holds an flock on one of the
slot files ``.http-HOST-slot-K``, and a pause is the unix time in ``.http-HOST.pause``, which
every request reads first (a stat, and a read only when the file was replaced). Without a
`state_dir` both hold within the process only. Each gate also counts what was sent through it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SLOT_POLL_S = 0.02  # between two looks at the slot files while all are held
LONG_PAUSE_S = 60.0  # a pause asked for longer than this is logged, so that a stall is explained

log = logging.getLogger("stoker.remote")


def sleep(seconds: float, stop: threading.Event | None) -> None:
    """`seconds` slept, or InterruptedError as soon as `stop` is set."""
    if stop is None:
        time.sleep(max(0.0, seconds))
    elif stop.wait(max(0.0, seconds)):
        raise InterruptedError("the reader was closed")


def jittered(seconds: float) -> float:
    """`seconds` and 0-10% more: waiters that a pause stopped together do not all resume at the
    same instant (never less: the server said when)."""
    return seconds * (1.0 + random.uniform(0.0, 0.1))


class HostGate:
    """One host's turns, pause and counters (thread-safe)."""

    def __init__(
        self,
        host: str,
        state_dir: Path | None,
        max_concurrent: int,
        requests_per_second: float | None,
    ):
        self.host = host
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._interval = 1.0 / requests_per_second if requests_per_second else 0.0
        self._lock = threading.Lock()
        self._next_send = 0.0  # time.monotonic() of this process's next request (the rate)
        self._pause_until = 0.0  # time.time(): this process's own pause
        self._file_pause = 0.0  # the pause file's, as last read
        self._file_seen: tuple[int, int] | None = None  # its (inode, mtime_ns) then
        name = re.sub(r"[^A-Za-z0-9.-]", "_", host)
        self._pause_path = state_dir / f".http-{name}.pause" if state_dir else None
        self._slot_paths = (
            [state_dir / f".http-{name}-slot-{k}" for k in range(max_concurrent)]
            if state_dir
            else []
        )
        self.requests = 0
        self.bytes = 0
        self.status: dict[str, int] = {}
        self.retries = 0
        self.waited_s = 0.0

    # --- turns ----------------------------------------------------------------------------------
    @contextmanager
    def turn(self, stop: threading.Event | None = None) -> Iterator[None]:
        """Held while one request is in flight to the host (its answer read or dropped): a slot
        of the cap taken, once no pause holds and the rate allows."""
        if stop is not None and stop.is_set():
            raise InterruptedError("the reader was closed")
        self._wait_pause(stop)
        while not self._slots.acquire(timeout=SLOT_POLL_S * 5):
            if stop is not None and stop.is_set():
                raise InterruptedError("the reader was closed")
        try:
            fd = self._take_slot_file(stop)
            try:
                self._wait_pause(stop)  # written while this request waited for its slot
                self._wait_rate(stop)
                yield
            finally:
                if fd >= 0:
                    os.close(fd)  # releases the flock
        finally:
            self._slots.release()

    def _take_slot_file(self, stop: threading.Event | None) -> int:
        """A descriptor holding an flock on a free slot file (-1 without a state_dir): the files
        are tried in turn, and all again after a short sleep while every one is held."""
        if not self._slot_paths:
            return -1
        start = random.randrange(len(self._slot_paths))  # spread the processes over the files
        while True:
            for k in range(len(self._slot_paths)):
                path = self._slot_paths[(start + k) % len(self._slot_paths)]
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except BlockingIOError:
                    os.close(fd)
            sleep(SLOT_POLL_S, stop)

    def _wait_rate(self, stop: threading.Event | None) -> None:
        if not self._interval:
            return
        with self._lock:
            now = time.monotonic()
            at = max(now, self._next_send)
            self._next_send = at + self._interval
        if at > now:
            sleep(at - now, stop)
            self.waited(at - now)

    # --- pauses ---------------------------------------------------------------------------------
    def paused_until(self) -> float:
        """The unix time before which nothing is sent to the host (0.0: none): this process's
        own pause, or the pause file's, whichever is later."""
        if self._pause_path is None:
            return self._pause_until
        try:
            st = os.stat(self._pause_path)
        except FileNotFoundError:
            return self._pause_until
        if (st.st_ino, st.st_mtime_ns) != self._file_seen:  # replaced: a new inode each time
            value = _read_pause(self._pause_path)
            with self._lock:
                self._file_pause, self._file_seen = value, (st.st_ino, st.st_mtime_ns)
        return max(self._pause_until, self._file_pause)

    def pause(self, until: float) -> None:
        """Nothing sent to the host before the unix time `until`, by any thread, nor by any
        process sharing the state_dir (the file is replaced atomically, never shortened)."""
        with self._lock:
            self._pause_until = max(self._pause_until, until)
        if until - time.time() > LONG_PAUSE_S:
            log.warning("%s asks for a pause of %.0f s", self.host, until - time.time())
        if self._pause_path is None or _read_pause(self._pause_path) >= until:
            return
        tmp = self._pause_path.with_name(
            f"{self._pause_path.name}.tmp-{os.getpid()}-{threading.get_ident()}"
        )
        tmp.write_text(repr(until))
        os.replace(tmp, self._pause_path)

    def _wait_pause(self, stop: threading.Event | None) -> None:
        while (left := self.paused_until() - time.time()) > 0:
            wait = jittered(left)
            sleep(wait, stop)
            self.waited(wait)

    # --- counters -------------------------------------------------------------------------------
    def count(self, status: int | str) -> None:
        """One request sent, answered with `status`."""
        with self._lock:
            self.requests += 1
            self.status[str(status)] = self.status.get(str(status), 0) + 1

    def count_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes += n

    def count_retry(self) -> None:
        with self._lock:
            self.retries += 1

    def waited(self, seconds: float) -> None:
        with self._lock:
            self.waited_s += seconds

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": self.requests,
                "bytes": self.bytes,
                "status": dict(self.status),
                "retries": self.retries,
                "waited_s": self.waited_s,
            }


def _read_pause(path: Path) -> float:
    """The pause file's unix time; 0.0 when there is none (or it cannot be read: it is being
    replaced, and is read again once it has been)."""
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return 0.0


def total(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Several gates' counters added up."""
    out: dict[str, Any] = {"requests": 0, "bytes": 0, "status": {}, "retries": 0, "waited_s": 0.0}
    for s in stats:
        for key in ("requests", "bytes", "retries", "waited_s"):
            out[key] += s[key]
        for code, n in s["status"].items():
            out["status"][code] = out["status"].get(code, 0) + n
    return out
