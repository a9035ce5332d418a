"""Byte ranges of a remote file (a Parquet file's footer, then its row groups), read politely:
`RangeClient.tail` reads a file's last bytes, its size and its ETag in one request, `range` and
`range_into` read the bytes between two offsets of the version of the file that `tail` saw
(``If-Match``), and a server that does not serve ranges is refused before its body is read.

http(s):// URLs, and s3:// objects through a presigned URL (`plain_get.object_url`), are read
with the standard library's HTTP client, for the reasons plain_get's docstring measures; any
other URL (gs://, a URL with credentials in it) through its fsspec backend.

Politeness (stoker.remote.host_gate keeps the turns): at most `max_concurrent` requests in
flight to one host from every process sharing `state_dir`; at most `requests_per_second` from
this process; an HTTP 429 or 503 pauses every request to that host until the time the server
gives (``Retry-After``, in seconds or as a date; ``RateLimit``'s ``t``; ``RateLimit-Reset``), or
for the Retry's backoff when it gives none. A redirect's location (Hugging Face's /resolve/
answers 302 with a signed CDN URL) is kept per URL and later ranges go there directly, until
its signature expires (less 5 minutes) or for 10 minutes when it says no expiry.

Errors are ShardIOError, naming the URL without credentials or query string (a signature):
after `retry.tries` tries for 429, 5xx and a connection that fails; at once for 401, 403, 412
(the file changed at the source) and others; RemoteNotFoundError (also a FileNotFoundError)
for 404 and 410.
"""

from __future__ import annotations

import errno
import functools
import http.client
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..errors import InvalidArgumentError, ShardIOError, StokerError
from . import plain_get
from .answers import (
    Body,
    RemoteNotFoundError,
    Size,
    Status,
    bare,
    changed,
    check_answer,
    check_bounds,
    clean,
    content_range,
    exact,
    host_of,
    kept_until,
    length,
    phrase,
    read_exact,
    refused,
    server_wait,
    shown,
    write_at,
    write_local,
)
from .host_gate import HostGate, jittered, sleep, total
from .retry import DEFAULT_RETRY, Retry
from .urls import url_filesystem

__all__ = ["RangeClient", "RemoteNotFoundError", "Tail"]

T = TypeVar("T")
RETRIED = {408, 425, 429}  # and every 5xx


@dataclass(frozen=True)
class Tail:
    """A file's last bytes, with what the server said of the whole file."""

    data: bytes  # the file's last len(data) bytes
    size: int  # the whole file's size
    etag: str | None  # the server's ETag (strong or weak, as sent), None if none


