"""What the pack writers share: the pack folder written aside and renamed into place (a pack
interrupted at any point never appears at its path), sizes, .npy headers, file CRCs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .. import _core
from ..errors import InvalidArgumentError


def parse_size(size: int | str) -> int:
    """Bytes from an int or a text such as "256MB", "64KB", "1.5G"."""
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    if not isinstance(size, str):
        raise InvalidArgumentError(f"a size is an int or a text such as '256MB', not {size!r}")
    s = size.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
    try:
        return int(float(s[:-1] if s[-1:] in "KMGT" else s) * mult)
    except ValueError:
        raise InvalidArgumentError(f"{size!r} is not a size such as '256MB'") from None


def remove_stale_partials(out: Path) -> None:
    """Removes what writers into `out` killed before they finished left behind (their process
    is gone); a writer still running elsewhere keeps its folder."""
    for partial in out.parent.glob(f".{out.name}.partial-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(partial, ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


# The element types stoker reads (stoker/core/dtype.h), by numpy name.
DTYPES = (
    "bool",
    "uint8",
    "int8",
    "uint16",
    "int16",
    "uint32",
    "int32",
    "uint64",
    "int64",
    "float16",
    "float32",
    "float64",
)


def checked_dtype(dtype: Any, what: str) -> np.dtype:
    """`dtype` as a little-endian numpy dtype stoker reads, or a clear error."""
    try:
        d = np.dtype(dtype)
    except TypeError as e:
        raise InvalidArgumentError(f"{what}: {dtype!r} is not a dtype") from e
    if d.name not in DTYPES:
        raise InvalidArgumentError(
            f"{what}: dtype {d} is not one stoker reads ({', '.join(DTYPES)})"
        )
    return d.newbyteorder("<") if d.itemsize > 1 else d


# Room for any row count: a header is written before the rows are counted (from an iterable)
# and rewritten, at the same length, once they are.
_ROWS_PLACEHOLDER = 10**18


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A .npy (format 1.0) header for a C-order array, its length the same whatever the first
    dimension (up to 10**18), so that it can be rewritten in place once the rows are known."""
    descr = np.lib.format.dtype_to_descr(dtype)

    def text(s: tuple[int, ...]) -> str:
        return repr({"descr": descr, "fortran_order": False, "shape": tuple(int(d) for d in s)})

    longest = len(text((_ROWS_PLACEHOLDER, *shape[1:])))
    size = -(-(10 + longest + 1) // 64) * 64  # magic, version, length; the text; a newline
    body = text(shape).ljust(size - 10 - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + (size - 10).to_bytes(2, "little") + body.encode("latin1")


def file_crc32c(path: Path) -> int:
    return int(_core.file_crc32c(str(path)))


def check_name(name: str, what: str) -> str:
    """A name that can be part of a file name in the pack folder."""
    if (
        not isinstance(name, str)
        or not name
        or name.startswith(".")
        or any(c in name for c in "/\\\0")
        or name != name.strip()
    ):
        raise InvalidArgumentError(
            f"{what} {name!r}: a non-empty name without '/' or a leading '.'"
        )
    return name


@contextlib.contextmanager
def pack_folder(out: Path, overwrite: bool) -> Iterator[Path]:
    """A folder to write the pack in, renamed to `out` when the block ends without an error
    (removed otherwise)."""
    out = Path(out)
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgumentError(f"{out} already exists (pass overwrite=True to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(out)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """manifest.json, written last: a folder without it is an incomplete pack."""
    path = folder / "manifest.json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


def progress_bar(enabled: bool, total: int | None, unit: str, desc: str) -> Any:
    if not enabled:
        return contextlib.nullcontext(None)
    from tqdm.auto import tqdm

    return tqdm(total=total, unit=unit, unit_scale=True, desc=desc)
