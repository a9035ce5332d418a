"""A token pack's documents for packing: the stream's shard files memory-mapped (a pack at a URL
fetched into the cache folder first) and the document index (documents.npz, written by
stoker.pack_tokens) read and checked against them; every size in it is untrusted."""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .. import _core
from ..errors import CorruptDataError, InvalidArgumentError

_MAX_INDEX_BYTES = 1 << 32
_REMOTE_OPEN_SHARDS = 16  # shards of a pack at a URL kept mapped at once


def _file_name(name: Any) -> str:
    """A file of the pack named by its manifest: a plain name inside the pack's folder."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name[0] == ".":
        raise ValueError(f"{name!r} is not a file name inside the pack")
    return name


class DocumentPack:
    """A token pack's stream and documents: the shard files memory-mapped (a pack at a URL
    fetched into ``cache_dir`` first) and the document index checked against them. A pack
    without an index but with an ``eos_id`` has a document ending at each eos."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        eos_id: int | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int | None = None,
    ):
        from ..remote import is_remote

        self.path = os.fspath(path)
        self._remote: Any = None
        if is_remote(self.path):
            from ..remote import RemotePack

            self._remote = RemotePack(self.path, cache_dir, cache_limit,
                                      dataset_options={"seq_len": 1})  # fmt: skip
            read = self._remote._fetch_small
        else:

            def read(name: str) -> bytes:
                return (Path(self.path) / name).read_bytes()

        try:
            manifest = json.loads(read("manifest.json"))
        except FileNotFoundError:
            raise InvalidArgumentError(f"{self.path}: no manifest.json (no token pack)") from None
        if manifest.get("format") != "stoker-tokens":
            raise InvalidArgumentError(
                f"{self.path}: a {manifest.get('format')!r} pack, not a token pack "
                "(stoker.pack_tokens)"
            )
        try:  # the manifest is untrusted: every field checked before it is used
            self.dtype = np.dtype(str(manifest["dtype"]))
            self.shard_files = [_file_name(s["file"]) for s in manifest["shards"]]
            self.shard_tokens = np.asarray([int(s["num_tokens"]) for s in manifest["shards"]],
                                           dtype=np.int64)  # fmt: skip
            documents = manifest.get("documents")
            index_file = None if documents is None else _file_name(documents["file"])
            if self.dtype.name not in ("uint16", "uint32", "int32"):
                raise ValueError(f"tokens of {self.dtype.name}")
            if not self.shard_files or (self.shard_tokens < 0).any():
                raise ValueError("no shards, or a negative token count")
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptDataError(
                f"{self.path}/manifest.json: not a token pack's manifest: {type(e).__name__}: {e}"
            ) from None
        self.shard_starts = np.concatenate(([0], np.cumsum(self.shard_tokens))).astype(np.int64)
        self.num_tokens = int(self.shard_starts[-1])
        self._opened = [False] * len(self.shard_files)
        self._lock = threading.Lock()
        self._mapped: list[int] = []  # a remote pack's mapped shards, oldest first
        self._all_mapped = False
        self.rows = _core.TokenRows(self.shard_starts, self.dtype.name)  # what writes batches
        self.eos_id = manifest.get("eos_id") if eos_id is None else eos_id
        if documents is not None and index_file is not None:
            where = f"{self.path}/{index_file}"
            try:
                raw = read(index_file)
            except FileNotFoundError:
                raise CorruptDataError(f"{where}: the manifest names it; it is not there") from None
            if len(raw) > _MAX_INDEX_BYTES:
                raise CorruptDataError(f"{where}: a document index of {len(raw):,} bytes")
            crc = documents.get("crc32c")
            if crc is not None and int(_core.crc32c(raw)) != int(crc):
                raise CorruptDataError(
                    f"{where}: its CRC32C is {int(_core.crc32c(raw))}, the manifest says {crc}: "
                    "damaged"
                )
            self.sources = [str(s) for s in documents.get("sources", [""])] or [""]
            self._load_index(raw, str(documents["file"]))
        elif self.eos_id is not None and self._remote is None:
            self.sources = [""]
            self._index_from_eos(int(self.eos_id))
        else:
            raise InvalidArgumentError(
                f"{self.path}: the pack has no document index, so whole documents cannot be "
                "packed: pack documents with stoker.pack_tokens(documents, ...), or give eos_id "
                "(a local pack's documents then end at each eos)"
            )

    def _load_index(self, raw: bytes, name: str) -> None:
        where = f"{self.path}/{name}"
        try:
            with np.load(io.BytesIO(raw), allow_pickle=False) as z:
                offset, length = z["offset"].astype(np.int64), z["length"].astype(np.int64)
                source = z["source"].astype(np.int64)
                span_ptr, spans = z["span_ptr"].astype(np.int64), z["spans"].astype(np.int64)
        except Exception as e:  # noqa: BLE001 - whatever zipfile or numpy make of bad bytes
            raise CorruptDataError(
                f"{where}: not a document index: {type(e).__name__}: {e}"
            ) from None
        n = len(offset)
        problem = None
        if len(length) != n or len(source) != n or len(span_ptr) != n + 1:
            problem = "its arrays' lengths differ"
        elif spans.ndim != 2 or spans.shape[1] != 2:
            problem = f"spans of shape {spans.shape}"
        elif n and (length.min() < 1 or offset.min() < 0):
            problem = "an empty document or a negative offset"
        elif n and (offset + length).max() > self.num_tokens:
            problem = f"a document past the stream's end ({self.num_tokens:,} tokens)"
        elif n and source.max() >= len(self.sources):
            problem = f"a source past the {len(self.sources)} named"
        elif span_ptr[0] != 0 or np.any(np.diff(span_ptr) < 0) or span_ptr[-1] != len(spans):
            problem = "span pointers out of order"
        elif len(spans):
            doc = np.repeat(np.arange(n), np.diff(span_ptr))
            if np.any(spans[:, 0] < 0) or np.any(spans[:, 1] <= spans[:, 0]) or np.any(
                spans[:, 1] > length[doc]
            ):
                problem = "a loss span outside its document"
        if problem:
            raise CorruptDataError(f"{where}: {problem}")
        self.offset, self.length, self.source = offset, length, source
        self.span_ptr, self.spans = span_ptr, np.ascontiguousarray(spans)

    def _index_from_eos(self, eos: int) -> None:
        """Documents that end at each eos (the last one, maybe, at the stream's end)."""
        ends = []
        for s in range(len(self.shard_files)):
            self._open(s)  # checks its size
            tokens = np.memmap(self._local_file(s), dtype=self.dtype, mode="r") if int(
                self.shard_tokens[s]) else np.zeros(0, self.dtype)  # fmt: skip
            ends.append(np.flatnonzero(tokens == eos) + self.shard_starts[s] + 1)
        end = np.concatenate([*ends, np.zeros(0, dtype=np.int64)]).astype(np.int64)
        if not len(end) or end[-1] != self.num_tokens:
            end = np.append(end, self.num_tokens)
        self.offset = np.concatenate(([0], end[:-1])).astype(np.int64)
        self.length = end - self.offset
        self.source = np.zeros(len(end), dtype=np.int64)
        self.span_ptr = np.zeros(len(end) + 1, dtype=np.int64)
        self.spans = np.zeros((0, 2), dtype=np.int64)

    @property
    def spans_flat(self) -> np.ndarray:
        """The loss-off spans as one int64 array, start and end after each other."""
        return self.spans.reshape(-1)

    @property
    def num_documents(self) -> int:
        return len(self.offset)

    def _local_file(self, s: int) -> Path:
        """Shard `s`'s token file here: a pack at a URL fetches it (outside the lock, so that
        threads fetch side by side)."""
        if self._remote is not None:
            return Path(self._remote.fetch(s))
        return Path(self.path) / self.shard_files[s]

    def _open(self, s: int) -> None:
        """Opens shard `s` for the engine's reads (a mapping a truncation cannot crash). A pack
        at a URL keeps the last `_REMOTE_OPEN_SHARDS` open, so that the cache may evict the
        others' files."""
        if self._opened[s]:
            return
        local = self._local_file(s)
        with self._lock:
            if self._opened[s]:
                return
            size = os.path.getsize(local)
            if size != int(self.shard_tokens[s]) * self.dtype.itemsize:
                raise CorruptDataError(
                    f"{self.path}/{self.shard_files[s]}: {size:,} bytes, not the "
                    f"{int(self.shard_tokens[s]):,} tokens the manifest gives"
                )
            self.rows.set_shard(s, str(local))
            self._opened[s] = True
            if self._remote is not None:
                self._mapped.append(s)
                while len(self._mapped) > _REMOTE_OPEN_SHARDS:
                    dropped = self._mapped.pop(0)
                    self._opened[dropped] = False
                    self.rows.set_shard(dropped, None)

    def map_for(self, plan: Any, rows: np.ndarray) -> None:
        """Maps the shards `rows` of `plan` read (a local pack maps each on first need; a pack
        at a URL fetches it)."""
        if self._remote is None and self._all_mapped:
            return
        for s in self.shards_for(plan, rows):
            self._open(s)
        if self._remote is None:
            self._all_mapped = all(self._opened)

    def start_fetching(self, upcoming: Callable[[], Sequence[int]]) -> None:
        """A pack at a URL: fetch the shards `upcoming()` names (soonest first) ahead of the
        reads, on the remote pack's fetcher threads. Nothing for a local pack."""
        if self._remote is not None:
            self._remote.start(upcoming)

    def shards_for(self, plan: Any, rows: np.ndarray) -> list[int]:
        """The shards `rows` of `plan` read, in order of first need."""
        pieces = plan.pieces_of(rows)
        starts = self.offset[plan.doc[pieces]] + plan.start[pieces]
        return self.shards_of(starts, plan.length[pieces])

    def shards_of(self, starts: np.ndarray, lengths: np.ndarray) -> list[int]:
        """The shards stream ranges [start, start + length) touch, in order of first need."""
        bounds = self.shard_starts
        first = np.searchsorted(bounds, starts, side="right") - 1
        last = np.searchsorted(bounds, starts + np.maximum(lengths, 1) - 1, side="right") - 1
        seen: dict[int, None] = {}
        for a, b in zip(first.tolist(), last.tolist()):
            for s in range(a, b + 1):
                seen.setdefault(s, None)
        return list(seen)

    def close(self) -> None:
        for s, opened in enumerate(self._opened):
            if opened:
                self.rows.set_shard(s, None)
        self._opened = [False] * len(self.shard_files)
        if self._remote is not None:
            self._remote.close()
