"""stoker.sweep: the seeds' num_workers sweep, for any loader, with a plot."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Iterable, Sequence

from .adapters import IterableAdapter, adapter_for
from .measure import _batch_size


@dataclasses.dataclass
class SweepResult:
    name: str
    values: list[Any]
    samples_per_second: list[float]

    @property
    def best(self) -> Any:
        """The value with the highest throughput."""
        return self.values[max(range(len(self.values)), key=self.samples_per_second.__getitem__)]

    def __str__(self) -> str:
        top = max(self.samples_per_second)
        lines = [f"{self.name:>12}  samples/s"]
        for v, r in zip(self.values, self.samples_per_second):
            bar = "#" * round(40 * r / top) if top > 0 else ""
            mark = "  <- best" if v == self.best else ""
            lines.append(f"{v!s:>12}  {r:9,.0f}  {bar}{mark}")
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike) -> str:
        """Throughput against the swept value, saved as PNG or SVG (by extension)."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.5, 3.6))
        ax.spines[["top", "right"]].set_visible(False)
        xs = list(range(len(self.values)))
        ax.plot(xs, self.samples_per_second, marker="o", color="#3a7ce8")
        best = self.values.index(self.best)
        ax.plot([best], [self.samples_per_second[best]], marker="*", markersize=16,
                color="#e8833a", label=f"best: {self.name}={self.best}")  # fmt: skip
        ax.set_xticks(xs, [str(v) for v in self.values])
        ax.set_xlabel(self.name)
        ax.set_ylabel("samples/s")
        ax.set_ylim(bottom=0)
        ax.set_title(f"Throughput against {self.name}")
        ax.legend(frameon=False)
        path = os.fspath(path)
        fig.savefig(path, bbox_inches="tight")
        plt.close(fig)
        return path


def measure_throughput(loader: Iterable[Any] | IterableAdapter, batches: int, warmup: int) -> float:
    """Samples per second over `batches` batches after `warmup` (passes run back to back).
    `loader`: a loader or its adapter."""
    seen = 0
    t0 = None
    it = adapter_for(loader).passes()
    try:
        for batch in it:
            if warmup > 0:
                warmup -= 1
                if warmup == 0:
                    t0 = time.perf_counter()
                continue
            if t0 is None:
                t0 = time.perf_counter()
                continue
            seen += _batch_size(batch) or 1
            batches -= 1
            if batches == 0:
                return seen / (time.perf_counter() - t0)
    finally:
        it.close()
    raise ValueError("the loader gave no batches")  # a pass gave none before the count was met


def sweep(
    make_loader: Callable[..., Iterable[Any]],
    name: str,
    values: Sequence[Any],
    *,
    batches: int = 30,
    warmup: int = 3,
    plot: str | os.PathLike | None = None,
) -> SweepResult:
    """Throughput of ``make_loader(**{name: value})`` for each value: the loader alone, `batches`
    batches after `warmup` (whose time, worker start-up included, is not counted). ::

        stoker.sweep(lambda num_workers: DataLoader(ds, 64, num_workers=num_workers),
                     "num_workers", [0, 1, 2, 4, 8], plot="workers.png")
        stoker.sweep(lambda threads: stoker.ImageLoader(pack, batch_size=64, threads=threads),
                     "threads", [1, 2, 4, 8])

    Loaders with a ``close()`` are closed after their run.
    """
    if not values:
        raise ValueError("values is empty")
    rates = []
    for value in values:
        adapter = adapter_for(make_loader(**{name: value}))
        try:
            rates.append(measure_throughput(adapter, batches, max(1, warmup)))
        finally:
            adapter.close()
            del adapter  # the loader, before the next is built
    result = SweepResult(name, list(values), rates)
    if plot is not None:
        result.plot(plot)
    return result
