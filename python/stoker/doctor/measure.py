"""Timing loaders and steps, and the batch helpers every phase uses."""

from __future__ import annotations

import time
from typing import Any, Callable

from .adapters import adapter_for


def _rate(per_second: float) -> str:
    """3 significant digits: 12.3, 1,230, 12.3k, 1.23M."""
    if per_second >= 1e6:
        return f"{per_second / 1e6:.3g}M"
    if per_second >= 1e4:
        return f"{per_second / 1e3:.3g}k"
    return f"{per_second:,.3g}" if per_second < 1000 else f"{per_second:,.0f}"


def _tensors(batch: Any) -> list:
    from ..device import _tensors

    return list(_tensors(batch))


def _batch_size(batch: Any) -> int | None:
    tensors = _tensors(batch)
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() > 0 else None


def _map(batch: Any, fn: Callable) -> Any:
    from ..device import _map_tensors

    return _map_tensors(batch, fn)


def _synchronize(device: Any) -> None:
    """Wait for the GPU: the batch's device, or any a step started using (a CPU loader whose
    step moves the batch to the GPU)."""
    import torch

    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    elif torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _time_loader(loader: Any, batches: int, warmup: int) -> tuple[float, int, Any]:
    """Seconds per batch over `batches` after `warmup` (passes back to back), samples per batch,
    and the first batch. `loader`: a loader or its adapter."""
    it = adapter_for(loader).passes()
    first = None
    n, elapsed = 0, 0.0
    try:
        for _ in range(warmup):
            batch = next(it)
            first = batch if first is None else first
        t0 = time.perf_counter()
        for _ in range(batches):
            batch = next(it)
            first = batch if first is None else first
            n += 1
        elapsed = time.perf_counter() - t0
    except StopIteration:
        elapsed = time.perf_counter() - t0 if n else 0.0
    finally:
        it.close()
    if n == 0:
        raise ValueError(
            f"the loader gave fewer than {warmup + 1} batches: too few to measure "
            "(lower warmup/steps, or use a larger dataset)"
        )
    return elapsed / n, _batch_size(first) or 0, first


def _time_copy(host: list, device: Any, pinned: bool | None) -> float:
    """Seconds to copy the tensors to the device (median of 5), pinned or as they are."""
    import torch

    if pinned:
        host = [t.pin_memory() for t in host]
    times = []
    for _ in range(6):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for t in host:
            t.to(device, non_blocking=bool(pinned))
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[2]


def _time_step(step, batch, device, steps: int, context=None) -> float:
    import contextlib

    context = context or contextlib.nullcontext
    with context():
        step(batch)
    _synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        with context():
            step(batch)
    _synchronize(device)
    return (time.perf_counter() - t0) / steps