class _Redirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, each counted, and a HEAD kept a HEAD (Python 3.11 follows one with a
    GET: the whole file)."""

    def __init__(self, count: Callable[[str, int], None]):
        self._count = count

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> Any:  # fmt: skip
        self._count(req.full_url, code)
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and req.get_method() == "HEAD":
            new.method = "HEAD"
        return new


class RangeClient:
    """Range reads of remote files, polite to their servers (thread-safe). `state_dir` (the
    cache folder) shares the concurrency cap and the servers' pauses with every process on the
    machine given the same folder; None keeps them to this process."""

    def __init__(
        self,
        state_dir: Path | None = None,
        retry: Retry | None = None,
        max_concurrent: int = 8,
        requests_per_second: float | None = None,
        timeout_s: float = 60.0,
    ):
        if max_concurrent < 1:
            raise InvalidArgumentError(f"max_concurrent is {max_concurrent}: at least 1")
        if requests_per_second is not None and not requests_per_second > 0:
            raise InvalidArgumentError(f"requests_per_second is {requests_per_second}: over 0")
        if not timeout_s > 0:
            raise InvalidArgumentError(f"timeout_s is {timeout_s}: over 0")
        self.state_dir = Path(state_dir) if state_dir is not None else None
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        self.retry = retry or DEFAULT_RETRY
        self.max_concurrent = max_concurrent
        self.requests_per_second = requests_per_second
        self.timeout_s = timeout_s
        self._lock = threading.Lock()  # guards the three dicts
        self._gates: dict[str, HostGate] = {}
        self._kept: dict[str, tuple[str, float]] = {}  # URL -> (location, unix time it expires)
        self._fsspec: dict[str, tuple[Any, str, bool]] = {}  # URL -> (fs, path, signed)
        self._opener = urllib.request.build_opener(_Redirects(self._count))

    # --- the interface --------------------------------------------------------------------------
    def tail(self, url: str, n: int) -> Tail:
        """The last `n` bytes of the file at `url` (all of it if it is shorter), its size and
        ETag: one request (``Range: bytes=-n``). A server that answers a suffix range with 416
        is asked a HEAD, then the range from an offset; one that ignores ranges, the range from
        an offset, refused if it ignores that too. Never more than `n` bytes are read."""
        if n < 1:
            raise InvalidArgumentError(f"tail of {n} bytes: at least 1")
        fs = self._through_fsspec(url)
        if fs is not None:
            return self._tail_fsspec(url, *fs, n)
        got = self._retrying(url, lambda target: self._suffix(url, target, n))
        if isinstance(got, Tail):
            return got
        if got is None or got.size is None:  # 416 to the suffix, or a 200 that gave no size
            got = self._retrying(url, lambda target: self._head(url, target))
        if got.size is None:
            raise ShardIOError(f"{shown(url)}: the server does not say the file's size")
        if got.size == 0:
            return Tail(b"", 0, got.etag)
        start = max(0, got.size - n)
        return Tail(self.range(url, start, got.size, got.etag), got.size, got.etag)

    def range(self, url: str, start: int, end: int, etag: str | None = None) -> bytes:
        """Bytes [start, end) of the file at `url`: one GET, exactly end - start bytes or an
        error. With `etag` (from `tail`), a file that has changed since is an error, not
        retried. A server that answers with the whole file is refused, its body unread."""
        check_bounds(url, start, end)
        if start == end:
            return b""
        fs = self._through_fsspec(url)
        if fs is not None:
            return self._range_fsspec(url, *fs, start, end, etag)
        return self._get_range(url, start, end, etag, None, lambda r: read_exact(r, end - start))

    def range_into(
        self,
        url: str,
        start: int,
        end: int,
        path: Path,
        etag: str | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """`range`, streamed (4 MiB reads) into the existing file `path` at offset `start`.
        InterruptedError once `stop` is set."""
        check_bounds(url, start, end)
        if not Path(path).is_file():
            raise FileNotFoundError(errno.ENOENT, "range_into writes into an existing file", path)
        if start == end:
            return
        fs = self._through_fsspec(url)
        if fs is not None:
            self._range_fsspec(url, *fs, start, end, etag, path, stop)
            return
        self._get_range(url, start, end, etag, stop, lambda r: write_at(r, path, start, end, stop))

    def stats(self) -> dict[str, Any]:
        """This client's counters: requests sent, bytes read, answers by status, retries and
        seconds waited (pauses, rate, backoff), in all and under "hosts" per host."""
        with self._lock:
            gates = list(self._gates.values())
        hosts = {g.host: g.stats() for g in gates}
        return {**total(list(hosts.values())), "hosts": hosts}

    # --- HTTP -----------------------------------------------------------------------------------
    def _suffix(self, url: str, target: str, n: int) -> Tail | Size | None:
        """tail's one GET: the Tail, a Size from a 200 left unread, or None for a 416."""
        try:
            with self._exchange(url, target, "GET", {"Range": f"bytes=-{n}"}, None) as r:
                etag = r.headers.get("ETag")
                if r.status == 206:
                    first, last, size = content_range(r.headers.get("Content-Range"))
                    if size is None or last != size - 1 or last - first + 1 > n:
                        sent = r.headers.get("Content-Range")
                        raise ShardIOError(
                            f"{shown(url)}: asked for its last {n:,} bytes, it sends {sent}"
                        )
                    return Tail(read_exact(r, last - first + 1), size, etag)
                size = length(r)
                if size is not None and size <= n:  # all of it, as asked: no more than n bytes
                    return Tail(read_exact(r, size), size, etag)
                return Size(size, etag)  # the server ignores ranges: its body is not read
        except Status as e:
            if e.status == 416:
                return None
            raise

    def _head(self, url: str, target: str) -> Size:
        with self._exchange(url, target, "HEAD", {}, None) as r:
            return Size(length(r), r.headers.get("ETag"))

    def _get_range(self, url: str, start: int, end: int, etag: str | None,
                   stop: threading.Event | None, consume: Callable[[Any], T]) -> T:  # fmt: skip
        headers = {"Range": f"bytes={start}-{end - 1}"}
        if etag and not etag.startswith("W/"):  # If-Match compares strongly: a weak one fails
            headers["If-Match"] = etag

        def attempt(target: str) -> T:
            with self._exchange(url, target, "GET", headers, stop) as r:
                check_answer(url, r, start, end, etag)
                return consume(r)

        return self._retrying(url, attempt, stop, etag)

    @contextmanager
    def _exchange(self, url: str, target: str, method: str, headers: dict[str, str],
                  stop: threading.Event | None) -> Iterator[Body]:  # fmt: skip
        """The answer to one request for `url`, sent to `target` while its host's gate gives it
        a turn (a redirect is followed within that turn); Status for an error status. Leaving
        drops what was not read of the body."""
        with self._gate(target).turn(stop):
            request = urllib.request.Request(target, headers=headers, method=method)
            try:
                response = self._opener.open(request, timeout=self.timeout_s)
            except urllib.error.HTTPError as e:
                e.close()  # its body unread
                answered = getattr(e, "filename", None) or target  # after any redirects
                self._count(answered, e.code)
                raise Status(e.code, e.headers, answered) from None
            with response:
                final = response.geturl()
                self._count(final, response.status)
                if final != target and target == url:  # a redirect: its location kept
                    self._keep(url, final)
                body = Body(response)
                try:
                    yield body
                finally:
                    self._gate(final).count_bytes(body.read)

    def _retrying(self, url: str, attempt: Callable[[str], T], stop: threading.Event | None = None,
                  etag: str | None = None) -> T:  # fmt: skip
        """attempt(where to send it) until it succeeds, an error is not worth a retry, or
        retry.tries are spent. A kept location that answers 403, 404 or 410 is resolved again
        once (without it counting as a try)."""
        delay, tries, resolved_again = self.retry.backoff, 0, False
        while True:
            target, kept = self._target(url)
            tries += 1
            paused = False
            try:
                return attempt(target)
            except Status as e:
                if kept and e.status in (403, 404, 410) and not resolved_again:
                    self._forget(url)
                    tries, resolved_again = tries - 1, True
                    continue
                if e.status not in RETRIED and e.status < 500:
                    raise refused(url, e, etag) from None
                why = f"HTTP {e.status} {phrase(e.status)}"
                if e.status in (429, 503):  # the server's time, or ours: for every process
                    wait = server_wait(e.headers, time.time())
                    until = time.time() + (delay if wait is None else wait)
                    for host in {target, e.url}:
                        self._gate(host).pause(until)
                    paused = True
            except (StokerError, InterruptedError):
                raise
            except (OSError, http.client.HTTPException) as e:  # no answer, or a short one
                why = clean(f"{type(e).__name__}: {e}")
            if tries >= self.retry.tries:
                raise ShardIOError(f"{shown(url)}: {why} ({tries} tries)", reason=why)
            gate = self._gate(target)
            gate.count_retry()
            if not paused:  # a pause is waited in the next request's turn
                wait = jittered(delay)
                sleep(wait, stop)
                gate.waited(wait)
            delay = min(delay * 2, self.retry.max_backoff)

    # --- where a URL is read from ---------------------------------------------------------------
    def _through_fsspec(self, url: str) -> tuple[Any, str] | None:
        """(fs, path) for a URL read through fsspec; None for one read over HTTP here."""
        parts = urlsplit(url)
        if parts.scheme in ("http", "https") and "@" not in parts.netloc:
            return None
        with self._lock:
            known = self._fsspec.get(url)
        if known is None:
            fs, path = url_filesystem(url)
            signed = plain_get.object_url(fs, path)
            if signed is not None:
                self._keep(url, signed)
            known = (fs, path, signed is not None)
            with self._lock:
                self._fsspec[url] = known
        return None if known[2] else known[:2]

    def _target(self, url: str) -> tuple[str, bool]:
        """Where a request for `url` goes now, and whether that is a kept location."""
        with self._lock:
            kept = self._kept.get(url)
        if kept is not None and time.time() < kept[1]:
            return kept[0], True
        parts = urlsplit(url)
        if parts.scheme in ("http", "https"):
            return url, False
        with self._lock:
            fs, path, _ = self._fsspec[url]  # a presigned URL's: _through_fsspec saw it first
        signed = plain_get.object_url(fs, path)  # signed again: the kept one expired
        if signed is None:
            raise ShardIOError(f"{shown(url)}: its URL could no longer be signed")
        self._keep(url, signed)
        return signed, False

    def _keep(self, url: str, location: str) -> None:
        with self._lock:
            self._kept[url] = (location, kept_until(location, time.time()))

    def _forget(self, url: str) -> None:
        with self._lock:
            self._kept.pop(url, None)

    def _gate(self, url: str) -> HostGate:
        host = host_of(url)
        with self._lock:
            gate = self._gates.get(host)
            if gate is None:
                gate = self._gates[host] = HostGate(
                    host, self.state_dir, self.max_concurrent, self.requests_per_second
                )
            return gate

    def _count(self, url: str, status: int | str) -> None:
        self._gate(url).count(status)

    # --- fsspec ---------------------------------------------------------------------------------
    def _fsspec_call(self, url: str, fn: Callable[[], T]) -> T:
        """fn() (one call of fsspec's) in the host's turn, retried; its errors as ShardIOError."""
        gate = self._gate(url)

        def once() -> T:
            with gate.turn():
                out = fn()
                gate.count("fsspec")
                if isinstance(out, bytes):
                    gate.count_bytes(len(out))
                return out

        try:
            return self.retry.run(shown(url), once, (FileNotFoundError, PermissionError))
        except FileNotFoundError:
            raise RemoteNotFoundError(f"{shown(url)}: not there") from None
        except PermissionError as e:
            why = f"not allowed to read it ({clean(str(e))})"
            raise ShardIOError(f"{shown(url)}: {why}", reason=why) from None

    def _tail_fsspec(self, url: str, fs: Any, path: str, n: int) -> Tail:
        size, etag = self._info(url, fs, path)
        start = max(0, size - n)
        data = self._fsspec_call(url, lambda: fs.cat_file(path, start, size)) if size else b""
        return Tail(exact(url, data, size - start), size, etag)

    def _info(self, url: str, fs: Any, path: str) -> tuple[int, str | None]:
        info = self._fsspec_call(url, lambda: fs.info(path))
        return int(info["size"]), info.get("ETag") or info.get("etag")

    def _range_fsspec(
        self, url: str, fs: Any, path: str, start: int, end: int, etag: str | None,
        into: Path | None = None, stop: threading.Event | None = None,
    ) -> bytes:  # fmt: skip
        """range (into=None) or range_into through fsspec. fsspec sends no If-Match: with an
        `etag`, the file's is asked first (one request more)."""
        if etag is not None:
            now = self._info(url, fs, path)[1]
            if now is not None and bare(now) != bare(etag):
                raise changed(url, etag)
        if into is None:
            data = self._fsspec_call(url, lambda: fs.cat_file(path, start, end))
            return exact(url, data, end - start)
        for at in range(start, end, plain_get.CHUNK):
            if stop is not None and stop.is_set():
                raise InterruptedError("the reader was closed")
            upto = min(at + plain_get.CHUNK, end)
            chunk = self._fsspec_call(url, functools.partial(fs.cat_file, path, at, upto))
            write_local(into, at, exact(url, chunk, upto - at))
        return b""


