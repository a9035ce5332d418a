"""The Parquet files an ``hf://datasets/ORG/NAME`` URL names on the Hugging Face Hub, listed once
and pinned to the commit they were listed at, so that every rank and worker reads the same bytes
even when the branch moves on while a job runs.

The URL's forms, as huggingface_hub's own ``hf://`` paths write them:

- ``hf://datasets/ORG/NAME``: every ``.parquet`` file in the repository (at ``main``);
- ``hf://datasets/ORG/NAME@REV``: at REV, a branch, a tag, a 40-hex commit sha,
  ``refs/convert/parquet`` or ``refs/pr/N`` (also URL-encoded: ``@refs%2Fconvert%2Fparquet``);
- either followed by ``/PATH``: one file (``/data/train-00000-of-00004.parquet``), a glob
  (``/data/train-*.parquet``, ``/**/*.parquet``: ``*`` and ``?`` stay within a folder, ``**``
  crosses folders) or a folder (``/data``: every ``.parquet`` under it).

A repository with no Parquet file matching at ``main``, REV not given, is read from the Hub's own
Parquet conversion (``refs/convert/parquet``, pinned to its commit the same way). That conversion
covers only the first 5 GB of each split of a large dataset (its folders are then named
``partial-SPLIT``, and a warning is logged).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

from ..errors import InvalidArgumentError, ShardIOError
from .cache import _Locked

if TYPE_CHECKING:
    from huggingface_hub import HfApi

__all__ = ["DEFAULT_ENDPOINT", "DEFAULT_MAX_AGE_S", "HubFile", "HubListing", "is_hf", "resolve"]

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_MAX_AGE_S = 600.0  # a cached listing of a branch or tag older than this is listed again
CONVERTED = "refs/convert/parquet"  # the Hub's own Parquet conversion of a dataset
INSTALL_HINT = "pip install huggingface_hub"

_PREFIX = "hf://datasets/"
_SHA = re.compile(r"[0-9a-f]{40}")
_SPECIAL_REF = re.compile(r"refs/(?:convert/\w+|pr/\d+)(?=/|$)")  # revisions with '/' in them
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # an org's or a dataset's name on the Hub
_GLOB = re.compile(r"[*?\[]")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HubFile:
    """One Parquet file of a listing."""

    path: str  # in the repository, e.g. "data/train-00000-of-00004.parquet"
    url: str  # its bytes, read with range requests: {endpoint}/datasets/{repo}/resolve/{sha}/{path}
    size: int
    etag: str  # its version: the LFS sha256, or the git blob id of a file not in LFS


@dataclass(frozen=True)
class HubListing:
    """The Parquet files an hf:// URL names, at commit `sha` of `revision` (the one asked for,
    ``main`` if none was, or ``refs/convert/parquet`` where the Hub's conversion was used)."""

    repo: str
    revision: str
    sha: str
    endpoint: str
    files: list[HubFile]


@dataclass(frozen=True)
class _Where:
    """What an hf:// URL names: a repository, a revision (None: not given) and a pattern."""

    url: str
    repo: str
    revision: str | None
    pattern: str  # a file, glob or folder in the repository; '' for all of it

    @property
    def shown(self) -> str:
        return f"hf://datasets/{self.repo}"


def is_hf(url: object) -> bool:
    """Whether `url` is an ``hf://`` URL. `resolve` reads only ``hf://datasets/...`` and says so
    for the others (models, spaces), rather than leaving them to a reader that knows no hf://."""
    return isinstance(url, str) and url[:5].lower() == "hf://"


def _parse(url: str) -> _Where:
    """`url`'s repository, revision and pattern, the way huggingface_hub's ``parse_hf_uri``
    splits them (an ``@`` right after ORG/NAME starts the revision; ``refs/convert/X`` and
    ``refs/pr/N`` are taken whole; the revision is URL-decoded). A malformed URL raises
    InvalidArgumentError."""
    if not url.startswith(_PREFIX):
        raise InvalidArgumentError(
            f"{url}: stoker reads Hub datasets, written hf://datasets/ORG/NAME[@REV][/PATH]"
        )
    body = url[len(_PREFIX) :]
    folder_marked = body.endswith("/")  # "…/data/": a folder, even named like a file
    org, _, rest = body.strip("/").partition("/")
    name, _, rest = rest.partition("/")
    revision: str | None = None
    if "@" in name:
        name, _, rev_and_path = name.partition("@")
        rev_and_path += "/" + rest if rest else ""
        special = _SPECIAL_REF.match(rev_and_path)
        if special:
            revision, rest = special.group(), rev_and_path[special.end() :]
        else:
            raw, _, rest = rev_and_path.partition("/")
            revision = unquote(raw)
        if not revision:
            raise InvalidArgumentError(f"{url}: an empty revision after '@'")
    if not (_NAME.fullmatch(org) and _NAME.fullmatch(name)):
        raise InvalidArgumentError(
            f"{url}: a dataset is named hf://datasets/ORG/NAME (letters, digits, '.', '_', '-')"
        )
    pattern = rest.strip("/")
    if any(part in ("..", ".") for part in pattern.split("/")):
        raise InvalidArgumentError(f"{url}: a path in the repository has no '.' or '..' in it")
    pattern += "/" if folder_marked and pattern else ""
    return _Where(url, f"{org}/{name}", revision, pattern)


