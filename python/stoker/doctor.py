"""stoker.diagnose and stoker.watch: what bounds a training job, with numbers.

``diagnose(loader, step)`` runs the seeds' experiments itself:

1. the loader alone (how fast can data come?);
2. the step alone on one cached batch, already on the device (how fast could training go if data
   were free? the seeds' synthetic-data experiment);
3. both together, timing for each step the wait for data and the step itself.

Meanwhile a sampler thread records CPU use per core, and the process's I/O. The verdict follows
from the three rates. For a data-bound job a sub-verdict names the stage: stoker's per-stage
times for an ImageLoader, process counters otherwise. Each recommendation is measured where that
is quick: a sibling loader with more threads or workers, a pack of a few samples resized with
``max_side``, the step under autocast or on a doubled batch, a pinned copy.

``watch(loader)`` observes a real training loop instead, without changing it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile
import threading
import time
from typing import Any, Callable, Iterable, Iterator

VERDICTS = ("data", "compute", "transfer", "balanced")
DATA_CAUSES = ("io", "decode", "augmentation", "python")

# A step this much slower than the loader (or the other way round) decides the verdict.
_MARGIN = 1.2
_STALL = 0.10  # waiting this share of the step time for data means data-bound
_WORTH = 1.10  # a recommendation is made when it measured at least this gain


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


# --- sampling CPU and I/O while the phases run ----------------------------------------------------
class _Sampler:
    """CPU use per core every `interval` seconds, labelled with the phase running."""

    def __init__(self, interval: float = 0.1):
        import psutil

        self._psutil = psutil
        self.interval = interval
        self.phase = "setup"
        self.samples: list[tuple[float, str, list[float]]] = []
        self._stop = threading.Event()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="stoker-doctor-cpu", daemon=True)
        psutil.cpu_percent(percpu=True)  # starts the first interval

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            per_core = self._psutil.cpu_percent(percpu=True)
            self.samples.append((time.perf_counter() - self._t0, self.phase, per_core))

    def __enter__(self) -> "_Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        means: dict[str, list[float]] = {}
        for phase in dict.fromkeys(p for _, p, _ in self.samples):
            rows = [c for _, p, c in self.samples if p == phase]
            means[phase] = [sum(col) / len(rows) for col in zip(*rows)]
        return {"cores": self._psutil.cpu_count(), "samples": self.samples, "mean": means}


def _process_io() -> dict[str, float]:
    """Bytes read and CPU seconds of this process and its children (DataLoader workers)."""
    import psutil

    me = psutil.Process()
    procs = [me] + me.children(recursive=True)
    read = cpu = 0.0
    for p in procs:
        try:
            with p.oneshot():
                read += p.io_counters().read_bytes
                t = p.cpu_times()
                cpu += t.user + t.system
        except (psutil.Error, AttributeError):
            pass
    return {"read_bytes": read, "cpu_s": cpu, "processes": len(procs)}


# --- helpers --------------------------------------------------------------------------------------
def _rate(per_second: float) -> str:
    """3 significant digits: 12.3, 1,230, 12.3k, 1.23M."""
    if per_second >= 1e6:
        return f"{per_second / 1e6:.3g}M"
    if per_second >= 1e4:
        return f"{per_second / 1e3:.3g}k"
    return f"{per_second:,.3g}" if per_second < 1000 else f"{per_second:,.0f}"


def _tensors(batch: Any) -> list:
    import torch

    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [t for v in batch.values() for t in _tensors(v)]
    if isinstance(batch, (list, tuple)):
        return [t for v in batch for t in _tensors(v)]
    return []


def _batch_size(batch: Any) -> int | None:
    tensors = _tensors(batch)
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() > 0 else None


def _map(batch: Any, fn: Callable) -> Any:
    from .device import _map_tensors

    return _map_tensors(batch, fn)


def _synchronize(device: Any) -> None:
    """Wait for the GPU: the batch's device, or any a step started using (a CPU loader whose
    step moves the batch to the GPU)."""
    import torch

    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    elif torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _is_stoker(loader: Any) -> bool:
    from .loader import ImageLoader

    return isinstance(loader, ImageLoader)


def _is_dataloader(loader: Any) -> bool:
    try:
        from torch.utils.data import DataLoader
    except ImportError:
        return False
    return isinstance(loader, DataLoader)


def _passes(loader: Iterable[Any]) -> Iterator[Any]:
    """The loader's batches, pass after pass: a phase may need more batches than one pass has."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            return


