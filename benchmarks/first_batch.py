"""No wait for the first batch (issue 25, item 5): how long building an ImageLoader and taking
its first batch takes, against a steady batch of the same loader, on imagenet-sample.

    .venv/bin/python benchmarks/first_batch.py [--rounds 7] [--pack PATH]

Each round runs in a fresh process (nothing warm but the page cache; torch imported first, as
a training script has it): it builds
``ImageLoader(pack, batch_size=256, size=224, threads=cores)``, takes the first batch (the
"first batch" time counts from before the constructor), then the next three (1,000 images:
three more full batches), whose mean is the "steady batch". Medians over the rounds after the
first (which warms the page cache), and the median of each round's own difference. Never a timed
test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROUND = """
import json, sys, time
import torch  # imported by any training script before it builds a loader (about 1.5 s here)
import stoker
from stoker.machine import usable_cores
t0 = time.perf_counter()
ld = stoker.ImageLoader(sys.argv[1], batch_size=256, size=224, threads=usable_cores())
it = iter(ld)
next(it)
t1 = time.perf_counter()
for _ in range(3):
    next(it)
t2 = time.perf_counter()
ld.close()
print(json.dumps({"first": t1 - t0, "steady": (t2 - t1) / 3}))
"""


def make_pack() -> str:
    """imagenet-sample packed with stoker's defaults, once, under build/."""
    import stoker

    pack = HERE.parent / "build" / "bench-first-batch" / "pack"
    if not (pack / "manifest.json").exists():
        src = HERE.parent.parent / "shared" / "data" / "imagenet-sample"
        files = sorted(p for p in src.iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
        listing = pack.parent / "files.csv"
        listing.parent.mkdir(parents=True, exist_ok=True)
        listing.write_text("".join(f"{p},{i}\n" for i, p in enumerate(files)))
        stoker.pack(listing, pack, overwrite=True, progress=False)
    return str(pack)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pack", default=None, help="default: imagenet-sample packed here")
    args = parser.parse_args()
    pack = args.pack or make_pack()
    runs = []
    for _ in range(args.rounds + 1):
        out = subprocess.run([sys.executable, "-c", ROUND, str(pack)], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
        runs.append(json.loads(out.strip().splitlines()[-1]))
    first = statistics.median(r["first"] for r in runs[1:]) * 1e3
    steady = statistics.median(r["steady"] for r in runs[1:]) * 1e3
    # Each round's own difference: a busy moment stretches a round's first and steady batches
    # alike, which the difference of the two medians would not cancel.
    extra = sorted((r["first"] - r["steady"]) * 1e3 for r in runs[1:])
    print(f"first batch (build + take) {first:.1f} ms, steady batch {steady:.1f} ms "
          f"(medians of {args.rounds} fresh processes); first minus steady, round by round: "
          f"median {statistics.median(extra):+.1f} ms, "
          f"range {extra[0]:+.1f} to {extra[-1]:+.1f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
