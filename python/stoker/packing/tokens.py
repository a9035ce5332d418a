"""stoker.pack_tokens: token streams into a token pack: flat little-endian token files of about
shard_size bytes each and a manifest (docs/FORMAT.md, "Token packs"). stoker.TokenLoader reads
it in windows (each shard file is what nanoGPT's train.bin is) or, from documents, packs whole
documents into rows by the pack's document index (documents.npz: each document's offset in the
stream, its length, its source and the spans where its loss mask is off)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from ..errors import InvalidArgumentError
from ._files import parse_size
from .result import PackResult
from ._files import checked_dtype, file_crc32c, pack_folder, progress_bar, write_manifest

FORMAT_VERSION = 1
TOKEN_DTYPES = ("uint16", "uint32", "int32")
_CHUNK_TOKENS = 8 << 20  # tokens read from a file at a time


def _file_chunks(path: Path, dtype: np.dtype | None) -> Iterator[np.ndarray]:
    """A .npy (1-d) or a flat .bin of `dtype`, a chunk at a time (memory-mapped)."""
    if path.suffix == ".npy":
        tokens = np.load(path, mmap_mode="r")
        if tokens.ndim != 1:
            raise InvalidArgumentError(f"{path}: a token file is a 1-d array, not {tokens.shape}")
    else:
        if dtype is None:
            raise InvalidArgumentError(
                f"{path}: a .bin file says nothing of its tokens: give dtype="
            )
        size = path.stat().st_size
        if size % dtype.itemsize:
            raise InvalidArgumentError(
                f"{path}: {size} bytes is not a whole number of {dtype.name} tokens"
            )
        tokens = np.memmap(path, dtype=dtype, mode="r")
    for start in range(0, len(tokens), _CHUNK_TOKENS):
        yield np.asarray(tokens[start : start + _CHUNK_TOKENS])


DOCUMENTS_FILE = "documents.npz"


class _DocumentIndex:
    """What documents.npz holds, gathered while the documents are written: each document's first
    token's offset in the stream and its length (eos included), its source (an index into
    `sources`), and the spans [start, end) of its tokens whose loss mask is off."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.lengths: list[int] = []
        self.source_of: list[int] = []
        self.sources: dict[str, int] = {}
        self.span_ends: list[int] = []  # each document's end in `spans`
        self.spans: list[tuple[int, int]] = []

    def add(self, offset: int, length: int, source: str, loss_mask: np.ndarray | None) -> None:
        self.offsets.append(offset)
        self.lengths.append(length)
        self.source_of.append(self.sources.setdefault(source, len(self.sources)))
        if loss_mask is not None:
            off = np.flatnonzero(np.diff(np.concatenate(([1], loss_mask, [1])).astype(np.int8)))
            self.spans.extend(zip(off[0::2].tolist(), off[1::2].tolist()))
        self.span_ends.append(len(self.spans))

    def write(self, path: Path) -> dict[str, Any]:
        if len(self.sources) > 65535:
            raise InvalidArgumentError(f"{len(self.sources)} sources: at most 65,535 names")
        np.savez(
            path,
            offset=np.asarray(self.offsets, dtype=np.int64),
            length=np.asarray(self.lengths, dtype=np.int64),
            source=np.asarray(self.source_of, dtype=np.uint16),
            span_ptr=np.asarray([0, *self.span_ends], dtype=np.int64),
            spans=np.asarray(self.spans, dtype=np.int64).reshape(-1, 2),
        )
        return {
            "file": path.name,
            "count": len(self.offsets),
            "sources": list(self.sources),
            "loss_masks": bool(self.spans),
            "bytes": path.stat().st_size,
            "crc32c": file_crc32c(path),
        }


def _document(k: int, document: Any) -> tuple[np.ndarray, np.ndarray | None, str]:
    """A document's tokens, loss mask (None: loss on every token) and source name."""
    mask = None
    source = ""
    if isinstance(document, dict):
        if "input_ids" not in document:
            raise InvalidArgumentError(
                f"document {k}: a dict document needs 'input_ids' (and optionally 'loss_mask', "
                f"'source'); it has {sorted(document)}"
            )
        unknown = set(document) - {"input_ids", "loss_mask", "source"}
        if unknown:
            raise InvalidArgumentError(f"document {k}: unknown keys {sorted(unknown)}")
        source = str(document.get("source") or "")
        if document.get("loss_mask") is not None:
            mask = np.asarray(document["loss_mask"])
        document = document["input_ids"]
    tokens = np.asarray(document)
    if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
        raise InvalidArgumentError(
            f"document {k}: a 1-d sequence of integer token ids, not {tokens.dtype} "
            f"{tokens.shape}"
        )
    if mask is not None:
        if mask.shape != tokens.shape or (mask.size and mask.dtype.kind not in "biu"):
            raise InvalidArgumentError(
                f"document {k}: its loss_mask must be {tokens.shape[0]} 0/1 values, one per "
                f"token, not {mask.dtype} {mask.shape}"
            )
        if mask.size and (mask.min() < 0 or mask.max() > 1):
            raise InvalidArgumentError(f"document {k}: a loss_mask holds only 0 and 1")
        mask = None if mask.all() else mask.astype(np.int8)
    return tokens, mask, source


def _document_chunks(
    documents: Iterable[Any], eos_id: int | None, index: _DocumentIndex
) -> Iterator[np.ndarray]:
    """Each document's tokens, then eos_id after it when given (the eos carries loss); each is
    added to `index` as it goes."""
    eos = None if eos_id is None else np.array([eos_id], dtype=np.int64)
    offset = 0
    for k, document in enumerate(documents):
        tokens, mask, source = _document(k, document)
        if tokens.size == 0:
            raise InvalidArgumentError(f"document {k} is empty")
        length = len(tokens) + (eos is not None)
        if mask is not None and eos is not None:
            mask = np.append(mask, np.int8(1))
        index.add(offset, length, source, mask)
        offset += length
        yield tokens
        if eos is not None:
            yield eos