def _time_loader(loader: Any, batches: int, warmup: int) -> tuple[float, int, Any]:
    """Seconds per batch over `batches` after `warmup`, samples per batch, and the first batch."""
    it = _passes(loader)
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


# --- diagnose -------------------------------------------------------------------------------------
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
    stoker_loader = loader if _is_stoker(loader) else None
    stats0 = stoker_loader.stats() if stoker_loader is not None else None

    with _Sampler() as sampler:
        # Phase 1: the loader alone.
        sampler.phase = "loader alone"
        io0 = _process_io()
        loader_s, batch_size, first = _time_loader(loader, steps, warmup)
        io1 = _process_io()
        stats1 = stoker_loader.stats() if stoker_loader is not None else None

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
        it = _passes(loader)
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
        stages, cause, cause_why = _data_cause(loader, stats0, stats1, io0, io1, loader_s, steps)
        if verdict == "data":
            explanation += " " + cause_why
        recommendations: list[Recommendation] = []
        if measure_recommendations:
            recommendations = _recommend(
                loader, step, verdict, cause, cached, first, device, loader_s, step_s,
                batch_size, steps, warmup,
            )  # fmt: skip
        recommendations.sort(key=lambda r: -(r.gain or 0.0))

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
        page_cache=_page_cache(loader),
        gpu=_gpu_info(device),
        recommendations=recommendations,
        explanation=explanation,
        source="diagnose",
    )


def _verdict(
    loader_s: float, step_s: float, transfer_s: float | None, stall: float
) -> tuple[str, str]:
    loader_s, step_s = max(loader_s, 1e-9), max(step_s, 1e-9)  # a step may do nothing
    data_rate, step_rate = 1 / loader_s, 1 / step_s
    if stall > _STALL or loader_s > _MARGIN * step_s:
        if transfer_s is not None and transfer_s > 0.5 * max(loader_s, step_s):
            return "transfer", (
                f"copying a batch to the device takes {1e3 * transfer_s:.1f} ms, against "
                f"{1e3 * step_s:.1f} ms of compute: the copy is the bottleneck."
            )
        return "data", (
            f"the loader alone makes {_rate(data_rate)} batches/s, the step alone could take "
            f"{_rate(step_rate)}/s: training waits for data."
        )
    if step_s > _MARGIN * loader_s:
        return "compute", (
            f"the step ({_rate(step_rate)}/s) is slower than the loader ({_rate(data_rate)} "
            "batches/s) and rarely waits: faster data would not help."
        )
    return "balanced", (
        f"loader ({_rate(data_rate)} batches/s) and step ({_rate(step_rate)}/s) are within "
        f"{int(100 * (_MARGIN - 1))}% of each other: both bound the job."
    )


