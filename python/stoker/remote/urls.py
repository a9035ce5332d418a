"""What a URL names, for stoker.remote: whether a loader's path is remote, whether it names
WebDataset shards rather than a pack folder, and a URL's ``user:password@`` removed for messages."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgumentError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


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


INSTALL_HINT = "pip install 'stoker[remote]'"


def url_filesystem(url: str) -> tuple[Any, str]:
    """fsspec's filesystem for `url` and the path on it. A scheme whose backend is not installed
    (fsspec itself, aiohttp for http(s)://, s3fs for s3://, gcsfs for gs://) raises an ImportError
    that names the extra to install, rather than fsspec's own message about its dependency."""
    scheme = url.split("://", 1)[0].lower()
    try:
        import fsspec  # type: ignore[import-untyped]  # torch needs it too; imported only here

        return fsspec.core.url_to_fs(url)
    except ImportError as e:
        extra = "pip install gcsfs" if scheme in ("gs", "gcs") else INSTALL_HINT
        raise ImportError(
            f"{redact(url)}: reading {scheme}:// URLs needs fsspec's {scheme} backend: {extra} "
            f"({e})"
        ) from e
    except ValueError as e:  # fsspec: "Protocol not known"
        raise InvalidArgumentError(f"{redact(url)}: fsspec knows no {scheme}:// ({e})") from e


def braceexpand(spec: str) -> list[str]:
    """WebDataset's brace notation (``train-{000..099}.tar``) expanded, in order."""
    try:
        from braceexpand import braceexpand as expand
    except ImportError as e:
        raise ImportError(
            f"{redact(spec)}: WebDataset's brace notation needs braceexpand: {INSTALL_HINT} ({e})"
        ) from e
    return list(expand(spec))
