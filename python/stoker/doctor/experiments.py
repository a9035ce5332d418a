"""The recommendations, each measured where that is quick: a sibling loader with more threads
or workers, a pack of a few samples resized with ``max_side``, the step under autocast or on a
doubled batch.

Which of the data experiments a loader can run, and how its trial loaders are built, its adapter
says (adapters.py); which of them a diagnosis runs follows from the stage that bounds it."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from typing import Any

from ..machine import usable_cores
from .adapters import (
    DECODE,
    MAP,
    REPACK,
    REMOTE,
    RESIDENT,
    THREADS,
    WORKERS,
    DataLoaderAdapter,
    StokerLoaderAdapter,
    adapter_for,
)
from .measure import _map, _rate, _tensors, _time_copy, _time_loader, _time_step
from .result import Recommendation

_WORTH = 1.10  # a recommendation is made when it measured at least this gain


def _recommend(
    loader, step, verdict, cause, cached, first, device, loader_s, step_s, batch_size, steps,
    warmup,
) -> tuple[list[Recommendation], list[str]]:  # fmt: skip
    """The changes that measured a gain of at least _WORTH, the largest gain first; and notes
    on what was measured and would not help. `loader`: a loader or its adapter."""
    out: list[Recommendation] = []
    notes: list[str] = []
    short = max(5, min(steps, 15))
    if verdict in ("data", "balanced"):
        adapter = adapter_for(loader)
        can = adapter.experiments
        if WORKERS in can:
            out += _more_workers(adapter, loader_s, short)
        if THREADS in can:
            out += _more_threads(adapter, loader_s, short, io_bound=cause == "io")
        if REPACK in can and cause in ("decode", "augmentation"):
            out += _repack(adapter, short)
        if DECODE in can and cause == "decode":
            found, why = _device_decode(adapter, loader_s, short)
            out += found
            notes += why
        if MAP in can and cause == "map":
            out += _without_map(adapter, loader_s, short)
        if RESIDENT in can:
            out += _resident(adapter, loader_s, short)
        if REMOTE in can and step_s:
            out += _remote_workers(adapter, loader_s, step_s)
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
    kept = [r for r in out if r.gain is not None and r.gain >= _WORTH]  # failed trials too
    return sorted(kept, key=lambda r: -(r.gain or 0.0)), notes


def _more_workers(loader, loader_s: float, batches: int) -> list[Recommendation]:
    """Sibling DataLoaders with 2, 4, 8 or as many workers as cores: the fastest."""
    adapter = adapter_for(loader, DataLoaderAdapter)
    current = adapter.workers
    cores = usable_cores()
    candidates = sorted({c for c in (2, 4, 8, cores) if current < c <= max(2, cores)})
    if not adapter.rebuildable:
        return []
    best = None
    for workers in candidates:
        with adapter.trying(num_workers=workers) as trial:
            try:
                seconds, _, _ = _time_loader(trial, batches, warmup=2)
            except Exception:  # a dataset that cannot go to worker processes: no measurement
                return []
        if best is None or seconds < best[1]:
            best = (workers, seconds)
    if best is None:
        return []
    workers, seconds = best
    return [Recommendation(
        "workers",
        f"raise DataLoader num_workers from {current} to {workers}",
        loader_s / seconds,
        f"loader alone {_rate(1 / loader_s)} -> {_rate(1 / seconds)} batches/s",
    )]  # fmt: skip


def _remote_workers(adapter, loader_s: float, step_s: float) -> list[Recommendation]:
    """How many remote workers would feed the step (its rate over one worker's) and what
    network that takes (a batch's bytes times the step's batches/s): sized, not tried. One
    worker's rate is its workers' own (remote_workers=), else this loader's (a worker with its
    threads). Only where this machine's cores are spent: otherwise more threads here come
    first."""
    if loader_s <= step_s * _WORTH:
        return []
    batch = adapter.batch_size
    made = adapter.worker_rate()
    if made is not None:
        per_worker, threads = made
        basis = f"each of its workers makes {per_worker:,.0f} samples/s"
    else:
        threads = max(1, adapter.threads)
        if threads < usable_cores() - 1:
            return []
        per_worker = batch / loader_s
        basis = f"a worker of {threads} threads as fast as this loader, {per_worker:,.0f}/s"
    needed = batch / step_s  # samples/s the step takes
    count = max(1, math.ceil(needed / per_worker))
    network = adapter.batch_bytes * needed / batch  # bytes/s into this machine
    return [Recommendation(
        "remote_workers",
        f"feed it from {count} remote workers on CPU machines: remote_workers="
        f"stoker.RayWorkers({count}, threads={threads}) (docs/DISTRIBUTED.md); they send "
        f"{network / 1e6:,.0f} MB/s ({8 * network / 1e9:.1f} Gbit/s) to this machine",
        loader_s / step_s,
        f"sized, not tried: the step takes {needed:,.0f} samples/s, {basis}",
    )]  # fmt: skip


def _sibling(loader, **changes):
    """`loader` rebuilt with `changes`, as the experiments' trial loaders are (by its
    adapter)."""
    return adapter_for(loader).trial(**changes)


def _device_decode(loader, loader_s: float, batches: int) -> tuple[list[Recommendation], list[str]]:
    """For a decode-bound stoker loader whose batches go to a device: the same loader with its
    Image field's other decode modes ("host", "gpu", "auto": the two it does not use), each
    timed alone as the loader was. A recommendation where one gains; otherwise a note with the
    figures saying the change would not help, or why the GPU decoder cannot run here."""
    from ..errors import DeviceUnavailableError

    adapter = adapter_for(loader, StokerLoaderAdapter)
    if adapter.device is None:
        return [], []  # host batches: the device decoder writes into device batches
    if adapter.image is None:
        return [], []
    _, current = adapter.image
    seconds: dict[str, float] = {}
    for mode in ("host", "gpu", "auto"):
        if mode == current:
            continue
        try:
            trial = adapter.decode_trial(mode)
        except DeviceUnavailableError as e:
            if mode == "host":
                raise  # decode="host" needs no device decoder: not this error
            return [], [f"decode='gpu' could not be tried: {e}"]
        try:
            seconds[mode], _, _ = _time_loader(trial, batches, warmup=2)
        finally:
            trial.close()
    if not seconds:
        return [], []
    best = min(seconds, key=lambda m: seconds[m])
    gain = loader_s / seconds[best]
    measured = f"loader alone: decode={current!r} {_rate(1 / loader_s)} batches/s, " + ", ".join(
        f"decode={m!r} {_rate(1 / s)}" for m, s in seconds.items()
    )
    if gain >= _WORTH:
        text = {"auto": f"decode images on the GPU as well: decode={best!r}",
                "gpu": f"decode images on the GPU: decode={best!r}",
                "host": f"decode images on the host's threads: decode={best!r}"}[best]  # fmt: skip
        return [Recommendation("decode", text, gain, measured)], []
    if current == "host":
        return [], [f"Decoding on the GPU would not help this job ({measured})."]
    return [], [f"Another decode mode would not help this job ({measured})."]


def _more_threads(loader, loader_s: float, batches: int, io_bound: bool) -> list[Recommendation]:
    """A sibling loader with a thread per core; for reads that wait on storage, with twice as
    many threads as now (threads blocked in a read use no CPU)."""
    adapter = adapter_for(loader, StokerLoaderAdapter)
    cores = usable_cores()
    threads = adapter.threads
    target = max(2 * threads, cores) if io_bound else cores
    if threads >= target:
        return []
    with adapter.trying(threads=target, cpu_budget=None) as trial:
        seconds, _, _ = _time_loader(trial, batches, warmup=2)
    if io_bound:
        text = f"more threads than cores, as reads wait on storage: threads={target}"
    elif adapter.autotune:
        text = f"let stoker use every core: cpu_budget={target}"
    else:
        text = f"let stoker use every core: threads={target}"
    return [Recommendation(
        "threads", f"{text} (now {threads})", loader_s / seconds,
        f"loader alone {_rate(1 / loader_s)} -> {_rate(1 / seconds)} batches/s",
    )]  # fmt: skip


def _without_map(loader, loader_s: float, batches: int) -> list[Recommendation]:
    """The same loader without its map= stage: what moving that work into stoker's batch ops
    (stoker.augment, run by the engine or on the GPU) could save at most."""
    with adapter_for(loader).trying(map=None, map_threads=None) as trial:
        seconds, _, _ = _time_loader(trial, batches, warmup=2)
    return [Recommendation(
        "map",
        "do the map= stage's work with stoker.augment's batch ops (augment=[...]: ColorJitter, "
        "RandAugment, RandomErasing, MixUp..., on the GPU with device='cuda') or in the fields' "
        "geometry; this is the loader without the stage",
        loader_s / seconds,
        f"loader alone {_rate(1 / loader_s)} -> {_rate(1 / seconds)} batches/s",
    )]  # fmt: skip


def _repack(loader, batches: int) -> list[Recommendation]:
    """Pack a few samples as they are, resized with max_side (when most are large) and as raw
    pixels (``codec="raw"``, at that side), and time each: what a repack of the whole pack
    would gain, and what the raw pixels would cost on disk."""
    from .. import _core
    from ..packing import pack

    adapter = adapter_for(loader, StokerLoaderAdapter)
    dataset = adapter.dataset
    side = math.ceil(adapter.size * 256 / 224 * 1.15)  # for RandomResizedCrop and Resize+Crop
    n = min(len(dataset), max(64, adapter.batch_size * 2))
    large = 0
    samples = []
    for i in range(n):
        record = dataset.record(i)
        if record.get("format") not in ("jpg", "jpeg", "png", "webp"):
            return []  # raw pixels already, or not an image pack
        data = dataset.read(i)
        info = _core.image_info(data)
        if min(info["width"], info["height"]) > 1.5 * side:
            large += 1
        samples.append((data, record))
    shrink = large >= n // 2
    tmp = tempfile.mkdtemp(prefix="stoker-doctor-")
    try:
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        lines = []
        for i, (data, record) in enumerate(samples):
            path = os.path.join(src, f"{i:06d}.{record['format']}")
            with open(path, "wb") as image_file:
                image_file.write(data)
            lines.append(f"{path},{record['label']}\n")
        with open(os.path.join(tmp, "list.csv"), "w") as listing:
            listing.writelines(lines)
        ways: dict[str, dict[str, Any]] = {"as packed": dict(max_side=None)}
        if shrink:  # re-encoded at quality 90 once shrunk: a lossy trade, as FFCV's writer's
            ways["resized"] = dict(max_side=side, quality=90)
        else:  # FFCV's trade without the shrinking: every image a JPEG at quality 90
            ways["jpeg"] = dict(codec="jpeg", quality=90)
        ways["raw"] = dict(max_side=side if shrink else None, codec="raw")
        times, disk, folders = {}, {}, {}
        for name, options in ways.items():
            folders[name] = folder = os.path.join(tmp, name.replace(" ", "_"))
            disk[name] = pack(
                os.path.join(tmp, "list.csv"), folder, progress=False, **options
            ).bytes
            with adapter.trying(path=folder, threads=adapter.threads, cpu_budget=None) as trial:
                per_batch, _, _ = _time_loader(trial, batches, warmup=1)
            times[name] = per_batch
        lossy = "resized" if shrink else "jpeg"
        psnr = _fidelity(adapter, folders["as packed"], folders[lossy])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out: list[Recommendation] = []
    before = times["as packed"]
    fidelity = f"lossy: {psnr:.1f} dB PSNR against the pack as it is, on the same crops"
    if shrink:
        out.append(Recommendation(
            "max_side",
            f"repack with max_side={side} (stoker pack --max-side {side} --quality 90): most "
            f"images are over {1.5 * side:.0f} px on their short side; {fidelity}",
            before / times["resized"],
            f"{n} samples packed both ways: {1e3 * before:.1f} -> "
            f"{1e3 * times['resized']:.1f} ms per batch; {psnr:.1f} dB",
        ))  # fmt: skip
    elif before / times["jpeg"] > 1.1:
        out.append(Recommendation(
            "jpeg",
            f"repack every image as a JPEG at quality 90 (stoker pack --codec jpeg --quality 90, "
            f"FFCV's trade); {fidelity}",
            before / times["jpeg"],
            f"{n} samples packed both ways: {1e3 * before:.1f} -> "
            f"{1e3 * times['jpeg']:.1f} ms per batch; {psnr:.1f} dB; "
            f"{disk['as packed'] / n / 1e3:.1f} -> {disk['jpeg'] / n / 1e3:.1f} kB per sample",
        ))  # fmt: skip
    cost = disk["raw"] / max(1, disk["as packed"])
    whole = cost * sum(int(f["bytes"]) for s in range(dataset.num_shards)
                       for f in dataset.shard_files(s))  # fmt: skip
    flag = f" --max-side {side}" if shrink else ""
    out.append(Recommendation(
        "raw",
        f"repack as decoded pixels, read without decoding (stoker pack --codec raw{flag}): "
        f"{cost:.1f}x the disk, about {whole / 2**30:.1f} GiB for the whole pack",
        before / times["raw"],
        f"{n} samples: {1e3 * before:.1f} ms per batch as packed, {1e3 * times['raw']:.1f} raw; "
        f"{disk['as packed'] / n / 1e3:.1f} -> {disk['raw'] / n / 1e3:.1f} kB per sample",
    ))  # fmt: skip
    return out


def _fidelity(loader, packed: str, repacked: str) -> float:
    """PSNR (dB) of a repacked copy's first batch against the same samples as packed, both
    through the loader's evaluation geometry (the same crops of the same images): what a lossy
    repack changes in what the model sees."""
    import torch

    adapter = adapter_for(loader)
    batches = []
    for folder in (packed, repacked):
        with adapter.trying(path=folder, train=False, augment=None, map=None) as trial:
            images = next(iter(trial))[0]
            batches.append(images.to(torch.float64))
    mse = float(((batches[0] - batches[1]) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _resident(loader, loader_s: float, batches: int) -> list[Recommendation]:
    """A sibling loader holding the dataset in host memory, when it fits and is not there yet:
    what reading from memory instead of the files gains."""
    from ..load.stages import resident as held

    adapter = adapter_for(loader, StokerLoaderAdapter)
    if adapter.resident or adapter.remote:
        return []
    needed = int(adapter.dataset.resident_bytes)
    available, total = held.host_memory()
    margin = max(held.MARGIN_MIN, int(held.MARGIN_FRACTION * total))
    if needed > available - margin:
        return []
    with adapter.trying(resident=True, threads=adapter.threads, cpu_budget=None) as trial:
        seconds, _, _ = _time_loader(trial, batches, warmup=2)
    arrays = _holds_arrays(adapter.dataset)
    gpu = " (with device='cuda', an array pack is held on the GPU)" if arrays else ""
    return [Recommendation(
        "resident",
        f"hold the dataset in memory: resident=True{gpu}; it takes {needed / 2**30:.2f} GiB of "
        f"the {available / 2**30:.1f} GiB available",
        loader_s / seconds,
        f"loader alone {_rate(1 / loader_s)} -> {_rate(1 / seconds)} batches/s",
    )]  # fmt: skip


def _holds_arrays(dataset) -> bool:
    import json

    manifest = os.path.join(str(dataset.path), "manifest.json")
    try:
        with open(manifest, encoding="utf-8") as f:
            return json.load(f).get("format") == "stoker-arrays"
    except (OSError, ValueError):
        return False


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
