"""A loader's batches made by workers elsewhere (``remote_workers=``): on the CPU machines of a
Ray cluster (`RayWorkers`), alongside the loader's own threads, and in this process when no
worker is left.

Every batch is a pure function of (seed, epoch, step, rank), so it does not matter where it is
made: a worker builds the same loader from its arguments (steps.py), positions its engine at a
chunk's first step and makes the chunk's batches; the trainer's loader keeps the pass's position
with an engine of indices only, and takes the results in step order (dispatch.py, the
WorkerSteps stage). Pools: ray_actors.py (Ray actors), local.py (threads of this process).
"""

from __future__ import annotations

import contextlib
from typing import Any

from .dispatch import Dispatcher
from .local import ThreadWorkers
from .ray_actors import RayWorkers
from .steps import Recipe

__all__ = ["Dispatcher", "RayWorkers", "ThreadWorkers", "open_workers"]


def open_workers(loader: Any, options: Any, augment_on_workers: bool) -> Dispatcher:
    """The dispatcher of `loader`'s workers: the pool its remote_workers= names, its own
    threads alongside (``threads=``, none with 0), and a worker in this process for when no
    other is left. A pool that fails to start closes those started before it."""
    spec = options.remote_workers
    recipe = Recipe.of(loader, augment_on_workers)
    threads = options.threads
    fallback = ThreadWorkers(1, "auto" if threads == 0 else threads, name="fallback")
    with contextlib.ExitStack() as stack:
        pools = [spec.open(recipe)]
        stack.callback(pools[0].close)
        if threads != 0:
            pools.append(ThreadWorkers(1, threads, name="local").open(recipe))
            stack.callback(pools[-1].close)
        dispatcher = Dispatcher(pools, spec.batches_in_flight, lambda: fallback.open(recipe),
                                spec.fallback_after, timeout=spec.timeout)  # fmt: skip
        stack.pop_all()  # the dispatcher closes its pools from now on
        return dispatcher
