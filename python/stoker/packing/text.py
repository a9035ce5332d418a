"""stoker.pack_text: text into a token pack, tokenized with the user's Hugging Face tokenizer.
Documents are read a batch at a time (Parquet record batches, JSON Lines, a Hugging Face
dataset's rows, text files), encoded by the tokenizer's Rust side on every core while the batch
before is written, and handed to stoker.pack_tokens as documents named by their source. The
manifest records which tokenizer made the ids: the sha256 of its JSON and its vocabulary size."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import logging
import os
import zlib
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..errors import CorruptDataError, InvalidArgumentError
from ._files import checked_dtype, progress_bar
from .result import PackResult
from .tokens import TOKEN_DTYPES, pack_tokens

log = logging.getLogger("stoker")

# The tokens that obviously end a document, looked up in this order in the vocabulary (GPT-2's
# and Qwen's, Llama 3's, Llama 2's and T5's, Gemma's).
EOS_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")  # .json: JSON Lines too (C4's .json.gz)
# A batch ends at batch_size documents or at this many characters, whichever comes first: a
# batch of whole books stays a few hundred MB of text and ids.
BATCH_CHARS = 64 << 20

Texts = Iterator[Any]  # a part's column values: text, None, or what the error names


@dataclass
class _Tokenizer:
    encode: Callable[[list[str]], list[list[int]]]
    sha256: str  # of its JSON (tokenizers.Tokenizer.to_str())
    vocab_size: int
    eos_id: int | None  # the obvious end-of-document token, where it has one


@dataclass
class _Part:
    """A file, a run of text files or a dataset: documents under one source name."""

    name: str  # the documents' source
    count: int | None  # its documents, where known before reading them
    texts: Callable[[], Texts]


def _load_tokenizer(tokenizer: Any, add_special_tokens: bool) -> _Tokenizer:
    """The backend tokenizer of a tokenizer.json path (or a folder holding one), a
    tokenizers.Tokenizer, or a transformers fast tokenizer; padding and truncation left off."""
    eos_id = None
    tok = tokenizer
    if isinstance(tok, (str, os.PathLike)):
        path = Path(tok).expanduser()
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise InvalidArgumentError(f"{path}: no such tokenizer.json")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise InvalidArgumentError(
                "pack_text reads a tokenizer.json with Hugging Face tokenizers "
                "(pip install tokenizers)"
            ) from None
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises its own Exception for a bad file
            raise InvalidArgumentError(f"{path}: not a tokenizers tokenizer.json: {e}") from e
    elif hasattr(tok, "backend_tokenizer"):  # transformers' fast tokenizers wrap one
        eos_id = getattr(tok, "eos_token_id", None)
        tok = tok.backend_tokenizer
    missing = [m for m in ("encode_batch", "get_vocab_size", "to_str") if not hasattr(tok, m)]
    if missing:
        raise InvalidArgumentError(
            "tokenizer: a path to a tokenizer.json, a tokenizers.Tokenizer or a transformers "
            f"fast tokenizer (use_fast=True), not a {type(tokenizer).__name__} (it has no "
            f"{', '.join(missing)})"
        )
    text = tok.to_str()
    sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if getattr(tok, "truncation", None) or getattr(tok, "padding", None):
        # A tokenizer.json made for a model's inputs may cut or pad every text: a copy does
        # neither, so that each document is packed whole (the user's object is left as it is).
        tok = type(tok).from_str(text)
        tok.no_truncation()
        tok.no_padding()
    if eos_id is None and hasattr(tok, "token_to_id"):
        eos_id = next((i for t in EOS_TOKENS if (i := tok.token_to_id(t)) is not None), None)
    encode_batch = getattr(tok, "encode_batch_fast", None) or tok.encode_batch  # no offsets

    def encode(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in encode_batch(texts, add_special_tokens=add_special_tokens)]

    return _Tokenizer(encode, sha256, int(tok.get_vocab_size()), eos_id)


def _stem(path: Path) -> str:
    """A file's name without its format's suffixes: wiki.jsonl.gz -> wiki."""
    name = path.name.removesuffix(".gz")
    for suffix in (".parquet", *JSONL_SUFFIXES, *TEXT_SUFFIXES):
        name = name.removesuffix(suffix)
    return name or path.name


def _kind(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.removesuffix(".gz").endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(TEXT_SUFFIXES):
        return "text"
    return None


def _check_text(value: Any, column: str, where: str) -> Any:
    if value is None or isinstance(value, str):
        return value
    raise InvalidArgumentError(f"{where}: {column!r} holds a {type(value).__name__}, not text")


def _jsonl_part(path: Path, name: str, column: str) -> _Part:
    def texts() -> Texts:
        opener: Callable[..., Any] = gzip.open if path.name.endswith(".gz") else open
        n = 0
        try:
            with opener(path, "rb") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except ValueError as e:  # not JSON, or not UTF-8
                        raise CorruptDataError(
                            f"{path}, line {n}: not JSON: {e}", shard=str(path), key=f"line {n}"
                        ) from None
                    if not isinstance(record, dict):
                        raise CorruptDataError(
                            f"{path}, line {n}: a JSON {type(record).__name__}, not an object "
                            f"with a {column!r} field", shard=str(path), key=f"line {n}"
                        )  # fmt: skip
                    if column not in record:
                        raise InvalidArgumentError(
                            f"{path}, line {n}: no field {column!r} (its fields: "
                            f"{', '.join(map(repr, record)) or 'none'}); name the text's field "
                            "with column=", shard=str(path), key=f"line {n}"
                        )  # fmt: skip
                    yield _check_text(record[column], column, f"{path}, line {n}")
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise CorruptDataError(
                f"{path}: a damaged gzip file after line {n}: {e}", shard=str(path)
            ) from None

    return _Part(name, None, texts)


def _parquet_part(path: Path, name: str, column: str, batch_size: int) -> _Part:
    try:
        import pyarrow as pa  # type: ignore[import-untyped]
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError:
        raise InvalidArgumentError("Parquet sources need pyarrow (pip install pyarrow)") from None
    try:
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except (pa.ArrowException, OSError) as e:
        raise CorruptDataError(f"{path}: not a readable Parquet file: {e}", shard=str(path)) from e
    if column not in schema.names:
        raise InvalidArgumentError(
            f"{path}: no column {column!r} (its columns: {', '.join(map(repr, schema.names))}); "
            "name the text's column with column="
        )
    kind = schema.field(column).type
    is_string_view = getattr(pa.types, "is_string_view", lambda t: False)
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or is_string_view(kind)):
        raise InvalidArgumentError(f"{path}: column {column!r} holds {kind}, not text")

    def texts() -> Texts:
        with pq.ParquetFile(path) as pf:  # a row group at a time, a batch of it at a time
            for batch in pf.iter_batches(batch_size, columns=[column], use_threads=False):
                yield from batch.column(0).to_pylist()

    return _Part(name, meta.num_rows, texts)


def _text_files_part(paths: list[Path], name: str) -> _Part:
    def texts() -> Texts:
        for p in paths:
            try:
                yield p.read_bytes().decode("utf-8")  # as it is: no newline translation
            except UnicodeDecodeError as e:
                raise CorruptDataError(
                    f"{p}: not UTF-8 text ({e.reason} at byte {e.start})", shard=str(p)
                ) from None

    return _Part(name, len(paths), texts)


def _dataset_name(ds: Any) -> str:
    info = getattr(ds, "info", None)
    for name in (getattr(info, "dataset_name", None), getattr(info, "builder_name", None)):
        if name and name not in ("parquet", "json", "csv", "text", "arrow", "generator"):
            return str(name)
    return "dataset"


def _dataset_part(ds: Any, name: str | None, column: str, batch_size: int) -> _Part:
    """A datasets.Dataset (read as Arrow, its indices mapping followed) or IterableDataset."""
    kind = type(ds).__name__
    if kind in ("DatasetDict", "IterableDatasetDict"):
        raise InvalidArgumentError(
            f"a {kind} holds several splits ({', '.join(ds)}): pack one, "
            "e.g. stoker.pack_text(ds['train'], out, tokenizer=...)"
        )
    columns = ds.column_names  # None for an IterableDataset whose features are unknown
    if columns is not None and column not in columns:
        raise InvalidArgumentError(
            f"the {kind} has no column {column!r} (its columns: "
            f"{', '.join(map(repr, columns))}); name the text's column with column="
        )
    name = name or _dataset_name(ds)
    if kind == "Dataset":

        def texts() -> Texts:
            table = ds.select_columns([column]).with_format("arrow")
            for batch in table.iter(batch_size=batch_size):
                yield from batch.column(0).to_pylist()

        return _Part(name, len(ds), texts)

    def rows() -> Texts:
        # Only the column is formatted where the features name it; where they are unknown, a
        # row without it is found in the batch (select_columns would raise a bare KeyError).
        rows = ds if columns is None else ds.select_columns([column])
        for batch in rows.with_format(None).iter(batch_size=batch_size):
            if column not in batch:
                raise InvalidArgumentError(
                    f"the {kind}'s rows have no column {column!r} (their columns: "
                    f"{', '.join(map(repr, batch))}); name the text's column with column="
                )
            yield from batch[column]

    return _Part(name, None, rows)


def _path_parts(path: Path, column: str, batch_size: int) -> list[_Part]:
    path = path.expanduser()
    if not path.exists():
        raise InvalidArgumentError(f"{path}: no such file or folder")
    if path.is_file():
        kind = _kind(path)
        if kind == "parquet":
            return [_parquet_part(path, _stem(path), column, batch_size)]
        if kind == "jsonl":
            return [_jsonl_part(path, _stem(path), column)]
        if kind == "text":
            return [_text_files_part([path], _stem(path))]
        raise InvalidArgumentError(
            f"{path}: pack_text reads .parquet, .jsonl (.ndjson, .json, gzipped too), .txt and "
            ".md files"
        )
    if (path / "dataset_info.json").is_file() or (path / "state.json").is_file():
        import datasets  # type: ignore[import-untyped]

        return [_dataset_part(datasets.load_from_disk(str(path)), path.name, column, batch_size)]
    # A folder is one source: its files in the order of their paths (subfolders too), a run of
    # text files read as one part so that their batches span files.
    found = []
    for root, dirs, files in os.walk(path, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(root, f) for f in files if not f.startswith(".")]
    parts: list[_Part] = []
    texts: list[Path] = []
    for p in sorted(found, key=lambda p: p.relative_to(path).parts):
        kind = _kind(p)
        if kind == "text":
            texts.append(p)
            continue
        if texts and kind is not None:
            parts.append(_text_files_part(texts, path.name))
            texts = []
        if kind == "parquet":
            parts.append(_parquet_part(p, path.name, column, batch_size))
        elif kind == "jsonl":
            parts.append(_jsonl_part(p, path.name, column))
    if texts:
        parts.append(_text_files_part(texts, path.name))
    if not parts:
        raise InvalidArgumentError(
            f"{path}: no .parquet, .jsonl (.ndjson, .json, gzipped too), .txt or .md files"
        )
    return parts


def _open_parts(source: Any, column: str, batch_size: int, nested: bool = False) -> list[_Part]:
    if type(source).__module__.startswith("datasets"):
        return [_dataset_part(source, None, column, batch_size)]
    if isinstance(source, (str, os.PathLike)):
        return _path_parts(Path(source), column, batch_size)
    if isinstance(source, (list, tuple)) and not nested:
        if not source:
            raise InvalidArgumentError("pack_text: an empty list of sources")
        return [p for s in source for p in _open_parts(s, column, batch_size, nested=True)]
    raise InvalidArgumentError(
        "pack_text reads a Parquet file or folder, a JSON Lines file, a folder of .txt/.md "
        "files, a Hugging Face datasets.Dataset or IterableDataset, or a list of these; not a "
        f"{type(source).__name__}"
    )


@dataclass
class _Counts:
    read: int = 0
    skipped: int = 0  # null, empty, or no tokens


def _batches(parts: list[_Part], batch_size: int, column: str, counts: _Counts) -> Iterator[
    tuple[str, list[str], int]
]:  # fmt: skip
    """(source, texts, documents read for them) of at most batch_size texts or BATCH_CHARS
    characters; null and empty texts are left out."""
    for part in parts:
        texts: list[str] = []
        chars = read = 0
        for k, value in enumerate(part.texts()):
            read += 1
            if not value:
                counts.skipped += 1
                continue
            if not isinstance(value, str):  # an IterableDataset's value may be anything
                _check_text(value, column, f"{part.name}, document {k}")
            texts.append(value)
            chars += len(value)
            if len(texts) == batch_size or chars >= BATCH_CHARS:
                yield part.name, texts, read
                counts.read += read
                texts, chars, read = [], 0, 0
        if read:
            yield part.name, texts, read
            counts.read += read


def _documents(
    parts: list[_Part], tok: _Tokenizer, batch_size: int, column: str, counts: _Counts, bar: Any
) -> Generator[dict[str, Any], None, None]:
    """Each document's ids and source, in order. A batch is encoded on a thread (its Rust side
    on every core, the GIL released) while the one before is written and the next one read."""
    yielded = 0
    with ThreadPoolExecutor(1, thread_name_prefix="stoker-tokenize") as pool:
        pending: tuple[str, Future[list[list[int]]], int] | None = None

        def emit(name: str, job: Future[list[list[int]]], read: int) -> Iterator[dict[str, Any]]:
            nonlocal yielded
            for ids in job.result():
                if ids:
                    yielded += 1
                    yield {"input_ids": ids, "source": name}
                else:
                    counts.skipped += 1
            if bar is not None:
                bar.update(read)

        for name, texts, read in _batches(parts, batch_size, column, counts):
            job = pool.submit(tok.encode, texts)
            if pending is not None:
                yield from emit(*pending)
            pending = (name, job, read)
        if pending is not None:
            yield from emit(*pending)
    if not yielded:
        raise InvalidArgumentError(
            f"pack_text: no text in {', '.join(dict.fromkeys(p.name for p in parts))} "
            f"({counts.read} documents read, all null, empty or without a token)"
        )


def _add_tokenizer(out: Path, tok: _Tokenizer) -> None:
    """Adds the tokenizer to the manifest pack_tokens wrote, replacing it whole (a reader sees
    the old manifest or the new one, never a part)."""
    path = out / "manifest.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest["tokenizer"] = {"sha256": tok.sha256, "vocab_size": tok.vocab_size}
    tmp = out / f".manifest.json.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def pack_text(
    source: Any,
    out: str | os.PathLike,
    *,
    tokenizer: Any,
    column: str = "text",
    dtype: Any = None,
    eos_id: int | None | Literal["auto"] = "auto",
    add_special_tokens: bool = True,
    batch_size: int = 1000,
    shard_size: int | str = "256MB",
    overwrite: bool = False,
    progress: bool = True,
    source_name: str | None = None,
) -> PackResult:
    """Tokenizes text with a Hugging Face tokenizer and writes the ids as a token pack at `out`
    (stoker.pack_tokens' format, with its document index), one document per text.

    ``source`` is a Parquet file or a folder of them (the ``column`` column, read a record batch
    at a time), a JSON Lines file (``.jsonl``, ``.ndjson``, ``.json``, gzipped too: the
    ``column`` field of each line's object), a folder of ``.txt`` and ``.md`` files (each file one
    document, in sorted order, subfolders included), a Hugging Face ``datasets.Dataset``,
    ``IterableDataset`` or ``save_to_disk`` folder, or a list of these. Each document's source
    (``TokenLoader``'s ``stats()["tokens"]`` counts per source) is its file's name without its
    suffixes, its folder's name, or the dataset's name; ``source_name`` names them all. Null
    and empty texts, and texts that encode to no token, are left out.

    ``tokenizer`` is a path to a ``tokenizer.json`` (or the folder holding it), a
    ``tokenizers.Tokenizer``, or a transformers fast tokenizer (its ``backend_tokenizer`` is
    used). Texts are encoded ``batch_size`` at a time with ``encode_batch``, on every core, with
    the special tokens its post-processor adds (a Llama tokenizer's BOS) unless
    ``add_special_tokens=False``; a tokenizer's padding and truncation are not applied. Each
    document ends with ``eos_id``: by default the tokenizer's end-of-text token, where it has
    an obvious one (a transformers tokenizer's ``eos_token_id``, else ``<|endoftext|>``,
    ``<|end_of_text|>``, ``</s>`` or ``<eos>`` in its vocabulary) that its post-processor does
    not already add; ``None`` appends none.

    ``dtype`` defaults to ``uint16`` where every id of the vocabulary fits (65,536 tokens at
    most), ``uint32`` beyond. The manifest's ``tokenizer`` holds the ``sha256`` of the
    tokenizer's JSON (``Tokenizer.to_str()``) and its ``vocab_size``. The progress bar counts
    documents.
    """
    if not isinstance(column, str) or not column:
        raise InvalidArgumentError(f"column: the text's column or field name, not {column!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidArgumentError(f"batch_size: a positive int, not {batch_size!r}")
    if source_name is not None and (not isinstance(source_name, str) or not source_name):
        raise InvalidArgumentError(f"source_name: a non-empty name, not {source_name!r}")
    tok = _load_tokenizer(tokenizer, add_special_tokens)
    if eos_id == "auto":
        eos_id = tok.eos_id
        if eos_id is not None:
            probe = tok.encode(["a"])[0]
            if probe and probe[-1] == eos_id:  # the post-processor ends each text with it
                eos_id = None
    elif eos_id is not None and (isinstance(eos_id, bool) or not isinstance(eos_id, int)):
        raise InvalidArgumentError(f"eos_id: a token id, 'auto' or None, not {eos_id!r}")
    largest = max(tok.vocab_size - 1, eos_id or 0)
    if dtype is None:
        dtype = "uint16" if largest <= np.iinfo(np.uint16).max else "uint32"
    store = checked_dtype(dtype, "pack_text dtype")
    if store.name in TOKEN_DTYPES and largest > np.iinfo(store).max:
        raise InvalidArgumentError(
            f"the tokenizer's {tok.vocab_size:,} ids do not fit in {store}: pack with "
            "dtype='uint32' (or leave dtype to pack_text)"
        )
    parts = _open_parts(source, column, batch_size)
    if source_name is not None:
        for part in parts:
            part.name = source_name
    out = Path(out)
    counts = _Counts()
    known = [p.count for p in parts]
    total = None if None in known else sum(c for c in known if c is not None)
    with (
        progress_bar(progress, total, "doc", f"tokenizing into {out.name}") as bar,
        contextlib.closing(_documents(parts, tok, batch_size, column, counts, bar)) as documents,
    ):
        result = pack_tokens(
            documents, out, dtype=store.name, eos_id=eos_id, shard_size=shard_size,
            overwrite=overwrite, progress=False,
        )  # fmt: skip
    _add_tokenizer(out, tok)
    if counts.skipped:
        log.info("pack_text: %d of %d documents null, empty or without a token, left out",
                 counts.skipped, counts.read)  # fmt: skip
    return result
