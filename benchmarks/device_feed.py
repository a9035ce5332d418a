"""What the device feed costs the training thread, and (on a GPU) what it moves.

    python benchmarks/device_feed.py

- host: the feed's Python bookkeeping per batch (device="cpu", small batches, nothing to
  normalise), against iterating the same batches bare; then ImageLoader(device="cpu") with
  bfloat16 normalisation against the uint8 loader, imagenet-sample at batch 256 when
  ../shared/data is there.
- cuda (when torch sees a GPU): host -> device throughput of a 256x3x224x224 uint8 batch through
  stoker.to_device from pinned and from pageable memory, against a blocking `.cuda()`; then
  ImageLoader on every core, imagenet-sample train at batch 256: uint8 batches on the host against
  device="cuda" bfloat16 normalised batches, and the same with a GPU step per batch that
  reads the batch, to show whether the feed costs the loader throughput.
Medians of 5 runs after a warm-up. docs/GPU.md quotes the figures.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import stoker

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def median_time(fn, runs: int = 5) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def feed_overhead() -> None:
    batches = [(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.zeros(4)) for _ in range(2000)]

    def bare():
        for _ in batches:
            pass

    def fed():
        for _ in stoker.to_device(batches, "cpu", channels_last=False):
            pass

    per_batch = (median_time(fed) - median_time(bare)) / len(batches)
    print(f"host: feed bookkeeping {1e6 * per_batch:.1f} us per batch (device='cpu', 2 tensors)")


def pack_imagenet_sample(images: Path, tmp: str) -> tuple[Path, int]:
    """The folder's JPEGs packed under `tmp` (a CSV gives each file its own class): the pack's
    path and its number of samples."""
    csv = Path(tmp) / "list.csv"
    files = sorted(images.glob("*.JPEG"))
    csv.write_text("".join(f"{f},{i}\n" for i, f in enumerate(files)))
    stoker.pack(csv, Path(tmp) / "pack", progress=False)
    return Path(tmp) / "pack", len(files)


def cpu_normalise() -> None:
    images = SHARED / "imagenet-sample"
    if not images.exists():
        print("host: ../shared/data/imagenet-sample not found, normalisation figure skipped")
        return
    with tempfile.TemporaryDirectory() as tmp:
        pack, n = pack_imagenet_sample(images, tmp)
        common = dict(batch_size=256, size=224, seed=0)
        plain = stoker.ImageLoader(pack, **common)
        normalised = stoker.ImageLoader(
            pack,
            device="cpu",
            dtype=torch.bfloat16,
            mean=stoker.IMAGENET_MEAN,
            std=stoker.IMAGENET_STD,
            **common,
        )

        def epoch(loader):
            return lambda: sum(1 for _ in loader)

        t_plain, t_norm = median_time(epoch(plain)), median_time(epoch(normalised))
        print(
            f"host: imagenet-sample, batch 256, train: uint8 {n / t_plain:.0f} img/s, "
            f"device='cpu' bfloat16 normalised {n / t_norm:.0f} img/s "
            f"({t_norm / t_plain:.2f}x the time; {stoker.ImageLoader.__name__} threads="
            f"{plain.threads})"
        )


def cuda_copies() -> None:
    if not torch.cuda.is_available():
        print("cuda: no GPU, skipped")
        return
    shape = (256, 3, 224, 224)
    pinned = [torch.randint(0, 256, shape, dtype=torch.uint8).pin_memory() for _ in range(4)]
    pageable = [t.clone() for t in pinned]
    nbytes = pinned[0].numel() * 20  # 20 batches a run

    def through_feed(source):
        def run():
            for _ in stoker.to_device(source * 5, "cuda"):
                pass
            torch.cuda.synchronize()

        return run

    def blocking():
        for t in pageable * 5:
            t.cuda()
        torch.cuda.synchronize()

    for name, fn in [
        ("to_device, pinned", through_feed(pinned)),
        ("to_device, pageable (staged)", through_feed(pageable)),
        (".cuda(), pageable", blocking),
    ]:
        print(f"cuda: {name}: {nbytes / median_time(fn) / 1e9:.1f} GB/s")
    print(f"cuda: {torch.cuda.get_device_name()}, torch {torch.__version__}")


def cuda_loader(epochs: int = 5) -> None:
    images = SHARED / "imagenet-sample"
    if not torch.cuda.is_available() or not images.exists():
        print("cuda: loader figures skipped (no GPU or no imagenet-sample)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        pack, n = pack_imagenet_sample(images, tmp)
        common = dict(batch_size=256, size=224, seed=0, threads=os.cpu_count())
        host = stoker.ImageLoader(pack, **common)
        norm = dict(dtype=torch.bfloat16, mean=stoker.IMAGENET_MEAN, std=stoker.IMAGENET_STD)
        cuda = stoker.ImageLoader(pack, device="cuda", **norm, **common)
        weight = torch.randn(3 * 224 * 224, 1000, device="cuda", dtype=torch.bfloat16)

        def run(loader, step: bool):
            def epochs_of():
                for epoch in range(epochs):
                    loader.set_epoch(epoch)
                    for images_, _ in loader:
                        if step:  # a GPU step that reads the whole batch
                            (images_.reshape(images_.shape[0], -1) @ weight).sum()
                torch.cuda.synchronize()

            return epochs_of

        n *= epochs
        figures = {
            "host uint8": median_time(run(host, False)),
            'device="cuda" bf16 normalised': median_time(run(cuda, False)),
            'device="cuda" bf16 normalised + a GPU step': median_time(run(cuda, True)),
        }
        for name, seconds in figures.items():
            print(f"cuda: ImageLoader threads={os.cpu_count()}, {name}: {n / seconds:.0f} img/s")
        print(f"cuda: feed stats {cuda.stats().get('device', {})}")


if __name__ == "__main__":
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}")
    feed_overhead()
    cpu_normalise()
    cuda_copies()
    cuda_loader()
