"""What this process may use of the machine. Imported by the loader, the doctor, the benchmarks
and the command line alike, and importing nothing of stoker's: no module needs another's import
for it."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's or taskset's share),
    not every core the machine has."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
