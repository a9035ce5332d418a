"""HTTP answers, for stoker.remote.ranges: whether one is the range asked for (checked before
its body is read), its body read or written into a file, the wait a 429 or 503 asks for, until
when a signed location may be used, and the error each status not worth a retry becomes (naming
the URL without its credentials or query string)."""

from __future__ import annotations

import email.utils
import errno
import re
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from http import HTTPStatus
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import parse_qs, urlsplit

from ..errors import InvalidArgumentError, ShardIOError
from .plain_get import CHUNK  # bytes per readinto when an answer is written to a file
from .urls import redact

KEEP_LOCATION_S = 600.0  # a redirect's location without an expiry in it: reused this long
EXPIRY_MARGIN_S = 300.0  # a signed location is not used in the last minutes of its life


class RemoteNotFoundError(ShardIOError, FileNotFoundError):
    """HTTP 404 or 410: the file is not there (not retried)."""


class Status(Exception):
    """An HTTP answer that is not a success: its status, headers and the URL that answered."""

    def __init__(self, status: int, headers: Any, url: str):
        super().__init__(status)
        self.status, self.headers, self.url = status, headers, url


@dataclass(frozen=True)
class Size:
    """What a HEAD (or a 200 left unread) says of a file."""

    size: int | None
    etag: str | None


class Body:
    """An answer being read: its status and headers, and its body's bytes counted as read."""

    def __init__(self, response: Any):
        self._response = response
        self.status: int = response.status
        self.headers: Any = response.headers
        self.read = 0

    def readinto(self, view: memoryview) -> int:
        k: int = self._response.readinto(view)
        self.read += k
        return k


def check_answer(url: str, r: Body, start: int, end: int, etag: str | None) -> None:
    """A GET's answer is bytes [start, end) of the version `etag` names, else ShardIOError
    (before its body is read)."""
    sent = r.headers.get("ETag")
    if etag and sent and bare(sent) != bare(etag):  # a server that ignores If-Match
        raise changed(url, etag)
    if r.status == 206:
        first, last, size = content_range(r.headers.get("Content-Range"))
        if (first, last) != (start, end - 1):
            past = f" (the file is {size:,} bytes)" if size is not None and end > size else ""
            raise ShardIOError(f"{shown(url)}: asked for bytes {start}-{end - 1}, the server "
                               f"sends {r.headers.get('Content-Range')}{past}")  # fmt: skip
        return
    size = length(r)
    if r.status == 200 and start == 0 and size == end:  # the range is the whole file
        return
    raise ShardIOError(
        f"{shown(url)}: the server does not serve byte ranges (asked for bytes {start}-"
        f"{end - 1}, it answers HTTP {r.status} with {size} bytes): refused unread"
    )


def read_exact(r: Body, n: int) -> bytes:
    """`n` bytes of the body, else OSError (retried)."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n and (k := r.readinto(view[got:])):
        got += k
    if got != n:
        raise OSError(errno.EIO, f"{got:,} bytes arrived, {n:,} expected")
    return bytes(buf)


def write_at(r: Body, path: Path, start: int, end: int, stop: threading.Event | None) -> None:
    """The body written into `path` at `start`, CHUNK bytes a read, as plain_get.copy_into. An
    answer cut short raises OSError (retried); the local file failing, ShardIOError (not)."""
    view, written = memoryview(bytearray(min(CHUNK, end - start))), 0
    with _open_local(path) as dst:
        dst.seek(start)
        while written < end - start:
            if stop is not None and stop.is_set():
                raise InterruptedError("the reader was closed")
            k = r.readinto(view[: min(len(view), end - start - written)])
            if not k:
                break
            _write_local(dst, path, view[:k])
            written += k
    if written != end - start:
        raise OSError(errno.EIO, f"{written:,} bytes arrived, {end - start:,} expected")


def write_local(path: Path, at: int, data: bytes) -> None:
    """`data` written into `path` at `at`."""
    with _open_local(path) as dst:
        dst.seek(at)
        _write_local(dst, path, data)


def _open_local(path: Path) -> BinaryIO:
    try:
        return open(path, "r+b")
    except OSError as e:
        raise ShardIOError(f"{path}: opening it to write a range: {e}") from None


def _write_local(dst: BinaryIO, path: Path, data: bytes | memoryview) -> None:
    try:
        dst.write(data)
    except OSError as e:
        raise ShardIOError(f"{path}: writing a range: {e}") from None


def exact(url: str, data: bytes, n: int) -> bytes:
    if len(data) != n:
        raise ShardIOError(f"{shown(url)}: {len(data):,} bytes arrived, {n:,} expected")
    return data


def refused(url: str, e: Status, etag: str | None) -> ShardIOError:
    """The error for a status not worth a retry."""
    if e.status in (404, 410):
        return RemoteNotFoundError(f"{shown(url)}: not there (HTTP {e.status})")
    if e.status == 412:
        return changed(url, etag)
    why = f"HTTP {e.status} {phrase(e.status)}"
    if e.status in (401, 403):
        why += ": not allowed to read it"
    if e.status == 416:
        _, _, size = content_range(e.headers.get("Content-Range"))
        why += f": the range is past its end ({size:,} bytes)" if size is not None else ""
    return ShardIOError(f"{shown(url)}: {why}", reason=why)


def changed(url: str, etag: str | None) -> ShardIOError:
    why = f"changed at the source since it was opened (its ETag is no longer {etag})"
    return ShardIOError(f"{shown(url)}: {why}: open it again", reason=why)


def server_wait(headers: Any, now: float) -> float | None:
    """The seconds a 429 or 503 asks to wait (the longest its headers give; never negative),
    None when it gives none: ``Retry-After`` (seconds or an HTTP-date), the IETF ``RateLimit``
    field's ``t`` (of a quota with ``r=0``, or without ``r``) and the older ``RateLimit-Reset``."""
    waits: list[float] = []
    retry_after = (headers.get("Retry-After") or "").strip()
    if retry_after:
        try:
            waits.append(float(retry_after))
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(retry_after)
                if when.tzinfo is None:
                    when = when.replace(tzinfo=timezone.utc)
                waits.append(when.timestamp() - now)
            except (TypeError, ValueError, IndexError):
                pass
    limit = headers.get("RateLimit") or ""
    for item in limit.split(","):  # IETF: "quota";r=0;t=30, one item per quota
        params = _params(item.split(";")[1:])
        if "t" in params and params.get("r", "0") == "0":
            waits.extend(_floats(params["t"]))
    older = _params(re.split(r"[,;]", limit))  # an earlier draft: limit=10, remaining=0, reset=30
    if "reset" in older and older.get("remaining", "0") == "0":
        waits.extend(_floats(older["reset"]))
    waits.extend(_floats(headers.get("RateLimit-Reset") or ""))
    return max(0.0, *waits) if waits else None


