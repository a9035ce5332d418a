"""Quarantine reports: the samples that failed, as JSON, for `stoker verify` and the loader.

A report is one JSON object::

    {"format": "stoker-quarantine", "version": 1,
     "kind": "verify" | "loader", "source": "packs/train", "created": "2025-01-31T12:00:00+00:00",
     "checked": 1000, "failed": 2,
     "failures": [{"index": 42, "shard": "shard-000000.tar", "key": "00000042",
                   "error": "CorruptDataError", "reason": "CRC32C mismatch: ..."}, ...]}

``index`` is the sample's position in the dataset, ``error`` the name of its stoker.errors class.
The file is replaced atomically: a reader never sees half a report.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from typing import Any, Iterable

from .. import faults

REPORT_FORMAT = "stoker-quarantine"
REPORT_VERSION = 1
KINDS = ("verify", "loader")
FAILURE_FIELDS = ("index", "shard", "key", "error", "reason")


def make_report(
    *, source: str, kind: str, checked: int, failures: Iterable[dict[str, Any]]
) -> dict[str, Any]:
    """The report as a dict (what write_report writes). Each failure keeps only FAILURE_FIELDS."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    rows = [{name: f.get(name) for name in FAILURE_FIELDS} for f in failures]
    return {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "kind": kind,
        "source": str(source),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "checked": int(checked),
        "failed": len(rows),
        "failures": rows,
    }


def write_report(
    path: str | os.PathLike, *, source: str, kind: str, checked: int, failures: list[dict]
) -> None:
    """Writes a quarantine report to ``path``: a temporary file in the same folder, then
    os.replace, so that the file at ``path`` is always a whole report (the old one or the new)."""
    report = make_report(source=source, kind=kind, checked=checked, failures=failures)
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    faults.point("file_open", path, OSError)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a report is for sharing
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
