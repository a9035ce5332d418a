"""What the machine shows while the phases run: CPU use per core, the process's I/O, the page
cache and the GPU."""

from __future__ import annotations

import threading
import time
from typing import Any


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


def _page_cache(dataset: Any) -> dict[str, Any] | None:
    """How much of the dataset's files the page cache holds, for one that can tell (a pack)."""
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
