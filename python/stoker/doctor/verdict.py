"""From the three rates to a verdict, and for a data-bound job to the stage that bounds it."""

from __future__ import annotations

from .adapters import adapter_for
from .measure import _rate

# A step this much slower than the loader (or the other way round) decides the verdict.
_MARGIN = 1.2
_STALL = 0.10  # waiting this share of the step time for data means data-bound


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


def _device_stage_share(stats0, stats1, loader_s) -> tuple[float, float] | None:
    """decode="gpu"/"auto": the device stage thread's busy seconds per batch, and their share
    of a batch's time; None without one."""
    now = (stats1.get("device") or {}).get("stage_thread")
    if now is None or loader_s <= 0:
        return None
    before = (stats0.get("device") or {}).get("stage_thread") or {"jobs": 0, "busy_s": 0.0}
    jobs = now["jobs"] - before["jobs"]
    if jobs <= 0:
        return None
    per_batch = (now["busy_s"] - before["busy_s"]) / jobs
    return per_batch, per_batch / loader_s


def _data_cause(loader, stats0, stats1, io0, io1, loader_s, steps):
    """(stages, cause, why): from the loader's own stage times where its adapter gave them
    (stats0, stats1: stoker's), else from the process's counters. `loader`: a loader or its
    adapter."""
    if stats0 is not None and stats1 is not None:
        seconds = {
            k: stats1["seconds"][k] - stats0["seconds"][k]
            for k in ("read", "decode", "transform", "collate")
        }
        batches = max(1, stats1["batches"] - stats0["batches"])
        stages = {k: v / batches for k, v in seconds.items()}
        worker_s = sum(seconds.values())
        if "map" in stats1["seconds"]:
            # map= runs per sample in Python, batch after batch, in the loader's own thread:
            # its share of a batch's time is taken from the whole batch, not the workers'.
            map_s = (stats1["seconds"]["map"] - stats0["seconds"].get("map", 0.0)) / batches
            stages["map"] = map_s
            if loader_s > 0 and map_s / loader_s > 0.3:
                return (
                    stages,
                    "map",
                    (
                        f"the map= stage (per-sample Python) takes {1e3 * map_s:.1f} ms of each "
                        f"batch's {1e3 * loader_s:.1f} ms: the data waits on it."
                    ),
                )
        device_stage = _device_stage_share(stats0, stats1, loader_s)
        if device_stage is not None and device_stage[1] > 0.5:
            stages["device_decode"] = device_stage[0]
            return (
                stages,
                "decode",
                (
                    f"the GPU decode stage's thread is busy {100 * device_stage[1]:.0f}% of each "
                    f"batch's {1e3 * loader_s:.1f} ms (decode='gpu'/'auto'): decoding on the "
                    "device bounds the data."
                ),
            )
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
    workers = adapter_for(loader).workers
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
