"""A map-style torch Dataset: anything with ``__getitem__`` and ``__len__`` (a
``torch.utils.data.Dataset``, a torchvision dataset, a ``TensorDataset``, a list), packed sample by
sample in index order: ``stoker.pack(dataset, out, image_codec="png")``.

The dataset's ``__getitem__`` is Python, so it runs in ``threads`` DataLoader worker processes
(none when ``threads`` is 1), and so does the costly part of turning a sample into members
(encoding pixels as PNG or JPEG, arrays as ``.npy``): the main process only receives bytes, and the
writer's threads check and prepare them as for any source (``max_side``, ``restart_interval``,
``codec="raw"``). An exception in ``__getitem__`` fails that sample only, named
``ClassName[index]`` with the exception's type, message and the line that raised it.

What a sample's values become:

- a PIL image, or a uint8 array or tensor HxWxC (C 1, 3 or 4): an image, encoded as
  ``image_codec`` says ("png", lossless, or "jpeg" at ``quality``); a uint8 *torch tensor* CxHxW
  (C 1, 3 or 4, H and W over 4: PILToTensor's and read_image's layout) is transposed to HxWxC
  first (numpy arrays are taken as HxWxC only); ``codec="raw"`` packs always encode pixels as PNG,
  so the raw pixels are exact;
- bytes that are an encoded image (JPEG, PNG, WebP, PPM): that image, byte for byte (other
  formats, BMP or TIFF, become a PNG of the same pixels); other bytes: a ``bin`` member;
- an int (or a 0-d integer array or tensor): the label (-1, "no label" as in torchvision's STL10
  unlabeled split, is none);
- a str: text; a float, or any other array or tensor: an ``.npy`` array (ToTensor's float output
  is stored as float32 arrays: pack PIL images, or PILToTensor's uint8, to get images);
- a nested dict or list: JSON; None: no member.

How they are named, where ``members=`` does not say:

- a tuple or list is positional, as torchvision's ``(image, label)``: its first int is the label
  (``cls``) and the first value of each other kind takes the name a stoker.Loader field reads by
  default: ``{ext}`` (``jpg`` or ``png``: stoker.Image()), ``txt`` (stoker.Text()), ``npy``
  (stoker.Array()), ``json``, ``bin``; later ones are named by their position: ``2.png``,
  ``3.txt``, ``4.npy`` (an int after the label is an array); a sample that is one value is a
  tuple of one;
- a dict has one member per key: a key that is a member name is used as it is (``jpg``,
  ``seg.png``, ``feat.npy``, ``txt``), an int under ``cls``, ``label`` or ``target`` is the label,
  and other keys are named from the key and the value's kind (``members.default_name``: the
  first image ``{ext}``, ``caption.txt``, ``feat.npy``, ``height.npy``).

``members=`` maps member name -> dict key or tuple position and picks only those (the name says
what the value becomes, as for every source); ``label=`` names the label's key or position. Without
``label=``, the label is found as above among the values ``members=`` does not pick.

A dataset's ``classes`` attribute (torchvision's convention) names the labels. A Python object
cannot be fingerprinted reliably, so an interrupted pack of a Dataset never resumes (it starts
over).
"""

from __future__ import annotations

import functools
import importlib.util
import traceback
import weakref
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...errors import InvalidArgumentError, StokerError
from ..members import (
    Options,
    check_member_name,
    default_name,
    image_format,
    is_pixels,
    label_value,
    member_kind,
    value_bytes,
)
from ..source import Job, SampleFailure, Source, failing_job, reason, record_sample

LABEL_KEYS = ("cls", "label", "target")
# The name the first value of a kind takes in a tuple: what the Loader's fields read by default.
BARE_NAMES = {"image": "{ext}", "text": "txt", "array": "npy", "json": "json", "bytes": "bin"}
PREFETCH = 2  # samples each worker reads ahead (the DataLoader's prefetch_factor)


@dataclass
class Converted:
    """One sample as a worker made it: (member name, bytes) and the label, or why it failed."""

    index: int
    members: list[tuple[str, bytes]]
    label: int | None
    failure: str | None = None


def _is_chw(value: Any) -> bool:
    """A uint8 torch tensor laid out CxHxW (PILToTensor's, torchvision.io.read_image's)."""
    shape = getattr(value, "shape", None)
    return (
        type(value).__module__.startswith("torch")
        and str(getattr(value, "dtype", "")) == "torch.uint8"
        and shape is not None
        and len(shape) == 3
        and shape[0] in (1, 3, 4)
        and shape[1] > 4
        and shape[2] > 4
    )


def _is_int(value: Any) -> bool:
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # numpy or 0-d torch
        value = value.item()
    return isinstance(value, int) and not isinstance(value, bool)


