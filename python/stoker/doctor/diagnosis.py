"""``diagnose``: the three phases, timed, and what follows from them."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from .adapters import adapter_for
from .experiments import _recommend
from .measure import _map, _synchronize, _tensors, _time_copy, _time_loader
from .result import Diagnosis, Recommendation
from .sampling import _gpu_info, _page_cache, _process_io, _Sampler
from .verdict import _data_cause, _verdict


def diagnose(
    loader: Iterable[Any],
    step: Callable[[Any], Any],
    *,
    steps: int = 40,
    warmup: int = 5,
    device: Any = None,
    measure_recommendations: bool = True,
) -> Diagnosis:
    """Find what bounds ``for batch in loader: step(batch)``.

    ``loader`` is any iterable of batches (a stoker ``ImageLoader``, a torch ``DataLoader``...),
    ``step(batch)`` one training step. Each phase takes ``warmup`` + ``steps`` batches, running
    passes back to back where one pass has fewer. ``device`` (default: that of the batch's
    tensors) is where the cached batch of phase 2 is put; CUDA work is synchronised after each
    step so that step times are real. ``measure_recommendations=False`` skips the experiments
    behind the recommendations (faster; gains are then not measured).
    """
    import torch

    if steps < 1 or warmup < 0:
        raise ValueError("steps must be >= 1 and warmup >= 0")
    adapter = adapter_for(loader)
    stats0 = adapter.stats()

    with _Sampler() as sampler:
        # Phase 1: the loader alone.
        sampler.phase = "loader alone"
        io0 = _process_io()
        loader_s, batch_size, first = _time_loader(adapter, steps, warmup)
        io1 = _process_io()
        stats1 = adapter.stats()

        # Phase 2: the step alone, on one batch cached on the device.
        sampler.phase = "step alone"
        tensors = _tensors(first)
        if device is None and tensors:
            device = tensors[0].device
        transfer_s = None
        cached = first
        if tensors and torch.device(device).type != "cpu":
            cached = _map(first, lambda t: t.to(device))
            _synchronize(device)
            host = [t for t in tensors if t.device.type == "cpu"]
            if host:
                transfer_s = _time_copy(host, device, pinned=None)
        for _ in range(max(1, warmup)):
            step(cached)
        _synchronize(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            step(cached)
        _synchronize(device)
        step_s = (time.perf_counter() - t0) / steps

        # Phase 3: both, timing the wait for each batch and the step.
        sampler.phase = "together"
        timeline: list[tuple[float, float]] = []
        it = adapter.passes()
        try:
            for i in range(warmup + steps):
                t0 = time.perf_counter()
                batch = next(it)
                t1 = time.perf_counter()
                step(batch)
                _synchronize(device)
                t2 = time.perf_counter()
                if i >= warmup:
                    timeline.append((t1 - t0, t2 - t1))
        except StopIteration:
            pass
        finally:
            it.close()
        io2 = _process_io()
        sampler.phase = "recommendations"

        wait = sum(w for w, _ in timeline)
        busy = sum(c for _, c in timeline)
        stall = wait / (wait + busy) if wait + busy > 0 else 0.0
        together_s = (wait + busy) / len(timeline) if timeline else None
        verdict, explanation = _verdict(loader_s, step_s, transfer_s, stall)
        if timeline and busy / len(timeline) > 1.15 * step_s:
            explanation += (
                f" Beside the loader the step took {100 * (busy / len(timeline) / step_s - 1):.0f}%"
                " longer than alone: they compete for the machine (CPU, memory bandwidth)."
            )
        stages, cause, cause_why = _data_cause(adapter, stats0, stats1, io0, io1, loader_s, steps)
        if verdict == "data":
            explanation += " " + cause_why
        recommendations: list[Recommendation] = []
        if measure_recommendations:
            recommendations, notes = _recommend(
                adapter, step, verdict, cause, cached, first, device, loader_s, step_s,
                batch_size, steps, warmup,
            )  # fmt: skip
            if notes:
                explanation += " " + " ".join(notes)

    return Diagnosis(
        verdict=verdict,
        stall=stall,
        data_cause=cause if verdict == "data" else None,
        loader_s=loader_s,
        step_s=step_s,
        together_s=together_s,
        transfer_s=transfer_s,
        batch_size=batch_size or None,
        stages=stages,
        timeline=timeline,
        cpu=sampler.summary(),
        io={
            "loader_read_bytes": io1["read_bytes"] - io0["read_bytes"],
            "together_read_bytes": io2["read_bytes"] - io1["read_bytes"],
            "loader_cpu_s": io1["cpu_s"] - io0["cpu_s"],
            "processes": io1["processes"],
        },
        page_cache=_page_cache(adapter.dataset),
        gpu=_gpu_info(device),
        recommendations=recommendations,
        explanation=explanation,
        source="diagnose",
    )
