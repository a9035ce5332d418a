"""What copying a remote worker's batch out of Ray's object store costs the trainer: RayPool
copies each result it reads (stoker.load.workers.ray_actors._owned), so that a batch's tensors
are the training loop's own memory, never a writable view of Ray's read-only objects. Prints,
for a batch of 256 x 224 x 224 x 3 uint8 (the ImageNet recipe's) and of 32 x 224 x 224 x 3:
the copy as the pool makes it (a new array each time: its pages faulted in as it is written),
a copy into memory already touched (np.copyto: the bandwidth alone), and, beside them, what
one engine thread takes to make such a batch from the imagenet-sample pack (the time a worker
spends per batch, which the copy is a fraction of). Thread CPU time, medians of interleaved
rounds after a warm-up.

    .venv/bin/python benchmarks/remote_copy.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        return platform.machine()


def cpu_time(fn) -> float:
    t0 = time.thread_time()
    fn()
    return time.thread_time() - t0


def engine_seconds_per_batch(batch: int, rounds: int) -> float | None:
    """One engine thread's seconds per batch of `batch` 224 px crops of imagenet-sample."""
    from remote_workers import make_pack

    import stoker

    try:
        pack = make_pack()
    except Exception as e:  # noqa: BLE001 - the shared data may be missing
        print(f"(no engine figure: {e})")
        return None
    loader = stoker.ImageLoader(pack, batch_size=batch, size=224, threads=1, seed=0)
    seconds = []
    with loader:
        it = iter(loader)
        next(it)  # warm-up
        for _ in range(min(rounds, len(loader) - 2)):
            t0 = time.perf_counter()
            next(it)
            seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    print(f"{cpu_model()}; {args.rounds} rounds, medians")
    for batch in (256, 32):
        measure(batch, args.rounds)


def measure(batch: int, rounds: int) -> None:
    from stoker.load.workers.ray_actors import _owned
    from stoker.load.workers.steps import StepResult

    images = np.random.default_rng(0).integers(0, 256, (batch, 224, 224, 3), dtype=np.uint8)
    images.setflags(write=False)  # as numpy maps an object of Ray's store
    labels = np.arange(batch, dtype=np.int64)
    labels.setflags(write=False)
    target = np.empty_like(images)
    target.fill(0)  # touched: no page faults left

    def owned() -> None:
        _owned(StepResult(0, outputs=[images, labels], indices=labels))

    owned()
    times: dict[str, list[float]] = {"owned": [], "copyto": []}
    for _ in range(rounds):  # interleaved
        times["owned"].append(cpu_time(owned))
        times["copyto"].append(cpu_time(lambda: np.copyto(target, images)))
    mb = images.nbytes / 1e6
    own, bare = statistics.median(times["owned"]), statistics.median(times["copyto"])
    print(f"batch {batch} ({mb:.1f} MB): the pool's copy {own * 1e3:.2f} ms "
          f"({mb / own / 1e3:.1f} GB/s, {own / batch * 1e6:.1f} us an image); into touched "
          f"memory {bare * 1e3:.2f} ms ({mb / bare / 1e3:.1f} GB/s)")  # fmt: skip
    made = engine_seconds_per_batch(batch, rounds)
    if made is not None:
        print(f"  one engine thread makes such a batch in {made * 1e3:.0f} ms: the copy is "
              f"{100 * own / made:.1f}% of it")  # fmt: skip


if __name__ == "__main__":
    main()
