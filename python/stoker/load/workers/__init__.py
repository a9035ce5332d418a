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

from typing import Any

from .dispatch import Dispatcher
from .local import ThreadWorkers
from .ray_actors import RayWorkers
from .steps import Recipe

__all__ = ["Dispatcher", "RayWorkers", "ThreadWorkers", "open_workers"]


def open_workers(loader: Any, options: Any, augment_on_workers: bool) -> Dispatcher:
    """The dispatcher of `loader`'s workers: the pool its remote_workers= names, its own
    threads alongside (``threads=``, none with 0), and a worker in this process for when no
    other is left."""
    spec = options.remote_workers
    recipe = Recipe.of(loader, augment_on_workers)
    pools = [spec.open(recipe)]
    threads = options.threads
    if threads != 0:
        pools.append(ThreadWorkers(1, threads, name="local").open(recipe))
    fallback = ThreadWorkers(1, "auto" if threads == 0 else threads, name="fallback")
    try:
        return Dispatcher(pools, spec.batches_in_flight, fallback.open(recipe),
                          spec.fallback_after)  # fmt: skip
    except BaseException:
        for pool in pools:
            pool.close()
        raise