@dataclass(frozen=True)
class _Selection:
    """Which folder to list (None: the whole repository), whether recursively, and which of the
    files listed are taken."""

    folder: str | None
    recursive: bool
    takes: Callable[[str], bool]


def _select(pattern: str) -> _Selection:
    """The listing a pattern needs: the folder above its first glob character, listed recursively
    only where the pattern reaches below it; an exact ``.parquet`` file through its folder, not
    recursively (a trailing '/' says a name is a folder)."""
    parquet = re.compile(r".*\.parquet", re.IGNORECASE)
    if not pattern:
        return _Selection(None, True, lambda path: bool(parquet.fullmatch(path)))
    if _GLOB.search(pattern):
        pattern = pattern.rstrip("/")
        parts = pattern.split("/")
        first = next(i for i, p in enumerate(parts) if _GLOB.search(p))
        below = "/".join(parts[first:])
        whole = _glob_regex(pattern)
        return _Selection(
            "/".join(parts[:first]) or None,
            "/" in below or "**" in below,
            lambda path: bool(whole.fullmatch(path) and parquet.fullmatch(path)),
        )
    if pattern.lower().endswith(".parquet"):
        folder = pattern.rpartition("/")[0]
        return _Selection(folder or None, False, lambda path: path == pattern)
    folder = pattern.rstrip("/")
    return _Selection(
        folder, True, lambda path: path.startswith(folder + "/") and bool(parquet.fullmatch(path))
    )


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """`pattern` as a regular expression over whole paths: ``*`` and ``?`` within one folder,
    ``**`` across folders (``a/**/b`` matches ``a/b`` too), ``[...]`` one character of a class
    (``[!...]``: not of it)."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) > 0:
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def resolve(
    url: str,
    endpoint: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    max_age_s: float = DEFAULT_MAX_AGE_S,
) -> HubListing:
    """The Parquet files `url` names (the module's docstring gives its forms), sorted by path,
    each with a URL pinned to the commit the revision pointed at when listed.

    `endpoint`: the Hub's address; else ``HF_ENDPOINT``; else https://huggingface.co. `token`:
    huggingface_hub's (a string, False for none); None takes its usual one (``HF_TOKEN``, or the
    one ``hf auth login`` stored). No message names a token.

    Requests: one for the revision's commit (none when the revision is a commit sha already),
    then one per page of the listing of the selected folder (the Hub pages at 1,000 entries,
    files and folders): 1 + ceil(entries / 1000) in all. Where the Hub's Parquet conversion is
    used, that again for ``refs/convert/parquet``.

    `cache_dir`: the listing is kept there as ``hf-<hash>.json`` and read from it without a
    request: always, for a revision that is a commit sha (it never changes); for a branch or tag,
    while it is younger than `max_age_s` seconds. A lock file beside it makes the processes of
    one machine (ranks, workers) list the repository once and the others read what it wrote.

    Raises InvalidArgumentError for a malformed URL, and where no Parquet file matches;
    ShardIOError where the Hub refuses (no such repository or revision, private or gated) or does
    not answer; ImportError without huggingface_hub.
    """
    where = _parse(url)
    hub = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    if cache_dir is None:
        return _resolve(where, hub, token)
    folder = Path(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    key = "|".join((hub, where.repo, where.revision or "", where.pattern))
    path = folder / f"hf-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    with _Locked(path.with_suffix(".lock"), fcntl.LOCK_EX):
        cached = _read_cached(path, where.revision, max_age_s)
        if cached is not None:
            return cached
        listing = _resolve(where, hub, token)
        _write_cached(path, listing)
        return listing


def _read_cached(path: Path, revision: str | None, max_age_s: float) -> HubListing | None:
    """The listing kept at `path`, if there is one still good for `revision`; an unreadable one
    counts as none (it is listed again and rewritten)."""
    try:
        kept = json.loads(path.read_text())
        if not (revision and _SHA.fullmatch(revision)):
            if not time.time() - float(kept["listed_at"]) < max_age_s:
                return None
        files = [HubFile(**f) for f in kept["files"]]
        return HubListing(kept["repo"], kept["revision"], kept["sha"], kept["endpoint"], files)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cached(path: Path, listing: HubListing) -> None:
    """`listing` written to `path` whole or not at all (a reader never sees half of it)."""
    part = path.with_name(f"{path.name}.part-{os.getpid()}")
    part.write_text(json.dumps({**asdict(listing), "listed_at": time.time()}))
    os.replace(part, path)


def _resolve(where: _Where, endpoint: str, token: str | bool | None) -> HubListing:
    """The listing at the revision asked for; else, with none asked for and nothing there, the
    Hub's Parquet conversion's."""
    api = _api(endpoint, token)
    listing = _listing(api, where, where.revision or "main")
    if listing.files:
        return listing
    converted = None
    if where.revision is None:
        try:
            converted = _listing(api, where, CONVERTED)
        except ShardIOError as e:
            if e.reason != "revision not found":
                raise
    if converted is not None and converted.files:
        folders = {part for f in converted.files for part in f.path.split("/")[:-1]}
        partial = sorted(p.removeprefix("partial-") for p in folders if p.startswith("partial-"))
        if partial:
            log.warning(
                "%s: read from the Hub's Parquet conversion (%s), which holds only the first "
                "5 GB of the splits %s",
                where.shown,
                CONVERTED,
                ", ".join(partial),
            )
        return converted
    where_to = f"matching {where.pattern!r}" if where.pattern else "in the repository"
    also = f", nor in the Hub's Parquet conversion ({CONVERTED})" if where.revision is None else ""
    raise InvalidArgumentError(
        f"{where.shown}: no Parquet files {where_to} at revision {listing.revision} "
        f"(commit {listing.sha[:12]}){also}"
    )


def _api(endpoint: str, token: str | bool | None) -> HfApi:
    """huggingface_hub's client for `endpoint`, or an ImportError saying how to install it."""
    try:
        from huggingface_hub import HfApi
    except ImportError as e:
        raise ImportError(f"reading hf:// URLs needs huggingface_hub: {INSTALL_HINT} ({e})") from e
    return HfApi(endpoint=endpoint, token=token, library_name="stoker")