def pack_tokens(
    source: str | os.PathLike | Sequence[str | os.PathLike] | Iterable[Any],
    out: str | os.PathLike,
    *,
    dtype: Any = "uint16",
    eos_id: int | None = None,
    shard_size: int | str = "256MB",
    overwrite: bool = False,
    progress: bool = True,
) -> PackResult:
    """Writes a token pack at `out` from nanoGPT-style flat ``.bin`` files (tokens of ``dtype``),
    1-d ``.npy`` files, or an iterable of documents, each followed by ``eos_id`` when it is
    given (the eos is part of its document and carries loss).

    A document is a sequence of token ids (a list, numpy array, tensor) or a dict with
    ``input_ids``, optionally ``loss_mask`` (one 0 or 1 per token: 0 where no loss is taken, as
    on an SFT prompt) and ``source`` (a name: ``stats()["tokens"]`` counts per source). A pack
    of documents has a document index, from which ``TokenLoader(packing="best_fit")`` plans its
    rows without reading a token.

    Tokens are stored as ``dtype`` (``uint16``, the default, holds ids below 65,536: GPT-2's
    vocabulary; ``uint32`` or ``int32`` beyond), every id checked to fit. Shard files hold about
    ``shard_size`` bytes and are fetched whole from object storage. ``eos_id`` is kept in the
    manifest: ``TokenLoader(return_positions=True)`` restarts position ids after it. The pack
    is written beside `out` and renamed into place at the end.
    """
    t0 = time.perf_counter()
    store = checked_dtype(dtype, "pack_tokens dtype")
    if store.name not in TOKEN_DTYPES:
        raise InvalidArgumentError(f"tokens are stored as {', '.join(TOKEN_DTYPES)}, not {store}")
    info = np.iinfo(store)
    if eos_id is not None and not (0 <= int(eos_id) <= info.max):
        raise InvalidArgumentError(f"eos_id {eos_id} does not fit in {store}")
    per_shard = max(2, parse_size(shard_size) // store.itemsize)
    out = Path(out)

    chunks: Iterator[np.ndarray]
    total: int | None = None
    index: _DocumentIndex | None = None
    if isinstance(source, (str, os.PathLike)) or (
        isinstance(source, (list, tuple)) and source and isinstance(source[0], (str, os.PathLike))
    ):
        paths = (
            [Path(source)] if isinstance(source, (str, os.PathLike)) else [Path(p) for p in source]
        )
        for p in paths:
            if not p.is_file():
                raise InvalidArgumentError(f"{p}: no such file")
        # A .bin holds tokens of `dtype`; a .npy says its own (converted, each id checked).
        total = sum(p.stat().st_size // store.itemsize for p in paths if p.suffix != ".npy") or None
        chunks = (chunk for p in paths for chunk in _file_chunks(p, store))
    else:
        index = _DocumentIndex()
        chunks = _document_chunks(source, eos_id, index)

    shards: list[dict[str, Any]] = []
    with (
        pack_folder(out, overwrite) as folder,
        progress_bar(progress, total, "token", f"packing tokens into {out.name}") as bar,
    ):
        f = None
        written = 0
        position = 0  # tokens so far, for errors

        def close() -> None:
            nonlocal f, written
            if f is None:
                return
            f.close()
            name = f"tokens-{len(shards):06d}.bin"
            path = folder / name
            shards.append({"file": name, "num_tokens": written, "bytes": path.stat().st_size,
                           "crc32c": file_crc32c(path)})  # fmt: skip
            f, written = None, 0

        for chunk in chunks:
            if chunk.size and (int(chunk.min()) < info.min or int(chunk.max()) > info.max):
                bad = int(np.argmax((chunk < info.min) | (chunk > info.max)))
                raise InvalidArgumentError(
                    f"token {position + bad} is {int(chunk[bad])}, which does not fit in {store}: "
                    "pack with dtype='uint32'"
                )
            tokens = chunk.astype(store, copy=False)
            at = 0
            while at < len(tokens):
                if f is None:
                    f = open(folder / f"tokens-{len(shards):06d}.bin", "wb")
                take = min(len(tokens) - at, per_shard - written)
                f.write(np.ascontiguousarray(tokens[at : at + take]).tobytes())
                written += take
                at += take
                if written == per_shard:
                    close()
            position += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
        close()
        num_tokens = sum(s["num_tokens"] for s in shards)
        if num_tokens < 2:
            raise InvalidArgumentError("pack_tokens: fewer than 2 tokens, not even one window")
        manifest: dict[str, Any] = {
            "format": "stoker-tokens",
            "version": FORMAT_VERSION,
            "dtype": store.name,
            "num_tokens": num_tokens,
            "num_samples": 0,  # windows depend on the reader's seq_len
            "eos_id": None if eos_id is None else int(eos_id),
            "shards": shards,
            "bytes": sum(s["bytes"] for s in shards),
        }
        if index is not None:
            manifest["documents"] = index.write(folder / DOCUMENTS_FILE)
        write_manifest(folder, manifest)
    return PackResult(
        out=out,
        num_samples=num_tokens,
        num_shards=len(shards),
        bytes=manifest["bytes"],
        seconds=time.perf_counter() - t0,
        classes=[],
        unit="tokens",
        num_documents=None if index is None else len(index.offsets),
    )
