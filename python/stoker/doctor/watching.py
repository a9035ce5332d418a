"""``watch``: observing a real training loop, without changing it."""

from __future__ import annotations

import time
from typing import Any, Iterable, Iterator

from .adapters import adapter_for
from .measure import _batch_size
from .result import Diagnosis, Recommendation
from .sampling import _page_cache, _process_io, _Sampler
from .verdict import _STALL, _data_cause


class watch:
    """Watches a real training loop without changing it::

        with stoker.watch(loader) as w:
            for batch in w:
                train_step(batch)
        print(w.diagnosis)

    Each batch's wait (time inside the loader) and the time until the next batch is asked for
    (the step) are recorded; the verdict comes from the share of time spent waiting. On a GPU,
    steps that never synchronise look fast to the host until the queue fills: the watch sees
    what the loop sees.
    """

    def __init__(self, loader: Iterable[Any]):
        self.loader = loader
        self._adapter = adapter_for(loader)
        self.timeline: list[tuple[float, float]] = []
        self.diagnosis: Diagnosis | None = None
        self._sampler: _Sampler | None = None
        self._batch_size: int | None = None

    def __enter__(self) -> "watch":
        self._stats0 = self._adapter.stats()
        self._io0 = _process_io()
        self._sampler = _Sampler().__enter__()
        self._sampler.phase = "training"
        self._t0 = time.perf_counter()
        return self

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)
        handed = None  # when the last batch was handed out
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            t1 = time.perf_counter()
            if handed is not None:
                self.timeline.append((t1 - t0, t0 - handed))
            if self._batch_size is None:
                self._batch_size = _batch_size(batch)
            handed = time.perf_counter()
            yield batch

    def __exit__(self, *exc) -> None:
        assert self._sampler is not None, "__exit__ without __enter__"
        self._sampler.__exit__(*exc)
        io1 = _process_io()
        wait = sum(w for w, _ in self.timeline)
        busy = sum(c for _, c in self.timeline)
        n = len(self.timeline)
        stall = wait / (wait + busy) if wait + busy > 0 else 0.0
        if stall > _STALL:
            verdict = "data"
            why = f"the loop waited for data {100 * stall:.0f}% of the time."
        elif n and stall < _STALL / 2:
            verdict = "compute"
            why = f"the loop waited for data only {100 * stall:.0f}% of the time."
        else:
            verdict = "balanced"
            why = f"the loop waited for data {100 * stall:.0f}% of the time."
        stats1 = self._adapter.stats() if self._stats0 is not None else None
        stages, cause, cause_why = _data_cause(
            self._adapter, self._stats0, stats1, self._io0, io1,
            (wait + busy) / max(n, 1), max(n, 1),
        )  # fmt: skip
        if verdict == "data":
            why += " " + cause_why
        recommendations = []
        if verdict == "data":
            recommendations.append(Recommendation(
                "workers",
                f"raise the loader's {self._adapter.knob}; stoker.diagnose measures the gain",
                None,
            ))  # fmt: skip
        self.diagnosis = Diagnosis(
            verdict=verdict,
            stall=stall,
            data_cause=cause if verdict == "data" else None,
            loader_s=None,  # watching measures no phase alone
            step_s=None,
            together_s=(wait + busy) / n if n else None,
            transfer_s=None,
            batch_size=self._batch_size,
            stages=stages,
            timeline=self.timeline,
            cpu=self._sampler.summary(),
            io={"read_bytes": io1["read_bytes"] - self._io0["read_bytes"]},
            page_cache=_page_cache(self._adapter.dataset),
            gpu=None,
            recommendations=recommendations,
            explanation=why,
            source="watch",
        )
