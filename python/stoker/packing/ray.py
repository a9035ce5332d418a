"""Packing on a Ray cluster: the connection and the running of tasks, nothing of the format.

stoker.pack(..., engine="ray") hands this module the function a local pack runs
(writer.write_part) and one argument tuple per contiguous range of records; Ray pickles the
function by reference, so every node imports it from its own stoker. The shards go straight
from the tasks into the pack's folder, which every node must see at the same path; only
each range's metadata comes back here. Ray is optional: imported only when asked for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

INSTALL_HINT = "engine='ray' needs Ray: pip install 'stoker[ray]' (or pip install ray)"


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e
    return ray


def require() -> None:
    """Raises ImportError with the install hint where Ray is not installed."""
    _ray()


@contextlib.contextmanager
def connect(address: str | None) -> Iterator[int]:
    """Connects to Ray (ray.init's rules for `address`) unless this process already is, and
    yields the cluster's CPU count; after, disconnects (stopping a local instance it started)
    only if stoker opened the connection and no other stoker user (a loader's remote workers)
    still uses it (stoker.ray_session)."""
    from .. import ray_session

    ray = _ray()
    release = ray_session.connect(address, include_dashboard=False)
    try:
        yield int(ray.cluster_resources().get("CPU", 1))
    finally:
        release()


def run_tasks(
    fn: Callable[..., Any],
    calls: Sequence[tuple],
    *,
    num_cpus: int,
    progress: bool,
    desc: str,
    on_result: Callable[[int, Any], Any] | None = None,
) -> list[Any]:
    """fn(*args) for each args in `calls`, each a Ray task reserving `num_cpus` CPUs; the
    results in the order of `calls`, each also given to `on_result(i, result)` as it comes. A
    task's exception is raised here (as its own class, with Ray's traceback); then, as on
    Ctrl-C, the tasks not finished are cancelled."""
    ray = _ray()
    remote = ray.remote(num_cpus=num_cpus)(fn)
    refs = [remote.remote(*args) for args in calls]
    order = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(refs), unit="task", desc=desc)
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                results[order[ref]] = ray.get(ref)
                if on_result is not None:
                    on_result(order[ref], results[order[ref]])
            if bar is not None:
                bar.update(len(done))
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    finally:
        if bar is not None:
            bar.close()
    return results
