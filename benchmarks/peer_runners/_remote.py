"""What the remote-read runners share (benchmarks/remote.py): their command line, the epoch loop
and the checks. Standard library only, as _common.py: each runs in its loader's own venv.

Two modes:

    <python> <runner>.py prepare --files LIST.tsv --out DIR --shard-bytes N
        writes the listed images in the loader's own format (a stoker pack, MDS shards, LitData
        chunks) into DIR, which benchmarks/remote.py then uploads to the S3 server;
    <python> <runner>.py read --source URL --cache DIR --samples N --epochs E --threads T ...
        builds the loader on `--source` with a fresh local cache `--cache` and runs E epochs:
        the first is the cold one (nothing cached; its time counts from building the loader),
        the others are warm (everything cached by the first).

The S3 endpoint and credentials reach the loader the way its users give them (AWS_* and the
peer's own variables in the environment, set by benchmarks/remote.py; see each runner).

Each epoch must give every sample exactly once (a runner's batches carry each sample's index in
the listing, checked here), as uint8 images of size x size with 3 channels; a runner that
drops, repeats or pads samples fails instead of looking fast. The result, as JSON: per epoch its
seconds, images, the CPU seconds of the runner and all its child processes (DataLoader's
workers), and those of the processes named by --watch (the S3 server, the latency proxy).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import _common

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of `root` and every process below it (DataLoader workers), live ones from
    /proc; the children that have already exited and been waited for, from their parent's
    cutime/cstime."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) / TICK  # utime stime cutime cstime
        todo += children.get(pid, [])
    return total


Batches = Iterable[tuple[Any, Any]]  # (images uint8 [B, H, W, 3] or [B, 3, H, W], indices [B])


def indexed_epochs(loader: Iterable[Any]) -> Callable[[int], Iterable[tuple[Any, list[int]]]]:
    """`epoch(e)` for read_main, from a loader whose batches are (images, sample indices)."""

    def epoch(e: int) -> Iterable[tuple[Any, list[int]]]:
        for images, index in loader:
            yield images, index.tolist()

    return epoch


def read_main(
    name: str,
    build: Callable[[argparse.Namespace, _common.Job], Callable[[int], Batches]],
    version: Callable[[], str],
    imports: Callable[[], object],
    notes: str = "",
    extra: Callable[[], dict] | None = None,
) -> int:
    """`imports()` imports the loader's modules (untimed: a training script has imported torch
    long before it builds its loader); `build(args, job)` makes the loader (timed as part of the
    cold epoch) and returns `epoch(e)`, which runs epoch e and yields (images, sample indices)
    batches."""
    args = _parse_read()
    _common.pin_to_cores(args.threads)
    job = _common.job_from_args(args, [], args.cache)
    watch = {k: int(v) for k, v in (w.split("=", 1) for w in args.watch)}
    me = os.getpid()

    def snapshot() -> tuple[float, float, dict[str, float]]:
        return (time.perf_counter(), tree_cpu_seconds(me),
                {k: cpu_seconds(pid) for k, pid in watch.items()})  # fmt: skip

    imports()
    epochs = []
    t0, c0, w0 = snapshot()
    run = build(args, job)
    setup_s = time.perf_counter() - t0
    for e in range(args.epochs):
        if e:
            t0, c0, w0 = snapshot()
        seen = bytearray(args.samples)
        n, first = 0, None
        for images, indices in run(e):
            n += _common._check(images, args.size, name)
            for i in indices:
                i = int(i)
                if not 0 <= i < args.samples or seen[i]:
                    raise SystemExit(f"{name}: epoch {e}: sample {i} out of range or repeated")
                seen[i] = 1
            if first is None:
                first = time.perf_counter() - t0
        t1, c1, w1 = snapshot()
        if n != args.samples or not all(seen):
            raise SystemExit(f"{name}: epoch {e}: {n} images for {args.samples} samples")
        epochs.append({
            "seconds": t1 - t0, "images": n, "first_batch_s": first, "cpu_s": c1 - c0,
            "watched_cpu_s": {k: w1[k] - w0[k] for k in watch},
        })  # fmt: skip
        print(f"{name} epoch {e}: {n / (t1 - t0):.0f} img/s", file=sys.stderr, flush=True)
    result = {"peer": name, "version": version(), "setup_s": setup_s, "epochs": epochs,
              "notes": notes, **(extra() if extra else {})}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1))
    return 0


def _parse_read() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="one remote-read benchmark run")
    parser.add_argument("mode", choices=["read"])
    parser.add_argument("--source", required=True, help="s3://bucket/prefix, or a local folder")
    parser.add_argument("--cache", type=Path, required=True, help="a fresh local cache folder")
    parser.add_argument("--samples", type=int, required=True)
    parser.add_argument("--pipeline", choices=("train", "eval"), default="train")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--resize", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=3, help="the first is the cold one")
    parser.add_argument("--watch", action="append", default=[], help="name=PID")
    parser.add_argument("--option", action="append", default=[], help="k=v, runner-specific")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def prepare_main(write: Callable[[list[tuple[str, int]], Path, int], None]) -> int:
    """`write(files, out, shard_bytes)`: the listed (path, label) images, in order, as the
    loader's format in `out`; sample i of the listing is the format's sample i."""
    parser = argparse.ArgumentParser(description="write the images in the loader's format")
    parser.add_argument("mode", choices=["prepare"])
    parser.add_argument("--files", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shard-bytes", type=int, required=True)
    args = parser.parse_args()
    write(_common.read_files(args.files), args.out, args.shard_bytes)
    return 0


def main(prepare: Callable[[], int], read: Callable[[], int]) -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "prepare":
        return prepare()
    return read()
