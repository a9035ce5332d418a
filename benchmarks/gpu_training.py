"""Training throughput on one GPU, fed every way (issue 32): how close each feed gets a real model
to the rate it trains at on data already on the GPU.

    python benchmarks/gpu_training.py --data /tmp/imagenet-like/train.csv
    python benchmarks/gpu_training.py --data train.csv --models resnet50 --markdown gpu.md

`--data`: a CSV of path,label (gpu-kit's mkdata.py writes one) or an ImageFolder tree; it is packed
with stoker.pack once (under --work). Every feed gives bfloat16 [256, 3, 224, 224] channels_last
batches on the GPU, normalised with ImageNet's mean and std, from RandomResizedCrop(224) + flip:
- synthetic: one such batch, already on the GPU (the model's own rate);
- stoker host: ImageLoader(device="cuda"), decoding on 4, 6 and all-but-one threads;
- stoker decode="gpu" with 2 and 4 threads; decode="auto" with all-but-one threads;
- DataLoader + PIL (torchvision's ImageFolder transforms in worker processes, pin_memory) with 6
  and all-but-one workers: the seed notes' path;
- DataLoader (6 workers reading the files' bytes) + torchvision.io.decode_jpeg(device="cuda") on
  the batch, then per-image RandomResizedCrop and flip on the GPU: torchvision's GPU path.
Each model (ResNet-50 and ResNet-18 from torchvision, bf16 autocast, channels_last, SGD) trains
--steps steps after --warmup on each feed: img/s, its share of the synthetic rate, the share of
the time the loop waited for data. Every feed is also timed alone (no model), and nvImageCodec's
own whole-image rate on the same files (batches of 256 in memory, its hardware backend only and
its default backends) is measured in the same run: the engines' limit. docs/GPU.md and the README
quote the tables.

`--smoke` runs the harness on the CPU with a tiny model and the feeds that need no GPU (CI's check
that the script works; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

import stoker

BATCH = 256
SIZE = 224


# --- feeds ---------------------------------------------------------------------------------------
Feed = Callable[[], Iterable[Any]]


def endless(make: Feed) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches from `make()`'s passes, one after another."""
    while True:
        for batch in make():
            yield batch[0], batch[1]


def stoker_feed(pack: Path, device: str, **options: Any) -> Feed:
    loader = stoker.ImageLoader(
        pack, batch_size=BATCH, size=SIZE, train=True, device=device, dtype=torch.bfloat16,
        mean=stoker.IMAGENET_MEAN, std=stoker.IMAGENET_STD, drop_last=True, **options,
    )  # fmt: skip

    def make() -> Iterable[Any]:
        return loader

    make.loader = loader  # type: ignore[attr-defined]  # its stats() after the feed is timed
    return make


def stage_figures(make: Feed, before: dict[str, Any] | None) -> dict[str, float] | None:
    """decode="gpu"/"auto": the stage thread's host time a batch (wall and CPU) since `before`
    (the loader's stats() then), the training thread's waits for it, and the decode split."""
    loader = getattr(make, "loader", None)
    if loader is None:
        return None
    now = loader.stats()
    stage = now.get("device", {}).get("stage_thread")
    if stage is None:
        return None
    old = (before or {}).get("device", {}).get("stage_thread") or {"jobs": 0, "busy_s": 0.0,
                                                                     "cpu_s": 0.0}  # fmt: skip
    jobs = max(1, stage["jobs"] - old["jobs"])
    decode = now.get("decode", {})
    return {
        "stage_busy_ms": 1e3 * (stage["busy_s"] - old["busy_s"]) / jobs,
        "stage_cpu_ms": 1e3 * (stage["cpu_s"] - old["cpu_s"]) / jobs,
        "stage_wait_s": now["device"].get("stage_wait_s", 0.0),
        "device_images": decode.get("device", 0),
        "host_images": decode.get("host", 0),
        "share": decode.get("share", 1.0),
    }


def synthetic_feed(device: str) -> Feed:
    images = torch.randn(BATCH, 3, SIZE, SIZE, device=device).to(torch.bfloat16)
    images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (BATCH,), device=device)
    return lambda: [(images, labels)] * 50


def _samples(data: Path) -> list[tuple[str, int]]:
    if data.suffix == ".csv":
        with open(data) as f:
            return [(row[0], int(row[1])) for row in csv.reader(f)]
    classes = sorted(p.name for p in data.iterdir() if p.is_dir())
    return [(str(f), c) for c, name in enumerate(classes) for f in sorted((data / name).iterdir())]


