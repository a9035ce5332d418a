"""ParquetPack: Parquet files read as a pack, one shard per row group, with no packing step.

Opening lists the files (stoker.parquet.files) and reads their footers (stoker.parquet.footers);
`bind(fields)` chooses the columns (stoker.parquet.columns) and opens the engine's dataset, a
shard per row group. While a pass runs, the fetcher threads (stoker.remote.fetcher, as for a
remote pack) take the row groups the pass reads next: a remote one's byte range is one range
request into the shared cache folder (kept at its offset in a sparse file, bounded and evicted as
a remote pack's shards are); then pyarrow decodes the row group from the local file (the GIL
released) and its columns are handed to the engine's gate, where the workers read each row's
cells in place. Decoded row groups are held while the batches in flight or the pass's next
shards include them, so memory is about ``prefetch_shards + threads + 2 x shuffle_window`` row
groups, or the batches in flight's where those span more.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import _core
from ..errors import InvalidArgumentError, StokerError
from ..remote.cache import _Locked, _Shard, default_cache_dir
from ..remote.fetcher import Fetcher
from ..remote.retry import Retry
from ..remote.urls import redact
from . import columns as cols
from .files import ParquetFile, list_files
from .footers import Footer, RowGroup, read_footers, row_groups


def http_limits(max_concurrent: int | None, requests_per_second: float | None) -> dict[str, Any]:
    """The RangeClient's limits on one host: those given, else ``STOKER_HTTP_MAX_CONCURRENT``
    (default 8 requests in flight from every process sharing the cache folder) and
    ``STOKER_HTTP_RATE`` (requests a second from this process; default none)."""
    env = os.environ
    try:
        concurrent = max_concurrent or int(env.get("STOKER_HTTP_MAX_CONCURRENT") or 8)
        rate = requests_per_second or (float(env["STOKER_HTTP_RATE"])
                                       if env.get("STOKER_HTTP_RATE") else None)  # fmt: skip
    except ValueError as e:
        raise InvalidArgumentError(f"STOKER_HTTP_MAX_CONCURRENT / STOKER_HTTP_RATE: {e}") from None
    return {"max_concurrent": concurrent, "requests_per_second": rate}


class ParquetPack(Fetcher):
    """Parquet files at `spec` (stoker.parquet.files says what it may name), read through the
    cache folder ``cache_dir/<name>-<hash of spec>`` when remote. `bind(fields)` must be called
    before `dataset` is used."""

    # Evicting a row group's file from the cache leaves its decoded columns, which pyarrow read
    # into memory, in the gate while held: memory is max_held's, disk cache_limit's.
    _evict_from_gate = False

    def __init__(
        self,
        spec: Any,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        retry: Retry | None = None,
        prefetch_shards: int = 2,
        fetch_threads: int = 2,
        endpoint: str | None = None,
        max_concurrent: int | None = None,
        requests_per_second: float | None = None,
    ):
        from ..remote.ranges import RangeClient

        text = os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else "\n".join(
            os.fspath(s) for s in spec)  # fmt: skip
        self.shown = redact(text.split("\n", 1)[0]) + ("" if "\n" not in text else " (+more)")
        self.url = text
        self._init_fetching(retry, cache_limit, prefetch_shards, fetch_threads)
        root = Path(cache_dir or default_cache_dir())
        self._root = root
        name = re.sub(r"[^A-Za-z0-9._-]", "_", text.rstrip("/").rsplit("/", 1)[-1])[:48] or "pq"
        self.folder = root / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        self.files: list[ParquetFile] = list_files(spec, endpoint, root)
        self.remote = not all(f.local for f in self.files)
        self.client: Any = None
        if self.remote:
            self.folder.mkdir(parents=True, exist_ok=True)
            with _Locked(self.folder / ".cache.lock", fcntl.LOCK_EX):
                self._remove_dead_parts()
            self.client = RangeClient(
                root, self.retry, **http_limits(max_concurrent, requests_per_second)
            )
        footers = root / "parquet-footers"  # one per file version on the machine, any spec
        if self.remote:
            footers.mkdir(parents=True, exist_ok=True)
        self.footers: list[Footer] = read_footers(self.files, self.client, footers)
        self.files = [f.file for f in self.footers]  # with their sizes and ETags
        self.schema = self.footers[0].metadata.schema.to_arrow_schema()
        self.features = cols._features(self.schema)
        self.fs = None
        self.dataset: Any = None
        self.columns: list[cols.Column] = []
        self.image_columns: list[str] = []
        self.groups: list[RowGroup] = []
        self._held: dict[int, None] = {}  # row groups handed to the gate, oldest first
        # Decoded row groups held at most (more while the pass's next ones need them): the
        # loader sets it to what a pass's workers read at once (two shuffle windows, prefetch,
        # threads).
        self.max_held = 12
        self.decoded = self.decoded_bytes = 0

    # --- columns -> the engine's dataset --------------------------------------------------------
    def bind(
        self, fields: Mapping[str, Any], image_members: str
    ) -> tuple[dict[str, Any], dict[str, dict]]:
        """The fields with their members set to the columns they read (errors name the file,
        the column and its type; columns.bind), and the schema Array fields take their shapes
        from; opens the dataset, a shard per row group."""
        first = self.files[0].name
        bound, self.columns, schema = cols.bind(
            fields, self.schema, self.features, first, image_members
        )
        read = sorted({c.read for c in self.columns})
        names = {c.member for c in self.columns}
        self.image_columns = [f.member for f in bound.values()
                              if f.kind == _core.FieldKind.image and f.member in names]  # fmt: skip
        first_types = cols.leaf_types(self.schema)
        self._present: list[list[cols.Column]] = []
        for footer in self.footers:  # every file: its own columns checked as the first's
            types = cols.leaf_types(footer.metadata.schema.to_arrow_schema())
            here = []
            for c in self.columns:
                if c.member not in types:
                    continue  # absent from this file's rows: the loader's missing policy
                cell, dtype, path = cols._cell(c.member, types[c.member])
                if (cell, dtype, path) != (c.cell, c.dtype, c.path):
                    raise InvalidArgumentError(
                        f"{footer.file.name}: column {c.member!r} is {types[c.member]} there, "
                        f"where {first} has it as {first_types[c.member]}"
                    )
                here.append(c)
            self._present.append(here)
        self.groups = row_groups(self.footers, read)
        if not any(g.rows for g in self.groups):
            raise InvalidArgumentError(f"{self.shown}: the Parquet files hold no rows")
        self.shards = [self._shard(g) for g in self.groups]
        infos = [
            (self._name(g), g.rows, g.first_row, [c.member for c in self._present[g.file]])
            for g in self.groups
        ]
        self.dataset = _core.Dataset.open_row_groups(
            self.shown, infos, cols.class_names(self.columns, bound, self.features)
        )
        self.gate = self.dataset.gate
        if self.remote:
            self._check_limit()
        return bound, schema

    def _name(self, g: RowGroup) -> str:
        return f"{self.files[g.file].name} (row group {g.group})"

    def _shard(self, g: RowGroup) -> _Shard:
        f = self.files[g.file]
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", f.name)[-80:]
        key = hashlib.sha256(f"{f.where}\n{f.size}\n{f.etag}".encode()).hexdigest()[:8]
        # The range in the name: loaders reading other columns of the file fetch other ranges.
        return _Shard(f"{safe}-{key}.rg{g.group}-{g.start}-{g.end}", "", g.end - g.start, f.where,
                      f"{redact(f.where)} (row group {g.group})", offset=g.start,
                      etag=f.etag or "")  # fmt: skip

    # --- the fetcher's hooks --------------------------------------------------------------------
    def fetch(self, shard: int, keep: set[int] | None = None) -> Path | None:
        """The row group's bytes in a local file: its own file when local, else fetched into
        the cache as a remote pack's shard is (ShardCache.fetch)."""
        g = self.groups[shard]
        f = self.files[g.file]
        if f.local or g.end == g.start:
            return Path(f.where)
        return super().fetch(shard, keep)

    def _check_fetched(self, shard: int, part: Path) -> None:
        """Nothing more to check: range_into wrote exactly the range, of the version the footer
        came from (If-Match)."""

    def _retrying(self, what: str, fn: Callable[[], Any], permanent: Any = ()) -> Any:
        """fn() once: the RangeClient retries each request itself, at the server's times."""
        return fn()

    def _download_shard(self, s: _Shard, part: Path) -> None:
        try:
            self.client.range_into(s.url, s.offset, s.offset + s.bytes, part, s.etag or None,
                                   self._stop)  # fmt: skip
        except InterruptedError:
            raise InvalidArgumentError("the loader was closed") from None

    def _hand_over(self, shard: int, path: Path) -> None:
        """The row group decoded from `path` and given to the gate; one that does not decode is
        given as failed, so that each of its rows is an error the loader's on_error handles."""
        import pyarrow as pa  # type: ignore[import-untyped]
        import pyarrow.parquet as pq  # type: ignore[import-untyped]

        g = self.groups[shard]
        present = self._present[g.file]
        name = self._name(g)

        def decoded(nbytes: int) -> None:  # counted before the gate has it: a reader may finish
            with self._lock:  # the pass, and read stats(), as soon as it has
                self.decoded += 1
                self.decoded_bytes += nbytes

        try:
            if not present:
                decoded(0)
                self.gate.ready_rows(shard, name, g.rows, [])
            else:
                reader = pq.ParquetFile(str(path), metadata=self.footers[g.file].metadata,
                                        pre_buffer=True)  # fmt: skip
                table = reader.read_row_group(g.group, columns=sorted({c.read for c in present}),
                                              use_threads=False)  # fmt: skip
                if table.num_rows != g.rows:
                    raise ValueError(f"{table.num_rows} rows where the footer says {g.rows}")
                columns = cols.gate_columns(table, present)
                decoded(table.nbytes)
                self.gate.ready_rows(shard, name, g.rows, columns)
        except (OSError, ValueError, pa.ArrowException, StokerError) as e:
            if self._stop.is_set():  # the loader closes: nothing waits for this row group
                raise
            why = f"row group {g.group} of {self.files[g.file].name} does not decode: {e}"
            self.gate.ready_rows(shard, name, g.rows, [], error=why)
        with self._lock:
            self._held.pop(shard, None)
            self._held[shard] = None

    def _set_keep(self, wanted: Sequence[int]) -> None:
        if self.remote:  # local files are not in the cache: nothing to keep from eviction
            super()._set_keep(wanted)

    def _wanted(self, wait_ms: int) -> list[int]:
        """Fetcher._wanted; and, past `max_held` decoded row groups, those the pass does not
        read soon dropped from the gate, the longest held first (a reader keeps its own until
        it is done). Below it they stay, so that a dataset of few row groups is decoded once,
        not once an epoch."""
        wanted = super()._wanted(wait_ms)
        with self._lock:
            excess = len(self._held) - self.max_held
        if excess <= 0:
            return wanted
        keep = set(wanted) | set(self._plan())
        with self._lock:
            done = [s for s in self._held if s not in keep][:excess]
            for s in done:
                del self._held[s]
        for s in done:
            self.gate.evict(s)
        return wanted

    # --- image sizes (aspect buckets, group_by's size) --------------------------------------
    def image_sizes(self, members: Sequence[str]) -> Any:
        """Each row's image (height, width), int64 [rows, 2] ((0, 0): none, or not an image),
        of the first of `members` (columns; else the Image fields') a file has: read from the
        images' headers, a row group at a time (a remote one fetched through the cache as a
        pass fetches it), once a machine: kept per file version and column in the cache
        folder."""
        import numpy as np

        named = [m for m in members if m in {c.member for c in self.columns}]
        members = named or self.image_columns  # a pack's names (jpg, png...): the Image's column
        out = []
        cache = Path(self._root) / "parquet-sizes"
        cache.mkdir(parents=True, exist_ok=True)
        for i, f in enumerate(self.files):
            here = [c for c in self._present[i] if c.member in members and c.cell == "bytes"]
            groups = [(k, g) for k, g in enumerate(self.groups) if g.file == i]
            rows = sum(g.rows for _, g in groups)
            if not here:
                out.append(np.zeros((rows, 2), np.int64))
                continue
            column = min(here, key=lambda c: list(members).index(c.member))
            key = hashlib.sha256(f"{f.where}\n{f.size}\n{f.etag}\n{self._mtime(f)}\n"
                                 f"{column.path}".encode()).hexdigest()[:20]  # fmt: skip
            path = cache / f"{key}.npy"
            if path.exists():
                out.append(np.load(path))
                continue
            sizes = np.concatenate([self._group_sizes(k, column) for k, _ in groups])
            part = path.with_name(f"{path.name}.part-{os.getpid()}.npy")
            np.save(part, sizes)
            os.replace(part, path)
            out.append(sizes)
        return np.concatenate(out) if out else np.zeros((0, 2), np.int64)

    @staticmethod
    def _mtime(f: ParquetFile) -> int:
        return os.stat(f.where).st_mtime_ns if f.local else 0

    def _group_sizes(self, shard: int, column: cols.Column) -> Any:
        import io

        import numpy as np
        import pyarrow.parquet as pq
        from PIL import Image

        g = self.groups[shard]
        path = self.fetch(shard)
        assert path is not None
        reader = pq.ParquetFile(str(path), metadata=self.footers[g.file].metadata)
        table = reader.read_row_group(g.group, columns=[column.read], use_threads=False)
        table = cols.flat(table)
        sizes = np.zeros((g.rows, 2), np.int64)
        for r, value in enumerate(table.column(column.path).to_pylist()):
            if value:
                try:
                    with Image.open(io.BytesIO(value)) as im:
                        sizes[r] = (im.height, im.width)
                except Exception:  # noqa: BLE001 - not an image: its size is unknown, (0, 0)
                    pass
        return sizes

    def close(self) -> None:
        if self.gate is not None:
            super().close()

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "url": self.shown,
            "files": len(self.files),
            "row_groups": len(self.groups),
            "row_groups_decoded": self.decoded,
            "decoded_bytes": self.decoded_bytes,
            **{f"gate_{k}": v for k, v in self.gate.stats().items()},
        }
        if self.remote:
            out.update(cache_dir=str(self.folder), cache_limit=self.cache_limit,
                       cache_bytes=self._used(), fetched=self.fetched,
                       fetched_bytes=self.fetched_bytes, http=self.client.stats())  # fmt: skip
            out["requests"] = out["http"]["requests"]
        return out
