"""An HTTP server on loopback that serves a folder's files by byte range, with the ways real
servers answer that a range reader must handle, for tests of stoker.remote.ranges.

`with RangeServer(root) as server:` serves `root` at `server.url` (GET and HEAD): ``Range:
bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` answered 206 with Content-Range, an unsatisfiable
one 416 with ``Content-Range: bytes */SIZE``; a strong ETag per file (its size and mtime_ns),
``If-Match`` that differs answered 412, ``If-None-Match`` that matches 304; Content-Length
always; a folder an HTML index of links, as nginx's autoindex (subfolders end with /).

What a test sets: `script(status, count, ...)` answers the next `count` requests whose path
matches with that status (429, 503, 403...) and headers; `suffix_416` answers suffix ranges
416 (as Hugging Face's API redirects do); `ignore_ranges` answers 200 with the whole body;
`redirect_prefix` ("/resolve/") answers paths under it 302 to ``/cdn/NAME?X-Amz-Expires=...``
(`redirect_expires_s`), which serves the same file; `latency_s` sleeps before each answer.
What it tells: `log` (a Record per request, in the order they arrived; complete once it has been
answered: `wait_idle()`), `max_in_flight` (the most requests held at once between their arrival
and the start of their answer: a client that has not had its answer cannot have released its
turn, so this never counts more than the client had in flight),
`whole_file_gets(name)`.
"""

from __future__ import annotations

import html
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["RangeServer", "Record"]

SEND_CHUNK = 64 * 1024


@dataclass
class Record:
    """One request as the server saw it."""

    method: str
    path: str  # with its query string
    range: str | None  # the Range header as sent
    time: float  # time.time() when it arrived
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 0  # 0 until it is answered
    sent: int = 0  # bytes of body written before the answer ended (or the client hung up)


@dataclass
class _Script:
    status: int
    count: int
    headers: dict[str, str]
    match: str | Callable[[str], bool] | None

    def matches(self, path: str) -> bool:
        if self.match is None:
            return True
        return self.match(path) if callable(self.match) else self.match in path


class RangeServer:
    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.log: list[Record] = []
        self.suffix_416 = False
        self.ignore_ranges = False
        self.redirect_prefix: str | None = None
        self.redirect_expires_s = 3600
        self.latency_s = 0.0
        self.max_in_flight = 0
        self._in_flight = 0  # arrived, not yet fully answered
        self._held = 0  # arrived, answer not yet begun
        self._scripts: list[_Script] = []
        self._lock = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def __enter__(self) -> RangeServer:
        owner = self

        class Handler(_Handler):
            server_owner = owner

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    # --- controls -------------------------------------------------------------------------------
    def script(
        self,
        status: int,
        count: int,
        retry_after: float | str | None = None,
        headers: dict[str, str] | None = None,
        match: str | Callable[[str], bool] | None = None,
    ) -> None:
        """The next `count` requests whose path contains `match` (or for which it is true)
        answered `status`, with ``Retry-After: retry_after`` and `headers`, and no body."""
        sent = dict(headers or {})
        if retry_after is not None:
            sent["Retry-After"] = str(retry_after)
        with self._lock:
            self._scripts.append(_Script(status, count, sent, match))

    def reset_log(self) -> None:
        with self._lock:
            self.log.clear()
            self.max_in_flight = 0

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until no request is being answered (their records are in the log)."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._in_flight == 0, timeout):
                raise TimeoutError(f"{self._in_flight} requests still being answered")

    def whole_file_gets(self, name: str) -> int:
        """GETs of the file `name` that asked for all of it: no Range, or one covering it."""
        size = (self.root / name).stat().st_size
        count = 0
        for r in self.log:
            if r.method != "GET" or urllib.parse.urlsplit(r.path).path.rsplit("/", 1)[-1] != name:
                continue
            span = _parse_range(r.range, size) if r.range else (0, size - 1)
            count += span == (0, size - 1)
        return count

    # --- for the handler ------------------------------------------------------------------------
    def _arrived(self, record: Record) -> None:
        with self._lock:
            self.log.append(record)
            self._in_flight += 1
            self._held += 1
            self.max_in_flight = max(self.max_in_flight, self._held)

    def _answering(self) -> None:
        with self._lock:
            self._held -= 1

    def _finished(self, record: Record, status: int, sent: int) -> None:
        with self._lock:
            record.status, record.sent = status, sent
            self._in_flight -= 1
            self._lock.notify_all()

    def _scripted(self, path: str) -> _Script | None:
        with self._lock:
            for s in self._scripts:
                if s.count > 0 and s.matches(path):
                    s.count -= 1
                    return s
        return None


