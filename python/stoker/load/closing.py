"""Closing from a finalizer. ``Loader.__del__`` runs wherever the garbage collector does, perhaps
inside threading's own bookkeeping: a thread starting holds the lock that joining a finished
non-daemon thread takes, so such a join there never returns. Inside ``without_waiting()`` the map
stage's pool (non-daemon threads) is told to stop and not waited for (``may_wait()`` is false);
the loader's other threads are daemons, whose joins take no such lock."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_local = threading.local()


@contextlib.contextmanager
def without_waiting() -> Iterator[None]:
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def may_wait() -> bool:
    """False inside ``without_waiting()`` on this thread: stop threads, never join them."""
    return getattr(_local, "depth", 0) == 0