def _listing(api: HfApi, where: _Where, revision: str) -> HubListing:
    """The matching files at `revision`, pinned to its commit: one request for the commit (none
    for a sha), one per page of the tree."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.errors import EntryNotFoundError
    from huggingface_hub.hf_api import RepoFile

    endpoint = str(api.endpoint)
    with _hub_errors(where, revision, endpoint):
        sha = revision
        if not _SHA.fullmatch(revision):
            sha = str(api.dataset_info(where.repo, revision=revision, expand=["sha"]).sha)
        selection = _select(where.pattern)
        try:
            entries = [
                e
                for e in api.list_repo_tree(
                    where.repo,
                    path_in_repo=selection.folder,
                    recursive=selection.recursive,
                    revision=sha,
                    repo_type="dataset",
                )
                if isinstance(e, RepoFile) and selection.takes(e.path)
            ]
        except EntryNotFoundError:  # no such folder: nothing matches
            entries = []
    files = [
        HubFile(
            path=e.path,
            url=hf_hub_url(
                where.repo, e.path, repo_type="dataset", revision=sha, endpoint=endpoint
            ),
            size=int(e.lfs.size if e.lfs else e.size),
            etag=str(e.lfs.sha256 if e.lfs else e.blob_id),
        )
        for e in sorted(entries, key=lambda e: e.path)
    ]
    return HubListing(where.repo, revision, sha, endpoint, files)


def _network_errors() -> tuple[type[Exception], ...]:
    """The errors of a request that got no answer: OSError (huggingface_hub's HTTP errors and
    its offline mode derive from it) and its HTTP client's transport errors (httpx2 in
    huggingface_hub 2, httpx before)."""
    found: list[type[Exception]] = [OSError]
    for client in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(client).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


@contextmanager
def _hub_errors(where: _Where, revision: str, endpoint: str) -> Iterator[None]:
    """huggingface_hub's errors as stoker's, naming the repository and the revision."""
    from huggingface_hub import errors

    login = "pass a token (HF_TOKEN, `hf auth login`, or token=)"
    try:
        yield
    except errors.GatedRepoError as e:
        raise ShardIOError(
            f"{where.shown}: a gated dataset: accept its conditions at "
            f"{endpoint}/datasets/{where.repo} and {login}",
            reason="gated repository",
        ) from e
    except errors.RepositoryNotFoundError as e:
        raise ShardIOError(
            f"{where.shown}: no such dataset at {endpoint}, or a private one: to read a private "
            f"dataset, {login} with access to it",
            reason="repository not found",
        ) from e
    except errors.RevisionNotFoundError as e:
        raise ShardIOError(
            f"{where.shown}: no revision {revision!r} (a branch, tag, commit sha or refs/pr/N)",
            reason="revision not found",
        ) from e
    except errors.HFValidationError as e:
        raise InvalidArgumentError(f"{where.url}: {e}") from e
    except _network_errors() as e:
        raise ShardIOError(
            f"{where.shown}@{revision}: listing it at {endpoint} failed: {type(e).__name__}: {e}",
            reason="hub request failed",
        ) from e