def kind_of(value: Any) -> str:
    """What a value becomes: image, label (an int), text, array, json, bytes, or none."""
    if value is None:
        return "none"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "image" if image_format(bytes(value[:12])) is not None else "bytes"
    if isinstance(value, str):
        return "text"
    if _is_int(value):
        return "label"
    if is_pixels(value) or _is_chw(value):
        return "image"
    if isinstance(value, (Mapping, list, tuple)):
        return "json"
    if isinstance(value, (float, bool)) or hasattr(value, "dtype"):
        return "array"
    raise ValueError(
        f"a {type(value).__name__} is not a value stoker packs (a PIL image, an array or tensor, "
        "a number, str, bytes, a dict or a list)"
    )


def _is_member_name(key: Any) -> bool:
    if not isinstance(key, str) or member_kind(key) == "bytes":
        return False
    try:
        check_member_name(key, "")
    except InvalidArgumentError:
        return False
    return True


def _fields(sample: Any) -> list[tuple[Any, Any]]:
    """(key, value) of a sample: a dict's items, a tuple's (position, value), or (0, sample)."""
    if isinstance(sample, Mapping):
        return list(sample.items())
    if isinstance(sample, (tuple, list)):
        return list(enumerate(sample))
    return [(0, sample)]


def _pick(sample: Any, key: Any, what: str) -> Any:
    fields = dict(_fields(sample))
    if key not in fields:
        keys = ", ".join(repr(k) for k in fields)
        raise ValueError(f"{what}: the sample has no key {key!r} (it has {keys})")
    return fields[key]


def default_values(fields: list[tuple[Any, Any]], keyed: bool, find_label: bool) -> list:
    """(member name, value) of a sample's values by the rules of the module's docstring; the
    label under ``cls``."""
    out: list[tuple[str, Any]] = []
    named: set[str] = set()  # the kinds whose bare name a tuple has given; "image" for a dict
    if keyed and any(_is_member_name(k) and member_kind(k) == "image" for k, _ in fields):
        named.add("image")  # a key named as an image member takes the first image's place
    for key, value in fields:
        try:
            kind = kind_of(value)
        except ValueError as e:
            raise ValueError(f"{key!r}: {e}") from None
        if kind == "none":
            continue
        if find_label and kind == "label" and (not keyed or key in LABEL_KEYS):
            out.append(("cls", value))
            find_label = False
            continue
        if kind == "label":
            kind = "array"
        if not keyed:
            name = f"{key}.{BARE_NAMES[kind]}" if kind in named else BARE_NAMES[kind]
            named.add(kind)
        elif _is_member_name(key):
            name = key
        else:
            name = default_name(str(key), kind, "image" not in named)
            if member_kind(name.replace("{ext}", "png")) == "image":
                named.add("image")
        out.append((name, value))
    return out


def sample_values(sample: Any, members: Mapping[str, Any] | None, label: Any) -> list:
    """(member name, value) of one sample: those `members` and `label` pick, or the defaults."""
    out: list[tuple[str, Any]] = []
    if label is not None:
        out.append(("cls", _pick(sample, label, "label")))
    if members is not None:
        out += [(name, _pick(sample, key, name)) for name, key in members.items()]
    picked = {label, *(members or {}).values()} - {None}
    rest = [(k, v) for k, v in _fields(sample) if k not in picked]
    defaults = default_values(rest, isinstance(sample, Mapping), label is None)
    if members is not None:  # only the label is found among the values it does not pick
        defaults = [(n, v) for n, v in defaults if n == "cls"]
    return out + defaults


def _raised(e: BaseException) -> str:
    """An exception from the dataset's code as a failure's reason: its type, message and the line
    that raised it."""
    frames = traceback.extract_tb(e.__traceback__)
    at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {e}{at}"


def _label(value: Any) -> int | None:
    if _is_int(value) and int(value) == -1:
        return None
    return label_value(value)


def convert(values: list[tuple[str, Any]], opts: Options) -> tuple[list[tuple[str, bytes]], Any]:
    """(member name, bytes) of each value, and the label: the encoding, done in the worker."""
    members: list[tuple[str, bytes]] = []
    label = None
    for name, value in values:
        try:
            if member_kind(name) == "label":
                label = _label(value)
                continue
            if _is_chw(value) and member_kind(name.replace("{ext}", "png")) in ("image", "mask"):
                value = value.permute(1, 2, 0).contiguous()
            name, data = value_bytes(name, value, opts)
            check_member_name(name, "member")
        except (StokerError, OSError, ValueError, TypeError, UnicodeDecodeError) as e:
            raise ValueError(f"{name.replace('{ext}', 'image')}: {reason(e)}") from e
        if any(n == name for n, _ in members):
            raise ValueError(f"two members named {name!r}: name them with members=")
        members.append((name, data))
    return members, label


