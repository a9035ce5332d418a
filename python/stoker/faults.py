"""Fault injection: a switch that makes the Nth acquisition of a kind fail, for tests that make
every acquisition of a loader's life fail in turn and check that nothing is left behind
(SQLite's anomaly tests, RocksDB's fault-injection environment; docs/RELIABILITY.md).

The kinds, and what each point's failure is (the failure the real one gives, so that the real
handling runs):

    thread       a thread started: the engine's workers (ResourceLimitError), the Python
                 layer's (RuntimeError, as threading's "can't start new thread")
    actor        a Ray actor created (remote_workers=): the actor's creation raises
    ray_get      a result read from Ray: raises as a lost object does
    file_open    a file opened: a shard, an index, a manifest (ShardIOError), a file a loader
                 writes (record=, quarantine=: OSError)
    mmap         a file mapped (array packs, token files): refused, so it is read with pread
    shard_fetch  a shard, manifest or index downloaded from a URL (ShardIOError, given up on)
    page_lock    a batch slot page-locked for the GPU (the CUDA runtime's error)
    stream       a CUDA stream created (the CUDA runtime's error)
    batch_alloc  a batch buffer allocated by the engine (ResourceLimitError)

Off unless armed (``with inject("file_open", 3): ...``); then each acquisition is counted, in
the engine's counters (stoker/core/fault.h), which both languages share. While off, a point
costs one check of a module-level flag here, one relaxed atomic load in C++.

A hold point is where a race can happen, between a check and what it guards: inside
``with hold("begin") as held: ...`` the first thread to reach it waits there (``held.wait()``
returns once one does) until the block ends, so that what races with it happens at that point
every time. The engine's points:

    begin        a pass begun (the engine's begin()), the loader found open, the pass not started
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import _core

KINDS = ("thread", "actor", "ray_get", "file_open", "mmap", "shard_fetch", "page_lock",
         "stream", "batch_alloc")  # fmt: skip

armed = False  # read by every point: False in normal runs


class InjectedFault(RuntimeError):
    """The default failure of a Python point (a point passes the class the real failure has)."""


def point(kind: str, what: str, error: type[BaseException] | None = None) -> None:
    """An acquisition of `kind` (`what`: the thing acquired, for the message): raises `error`
    (default InjectedFault) when it is the one armed to fail."""
    if armed and _core.fault_due(kind):
        raise (error or InjectedFault)(_core.fault_describe(kind, what))


def due(kind: str) -> bool:
    """Counts an acquisition of `kind` whose failure the caller makes itself: whether to fail
    it (then `describe` gives its message)."""
    return armed and _core.fault_due(kind)


def describe(kind: str, what: str) -> str:
    return _core.fault_describe(kind, what)


@contextlib.contextmanager
def inject(kind: str = "", nth: int = 0) -> Iterator["Counts"]:
    """Inside, the `nth` acquisition of `kind` fails (counted from 1; 0 or no kind: none fails,
    every acquisition is only counted); yields what was counted (read it after the block)."""
    global armed
    if kind and kind not in KINDS:
        raise ValueError(f"no fault point {kind!r}: one of {', '.join(KINDS)}")
    counts = Counts()
    _core.fault_arm(kind, nth)
    armed = True
    try:
        yield counts
    finally:
        armed = False
        _core.fault_disarm()
        counts.by_kind = dict(_core.fault_counts())
        counts.fired = _core.fault_fired()


@contextlib.contextmanager
def hold(point: str) -> Iterator["Held"]:
    """Inside, the first thread to reach hold point `point` waits there; it goes on when the
    block ends."""
    _core.fault_hold(point)
    try:
        yield Held(point)
    finally:
        _core.fault_release()


class Held:
    def __init__(self, point: str):
        self.point = point

    def wait(self, timeout: float = 60.0) -> None:
        """Returns once a thread waits at the point (raises TimeoutError after `timeout` s)."""
        if not _core.fault_wait_held(int(timeout * 1000)):
            raise TimeoutError(f"no thread reached hold point {self.point!r} in {timeout:g} s")


class Counts:
    """What an ``inject`` block counted: acquisitions by kind, and whether its failure fired."""

    def __init__(self) -> None:
        self.by_kind: dict[str, int] = {}
        self.fired = False
