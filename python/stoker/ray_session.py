"""The process's connection to Ray as stoker uses it: shared by every stoker user of Ray in the
process (each loader's remote workers, stoker.pack(engine="ray")), and closed by Ray's rule for
libraries: stoker shuts down only a connection it opened itself, and only when no stoker user
of it is left (a count). A connection the user opened (``ray.init`` before stoker asks) is the
user's: stoker never shuts it down. Ray is imported only here, and only when asked for."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_users = 0  # stoker users of the connection now open
_opened_by_stoker = False  # whether stoker called ray.init for it


def connect(address: str | None, **init_options: Any) -> Callable[[], None]:
    """Connects this process to Ray (``ray.init(address, **init_options)``) unless it is
    already connected, and counts one user of the connection; returns the user's release,
    which shuts the connection down once no stoker user is left, if stoker opened it."""
    global _users, _opened_by_stoker
    import ray

    with _lock:
        if not ray.is_initialized():
            ray.init(address=address, **init_options)
            _opened_by_stoker = True
        _users += 1
    released = False

    def release() -> None:
        global _users, _opened_by_stoker
        nonlocal released
        with _lock:
            if released:
                return
            released = True
            _users -= 1
            if _users == 0 and _opened_by_stoker:
                _opened_by_stoker = False
                if ray.is_initialized():  # not after Ray's own shutdown at exit
                    ray.shutdown()

    return release


def users() -> int:
    """stoker's users of the connection now (for tests)."""
    return _users
