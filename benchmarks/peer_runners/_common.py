"""What every peer runner shares: its command line, the timing loop and the result it writes.

Standard library only: a runner runs inside its peer's own virtual environment
(build/peers/<peer>/venv, made by benchmarks/setup_peers.py), where stoker is not installed.

    <venv>/bin/python benchmarks/peer_runners/<peer>.py --files LIST.tsv --pipeline train \\
        --threads 2 --epochs 3 --work build/peers/<peer>/work --out result.json

A runner module defines
    ENV      a dict literal read by setup_peers.py without importing the module: "pip" (packages),
             "apt" (Debian packages), "torch" (install torch==2.13.0 first), "build" (shell
             commands run after pip, with $VENV, $PY and $BUILD set), "venv": "main" for the
             project's own .venv
and calls main(name, make_epoch, version=..., prepare=...) where
    prepare(job)      converts the files once, untimed (a .beton, TFRecords, WebDataset shards);
                      it keeps what it made under job.work and reuses it when job.key matches;
    make_epoch(job)   returns a function that runs one epoch and yields (images, labels) batches.

Each epoch must produce every listed sample exactly once, as uint8 images of size x size with 3
channels (HWC or CHW, batched): the loop checks the count and the shape of every batch, so a peer
that silently drops samples or skips a step cannot look fast.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator


@dataclass
class Job:
    files: list[tuple[str, int]]  # (path, label), in the listed order; a file may repeat
    train: bool  # RandomResizedCrop(size) + flip; else Resize(resize) + CenterCrop(size)
    size: int
    resize: int
    batch_size: int
    threads: int  # cores: the process is pinned to this many, and the peer told to use them
    work: Path  # the runner's own folder for converted data, kept between runs
    options: dict[str, str]  # --option k=v, peer-specific (e.g. workers=3)

    @property
    def key(self) -> str:
        """A digest of the file list: converted data made for another list is stale."""
        h = hashlib.sha256()
        for path, label in self.files:
            h.update(f"{path}\t{label}\n".encode())
        return h.hexdigest()[:16]

    @property
    def unique_files(self) -> list[tuple[str, int]]:
        """The distinct (path, label) pairs, in first-seen order."""
        return list(dict.fromkeys(self.files))


def pin_to_cores(n: int) -> None:
    """Keep this process (and every thread and child it starts) on n of the allowed cores, so a
    peer that sizes its thread pool from the machine cannot use more cores than the others."""
    allowed = sorted(os.sched_getaffinity(0))
    if n > len(allowed):
        raise SystemExit(f"--threads {n}: only {len(allowed)} cores are available")
    os.sched_setaffinity(0, allowed[:n])
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(var, str(n))


def job_from_args(args: argparse.Namespace, files: list[tuple[str, int]], work: Path) -> Job:
    """The Job a runner's command line asks for (--pipeline, --size, --resize, --batch-size,
    --threads, --option k=v), on `files` with `work` as its folder."""
    return Job(
        files=files,
        train=args.pipeline == "train",
        size=args.size,
        resize=args.resize,
        batch_size=args.batch_size,
        threads=args.threads,
        work=work,
        options=dict(o.split("=", 1) for o in args.option),
    )


def _check(images: Any, size: int, name: str) -> int:
    shape = tuple(int(d) for d in images.shape)
    dtype = str(getattr(images, "dtype", "?"))
    if len(shape) != 4 or shape[1:] not in ((size, size, 3), (3, size, size)):
        raise SystemExit(f"{name}: a batch of shape {shape}, not [B, {size}, {size}, 3] or CHW")
    if "uint8" not in dtype:
        raise SystemExit(f"{name}: a batch of {dtype}, not uint8")
    return shape[0]


def read_files(listing: Path) -> list[tuple[str, int]]:
    out = []
    for line in listing.read_text().splitlines():
        if line.strip():
            path, label = line.rsplit("\t", 1)
            out.append((path, int(label)))
    return out


def main(
    name: str,
    make_epoch: Callable[[Job], Callable[[], Iterable[tuple[Any, Any]]]],
    *,
    version: Callable[[], str] = lambda: "?",
    prepare: Callable[[Job], None] | None = None,
    notes: str = "",
) -> int:
    parser = argparse.ArgumentParser(description=f"{name}: one benchmark run")
    parser.add_argument("--files", type=Path, required=True, help="path<TAB>label per line")
    parser.add_argument("--pipeline", choices=("train", "eval"), required=True)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--resize", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs, after one warm-up")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--option", action="append", default=[], help="k=v, peer-specific")
    args = parser.parse_args()
    pin_to_cores(args.threads)
    job = job_from_args(args, read_files(args.files), args.work)
    job.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if prepare is not None:
        prepare(job)
    prepare_s = time.perf_counter() - t0
    run = make_epoch(job)
    rates, cpu, startup_s = [], [], 0.0
    for epoch in range(args.epochs + 1):  # epoch 0 warms up: JIT, page cache, thread pools
        t0, c0 = time.perf_counter(), time.process_time()
        n = 0
        for images, _labels in run():
            n += _check(images, job.size, name)
        seconds = time.perf_counter() - t0
        cpu_s = time.process_time() - c0
        if n != len(job.files):
            raise SystemExit(f"{name}: {n} images in an epoch of {len(job.files)} samples")
        if epoch == 0:
            startup_s = seconds
        else:
            rates.append(n / seconds)
            cpu.append(cpu_s / n)
        print(f"{name} [{args.pipeline}] epoch {epoch}: {n / seconds:.0f} img/s", file=sys.stderr)
    result = {
        "peer": name,
        "version": version(),
        "pipeline": args.pipeline,
        "threads": args.threads,
        "samples": len(job.files),
        "images_per_s": rates,
        "median_images_per_s": statistics.median(rates),
        # CPU seconds of this process (every thread) an image: what the load of other processes
        # on the machine inflates far less than the wall time. Worker processes (DataLoader's)
        # are not counted.
        "cpu_s_per_image": cpu,
        "warmup_epoch_s": startup_s,
        "prepare_s": prepare_s,
        "notes": notes,
    }
    args.out.write_text(json.dumps(result, indent=1))
    return 0


def batches(items: Iterator[Any], batch_size: int) -> Iterator[list[Any]]:
    """Consecutive lists of batch_size items (the last one shorter)."""
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


sys.dont_write_bytecode = True  # the runners live in the source tree
