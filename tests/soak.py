"""Soak: many epochs over ../shared/data/imagenet-sample with corrupt samples mixed in.

Prints, per epoch, the process's resident memory, threads and open descriptors, and at the end a
JSON line with the drift of resident memory after the first epoch, and whether the thread and
descriptor counts came back to where they were before the loader existed.

    .venv/bin/python tests/soak.py --epochs 20
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def make_shard(path: Path, corrupt_every: int) -> tuple[int, int]:
    """imagenet-sample as one WebDataset shard, with a damaged or hostile file from
    jpeg-corrupt after every `corrupt_every` good ones. Returns (good, corrupt)."""
    good = sorted((DATA / "imagenet-sample").glob("*.JPEG"))
    bad = sorted(p for p in (DATA / "jpeg-corrupt").rglob("*") if p.is_file())
    n_bad = 0
    with tarfile.open(path, "w") as tar:

        def add(name: str, payload: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))

        for i, p in enumerate(good):
            add(f"{i:05d}.jpg", p.read_bytes())
            add(f"{i:05d}.cls", str(i % 10).encode())
            if i % corrupt_every == corrupt_every - 1:
                add(f"{i:05d}-bad.jpg", bad[n_bad % len(bad)].read_bytes())
                add(f"{i:05d}-bad.cls", b"0")
                n_bad += 1
    return len(good), n_bad


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--corrupt-every", type=int, default=10)
    args = parser.parse_args()

    import torch

    import stoker

    with tempfile.TemporaryDirectory() as tmp:
        shard = Path(tmp) / "soak.tar"
        good, n_bad = make_shard(shard, args.corrupt_every)
        # torch starts its own worker threads on its first parallel operation: do one first, so
        # that the counts below are stoker's alone.
        dummy = torch.zeros((args.batch_size, 3, 224, 224), dtype=torch.uint8)
        checksum = dummy[:, :, ::16, ::16].sum() * 0
        threads0, fds0 = threads(), fds()
        loader = stoker.ImageLoader(
            shard, batch_size=args.batch_size, threads=args.threads, on_error="skip"
        )
        rss, t0 = [], time.perf_counter()
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            for images, labels in loader:
                checksum += images[:, :, ::16, ::16].sum() + labels.sum()  # touch every batch
            rss.append(rss_bytes())
            stats = loader.stats()
            print(
                f"epoch {epoch + 1:2d}: {stats['samples']} samples, {stats['skipped']} skipped, "
                f"RSS {rss[-1] / 2**20:.1f} MiB, {threads()} threads, {fds()} fds",
                flush=True,
            )
        seconds = time.perf_counter() - t0
        stats = loader.stats()
        loader.close()
        del loader
        result = {
            "epochs": args.epochs,
            "good": good,
            "corrupt": n_bad,
            "delivered": stats["samples"],
            "skipped": stats["skipped"],
            "seconds": round(seconds, 1),
            "rss_first_mib": round(rss[0] / 2**20, 1),
            "rss_max_after_first_mib": round(max(rss[1:] or rss) / 2**20, 1),
            "rss_last_mib": round(rss[-1] / 2**20, 1),
            "rss_drift": (max(rss[1:] or rss) - rss[0]) / rss[0],
            "threads_before": threads0,
            "threads_after": threads(),
            "fds_before": fds0,
            "fds_after": fds(),
        }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
