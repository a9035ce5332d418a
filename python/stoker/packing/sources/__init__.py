"""Every source stoker.pack reads, one module each, and how a source's kind is found: named with
``format=``, else from the object (a Hugging Face ``datasets.Dataset``, a torch ``Dataset``), the
path's extension, a folder's layout, or a file's first bytes."""

from __future__ import annotations

import glob
import importlib
import os
from pathlib import Path
from typing import Any

from ...errors import InvalidArgumentError
from ..members import Options
from ..source import Source

# format name -> (module in this package, class, the options of stoker.pack it takes beyond
# (src, opts)). One line per source: a new format is a module here, a line in this table and, if
# it can be recognised, a rule in `detect`.
FORMATS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "imagefolder": ("folder", "ImageFiles", ()),
    "csv": ("folder", "ImageFiles", ()),
    "table": ("table", "Table", ()),
    "coco": ("coco", "Coco", ("images",)),
    "webdataset": ("webdataset", "WebDatasetShards", ()),
    "parquet": ("parquet", "ParquetSource", ("members", "label")),
    "huggingface": ("parquet", "HuggingFaceSource", ("members", "label")),
    "lmdb": ("lmdb", "LmdbSource", ("label", "record", "allow_pickle")),
    "tfrecord": ("tfrecord", "TFRecordSource", ("members", "label", "compression")),
    "hdf5": ("hdf5", "Hdf5Source", ("members", "label")),
    "pt": ("torch_file", "TorchFileSource", ("members", "label")),
    "dataset": ("torch_dataset", "TorchDatasetSource", ("members", "label", "threads")),
}
# How errors name each format.
NAMES = {"imagefolder": "ImageFolder", "csv": "path,label CSV", "table": "table",
         "coco": "COCO instances .json", "webdataset": "WebDataset", "parquet": "Parquet",
         "huggingface": "Hugging Face dataset", "lmdb": "LMDB", "tfrecord": "TFRecord",
         "hdf5": "HDF5", "pt": ".pt file", "dataset": "torch Dataset"}  # fmt: skip

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_ZIP_MAGIC = b"PK\x03\x04"


def source_class(name: str) -> type[Source]:
    if name not in FORMATS:
        raise InvalidArgumentError(
            f"format must be one of {', '.join(sorted(FORMATS))}, not {name!r}"
        )
    module, cls, _ = FORMATS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def _head(path: Path, n: int = 16) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def _looks_like_tfrecord(path: Path) -> bool:
    """A TFRecord file has no magic: its first record's length must carry its masked CRC."""
    from .tfrecord import is_tfrecord

    return is_tfrecord(path)


def detect(src: Any, images: Any = None) -> str:
    """The format of `src`, or a clear error listing what stoker.pack reads."""
    module = type(src).__module__
    if module.startswith("datasets"):
        if type(src).__name__ in ("DatasetDict", "IterableDatasetDict"):
            raise InvalidArgumentError(
                f"a {type(src).__name__} holds several splits ({', '.join(src)}): pack one, "
                "e.g. stoker.pack(ds['train'], out)"
            )
        return "huggingface"
    if not isinstance(src, (str, os.PathLike)):
        if hasattr(src, "__getitem__") and hasattr(src, "__len__"):
            return "dataset"
        raise InvalidArgumentError(
            f"stoker.pack reads a path, a Hugging Face datasets.Dataset or a map-style torch "
            f"Dataset (with __getitem__ and __len__), not a {type(src).__name__}"
        )
    text = os.fspath(src)
    if any(c in text for c in "*?["):
        matches = sorted(glob.glob(text))
        if not matches:
            raise InvalidArgumentError(f"{text}: matches no file")
        return detect(matches[0])
    path = Path(text)
    suffix = path.suffix.lower()
    name = path.name.lower()
    if path.is_dir():
        entries = {e.name for e in os.scandir(path)}
        if "dataset_info.json" in entries or "state.json" in entries:
            return "huggingface"
        if "data.mdb" in entries:
            return "lmdb"
        files = [e for e in entries if not e.startswith(".")]
        if files and all(e.endswith(".parquet") for e in files if "." in e):
            if any(e.endswith(".parquet") for e in files):
                return "parquet"
        if any(e.endswith((".tar", ".tar.gz", ".tgz")) for e in files):
            return "webdataset"
        if any(".tfrecord" in e or ".tfrec" in e for e in files):
            return "tfrecord"
        if any(e.endswith(".parquet") for e in files):
            return "parquet"
        plain = sorted(e for e in files if (path / e).is_file())
        if plain and not any((path / e).is_dir() for e in files):
            if _looks_like_tfrecord(path / plain[0]):  # TF's names: train-00000-of-01024
                return "tfrecord"
        return "imagefolder"
    if not path.exists():
        raise InvalidArgumentError(f"{path}: no such file or folder")
    if images is not None and suffix == ".json":
        return "coco"
    if suffix == ".json":
        return "coco"  # Coco() says images= is needed
    if suffix in (".jsonl",):
        return "table"
    if suffix == ".csv":
        from .table import is_member_table

        return "table" if is_member_table(path) else "csv"
    if name.endswith((".tar", ".tar.gz", ".tgz")):
        return "webdataset"
    if suffix in (".parquet", ".arrow"):
        return "parquet"
    if suffix == ".mdb":
        return "lmdb"
    head = _head(path)
    if suffix in (".h5", ".hdf5", ".hdf", ".he5") or head.startswith(_HDF5_MAGIC):
        return "hdf5"
    if suffix in (".pt", ".pth") or (head.startswith(_ZIP_MAGIC) and "pt" in suffix):
        return "pt"
    if (
        ".tfrecord" in name
        or ".tfrec" in name
        or suffix == ".record"
        or (_looks_like_tfrecord(path))
    ):
        return "tfrecord"
    raise InvalidArgumentError(
        f"{path}: not a format stoker.pack recognises: an ImageFolder directory, a .csv or .jsonl "
        "table, a COCO .json (with images=), WebDataset .tar shards, Parquet or a Hugging Face "
        "dataset (save_to_disk folder or datasets.Dataset), LMDB, TFRecord, HDF5, a .pt file, "
        "or a torch Dataset; name it with format= if it is one of these"
    )


def open_source(src: Any, format: str | None, opts: Options, **options: Any) -> Source:
    """The source for `src` (of `format`, or the detected one), given only the options it
    takes: any other given option is refused, naming the formats that take it."""
    name = format or detect(src, options.get("images"))
    cls = source_class(name)
    takes = set(FORMATS[name][2])
    given = {k: v for k, v in options.items() if v is not None}
    extra = sorted(set(given) - takes - {"threads"})
    if extra:
        which = {k: sorted(f for f, entry in FORMATS.items() if k in entry[2]) for k in extra}
        raise InvalidArgumentError(
            f"{src!s:.200}: a {NAMES[name]} source does not take "
            + "; ".join(
                f"{k}= (it goes with: {', '.join(NAMES[f] for f in v)})" for k, v in which.items()
            )
        )
    kwargs = {k: v for k, v in options.items() if k in takes}
    if isinstance(src, (str, os.PathLike)) and not any(c in os.fspath(src) for c in "*?["):
        src = Path(os.path.expanduser(os.fspath(src)))
    source = cls(src, opts, **kwargs)  # type: ignore[call-arg]
    if format in ("imagefolder", "csv") and source.format != format:
        raise InvalidArgumentError(f"{src}: format={format!r}, but it is a {source.format} source")
    return source
