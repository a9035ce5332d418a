"""What ``record=`` costs (issue 26, item 1: under 1% of throughput): an ImageLoader's training
epochs over imagenet-sample with and without a record of every step, interleaved.

    .venv/bin/python benchmarks/record_overhead.py [--rounds 7] [--epochs 3]

One process; each round times `--epochs` epochs of each loader (batch 256, size 224, the
machine's cores), in alternating order, after one warm-up epoch each. Reports medians of the
rounds and their ratio. Never a timed test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from first_batch import make_pack  # noqa: E402


def main() -> int:
    import stoker
    from stoker.machine import usable_cores

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    pack = make_pack()
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "steps.jsonl"
        loaders = {
            name: stoker.ImageLoader(
                pack, batch_size=256, size=224, threads=usable_cores(), **extra
            )  # fmt: skip
            for name, extra in (("plain", {}), ("record", {"record": record}))
        }
        times: dict[str, list[float]] = {name: [] for name in loaders}
        epoch = 0

        def run(name: str) -> float:
            nonlocal epoch
            loader = loaders[name]
            t0 = time.perf_counter()
            for _ in range(args.epochs):
                epoch += 1
                loader.set_epoch(epoch)
                for _batch in loader:
                    pass
            return time.perf_counter() - t0

        for name in loaders:
            run(name)  # warm-up
        for r in range(args.rounds):
            order = list(loaders) if r % 2 == 0 else list(loaders)[::-1]
            for name in order:
                times[name].append(run(name))
        images = args.epochs * len(loaders["plain"].dataset)
        rate = {name: images / statistics.median(t) for name, t in times.items()}
        lines = len(record.read_text().splitlines())
        for loader in loaders.values():
            loader.close()
    print(f"plain  {rate['plain']:7.0f} images/s")
    print(f"record {rate['record']:7.0f} images/s ({lines} steps recorded)")
    print(f"record / plain: {rate['record'] / rate['plain']:.4f} "
          f"(median of {args.rounds} interleaved rounds of {args.epochs} epochs)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
