"""What ``diagnose`` and ``watch`` return: a verdict with its figures, and recommendations."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

VERDICTS = ("data", "compute", "transfer", "balanced")
DATA_CAUSES = ("io", "decode", "augmentation", "map", "python")


@dataclasses.dataclass
class Recommendation:
    """One change, and the speed-up it was measured to give (``gain``: 1.8 means 1.8x the
    throughput of the stage it changes), or ``None`` where it could not be measured quickly."""

    action: str
    text: str
    gain: float | None
    measured: str = ""

    def __str__(self) -> str:
        gain = f"{self.gain:.2f}x" if self.gain is not None else "not measured"
        return f"{self.text} ({gain}{': ' + self.measured if self.measured else ''})"


@dataclasses.dataclass
class Diagnosis:
    """What bounds the job. Times are seconds per batch (or per step)."""

    verdict: str  # one of VERDICTS
    stall: float  # share of the time per step spent waiting for data, with both running
    data_cause: str | None  # for verdict "data": one of DATA_CAUSES
    loader_s: float | None  # per batch, the loader alone
    step_s: float | None  # per step, on a cached batch on the device
    together_s: float | None  # per step, loader and step together
    transfer_s: float | None  # host -> device copy of one batch, where there is a device
    batch_size: int | None
    stages: dict[str, float]  # seconds per batch by stage (stoker) or counters (others)
    timeline: list[tuple[float, float]]  # (wait, step) seconds per step, together / watched
    cpu: dict[str, Any]  # cores, samples [(t, phase, [% per core])], mean per phase
    io: dict[str, Any]  # bytes read per phase
    page_cache: dict[str, Any] | None  # resident share of the data files, where known
    gpu: dict[str, Any] | None
    recommendations: list[Recommendation]
    explanation: str
    source: str  # "diagnose" or "watch"

    @property
    def sub_verdict(self) -> str | None:
        return self.data_cause

    def summary(self) -> str:
        lines = [
            f"stoker doctor: {self.verdict}-bound"
            + (f" ({self.data_cause})" if self.data_cause else "")
            + f", waiting for data {100 * self.stall:.0f}% of the step time"
        ]
        lines.append(f"  {self.explanation}")
        rows = [
            ("loader alone", self.loader_s),
            ("step alone (cached batch)", self.step_s),
            ("both together", self.together_s),
            ("host -> device copy", self.transfer_s),
        ]
        for name, value in rows:
            if value is not None:
                rate = ""
                if self.batch_size:
                    rate = f"  ({self.batch_size / value:,.0f} samples/s)" if value > 0 else ""
                lines.append(f"  {name:<28} {1e3 * value:9.1f} ms per batch{rate}")
        if self.stages:
            total = sum(self.stages.values()) or 1.0
            shares = ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in self.stages.items())
            lines.append(f"  loader time by stage: {shares}")
        means = self.cpu.get("mean") or {}
        if means:
            cpu = ", ".join(f"{phase} {sum(m) / len(m):.0f}%" for phase, m in means.items() if m)
            lines.append(f"  CPU use (mean of {self.cpu.get('cores')} cores): {cpu}")
        if self.page_cache:
            lines.append(
                f"  data files in the page cache: {100 * self.page_cache['resident']:.0f}% of "
                f"{self.page_cache['bytes'] / 1e6:,.0f} MB"
            )
        if self.recommendations:
            lines.append("  recommendations, by measured gain:")
            for i, r in enumerate(self.recommendations, 1):
                lines.append(f"    {i}. {r}")
        else:
            lines.append("  no change measured to help")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def to_html(self, path: str | os.PathLike) -> str:
        """A self-contained page (plots inline as SVG): the timeline of data wait against step
        time, CPU use per core, and the recommendations. Returns the path."""
        from .report import write_html

        return write_html(self, os.fspath(path))
