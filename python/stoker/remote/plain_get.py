"""One plain HTTP GET per object, streamed: how stoker.remote fetches an object where its fsspec
backend can name a URL for it (an http(s):// URL itself; an s3:// object's presigned URL).

Measured on one 64 MiB shard from SeaweedFS on loopback (docs/BENCHMARKS.md, "Reading from
object storage"): a GET read with `readinto` into a reused buffer came at 770-864 MiB/s for
0.3-0.6 ms of CPU per MiB; fsspec's file object (8 MiB ranged reads through s3fs's event loop,
copied back to the calling thread) at 94-346 MiB/s for 2.2-6.8 ms/MiB, and `get_file` at 159-386
MiB/s for 1.9-4.6 ms/MiB. That CPU is taken from the decoders on the same cores. (Writing the
bytes into the cache file's pages costs the same either way.) A small file (manifest, index) is
one GET, where fsspec sends two HEADs before it.

Any other backend (gs://, a URL with credentials in it) is read through fsspec. Errors are
those fsspec's backends raise: FileNotFoundError (404), PermissionError (401, 403), OSError for
the rest. No URL is in a message: a presigned one carries a signature.
"""

from __future__ import annotations

import errno
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

CHUNK = 4 * 2**20  # bytes per readinto
TIMEOUT_S = 60.0  # to connect, and between two reads
SIGNED_FOR_S = 3600  # a presigned URL's life; signed again for every GET


def object_url(fs: Any, path: str) -> str | None:
    """A URL that one plain GET reads `path` of `fs` from, or None (read it through fsspec)."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if "http" in protocols or "https" in protocols:
        parts = urlsplit(path)
        return path if parts.scheme in ("http", "https") and "@" not in parts.netloc else None
    if "s3" in protocols:
        try:
            return str(fs.sign(path, expiration=SIGNED_FOR_S))
        except Exception:  # noqa: BLE001 - no signer for these credentials: fsspec reads it
            return None
    return None


class _RangeNotSatisfiable(OSError):
    """HTTP 416: a range from 0 of an empty object (S3 answers so; nginx with 200 and nothing)."""


def _open(url: str, headers: dict[str, str]) -> Any:
    try:
        request = urllib.request.Request(url, headers=headers)
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 404:
            raise FileNotFoundError(errno.ENOENT, "HTTP 404 Not Found") from None
        if e.code == 416:
            raise _RangeNotSatisfiable(errno.EIO, "HTTP 416 Range Not Satisfiable") from None
        if e.code in (401, 403):
            raise PermissionError(errno.EACCES, f"HTTP {e.code} {e.reason}") from None
        raise OSError(errno.EIO, f"HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:  # no answer: its reason, not the URL
        raise OSError(errno.EIO, f"no answer: {e.reason}") from None


def get_bytes(url: str, limit: int) -> bytes:
    """The object's first `limit` bytes or fewer (whatever the server sends: never more read)."""
    try:
        with _open(url, {"Range": f"bytes=0-{limit - 1}"}) as r:
            return bytes(r.read(limit))
    except _RangeNotSatisfiable:
        return b""  # the object is empty


def get_into(url: str, part: Path, expected: int, stop: threading.Event) -> None:
    """The object written over `part` from its start: exactly `expected` bytes, else OSError
    (EFBIG for more, EIO for fewer). InterruptedError once `stop` is set."""
    with _open(url, {}) as r:
        length = r.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) != expected:
            code = errno.EFBIG if int(length) > expected else errno.EIO
            raise OSError(code, f"the server sends {int(length):,} bytes, {expected:,} expected")
        copy_into(r, part, expected, stop, CHUNK)


def copy_into(src: Any, part: Path, expected: int, stop: threading.Event, chunk: int) -> None:
    """`src` (a binary file object with readinto: an HTTP response, an fsspec file) written over
    `part` from its start, `chunk` bytes a read, with get_into's checks and errors."""
    view = memoryview(bytearray(chunk))
    written = 0
    with open(part, "r+b") as dst:
        while n := src.readinto(view):
            if stop.is_set():
                raise InterruptedError("the loader was closed")
            written += n
            if written > expected:
                raise OSError(errno.EFBIG, f"more than the {expected:,} bytes expected")
            dst.write(view[:n])
    if written != expected:
        raise OSError(errno.EIO, f"{written:,} bytes arrived, {expected:,} expected")