def _data_cause(loader, stats0, stats1, io0, io1, loader_s, steps):
    """(stages, cause, why): for stoker from the engine's stage times, else from counters."""
    if stats0 is not None and stats1 is not None:
        seconds = {
            k: stats1["seconds"][k] - stats0["seconds"][k]
            for k in ("read", "decode", "transform", "collate")
        }
        batches = max(1, stats1["batches"] - stats0["batches"])
        stages = {k: v / batches for k, v in seconds.items()}
        worker_s = sum(seconds.values())
        threads = max(1, stats1.get("threads", 1))
        # The workers' time per batch, spread over the threads, against the time a batch took:
        # far below it, the engine was not what the training loop waited for.
        engine_share = (worker_s / batches / threads) / loader_s if loader_s > 0 else 1.0
        if engine_share < 0.5:
            return (
                stages,
                "python",
                (
                    f"stoker's workers were busy only {100 * engine_share:.0f}% of the time: the "
                    "time goes outside the engine (the Python loop, a wrapper, the device feed)."
                ),
            )
        names = {"read": "io", "decode": "decode", "transform": "augmentation"}
        top = max(("read", "decode", "transform"), key=lambda k: seconds[k])
        share = seconds[top] / worker_s if worker_s > 0 else 0.0
        what = {
            "io": "reading the shards",
            "decode": "decoding images",
            "augmentation": "cropping and resizing (augmentation)",
        }[names[top]]
        return (
            stages,
            names[top],
            f"stoker's workers spend {100 * share:.0f}% of their time {what}.",
        )
    wall = loader_s * (steps + 0.0)
    cpu = io1["cpu_s"] - io0["cpu_s"]
    read = io1["read_bytes"] - io0["read_bytes"]
    workers = getattr(loader, "num_workers", None)
    stages = {"cpu_s_per_batch": cpu / steps, "read_mb_per_batch": read / steps / 1e6}
    if workers == 0:
        return (
            stages,
            "python",
            (
                "the DataLoader has num_workers=0: loading and transforms run one sample at a time "
                "in the training process's Python thread."
            ),
        )
    procs = max(1, io1["processes"] - 1)
    busy = cpu / (wall * procs) if wall > 0 else 0.0
    if busy > 0.6:
        return (
            stages,
            "decode",
            (
                f"the loader's {procs} worker process(es) are {100 * busy:.0f}% busy on the CPU: "
                "decoding and transforms (counters cannot tell them apart)."
            ),
        )
    if read > 0:
        return (
            stages,
            "io",
            (
                f"the loader's processes are only {100 * busy:.0f}% busy on the CPU while reading "
                f"{read / wall / 1e6:.0f} MB/s: they wait for storage."
            ),
        )
    return (
        stages,
        "python",
        (
            f"the loader's processes are {100 * busy:.0f}% busy and read nothing from storage: the "
            "time goes to inter-process transfer and Python overhead."
        ),
    )


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


def _page_cache(loader: Any) -> dict[str, Any] | None:
    dataset = getattr(loader, "dataset", None)
    page_cache = getattr(dataset, "page_cache", None)
    if not callable(page_cache):
        return None
    shards = page_cache()
    total = sum(b for _, b, _ in shards)
    resident = sum(r for _, _, r in shards)
    return {"files": len(shards), "bytes": total, "resident": resident / total if total else 0.0}


def _gpu_info(device: Any) -> dict[str, Any] | None:
    import torch

    if device is None or torch.device(device).type != "cuda":
        return None
    info: dict[str, Any] = {
        "name": torch.cuda.get_device_name(device),
        "max_memory_allocated": torch.cuda.max_memory_allocated(device),
    }
    try:
        info["utilization"] = torch.cuda.utilization(device)  # NVML, via pynvml
    except Exception as e:  # pynvml missing or NVML unavailable
        info["utilization"] = None
        info["nvml"] = str(e)
    return info


# --- recommendations ------------------------------------------------------------------------------
def _recommend(
    loader, step, verdict, cause, cached, first, device, loader_s, step_s, batch_size, steps,
    warmup,
) -> list[Recommendation]:  # fmt: skip
    out: list[Recommendation] = []
    short = max(5, min(steps, 15))
    if verdict in ("data", "balanced"):
        if _is_dataloader(loader):
            out += _more_workers(loader, loader_s, short)
        elif _is_stoker(loader):
            out += _more_threads(loader, loader_s, short, io_bound=cause == "io")
            if cause in ("decode", "augmentation"):
                out += _max_side(loader, loader_s, short)
    if verdict == "transfer" and device is not None:
        host = [t for t in _tensors(first) if t.device.type == "cpu"]
        if host and not all(t.is_pinned() for t in host):
            pageable = _time_copy(host, device, pinned=False)
            pinned = _time_copy(host, device, pinned=True)
            out.append(Recommendation(
                "pin_memory",
                "copy from pinned memory on a side stream: ImageLoader(device='cuda') or "
                "stoker.to_device(loader, 'cuda'), or DataLoader(pin_memory=True)",
                pageable / pinned,
                f"copy of one batch {1e3 * pageable:.1f} ms pageable, {1e3 * pinned:.1f} ms pinned",
            ))  # fmt: skip
    if verdict in ("compute", "balanced"):
        out += _amp(step, cached, device, step_s, short)
        out += _larger_batch(step, cached, device, step_s, short)
    return [r for r in out if r.gain is not None and r.gain >= _WORTH]  # failed trials too


