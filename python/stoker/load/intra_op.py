"""How many of torch's intra-op threads the consumer's thread uses for the batch ops stoker runs
on the CPU (augment= on a host batch), set for the block and restored.

torch runs a large CPU op on an OpenMP team of all the cores; between ops that team's threads
spin waiting for more work. On a machine whose cores the loader's own engine threads are using,
the two fight: on 2 cores, a log-mel on the batch with the team of 2 beside 2 engine threads ran
at a third of the rate it reaches on the consumer's thread alone (benchmarks/media.py's audio
recipe, beside other jobs). `torch.set_num_threads` would change the process's default for
every thread started later; the OpenMP runtime's own `omp_set_num_threads` sets only the calling
thread's count, which is what torch's ops read (`at::get_num_threads` is
`omp_get_max_threads`). Where torch has no OpenMP runtime loaded (macOS, other builds) this is
a no-op."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from typing import Any

_RUNTIMES = ("libgomp", "libiomp5", "libomp")
_found: list[Any] = []  # [runtime or None], once


def _runtime() -> Any:
    """The OpenMP runtime torch loaded (ctypes), or None."""
    if not _found:
        runtime = None
        try:
            with open("/proc/self/maps") as maps:
                paths = {line.split()[-1] for line in maps if "/" in line}
            for path in sorted(paths):
                if any(os.path.basename(path).startswith(name) for name in _RUNTIMES):
                    lib = ctypes.CDLL(path)
                    if hasattr(lib, "omp_set_num_threads") and hasattr(lib, "omp_get_max_threads"):
                        runtime = lib
                        break
        except OSError:  # no /proc (macOS), or the library will not open again
            runtime = None
        _found.append(runtime)
    return _found[0]


@contextlib.contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """The calling thread's torch ops use at most `count` threads inside the block (never more
    than they would outside it); other threads are not touched."""
    runtime = _runtime()
    before = runtime.omp_get_max_threads() if runtime is not None else 0
    if runtime is None or count >= before:
        yield
        return
    runtime.omp_set_num_threads(max(1, count))
    try:
        yield
    finally:
        runtime.omp_set_num_threads(before)


def consumer_share(engine_threads: int) -> int:
    """The threads left to the consumer's batch ops: the cores this process may use, less the
    engine's threads (at least 1)."""
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return max(1, cores - engine_threads)
