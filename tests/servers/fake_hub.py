"""A loopback stand-in for the Hugging Face Hub's HTTP API, for tests: the requests
huggingface_hub 2.4 sends for ``dataset_info`` and ``list_repo_tree`` answered the way the Hub
answers them (the JSON fields it parses, the error headers it maps to its exceptions, pages
chained by a ``Link: <...>; rel="next"`` header), and ``/datasets/ORG/NAME/resolve/REV/PATH``
serving local files with range requests. Every request is logged, so a test can count them."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["FakeHub", "Request"]

# repo -> {revision name: (commit sha, {path in repo: local file})}
Repos = Mapping[str, Mapping[str, tuple[str, Mapping[str, str | Path]]]]


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # with its query
    status: int

    @property
    def kind(self) -> str:
        """``info`` (dataset_info), ``tree`` (a page of list_repo_tree), ``resolve`` (a file's
        bytes) or ``other``."""
        route = urlsplit(self.path).path
        if route.startswith("/api/datasets/"):
            return "tree" if "/tree/" in route else "info"
        return "resolve" if "/resolve/" in route else "other"


@dataclass(frozen=True)
class _File:
    local: Path
    size: int
    blob_id: str  # git's blob id: of the file itself, or of its LFS pointer
    sha256: str | None  # set for a file in LFS

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id


def _file(local: Path, lfs: bool) -> _File:
    data = local.read_bytes()
    sha256 = hashlib.sha256(data).hexdigest() if lfs else None
    stored = data
    if lfs:  # git stores the pointer, LFS the bytes
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\n"
        stored = f"{pointer}size {len(data)}\n".encode()
    blob_id = hashlib.sha1(b"blob %d\0" % len(stored) + stored).hexdigest()
    return _File(local, len(data), blob_id, sha256)


class FakeHub:
    """`repos` served at ``endpoint`` (http://127.0.0.1:PORT) while the context is open.

    `repos` maps ``"org/name"`` to ``{revision name: (commit sha, {path in repo: local file})}``
    (``"main"``, other branches or tags, ``"refs/convert/parquet"``); a revision is also found by
    its sha. ``.parquet`` files are stored in LFS, as on the Hub, the others in git.

    `page_size`: tree entries per page (the Hub's is 1000). `token`: the only token that reads
    the repos in `private`; a gated repo's listing is public but its files need that token.
    `requests`: what was asked, in order.
    """

    def __init__(
        self,
        repos: Repos,
        page_size: int = 1000,
        token: str | None = None,
        private: Iterable[str] = (),
        gated: Iterable[str] = (),
    ):
        self.repos = {
            repo: {
                rev: (sha, {p: _file(Path(f), p.endswith(".parquet")) for p, f in files.items()})
                for rev, (sha, files) in revisions.items()
            }
            for repo, revisions in repos.items()
        }
        self.page_size, self.token = page_size, token
        self.private, self.gated = set(private), set(gated)
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.endpoint = ""

    def __enter__(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        poll = {"poll_interval": 0.02}  # shutdown() waits for a poll: 0.5 s by default
        threading.Thread(target=self._server.serve_forever, kwargs=poll, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def count(self, kind: str | None = None) -> int:
        """How many requests of `kind` (Request.kind; None: all) were made."""
        with self._lock:
            return sum(kind is None or r.kind == kind for r in self.requests)

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def _log(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def revision(self, repo: str, rev: str) -> tuple[str, dict[str, _File]] | None:
        """The commit and files of `rev` (a name or a sha) of `repo`."""
        revisions = self.repos[repo]
        if rev in revisions:
            return revisions[rev]
        return next(((sha, files) for sha, files in revisions.values() if sha == rev), None)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    _API = re.compile(r"/api/datasets/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+)(/.*)?)?")
    _RESOLVE = re.compile(r"/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if m := self._API.fullmatch(url.path):
            repo, kind, rev = m.group(1), m.group(2), unquote(m.group(3) or "main")
            if self._refused(repo, files=False):
                return
            found = self.fake.revision(repo, rev)
            if found is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            if kind == "tree":
                folder = unquote(m.group(4) or "").strip("/")
                return self._tree(found[1], folder, query)
            return self._info(repo, found, query)
        if m := self._RESOLVE.fullmatch(url.path):
            repo, rev, path = m.group(1), unquote(m.group(2)), unquote(m.group(3))
            if self._refused(repo, files=True):
                return
            found = self.fake.revision(repo, rev)
            if found is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            if path not in found[1]:
                return self._error(404, "EntryNotFound", f"{path} does not exist on {rev}")
            return self._serve(found[0], found[1][path])
        self._send(404, b"Not Found")

    def _refused(self, repo: str, files: bool) -> bool:
        """Answers as the Hub does (401 with an X-Error-Code) where `repo` cannot be read."""
        authorized = self.fake.token is not None and (
            self.headers.get("Authorization") == f"Bearer {self.fake.token}"
        )
        if repo not in self.fake.repos or (repo in self.fake.private and not authorized):
            self._error(401, "RepoNotFound", "Repository not found")
            return True
        if files and repo in self.fake.gated and not authorized:
            self._error(401, "GatedRepo", "Access to this dataset is restricted.")
            return True
        return False

    def _info(
        self, repo: str, found: tuple[str, dict[str, _File]], query: dict[str, list[str]]
    ) -> None:
        sha, files = found
        body: dict[str, Any] = {"_id": hashlib.md5(repo.encode()).hexdigest()[:24], "id": repo}
        expand = query.get("expand") or query.get("expand[]")
        if not expand or "sha" in expand:
            body["sha"] = sha
        if not expand:
            body |= {"private": repo in self.fake.private, "gated": repo in self.fake.gated}
            body["siblings"] = [{"rfilename": p} for p in sorted(files)]
        self._json(body)

    def _tree(self, files: dict[str, _File], folder: str, query: dict[str, list[str]]) -> None:
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = f"{folder}/" if folder else ""
        under = sorted(p for p in files if p.startswith(prefix))
        if folder and not under:
            return self._error(404, "EntryNotFound", f"{folder} does not exist")
        folders = {"/".join(p.split("/")[:n]) for p in under for n in range(1, p.count("/") + 1)}
        entries = sorted(
            [(p, files[p]) for p in under] + [(d, None) for d in folders if d.startswith(prefix)],
            key=lambda e: e[0],
        )
        if not recursive:
            entries = [e for e in entries if "/" not in e[0][len(prefix) :]]
        start = int(query.get("cursor", ["0"])[0])
        page = entries[start : start + self.fake.page_size]
        body = [self._entry(path, f) for path, f in page]
        headers = {}
        if start + self.fake.page_size < len(entries):
            next_query = f"recursive={str(recursive).lower()}&expand=false"
            url = urlsplit(self.path)._replace(query=f"{next_query}&cursor={start + len(page)}")
            headers["Link"] = f'<{self.fake.endpoint}{url.geturl()}>; rel="next"'
        self._json(body, headers)

    @staticmethod
    def _entry(path: str, f: _File | None) -> dict[str, Any]:
        if f is None:
            oid = hashlib.sha1(path.encode()).hexdigest()
            return {"type": "directory", "oid": oid, "size": 0, "path": path}
        entry: dict[str, Any] = {"type": "file", "oid": f.blob_id, "size": f.size, "path": path}
        if f.sha256:
            entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
        return entry

    def _serve(self, sha: str, f: _File) -> None:
        """`f`'s bytes, or the range asked for (206 with Content-Range; 416 outside the file)."""
        data = f.local.read_bytes()
        headers = {"ETag": f'"{f.etag}"', "X-Repo-Commit": sha, "Accept-Ranges": "bytes"}
        wanted = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        if wanted is None:
            return self._send(200, data, headers, "application/octet-stream")
        first, last = wanted.groups()
        if first:
            start, end = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
        else:  # bytes=-N: the last N
            start, end = max(len(data) - int(last or 0), 0), len(data) - 1
        if start >= len(data) or start > end:
            headers["Content-Range"] = f"bytes */{len(data)}"
            return self._send(416, b"", headers)
        headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        self._send(206, data[start : end + 1], headers, "application/octet-stream")

    def _error(self, status: int, code: str, message: str) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message}
        self._send(status, json.dumps({"error": message}).encode(), headers, "application/json")

    def _json(self, body: Any, headers: dict[str, str] | None = None) -> None:
        self._send(200, json.dumps(body).encode(), headers, "application/json")

    def _send(
        self,
        status: int,
        data: bytes,
        headers: dict[str, str] | None = None,
        content_type: str = "text/plain",
    ) -> None:
        self.fake._log(Request(self.command, self.path, status))
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