def _more_workers(loader, loader_s: float, batches: int) -> list[Recommendation]:
    from torch.utils.data import DataLoader

    from .bench import default_threads

    current = loader.num_workers
    cores = default_threads()
    candidates = sorted({c for c in (2, 4, 8, cores) if current < c <= max(2, cores)})
    if loader.batch_sampler is None:  # an IterableDataset, or batch_size=None: not rebuilt here
        return []
    best = None
    for workers in candidates:
        trial = DataLoader(
            loader.dataset,
            batch_sampler=loader.batch_sampler,
            num_workers=workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
        )
        try:
            seconds, _, _ = _time_loader(trial, batches, warmup=2)
        except Exception:  # a dataset that cannot go to worker processes: no measurement
            return []
        if best is None or seconds < best[1]:
            best = (workers, seconds)
        del trial
    if best is None:
        return []
    workers, seconds = best
    return [Recommendation(
        "workers",
        f"raise DataLoader num_workers from {current} to {workers}",
        loader_s / seconds,
        f"loader alone {_rate(1 / loader_s)} -> {_rate(1 / seconds)} batches/s",
    )]  # fmt: skip


def _sibling(loader, **changes):
    from .loader import ImageLoader

    kwargs = dict(loader._init_kwargs)
    # A trial must not write the user's quarantine report, nor warn about samples again.
    kwargs.update(quarantine=None, on_error="skip" if kwargs["on_error"] != "raise" else "raise")
    kwargs.update(changes)
    kwargs["device"] = None  # the experiments time the host pipeline
    for k in ("dtype", "mean", "std"):
        kwargs[k] = None
    return ImageLoader(**kwargs)


def _more_threads(loader, loader_s: float, batches: int, io_bound: bool) -> list[Recommendation]:
    """A sibling loader with a thread per core; for reads that wait on storage, with twice as
    many threads as now (threads blocked in a read use no CPU)."""
    from .bench import default_threads

    cores = default_threads()
    threads = loader._engine.max_threads
    target = max(2 * threads, cores) if io_bound else cores
    if threads >= target:
        return []
    trial = _sibling(loader, threads=target, cpu_budget=None)
    try:
        seconds, _, _ = _time_loader(trial, batches, warmup=2)
    finally:
        trial.close()
    if io_bound:
        text = f"more threads than cores, as reads wait on storage: threads={target}"
    elif loader.autotune:
        text = f"let stoker use every core: cpu_budget={target}"
    else:
        text = f"let stoker use every core: threads={target}"
    return [Recommendation(
        "threads", f"{text} (now {threads})", loader_s / seconds,
        f"loader alone {_rate(1 / loader_s)} -> {_rate(1 / seconds)} batches/s",
    )]  # fmt: skip


def _max_side(loader, loader_s: float, batches: int) -> list[Recommendation]:
    """Pack a few samples twice, as they are and resized with max_side, and time both."""
    from . import _core
    from .packer import pack

    dataset = loader.dataset
    size = loader.size
    side = math.ceil(size * 256 / 224 * 1.15)  # enough for RandomResizedCrop and Resize+Crop
    n = min(len(dataset), max(64, loader.batch_size * 2))
    large = 0
    samples = []
    for i in range(n):
        data = dataset.read(i)
        info = _core.image_info(data)
        if min(info["width"], info["height"]) > 1.5 * side:
            large += 1
        samples.append((data, dataset.record(i)))
    if large < n // 2:
        return []
    tmp = tempfile.mkdtemp(prefix="stoker-doctor-")
    try:
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        lines = []
        for i, (data, record) in enumerate(samples):
            path = os.path.join(src, f"{i:06d}.{record['format']}")
            with open(path, "wb") as f:
                f.write(data)
            lines.append(f"{path},{record['label']}\n")
        with open(os.path.join(tmp, "list.csv"), "w") as f:
            f.writelines(lines)
        times = {}
        for name, max_side in (("as packed", None), ("resized", side)):
            out = os.path.join(tmp, name.replace(" ", "_"))
            pack(os.path.join(tmp, "list.csv"), out, max_side=max_side, progress=False)
            trial = _sibling(loader, path=out, threads=loader._engine.max_threads, cpu_budget=None)
            try:
                per_batch, _, _ = _time_loader(trial, batches, warmup=1)
            finally:
                trial.close()
            times[name] = per_batch
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gain = times["as packed"] / times["resized"]
    return [Recommendation(
        "max_side",
        f"repack with max_side={side} (stoker pack --max-side {side}): most images are over "
        f"{1.5 * side:.0f} px on their short side",
        gain,
        f"{n} samples packed both ways: {1e3 * times['as packed']:.1f} -> "
        f"{1e3 * times['resized']:.1f} ms per batch",
    )]  # fmt: skip


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


