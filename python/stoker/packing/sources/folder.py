"""Image files: an ImageFolder tree (``ROOT/CLASS/IMAGE``, torchvision's order and labels), or a
``.csv`` of ``path,label`` rows. Each sample is the file as ``KEY.jpg`` (``.png``, ``.webp``)
and ``KEY.cls``. Video and audio files are listed the same way (a UCF101 or ESC-50 tree) and
stored as they are, ``KEY.mp4`` (``.mkv``, ``.wav``, ``.flac``...) and ``KEY.cls``."""

from __future__ import annotations

import csv
import functools
import os
from collections.abc import Iterator
from pathlib import Path

from ...errors import InvalidArgumentError, StokerError
from ..members import (
    AUDIO_MEMBER_EXTENSIONS,
    VIDEO_MEMBER_EXTENSIONS,
    Options,
    image_field,
    member_data,
    member_kind,
    prepare_image,
)
from ..source import Job, Sample, SampleFailure, Source, files_fingerprint, reason

# torchvision.datasets.folder.IMG_EXTENSIONS: the files an ImageFolder lists, in its order.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# Video and audio files, stored as they are (members.py).
MEDIA_EXTENSIONS = tuple("." + e for e in VIDEO_MEMBER_EXTENSIONS + AUDIO_MEMBER_EXTENSIONS)
PATH_HEADERS = ("path", "file", "filename")


def list_image_folder(root: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """torchvision ImageFolder's samples and classes: classes sorted, files sorted per class."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if not classes:
        raise InvalidArgumentError(f"{root}: no class folders (expected ROOT/CLASS/IMAGE files)")
    samples = []
    for label, name in enumerate(classes):
        for dirpath, _, files in sorted(os.walk(root / name, followlinks=True)):
            for fname in sorted(files):
                if fname.lower().endswith(IMG_EXTENSIONS + MEDIA_EXTENSIONS):
                    samples.append((os.path.join(dirpath, fname), label))
    return samples, classes


def list_csv(path: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """Rows of `path,label`; an optional header; labels are integers or class names."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("#")]
    if rows and len(rows[0]) >= 2 and rows[0][0].strip().lower() in PATH_HEADERS:
        rows = rows[1:]
    if not rows:
        raise InvalidArgumentError(f"{path}: no rows")
    for i, r in enumerate(rows):
        if len(r) < 2:
            raise InvalidArgumentError(f"{path}: row {i + 1} is not 'path,label': {r!r}")
    base = path.parent
    labels = [r[1].strip() for r in rows]
    if all(lab.lstrip("-").isdigit() for lab in labels):
        ints = [int(lab) for lab in labels]
        if min(ints) < 0:
            raise InvalidArgumentError(f"{path}: labels must be >= 0")
        classes = [str(i) for i in range(max(ints) + 1)]
    else:
        classes = sorted(set(labels))
        index = {c: i for i, c in enumerate(classes)}
        ints = [index[lab] for lab in labels]
    return [(str(base / r[0].strip()), lab) for r, lab in zip(rows, ints, strict=True)], classes


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def file_sample(path: str, opts: Options) -> Sample:
    ext = path.rpartition(".")[2].lower()
    if "/" not in ext and member_kind(ext) in ("video", "audio"):  # stored as they are
        try:
            data, info, rewritten = member_data(ext, member_kind(ext), read_file(path), opts)
        except (StokerError, OSError) as e:
            raise SampleFailure(path, reason(e)) from e
        return Sample([(info[0], data)], [info], rewritten)  # named anew if re-encoded
    try:
        data, fmt, width, height, rewritten = prepare_image(read_file(path), opts)
    except (StokerError, OSError, ValueError) as e:
        raise SampleFailure(path, reason(e)) from e
    return Sample([(fmt, data)], [image_field(fmt, data, width, height)], bool(rewritten))


class ImageFiles(Source):
    """Image (or video, or audio) files with labels, listed up front (an ImageFolder or a
    path,label CSV)."""

    unit = "img"

    def __init__(self, src: Path, opts: Options):
        self.src, self.opts = src, opts
        if src.is_dir():
            self.samples, self.classes = list_image_folder(src)
            self.format = "imagefolder"  # type: ignore[misc]
        else:
            self.samples, self.classes = list_csv(src)
            self.format = "csv"  # type: ignore[misc]
        if not self.samples:
            raise InvalidArgumentError(f"{src}: no image, video or audio files found")

    def __len__(self) -> int:
        return len(self.samples)

    def jobs(self, start: int = 0, stop: int | None = None) -> Iterator[Job]:
        for path, label in self.samples[start:stop]:
            yield Job(path, label, None, functools.partial(file_sample, path, self.opts))

    def fingerprint(self) -> str:
        listing = "\n".join(f"{p}\t{label}" for p, label in self.samples)
        files = [self.src] if self.src.is_file() else []
        return files_fingerprint(files, listing)
