"""stoker.verify: check every sample of a pack (or of WebDataset shards) before training on it.

Each sample is read, its CRC32C compared with the index (stoker packs; foreign shards carry no
CRCs) and its image decoded in full, to the end of the file, so that damage anywhere in it is found.
The work runs in C++ without the GIL, in chunks spread over a thread pool.
"""

from __future__ import annotations

import os
import time
from concurrent import futures
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from .. import _core
from ..errors import InvalidArgumentError, error_class
from ..load.loader import open_dataset

CHUNK = 64  # samples per task: enough to amortise a decoder's set-up, small for a smooth bar


@dataclass(frozen=True)
class VerifyFailure:
    """One sample that failed: its position in the dataset, where it is, and why."""

    index: int
    shard: str
    key: str
    error: str  # the stoker.errors class name, e.g. "CorruptDataError"
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class VerifyReport:
    """What stoker.verify found. ``clean`` is true when every sample passed."""

    path: str
    samples: int  # in the dataset
    checked: int  # samples looked at (all of them, unless interrupted)
    bytes: int  # image bytes read
    seconds: float
    failures: list[VerifyFailure] = field(default_factory=list)  # in dataset order
    crc_checked: bool = False  # CRC32C compared with the index (stoker packs only)
    decoded: bool = True  # every image decoded in full
    files: int = 0  # data files checked whole against the manifest's CRC32C (array, token packs)

    @property
    def clean(self) -> bool:
        return not self.failures and self.checked == self.samples

    @property
    def samples_per_s(self) -> float:
        return self.checked / self.seconds if self.seconds > 0 else 0.0

    def checks(self) -> str:
        done = (["CRC32C"] if self.crc_checked else []) + (["full decode"] if self.decoded else [])
        return " + ".join(done) if done else "read only"

    def summary(self) -> str:
        verdict = "clean" if self.clean else f"{len(self.failures)} FAILED"
        files = f" and {self.files:,} file(s)" if self.files else ""
        return (
            f"verified {self.checked:,} of {self.samples:,} samples{files} of {self.path} "
            f"({self.checks()}): {self.bytes / 1e6:,.1f} MB in {self.seconds:.2f} s "
            f"({self.samples_per_s:,.0f} samples/s): {verdict}"
        )

    def describe(self, max_failures: int = 10, more: str = "") -> str:
        """The summary line, then one line per failure up to ``max_failures``."""
        lines = [self.summary()]
        lines += [format_failure(f) for f in self.failures[:max_failures]]
        if len(self.failures) > max_failures:
            lines.append(f"  ... {len(self.failures) - max_failures} more{more}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def _is_token_pack(path: Any) -> bool:
    if not isinstance(path, (str, os.PathLike)):
        return False
    manifest = os.path.join(os.fspath(path), "manifest.json")
    if not os.path.isfile(manifest):
        return False
    import json

    try:
        with open(manifest, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError):
        return False  # not a token pack; opening it as a pack names what is wrong
    return isinstance(m, dict) and m.get("format") == "stoker-tokens"


def _check_files(dataset: Any, pool: futures.Executor) -> tuple[list[tuple], int, int]:
    """Failures (as verify_range's rows) of the data files whose CRC32C the manifest records
    (array packs' columns, token packs' files) and differs from theirs; and the bytes read."""
    folder = dataset.path
    jobs = []
    for shard in range(dataset.num_shards):
        first = sum(dataset.shard_samples(s) for s in range(shard))
        for f in dataset.shard_files(shard):
            if f["crc32c"] is not None:
                path = os.path.join(folder, f["name"])
                jobs.append((first, f, pool.submit(_core.file_crc32c, path)))
    rows, nbytes = [], 0
    corrupt = 1  # ErrorCode::kCorruptData: stoker.CorruptDataError
    for first, f, task in jobs:
        crc = task.result()
        nbytes += int(f["bytes"])
        if crc != f["crc32c"]:
            rows.append((first, corrupt, f["name"], "",
                         f"CRC32C mismatch: the file changed after packing (manifest "
                         f"{f['crc32c']:08x}, file {crc:08x})"))  # fmt: skip
    return rows, nbytes, len(jobs)


def format_failure(f: VerifyFailure) -> str:
    return f"  {f.shard}  {f.key}  {f.error}: {f.reason}"


def verify(
    path: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    threads: int | None = None,
    decode: bool = True,
    check_crc: bool = True,
    report: str | os.PathLike | None = None,
    progress: bool = True,
    max_pixels: int = 1 << 28,
    max_scans: int = 256,
    max_decode_memory: int = 512 << 20,
    allow_warnings: bool = False,
) -> VerifyReport:
    """Checks every sample of ``path`` (what ImageLoader accepts: a pack folder, a .tar, a folder
    of .tar shards, a glob or a list) and returns a VerifyReport listing the failures.

    A sample fails when its bytes cannot be read, their CRC32C differs from the index (the shard
    changed after packing; ``check_crc=False`` skips this), or, with ``decode=True``, its image
    does not decode in full within ``max_pixels``, ``max_scans`` and ``max_decode_memory`` —
    including JPEGs that libjpeg decodes only with warnings (truncated, damaged data), unless
    ``allow_warnings``.

    ``threads`` defaults to the CPU count; the failures do not depend on it. ``report`` writes the
    failures as a JSON quarantine report (the format of the loaders' ``quarantine=``). Raises the
    StokerError of the dataset when it cannot be opened.
    """
    if threads is None:
        threads = os.cpu_count() or 1
    if isinstance(threads, bool) or not isinstance(threads, int) or threads <= 0:
        raise InvalidArgumentError(f"threads must be a positive int, not {threads!r}")
    if report is not None:
        folder = os.path.dirname(os.path.abspath(os.fspath(report)))
        if not os.path.isdir(folder):  # refuse now rather than after the whole run
            raise InvalidArgumentError(f"cannot write the report: no folder {folder!r}")
    start = time.perf_counter()
    tokens = _is_token_pack(path)
    # A token pack's samples are windows of the reader's choosing: its files are what is checked.
    dataset = open_dataset(path, seq_len=1) if tokens else open_dataset(path)
    source = os.fspath(path) if isinstance(path, (str, os.PathLike)) else dataset.path
    n = 0 if tokens else len(dataset)
    options: dict[str, Any] = dict(
        check_crc=check_crc,
        decode=decode,
        fail_on_warnings=not allow_warnings,
        max_pixels=max_pixels,
        max_scans=max_scans,
        max_decode_memory=max_decode_memory,
    )
    rows: list[tuple] = []
    checked = nbytes = files = 0
    crc_checked = check_crc and dataset.has_crc

    from tqdm.auto import tqdm

    name = os.path.basename(source.rstrip("/")) or source
    bar = tqdm(total=n, unit="img", desc=f"verifying {name}", disable=not progress)
    pool = futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="stoker-verify")
    try:
        tasks = [
            pool.submit(_core.verify_range, dataset, b, min(b + CHUNK, n), **options)
            for b in range(0, n, CHUNK)
        ]
        for task in futures.as_completed(tasks):
            part = task.result()
            rows += part["failures"]
            checked += part["checked"]
            nbytes += part["bytes"]
            crc_checked = part["crc_checked"]
            bar.update(part["checked"])
            if rows:
                bar.set_postfix(failed=len(rows), refresh=False)
        if check_crc:  # array and token packs: each file's CRC32C against the manifest
            file_rows, file_bytes, files = _check_files(dataset, pool)
            rows += file_rows
            nbytes += file_bytes
            crc_checked = crc_checked or bool(file_bytes)
    finally:
        # Ctrl-C or an error: drop the chunks not started; those running end within CHUNK samples.
        pool.shutdown(wait=False, cancel_futures=True)
        bar.close()
    rows.sort(key=lambda r: r[0])
    result = VerifyReport(
        path=source,
        samples=n,
        checked=checked,
        bytes=nbytes,
        seconds=time.perf_counter() - start,
        failures=[
            VerifyFailure(index, shard, key, error_class(code).__name__, reason)
            for index, code, shard, key, reason in rows
        ],
        crc_checked=crc_checked,
        decoded=decode,
        files=files,
    )
    if report is not None:
        from ..load.quarantine import write_report

        write_report(
            report,
            source=source,
            kind="verify",
            checked=result.checked,
            failures=[f.as_dict() for f in result.failures],
        )
    return result