def _amp(step, cached, device, step_s: float, steps: int) -> list[Recommendation]:
    import torch

    device_type = torch.device(device).type if device is not None else "cpu"
    dtype = torch.bfloat16
    if device_type == "cuda" and not torch.cuda.is_bf16_supported():
        dtype = torch.float16
    try:
        amp_s = _time_step(
            step, cached, device, steps, lambda: torch.autocast(device_type, dtype=dtype)
        )
    except Exception as e:  # a step that cannot run under autocast
        return [Recommendation("amp", "mixed precision (torch.autocast)", None, f"failed: {e}")]
    name = str(dtype).replace("torch.", "")
    return [Recommendation(
        "amp", f"mixed precision: torch.autocast('{device_type}', dtype=torch.{name})",
        step_s / amp_s, f"step {1e3 * step_s:.1f} -> {1e3 * amp_s:.1f} ms",
    )]  # fmt: skip


def _larger_batch(step, cached, device, step_s: float, steps: int) -> list[Recommendation]:
    import torch

    tensors = _tensors(cached)
    if not tensors or tensors[0].dim() == 0:
        return []
    size = int(tensors[0].shape[0])
    try:
        doubled = _map(cached, lambda t: torch.cat([t, t]) if t.dim() > 0 else t)
        double_s = _time_step(step, doubled, device, steps)
    except Exception as e:  # out of memory, or a step tied to its batch size
        return [Recommendation("batch_size", f"batch size {2 * size}", None, f"failed: {e}")]
    gain = 2 * step_s / double_s  # samples per second, doubled batch against this one
    return [Recommendation(
        "batch_size", f"a larger batch: {2 * size} instead of {size} (scale the learning rate)",
        gain, f"{size / step_s:,.0f} -> {2 * size / double_s:,.0f} samples/s in the step",
    )]  # fmt: skip


# --- watch ----------------------------------------------------------------------------------------
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
        self.timeline: list[tuple[float, float]] = []
        self.diagnosis: Diagnosis | None = None
        self._sampler: _Sampler | None = None
        self._batch_size: int | None = None

    def __enter__(self) -> "watch":
        self._stats0 = self.loader.stats() if _is_stoker(self.loader) else None
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
        stats1 = self.loader.stats() if self._stats0 is not None else None
        stages, cause, cause_why = _data_cause(
            self.loader, self._stats0, stats1, self._io0, io1, (wait + busy) / max(n, 1), max(n, 1)
        )
        if verdict == "data":
            why += " " + cause_why
        recommendations = []
        if verdict == "data":
            knob = "threads (or cpu_budget)" if _is_stoker(self.loader) else "num_workers"
            recommendations.append(Recommendation(
                "workers", f"raise the loader's {knob}; stoker.diagnose measures the gain", None,
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
            page_cache=_page_cache(self.loader),
            gpu=None,
            recommendations=recommendations,
            explanation=why,
            source="watch",
        )


# --- the built-in model of `stoker doctor` --------------------------------------------------------
def builtin_step(model: str, num_classes: int, device: Any) -> Callable[[Any], None]:
    """A training step (SGD, cross-entropy) of a small CNN, for diagnosing without user code:
    "tiny" is 3 stride-2 convolutions; "small" 8 convolutions at ResNet-18's widths."""
    import torch
    import torch.nn as nn

    widths = {"tiny": [16, 32, 64], "small": [64, 64, 128, 128, 256, 256, 512, 512]}[model]
    layers, cin = [], 3
    for i, w in enumerate(widths):
        stride = 2 if model == "tiny" or i % 2 == 0 else 1
        layers += [nn.Conv2d(cin, w, 3, stride=stride, padding=1, bias=False),
                   nn.BatchNorm2d(w), nn.ReLU(inplace=True)]  # fmt: skip
        cin = w
    net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))
    net = net.to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def step(batch: Any) -> None:
        images, labels = batch[0], batch[1]
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if images.dtype == torch.uint8:
            images = images.float().div_(255)
        loss = nn.functional.cross_entropy(net(images.to(next(net.parameters()).dtype)), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step