class _PILDataset(torch.utils.data.Dataset):
    """torchvision's ImageFolder recipe: PIL open, RandomResizedCrop, flip, ToTensor, Normalize."""

    def __init__(self, samples: list[tuple[str, int]]):
        import torchvision.transforms as T

        self.samples = samples
        self.transform = T.Compose([
            T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(), T.ToTensor(),
            T.Normalize(stoker.IMAGENET_MEAN, stoker.IMAGENET_STD),
        ])  # fmt: skip

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.samples[i]
        with Image.open(path) as im:
            return self.transform(im.convert("RGB")), label


class _BytesDataset(torch.utils.data.Dataset):
    def __init__(self, samples: list[tuple[str, int]]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        import torchvision.io

        path, label = self.samples[i]
        return torchvision.io.read_file(path), label


def _on_device(batches: Iterable[Any], device: str) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for images, labels in batches:
        images = images.to(device, non_blocking=True).to(torch.bfloat16)
        yield images.contiguous(memory_format=torch.channels_last), labels.to(device)


def dataloader_pil_feed(samples: list[tuple[str, int]], workers: int, device: str) -> Feed:
    loader = torch.utils.data.DataLoader(
        _PILDataset(samples), batch_size=BATCH, shuffle=True, num_workers=workers,
        pin_memory=device != "cpu", drop_last=True, persistent_workers=True, prefetch_factor=4,
    )  # fmt: skip
    return lambda: _on_device(loader, device)


def dataloader_nvjpeg_feed(samples: list[tuple[str, int]], workers: int, device: str) -> Feed:
    import torchvision.io
    import torchvision.transforms.v2 as T2
    import torchvision.transforms.v2.functional as TF

    loader = torch.utils.data.DataLoader(
        _BytesDataset(samples), batch_size=BATCH, shuffle=True, num_workers=workers,
        drop_last=True, persistent_workers=True, collate_fn=lambda b: tuple(zip(*b)),
    )  # fmt: skip
    mean = torch.tensor(stoker.IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(stoker.IMAGENET_STD, device=device).view(1, 3, 1, 1)

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for data, labels in loader:
            decoded = torchvision.io.decode_jpeg(list(data), device=device,
                                                 mode=torchvision.io.ImageReadMode.RGB)  # fmt: skip
            out = []
            for image in decoded:  # torchvision's transforms are per image
                top, left, h, w = T2.RandomResizedCrop.get_params(
                    image, (0.08, 1.0), (3 / 4, 4 / 3)
                )
                crop = TF.resized_crop(image, top, left, h, w, [SIZE, SIZE], antialias=True)
                out.append(TF.horizontal_flip(crop) if torch.rand(()) < 0.5 else crop)
            images = (torch.stack(out).float().div_(255) - mean) / std
            yield (images.to(torch.bfloat16).contiguous(memory_format=torch.channels_last),
                   torch.tensor(labels, device=device))  # fmt: skip

    return batches


# --- measurement ---------------------------------------------------------------------------------
def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def feed_alone(make: Feed, batches: int, warmup: int, device: str) -> float:
    """img/s of the feed with nothing else running (each batch waited for on the GPU)."""
    it = endless(make)
    for _ in range(warmup):
        next(it)
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(batches):
        images, _ = next(it)
    synchronize(device)
    return batches * BATCH / (time.perf_counter() - t0)


def make_model(name: str, device: str) -> torch.nn.Module:
    if name == "tiny":
        model: torch.nn.Module = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 7, stride=4), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(8, 1000),
        )  # fmt: skip
    else:
        import torchvision.models

        model = getattr(torchvision.models, name)()
    return model.to(device).to(memory_format=torch.channels_last)


