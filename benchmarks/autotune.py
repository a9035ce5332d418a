"""threads="auto" against a sweep of fixed thread counts, on the same pack, in the same run.

    python benchmarks/autotune.py [PACK] [--batch-size 64] [--rounds 3]

Two consumers:
- a fast one (takes each batch and goes on), where the loader is the bottleneck and auto must
  match the best fixed count;
- a slow one (sleeps for `--slow-ms` per batch), where any thread count keeps up and auto should
  shed the threads it does not need.
Medians of `--rounds` interleaved runs, each 40 batches after a warm-up of 5 (auto's first
intervals included: its convergence counts). docs/DOCTOR.md quotes the output.

The comparison is made here, on a quiet machine, and not in the tests: tests/python/test_doctor.py
once required auto to reach 90% of the best fixed count, and failed beside other jobs (210 against
0.9 x 239 img/s). The tests check the tuner's decisions instead (autotune_test.cc on a model of a
busy machine, test_doctor.py on the intervals the engine measured).
"""

from __future__ import annotations

import argparse
import statistics
import time

import stoker
from stoker.machine import usable_cores


def run(loader, batches: int, warmup: int, sleep_s: float) -> tuple[float, float]:
    """(samples/s, mean threads working) over `batches` after `warmup`, passes back to back."""
    seen, counted, t0, thread_sum = 0, 0, None, 0
    while counted < batches:
        for images, _ in loader:
            if sleep_s:
                time.sleep(sleep_s)
            if warmup > 0:
                warmup -= 1
                if warmup == 0:
                    t0 = time.perf_counter()
                continue
            seen += images.shape[0]
            counted += 1
            thread_sum += loader.threads
            if counted == batches:
                break
    return seen / (time.perf_counter() - t0), thread_sum / counted


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("pack", nargs="?", default="bench-data/imagenet-sample.pack")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--slow-ms", type=float, default=100.0)
    args = p.parse_args()
    cores = usable_cores()
    fixed = list(range(1, cores + 2))
    print(f"{args.pack}, batch {args.batch_size}, {cores} cores, rounds {args.rounds}")
    for consumer, sleep_s in (("fast consumer", 0.0), ("slow consumer", args.slow_ms / 1e3)):
        results: dict = {k: [] for k in ["auto", *fixed]}
        for _ in range(args.rounds):
            for threads in results:
                budget = {"cpu_budget": cores} if threads == "auto" else {}
                loader = stoker.ImageLoader(
                    args.pack, batch_size=args.batch_size, threads=threads, **budget
                )
                results[threads].append(run(loader, 40, 5, sleep_s))
                loader.close()
        print(f"{consumer}" + (f" ({args.slow_ms:.0f} ms a batch)" if sleep_s else "") + ":")
        best = max(statistics.median(r for r, _ in v) for k, v in results.items() if k != "auto")
        for threads, runs in results.items():
            rate = statistics.median(r for r, _ in runs)
            used = statistics.median(t for _, t in runs)
            print(
                f"  threads={threads!s:<5} {rate:8.0f} img/s  {100 * rate / best:5.1f}% of the "
                f"best fixed, {used:.2f} threads working on average"
            )


if __name__ == "__main__":
    main()
