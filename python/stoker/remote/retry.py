"""How stoker.remote tries a failed fetch again (`Retry`), and the failures not worth a retry."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import CorruptDataError, InvalidArgumentError, ShardIOError
from .host_gate import sleep
from .urls import redact


@dataclass(frozen=True)
class Retry:
    """How a failed fetch is retried: `tries` in all, waiting `backoff` seconds after the first
    failure, doubling up to `max_backoff`."""

    tries: int = 10  # waits 47.5 s in all: an object store restarting takes 20-30 s (SeaweedFS)
    backoff: float = 0.5
    max_backoff: float = 8.0

    def run(self, what: str, fn: Callable[[], Any],
            permanent: tuple[type[BaseException], ...] = (),
            stop: threading.Event | None = None) -> Any:  # fmt: skip
        """fn(), tried again on any exception but those in `permanent` and InterruptedError
        (what a read raises once its loader is closed); then ShardIOError. InterruptedError as
        soon as `stop` is set while it waits to try again."""
        delay = self.backoff
        for attempt in range(1, self.tries + 1):
            try:
                return fn()
            except permanent:
                raise
            except InterruptedError:  # the loader was closed: nothing to try again
                raise
            except Exception as e:  # noqa: BLE001 - network stacks raise anything; retried
                if attempt == self.tries:
                    why = redact(f"{type(e).__name__}: {e}")
                    raise ShardIOError(f"{what}: {why} ({self.tries} tries)", reason=why) from None
                sleep(delay, stop)
                delay = min(delay * 2, self.max_backoff)
        raise AssertionError("unreachable")


DEFAULT_RETRY = Retry()

# Not worth a retry: we may not read it, or it is not what it should be. (A shard the manifest
# lists that is "not found" is retried: fsspec's HTTP backend says FileNotFoundError for a server
# that does not answer too.)
_PERMANENT: tuple[type[BaseException], ...] = (
    PermissionError,
    InvalidArgumentError,
    CorruptDataError,
)
