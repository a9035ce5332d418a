"""A ``.pt``/``.pth`` file of tensors, written as an array pack: a tensor (field ``data``), a tuple
or list of tensors (TensorDataset's layout, torchvision MNIST's processed files: ``data``, then
``label`` when the second is one integer a row, then ``field2``...), or a dict of tensors (its
keys the fields; ``label``/``labels``/``target``/``targets``/``y``/``cls`` the label, a list
under ``classes``/``class_names`` its names). Every tensor has the samples as its first dimension.

The file is read with ``torch.load(weights_only=True)``: stoker never unpickles arbitrary
objects. Zip-format files (torch.save's default) are memory-mapped, and the columns are numpy
views of the mapped tensors: nothing is copied before pack_arrays writes it a chunk at a time.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CorruptDataError, InvalidArgumentError
from .._files import DTYPES, check_name
from ..members import Options
from ..source import Source, files_fingerprint

LABEL_KEYS = ("label", "labels", "target", "targets", "y", "cls")
CLASS_KEYS = ("classes", "class_names")
_ZIP_MAGIC = b"PK\x03\x04"

log = logging.getLogger("stoker")


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise InvalidArgumentError("reading a .pt file needs torch (pip install torch)") from None
    return torch


def load_file(path: Path) -> Any:
    """What the file holds, loaded with weights_only=True (mapped where it is a zip file)."""
    torch = _torch()
    try:
        with open(path, "rb") as f:
            mapped = f.read(4) == _ZIP_MAGIC  # older (legacy) files cannot be mapped
    except OSError as e:
        raise InvalidArgumentError(f"{path}: cannot be read: {e}") from None
    if not mapped:
        log.info("%s: not a zip-format .pt file (torch < 1.6): loaded whole, not mapped", path)
    try:
        return torch.load(path, weights_only=True, mmap=mapped, map_location="cpu")
    except pickle.UnpicklingError as e:
        text = str(e)
        if "Weights only load failed" not in text:
            raise _damaged(path, e) from None
        held = next((line.strip() for line in text.splitlines() if "Unsupported global" in line),
                    "objects other than tensors")  # fmt: skip
        raise InvalidArgumentError(
            f"{path}: the file holds pickled Python objects ({held}); stoker loads .pt files with "
            "torch.load(weights_only=True) and never unpickles arbitrary objects. Save tensors "
            "instead (torch.save({'x': x, 'y': y}, path)), or pass the Dataset object itself to "
            "stoker.pack"
        ) from None
    except (RuntimeError, EOFError, KeyError, ValueError, OSError, AttributeError) as e:
        raise _damaged(path, e) from None


def _damaged(path: Path, e: BaseException) -> CorruptDataError:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    message = f"not a .pt file torch.load reads, or a damaged one ({type(e).__name__}: {first})"
    return CorruptDataError(f"{path}: {message}", reason=message, shard=str(path))


def _describe(key: str, value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{key} {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return f"{key} ({type(value).__name__})"


def _is_label(value: Any) -> bool:
    torch = _torch()
    return (
        isinstance(value, torch.Tensor)
        and not value.is_floating_point()
        and not value.is_complex()
        and value.dtype != torch.bool
        and value.dim() in (1, 2)
        and tuple(value.shape[1:]) in ((), (1,))
    )


def _entries(path: Path, obj: Any) -> tuple[dict[str, Any], dict[str, str], str | None, Any]:
    """(key -> value, key -> the field it is by default, the label's key, class names) of what
    the file holds."""
    torch = _torch()
    classes, label = None, None
    if isinstance(obj, torch.Tensor):
        return {"0": obj}, {"0": "data"}, None, None
    if isinstance(obj, (tuple, list)):
        entries = {str(i): v for i, v in enumerate(obj)}
        fields = {k: "data" if k == "0" else f"field{k}" for k in entries}
        if len(obj) > 1 and _is_label(obj[1]):
            label = "1"
    elif isinstance(obj, Mapping):
        entries = {str(k): v for k, v in obj.items()}
        for key in CLASS_KEYS:
            value = entries.pop(key, None)
            if isinstance(value, (list, tuple)) and all(isinstance(c, str) for c in value):
                classes = list(value)
                break
        fields = {k: k for k in entries}
        labels = [k for k in entries if k.lower() in LABEL_KEYS and _is_label(entries[k])]
        if labels:
            label = min(labels, key=lambda k: LABEL_KEYS.index(k.lower()))
    else:
        raise InvalidArgumentError(
            f"{path}: holds a {type(obj).__name__}; stoker packs a .pt file of a tensor, a tuple "
            "or list of tensors, or a dict of tensors, each with one row per sample"
        )
    if label is not None:
        del fields[label]
    return entries, fields, label, classes


def _column(path: Path, key: str, value: Any, label: bool) -> np.ndarray:
    """A tensor as the numpy view pack_arrays writes (the label as int64)."""
    torch = _torch()
    if not isinstance(value, torch.Tensor):
        raise InvalidArgumentError(f"{path}: {_describe(key, value)} is not a tensor")
    if value.dim() == 0:
        raise InvalidArgumentError(f"{path}: {_describe(key, value)} is one value, not rows")
    if value.layout != torch.strided:
        raise InvalidArgumentError(f"{path}: {_describe(key, value)} is a {value.layout} tensor")
    if label:
        if not _is_label(value):
            raise InvalidArgumentError(
                f"{path}: the label {_describe(key, value)} must hold one integer a row"
            )
        return value.detach().reshape(-1).numpy().astype(np.int64, copy=False)
    name = str(value.dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise InvalidArgumentError(
            f"{path}: {_describe(key, value)}: {name} is not a dtype an array pack stores "
            f"({', '.join(DTYPES)}); convert it (e.g. x.float()) and save the file again"
        )
    return value.detach().numpy()


class TorchFileSource(Source):
    format = "pt"

    def __init__(
        self,
        src: str | os.PathLike,
        opts: Options,
        members: Mapping[str, Any] | None = None,
        label: Any = None,
    ):
        self.path, self.opts = Path(src), opts
        if not self.path.is_file():
            raise InvalidArgumentError(f"{self.path}: no such file")
        self.members = None if members is None else {k: str(v) for k, v in members.items()}
        self.label_key = None if label is None else str(label)
        self._columns: dict[str, np.ndarray] | None = self._load()
        self.n = len(next(iter(self._columns.values())))

    def _load(self) -> dict[str, np.ndarray]:
        entries, fields, label, self.classes = _entries(self.path, load_file(self.path))

        def unknown(key: str) -> InvalidArgumentError:
            listing = "; ".join(_describe(k, v) for k, v in entries.items())
            return InvalidArgumentError(f"{self.path}: no key {key!r} (it holds: {listing})")

        if self.members is not None:
            chosen = {}
            for field, key in self.members.items():
                if key not in entries:
                    raise unknown(key)
                chosen[check_name(field.removesuffix(".npy"), "field")] = key
            if label in chosen.values():  # the members hold it: not the label too
                label = None
        else:
            chosen = {f: k for k, f in fields.items() if k != self.label_key}
            skipped = [k for k in chosen.values() if not hasattr(entries[k], "shape")]
            if skipped:
                log.info("%s: left out (not tensors): %s", self.path, ", ".join(skipped))
                chosen = {f: k for f, k in chosen.items() if k not in skipped}
        if self.label_key is None:
            self.label_key = label
        elif self.label_key not in entries:
            raise unknown(self.label_key)
        if "label" in chosen and self.label_key is not None:
            raise InvalidArgumentError(
                f"{self.path}: {chosen['label']!r} and the label {self.label_key!r} would both "
                "be the field 'label': name the fields with members={field: key}"
            )
        columns = {f: _column(self.path, k, entries[k], False) for f, k in chosen.items()}
        if self.label_key is not None:
            columns["label"] = _column(self.path, self.label_key, entries[self.label_key], True)
        if not columns:
            raise InvalidArgumentError(f"{self.path}: holds no tensors")
        if len({len(c) for c in columns.values()}) > 1:
            keys = [*chosen.values(), *([self.label_key] if self.label_key else [])]
            raise InvalidArgumentError(
                f"{self.path}: the tensors have different first dimensions (one row per sample "
                "in all; pick those that do with members=): "
                + "; ".join(_describe(k, entries[k]) for k in keys)
            )
        return columns

    def __len__(self) -> int:
        return self.n

    @property
    def columns(self) -> dict[str, np.ndarray]:  # type: ignore[override]
        """Field name -> a numpy view of the file's tensor (mapped, loaded again after
        unpickling)."""
        if self._columns is None:
            self._columns = self._load()
        return self._columns

    def fingerprint(self) -> str:
        return files_fingerprint([self.path], self.members, self.label_key)

    def close(self) -> None:
        self._columns = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_columns": None}