class Converter:
    """The user's dataset as the DataLoader's workers read it: each index becomes a Converted
    (an exception in the dataset's code, or in making its values into members, a failure)."""

    def __init__(self, dataset: Any, opts: Options, members: Mapping[str, Any] | None, label: Any):
        self.dataset, self.members, self.label = dataset, members, label
        self.opts = replace(opts, image_codec="png") if opts.codec == "raw" else opts

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Converted:
        try:
            sample = self.dataset[i]
        except Exception as e:
            return Converted(i, [], None, _raised(e))
        try:
            values = sample_values(sample, self.members, self.label)
            members, label = convert(values, self.opts)
        except Exception as e:
            return Converted(i, [], None, reason(e) if isinstance(e, ValueError) else _raised(e))
        return Converted(i, members, label)


def _check_key(key: Any, what: str) -> None:
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise InvalidArgumentError(
            f"{what} must be a dict key (str) or a tuple position (int), not {key!r}"
        )


def _identity(item: Any) -> Any:
    return item


class TorchDatasetSource(Source):
    format = "dataset"

    def __init__(
        self,
        dataset: Any,
        opts: Options,
        members: Mapping[str, Any] | None = None,
        label: Any = None,
        threads: int | None = None,
    ):
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise InvalidArgumentError(
                f"a {type(dataset).__name__} is not a map-style Dataset (it needs __getitem__ "
                "and __len__; an IterableDataset cannot be packed by index)"
            )
        self.name = type(dataset).__name__
        if members is not None:
            if not isinstance(members, Mapping) or not members:
                raise InvalidArgumentError(
                    f"{self.name}: members must map member names to keys or positions, e.g. "
                    f"{{'jpg': 0, 'feat.npy': 'features'}}, not {members!r}"
                )
            for name, key in members.items():
                check_member_name(name, f"{self.name}: members=")
                _check_key(key, f"{self.name}: members[{name!r}]")
        if label is not None:
            _check_key(label, f"{self.name}: label=")
        self.dataset, self.opts, self.members, self.label = dataset, opts, members, label
        # Worker processes need torch's DataLoader; a list packs in this process without it.
        torch_there = importlib.util.find_spec("torch") is not None
        self.workers = threads if threads and threads > 1 and torch_there else 0
        classes = getattr(dataset, "classes", None)
        if isinstance(classes, (list, tuple)) and all(isinstance(c, str) for c in classes):
            self.classes = list(classes)
        self.extra = {}
        self._open: weakref.WeakSet[Generator[Job, None, None]] = weakref.WeakSet()

    def __len__(self) -> int:
        return len(self.dataset)

    def jobs(self, start: int = 0, stop: int | None = None) -> Iterator[Job]:
        jobs = self._jobs(start, min(len(self), len(self) if stop is None else stop))
        self._open.add(jobs)
        return jobs

    def _jobs(self, start: int, stop: int) -> Generator[Job, None, None]:
        for item in self._converted(start, stop):
            where = f"{self.name}[{item.index}]"
            if item.failure is not None:
                yield failing_job(SampleFailure(where, item.failure))
                continue
            make = functools.partial(record_sample, item.members, where, self.opts, item.label)
            yield Job(where, -1, None, make)

    def _converted(self, start: int, stop: int) -> Iterator[Converted]:
        converter = Converter(self.dataset, self.opts, self.members, self.label)
        workers = min(self.workers, max(0, stop - start))
        if workers == 0:
            yield from map(converter.__getitem__, range(start, stop))
            return
        from torch.utils.data import DataLoader

        loader: DataLoader[Converted] = DataLoader(
            converter,  # type: ignore[arg-type]
            batch_size=None,
            sampler=range(start, stop),
            num_workers=workers,
            collate_fn=_identity,
            prefetch_factor=PREFETCH,
            persistent_workers=False,
        )
        items = iter(loader)
        try:
            next_index = start
            while True:
                try:
                    item = next(items)
                except StopIteration:
                    return
                except RuntimeError as e:  # a worker died: a crash in native code, or killed
                    raise StokerError(
                        f"{self.name}: a DataLoader worker stopped while reading samples from "
                        f"index {next_index} on ({e}); a crash in the dataset's __getitem__ or a "
                        "library it calls, or the system out of memory",
                        reason=str(e),
                        shard=f"{self.name}[{next_index}]",
                    ) from e
                next_index = item.index + 1
                yield item
        finally:
            del items  # its workers are shut down now, not when the generator is collected

    def close(self) -> None:
        for jobs in list(self._open):
            jobs.close()
        self._open = weakref.WeakSet()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_open"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _open=weakref.WeakSet())