def train(model: torch.nn.Module, make: Feed, steps: int, warmup: int, device: str) -> dict:
    """img/s training on `make`'s batches, and the share of the time spent waiting for them."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    it = endless(make)
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    waited = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            synchronize(device)
            waited, t0 = 0.0, time.perf_counter()
        t = time.perf_counter()
        images, labels = next(it)
        waited += time.perf_counter() - t
        with torch.autocast(device_type, dtype=torch.bfloat16):
            loss = loss_fn(model(images), labels.remainder(1000))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    synchronize(device)
    elapsed = time.perf_counter() - t0
    return {"img_s": steps * BATCH / elapsed, "wait": waited / elapsed}


def nvimgcodec_rates(samples: list[tuple[str, int]], batches: int) -> dict[str, float]:
    """nvImageCodec decoding whole files from memory, batches of 256: hardware backend only, and
    its default backends (the engines' limit for decode="gpu"); then the hardware backend with
    two decoders, each on a thread of its own, at once (whether a second stage thread, with a
    decoder of its own, would raise decode="gpu"'s rate); and the host time of one call."""
    import threading

    from nvidia import nvimgcodec  # type: ignore[import-not-found]

    data = [Path(p).read_bytes() for p, _ in samples[: BATCH * min(batches, 8)]]
    chunks = [data[k : k + BATCH] for k in range(0, len(data) - BATCH + 1, BATCH)]
    hardware = [nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY)]
    out = {}

    def run(decoder: Any, count: int, offset: int = 0) -> None:
        for k in range(count):
            decoder.decode(chunks[(k + offset) % len(chunks)])

    for name, backends in (("hardware", hardware), ("default", None)):  # fmt: skip
        decoder = nvimgcodec.Decoder(backends=backends)
        decoder.decode(chunks[0])  # warm-up: initialisation, the hardware's batch
        torch.cuda.synchronize()
        t0, cpu0 = time.perf_counter(), time.thread_time()
        run(decoder, batches)
        host = time.perf_counter() - t0
        cpu = time.thread_time() - cpu0
        torch.cuda.synchronize()
        out[name] = batches * BATCH / (time.perf_counter() - t0)
        if name == "hardware":
            out["hardware_call_host_ms"] = 1e3 * host / batches
            out["hardware_call_cpu_ms"] = 1e3 * cpu / batches
    pair = [nvimgcodec.Decoder(backends=hardware) for _ in range(2)]
    for decoder in pair:
        decoder.decode(chunks[0])
    torch.cuda.synchronize()
    threads = [threading.Thread(target=run, args=(d, batches // 2, i)) for i, d in enumerate(pair)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    out["hardware, two decoders on two threads"] = 2 * (batches // 2) * BATCH / (
        time.perf_counter() - t0
    )
    return out


# --- the run -------------------------------------------------------------------------------------
def feeds(pack: Path, samples: list[tuple[str, int]], device: str, smoke: bool) -> dict[str, Feed]:
    cores = os.cpu_count() or 2
    most = max(1, cores - 1)
    out: dict[str, Feed] = {"synthetic (already on the GPU)": synthetic_feed(device)}
    for threads in sorted({t for t in (4, 6, most) if t <= most} or {most}):
        out[f"stoker host, {threads} threads"] = stoker_feed(pack, device, threads=threads)
    if not smoke:
        for threads in (2, 4):
            out[f'stoker decode="gpu", {threads} threads'] = stoker_feed(
                pack, device, threads=threads, decode="gpu"
            )
        out[f'stoker decode="auto", {most} threads'] = stoker_feed(
            pack, device, threads=most, decode="auto"
        )
    try:
        import torchvision  # noqa: F401
    except ImportError:
        print("torchvision is not installed: no DataLoader rows", file=sys.stderr)
        return out
    for workers in sorted({min(6, most), most}):
        out[f"DataLoader + PIL, {workers} workers"] = dataloader_pil_feed(samples, workers, device)
    if not smoke:
        out["DataLoader (6 workers) + decode_jpeg(cuda)"] = dataloader_nvjpeg_feed(
            samples, 6, device
        )
    return out


def main() -> None:
    global BATCH
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="CSV of path,label or ImageFolder")
    parser.add_argument("--work", type=Path, default=None, help="where the pack goes")
    parser.add_argument("--models", nargs="+", default=["resnet50", "resnet18"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--feed-batches", type=int, default=40)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--only", nargs="*", help="feeds whose names contain one of these")
    parser.add_argument("--smoke", action="store_true", help="the harness on the CPU, tiny")
    args = parser.parse_args()
    BATCH = args.batch
    device = "cpu" if args.smoke else "cuda"
    # Batches of many workers through one pipe: file descriptors run out with the default.
    torch.multiprocessing.set_sharing_strategy("file_system")
    if args.smoke:
        args.models, args.steps, args.warmup, args.feed_batches = ["tiny"], 2, 1, 2
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-training-"))
    pack = work / "pack"
    if not (pack / "manifest.json").exists():
        stoker.pack(args.data, pack, progress=True)
    samples = _samples(args.data)
    machine = (torch.cuda.get_device_name() if device == "cuda" else platform.processor()) + (
        f", {os.cpu_count()} cores, torch {torch.__version__}"
    )
    result: dict[str, Any] = {"machine": machine, "date": time.strftime("%Y-%m-%d"),
                              "samples": len(samples), "feeds": {}, "models": {}}  # fmt: skip
    made = feeds(pack, samples, device, args.smoke)
    if args.only:
        made = {k: v for k, v in made.items() if any(o in k for o in args.only) or "synthetic" in k}
    if device == "cuda":
        try:
            result["nvimgcodec"] = nvimgcodec_rates(samples, args.feed_batches)
        except ImportError as e:
            print(f"nvImageCodec's own rate not measured: {e}", file=sys.stderr)
    failed: dict[str, str] = {}
    result["stages"] = {}
    for name, make in list(made.items()):
        try:
            loader = getattr(make, "loader", None)
            before = loader.stats() if loader is not None else None
            result["feeds"][name] = feed_alone(make, args.feed_batches, args.warmup, device)
            figures = stage_figures(make, before)
            if figures is not None:
                result["stages"][name] = figures
        except Exception as e:  # a feed that fails is reported, the others still measured
            traceback.print_exc()
            failed[name] = f"{type(e).__name__}: {e}"
            del made[name]
            continue
        print(f"feed alone: {name}: {result['feeds'][name]:,.0f} img/s", flush=True)
    result["failed"] = failed
    for model_name in args.models:
        model = make_model(model_name, device)
        rows = {}
        for name, make in made.items():
            rows[name] = train(model, make, args.steps, args.warmup, device)
            print(f"{model_name}: {name}: {rows[name]['img_s']:,.0f} img/s, waiting "
                  f"{100 * rows[name]['wait']:.1f}%", flush=True)  # fmt: skip
        result["models"][model_name] = rows
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    text = markdown(result)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.markdown:
        args.markdown.write_text(text)


def markdown(result: dict[str, Any]) -> str:
    lines = [f"{result['machine']}, {result['date']}, {result['samples']:,} images, batch {BATCH}, "
             "RandomResizedCrop 224 + flip, bf16 normalised on the GPU.", ""]  # fmt: skip
    for model, rows in result["models"].items():
        synthetic = next(iter(rows.values()))["img_s"]
        lines.append(f"| {model}, bf16 autocast, channels_last | img/s | share of synthetic | "
                     "waiting for data | the feed alone, img/s |")  # fmt: skip
        lines.append("|---|---:|---:|---:|---:|")
        for name, row in rows.items():
            share, alone = 100 * row["img_s"] / synthetic, result["feeds"][name]
            lines.append(f"| {name} | {row['img_s']:,.0f} | {share:.1f}% "
                         f"| {100 * row['wait']:.1f}% | {alone:,.0f} |")  # fmt: skip
        lines.append("")
    for name, why in result.get("failed", {}).items():
        lines.append(f"{name}: failed: {why}")
    if "nvimgcodec" in result:
        rates = result["nvimgcodec"]
        shown = [f"{k} {v:,.0f} img/s" for k, v in rates.items() if not k.endswith("_ms")]
        lines.append("nvImageCodec alone, whole files from memory, batches of 256: "
                     + ", ".join(shown) + ".")  # fmt: skip
        if "hardware_call_host_ms" in rates:
            lines.append(f"Its hardware backend's call: {rates['hardware_call_host_ms']:.1f} ms "
                         f"on the host, {rates['hardware_call_cpu_ms']:.1f} ms CPU.")  # fmt: skip
        for name, rate in result["feeds"].items():
            if "decode=" in name and "hardware" in rates:
                lines.append(f"{name}: {rate / rates['hardware']:.2f}x nvImageCodec's hardware "
                             "rate.")  # fmt: skip
    for name, figures in result.get("stages", {}).items():
        lines.append(f"{name}: stage thread {figures['stage_busy_ms']:.1f} ms busy a batch, "
                     f"{figures['stage_cpu_ms']:.1f} ms CPU; the training thread waited "
                     f"{figures['stage_wait_s']:.2f} s for it; device share "
                     f"{figures['share']:.2f}")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