def kept_until(location: str, now: float) -> float:
    """Until when a redirect's (or a presigned) `location` is used: its signature's expiry less
    EXPIRY_MARGIN_S (``X-Amz-Expires`` after ``X-Amz-Date``, the same of Google's, or
    CloudFront's ``Expires`` unix time), else KEEP_LOCATION_S from now."""
    query = {k.lower(): v[0] for k, v in parse_qs(urlsplit(location).query).items()}
    for vendor in ("x-amz-", "x-goog-"):
        if vendor + "expires" in query:
            try:
                signed = datetime.strptime(query.get(vendor + "date", ""), "%Y%m%dT%H%M%SZ")
                at = signed.replace(tzinfo=timezone.utc).timestamp()
            except ValueError:
                at = now
            return at + float(query[vendor + "expires"]) - EXPIRY_MARGIN_S
    if query.get("expires", "").isdigit():
        return float(query["expires"]) - EXPIRY_MARGIN_S
    return now + KEEP_LOCATION_S


def content_range(header: str | None) -> tuple[int, int, int | None]:
    """``bytes FIRST-LAST/SIZE`` (SIZE may be ``*``); (-1, -1, SIZE) for ``bytes */SIZE``."""
    try:
        unit, spec = (header or "").split(" ", 1)
        span, size = spec.strip().split("/", 1)
        whole = None if size.strip() == "*" else int(size)
        if span == "*":
            return -1, -1, whole
        first, last = span.split("-", 1)
        if unit.lower() != "bytes":
            raise ValueError(unit)
        return int(first), int(last), whole
    except ValueError:
        return -1, -1, None


def length(r: Body) -> int | None:
    value = (r.headers.get("Content-Length") or "").strip()
    return int(value) if value.isdigit() else None


def _params(parts: list[str]) -> dict[str, str]:
    """``key=value`` parts as a dict (keys lowercase, values stripped of spaces)."""
    pairs = (p.split("=", 1) for p in parts if "=" in p)
    return {k.strip().lower(): v.strip() for k, v in pairs}


def _floats(text: str) -> list[float]:
    try:
        return [float(text.strip().strip('"'))] if text.strip() else []
    except ValueError:
        return []


def bare(etag: str) -> str:
    return etag.removeprefix("W/")


def phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def host_of(url: str) -> str:
    return urlsplit(url).netloc.rsplit("@", 1)[-1].lower()


def shown(url: str) -> str:
    """`url` for a message: no credentials, no query string (a signature), no fragment."""
    return redact(url.split("?", 1)[0].split("#", 1)[0])


def clean(text: str) -> str:
    """An exception's text for a message: credentials and query strings of URLs removed."""
    return redact(re.sub(r"(://[^\s?]*)\?\S*", r"\1", text))


def check_bounds(url: str, start: int, end: int) -> None:
    if not 0 <= start <= end:
        raise InvalidArgumentError(f"{shown(url)}: bytes [{start}, {end}) is not a range")