class _Handler(BaseHTTPRequestHandler):
    server_owner: RangeServer
    protocol_version = "HTTP/1.0"  # a connection per request, as urllib uses them

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(head=False)

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def _answer(self, head: bool) -> None:
        owner = self.server_owner
        record = Record(self.command, self.path, self.headers.get("Range"), time.time(),
                        dict(self.headers.items()))  # fmt: skip
        owner._arrived(record)
        status, sent = 500, 0
        try:
            if owner.latency_s:
                time.sleep(owner.latency_s)
            owner._answering()
            status, sent = self._respond(owner, head)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up before the headers were written
        finally:
            owner._finished(record, status, sent)

    def _respond(self, owner: RangeServer, head: bool) -> tuple[int, int]:
        script = owner._scripted(self.path)
        if script is not None:
            return self._empty(script.status, script.headers), 0
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if owner.redirect_prefix and path.startswith(owner.redirect_prefix):
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            query = f"X-Amz-Expires={owner.redirect_expires_s}&X-Amz-Date={stamp}"
            rest = urllib.parse.quote(path[len(owner.redirect_prefix) :])
            return self._empty(302, {"Location": f"/cdn/{rest}?{query}"}), 0
        if owner.redirect_prefix and path.startswith("/cdn/"):
            path = path[len("/cdn") :]
        local = (owner.root / path.lstrip("/")).resolve()
        if not local.is_relative_to(owner.root) or not local.exists():
            return self._empty(404, {}), 0
        if local.is_dir():
            return self._index(local, path, head)
        return self._file(owner, local, head)

    def _empty(self, status: int, headers: dict[str, str]) -> int:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()
        return status

    def _index(self, folder: Path, path: str, head: bool) -> tuple[int, int]:
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
        links = "".join(f'<a href="{html.escape(urllib.parse.quote(n))}">{html.escape(n)}</a>\n'
                        for n in names)  # fmt: skip
        body = f"<html><body><h1>Index of {html.escape(path)}</h1>\n{links}</body></html>\n"
        return self._send(200, {"Content-Type": "text/html"}, body.encode(), head)

    def _file(self, owner: RangeServer, local: Path, head: bool) -> tuple[int, int]:
        st = local.stat()
        size = st.st_size
        etag = f'"{size:x}-{st.st_mtime_ns:x}"'
        base = {"ETag": etag, "Accept-Ranges": "bytes"}
        if_match = self.headers.get("If-Match")
        if if_match and if_match.strip() != "*" and etag not in _etags(if_match):
            return self._empty(412, base), 0
        if etag in _etags(self.headers.get("If-None-Match") or ""):
            return self._empty(304, base), 0
        wanted = self.headers.get("Range")
        if wanted is None or owner.ignore_ranges:
            return self._stream(200, base, local, 0, size, head)
        if owner.suffix_416 and re.fullmatch(r"\s*bytes=-\d+\s*", wanted):
            return self._empty(416, {**base, "Content-Range": f"bytes */{size}"}), 0
        span = _parse_range(wanted, size)
        if span is None:
            return self._empty(416, {**base, "Content-Range": f"bytes */{size}"}), 0
        first, last = span
        headers = {**base, "Content-Range": f"bytes {first}-{last}/{size}"}
        return self._stream(206, headers, local, first, last + 1, head)

    def _stream(self, status: int, headers: dict[str, str], local: Path, start: int, end: int,
                head: bool) -> tuple[int, int]:  # fmt: skip
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        sent = 0
        if head:
            return status, 0
        try:
            with open(local, "rb") as f:
                f.seek(start)
                while sent < end - start and (chunk := f.read(min(SEND_CHUNK, end - start - sent))):
                    self.wfile.write(chunk)
                    sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up: what was sent until then is recorded
        return status, sent

    def _send(self, status: int, headers: dict[str, str], body: bytes,
              head: bool) -> tuple[int, int]:  # fmt: skip
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)
        return status, 0 if head else len(body)


def _etags(header: str) -> list[str]:
    return [t.strip() for t in header.split(",") if t.strip()]


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) of a single ``bytes=`` range of a file of `size` bytes; None when it is
    unsatisfiable (or not a single byte range: tests send nothing else)."""
    match = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", header or "")
    if match is None or match.group(1) == match.group(2) == "":
        return None
    a, b = match.groups()
    if a == "":  # the last b bytes
        n = int(b)
        return (max(0, size - n), size - 1) if n > 0 and size > 0 else None
    first = int(a)
    last = min(int(b), size - 1) if b else size - 1
    return (first, last) if first < size and first <= last else None


def sparse_file(path: Path, size: int, tail: bytes = b"") -> Path:
    """A file of `size` bytes, all zeros but its last len(tail) (no blocks on disk for them)."""
    with open(path, "wb") as f:
        f.truncate(size)
        if tail:
            f.seek(size - len(tail))
            f.write(tail)
    os.utime(path)
    return path
