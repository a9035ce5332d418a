"""Where one image's time goes in ImageLoader: decode, resample, and the rest, train and eval.

    .venv/bin/python benchmarks/stage_split.py                 # 3 rounds
    .venv/bin/python benchmarks/stage_split.py --perf          # and a perf profile of each
    .venv/bin/python benchmarks/stage_split.py --option fast_idct=1 --rounds 7

The 1,000 imagenet-sample files, packed with stoker's defaults (restart markers), read by
ImageLoader with one worker thread (threads=1, batch 256): a warm-up epoch, then --epochs timed
epochs, in --rounds interleaved rounds (train, eval, train, eval...). Per image, from
`loader.stats()["seconds"]` (each stage's wall time in the worker thread): read, decode (libjpeg:
entropy decoding, IDCT, upsampling and colour conversion; the restart-interval cut), transform
(the resampler, into the batch slot); and the worker's rest (sampler, slots, the clock itself),
the epoch's wall time less those. Printed: the medians over the rounds. With --option k=v (a
bool ImageLoader argument), every round also runs the loader with it, alternating which goes
first, and the ratio on / off of each stage's median is printed: the option's effect on the
stage it acts on, which the whole loader's throughput dilutes.

Wall times count the time the worker was not running, which other work on the machine inflates.
--perf also samples the worker thread's CPU time with `perf record` over one extra epoch of each
pipeline (root, or perf_event_paranoid <= 1), and splits its samples by library: libjpeg,
stoker's extension (the installed one has no symbols to split it further), libc, the kernel
(page-cache reads, page faults). Samples are taken only while the thread runs, so this split
holds on a busy machine too. Never a timed test.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "imagenet-sample"
STAGES = ("read", "decode", "transform", "collate")


def make_pack(work: Path) -> Path:
    import stoker

    pack = work / "pack"
    if not (pack / "manifest.json").exists():
        files = sorted(p for p in DATA.iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
        table = work / "list.csv"
        table.write_text("".join(f"{p},{i}\n" for i, p in enumerate(files)))
        stoker.pack(table, pack, overwrite=True, progress=False)
    return pack


def timed(pack: Path, train: bool, epochs: int, **options: bool) -> dict[str, float]:
    """ms an image: each stage, the wall time, and the rest."""
    import stoker

    loader = stoker.ImageLoader(
        str(pack), batch_size=256, train=train, threads=1, seed=0, **options
    )
    for _ in loader:
        pass  # warm-up: page cache, the batch slots' first touch
    before = loader.stats()["seconds"]
    n, t0 = 0, time.perf_counter()
    for epoch in range(1, epochs + 1):
        loader.set_epoch(epoch)
        for images, _labels in loader:
            n += images.shape[0]
    wall = time.perf_counter() - t0
    after = loader.stats()["seconds"]
    loader.close()
    out = {s: (after[s] - before[s]) * 1000 / n for s in STAGES}
    out["wall"] = wall * 1000 / n
    out["rest"] = out["wall"] - sum(out[s] for s in STAGES)
    return out


PERF_EPOCH = """
import sys, stoker
loader = stoker.ImageLoader(sys.argv[1], batch_size=256, train=sys.argv[2] == "train", threads=1)
for _ in loader:
    pass
open(sys.argv[3], "w").close()  # the warm-up is over: perf starts
import time
while not open(sys.argv[3]).read():
    time.sleep(0.01)
loader.set_epoch(1)
for _ in loader:
    pass
"""


def perf_split(pack: Path, mode: str, work: Path) -> dict[str, float]:
    """Shares of the worker thread's CPU samples over one epoch after a warm-up, by library."""
    flag = work / f"perf-{mode}.flag"
    flag.unlink(missing_ok=True)
    data = work / f"perf-{mode}.data"
    child = subprocess.Popen([sys.executable, "-c", PERF_EPOCH, str(pack), mode, str(flag)])
    while not flag.exists():
        time.sleep(0.05)
    perf = subprocess.Popen(
        ["perf", "record", "-q", "-F", "999", "-p", str(child.pid), "-o", str(data)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    flag.write_text("go")
    child.wait()
    perf.wait()
    # perf's "pid" key is the thread id; samples are periods (the clock's ticks).
    report = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "--sort", "pid,dso", "-F", "period,pid,dso"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    threads: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in report.splitlines():
        parts = line.split()
        if len(parts) < 3 or line.startswith("#") or not parts[0].isdigit():
            continue
        period, tid, dso = int(parts[0]), parts[1], parts[2]
        group = "other"
        for needle, name in LIBRARIES:
            if needle in dso:
                group = name
                break
        threads[tid][group] += period
    # The worker: the thread that ran libjpeg (the training thread only waits for batches).
    worker = max(threads.values(), key=lambda c: c["libjpeg"])
    total = sum(worker.values())
    return {k: 100 * v / total for k, v in worker.most_common()}


LIBRARIES = (
    ("libjpeg", "libjpeg"),
    ("_core", "stoker's extension (resampler, restart cut, the rest)"),
    ("libc", "libc (memcpy, memset)"),
    ("kernel", "kernel (pread, page faults)"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs a run")
    parser.add_argument("--perf", action="store_true")
    parser.add_argument("--option", default=None, help="k=v: also run with this bool option")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "stage-split")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    pack = make_pack(args.work)
    variants: dict[str, dict[str, bool]] = {"default": {}}
    if args.option:
        key, value = args.option.split("=", 1)
        variants[args.option] = {key: value.lower() in ("1", "true")}
    print(f"load average at the start: {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[tuple[str, str], list[dict[str, float]]] = {
        (m, v): [] for m in ("train", "eval") for v in variants
    }
    for r in range(args.rounds):
        for mode in ("train", "eval"):
            order = list(variants) if r % 2 == 0 else list(variants)[::-1]
            for variant in order:
                t = timed(pack, mode == "train", args.epochs, **variants[variant])
                results[mode, variant].append(t)
                print(
                    f"  round {r + 1} {mode} {variant}: "
                    + ", ".join(f"{k} {v:.3f}" for k, v in t.items())
                    + " ms an image",
                    flush=True,
                )
    medians = {}
    for (mode, variant), runs in results.items():
        med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        medians[mode, variant] = med
        shares = ", ".join(
            f"{k} {med[k]:.3f} ms ({100 * med[k] / med['wall']:.0f}%)" for k in (*STAGES, "rest")
        )
        print(f"{mode}, {variant}: {med['wall']:.3f} ms an image (one thread): {shares}")
    if args.option:
        for mode in ("train", "eval"):
            a, b = medians[mode, "default"], medians[mode, args.option]
            ratios = ", ".join(f"{k} {b[k] / a[k]:.3f}" for k in ("decode", "transform", "wall"))
            print(f"{mode}: {args.option} / default, medians: {ratios}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}", flush=True)
    if args.perf:
        with tempfile.TemporaryDirectory(dir=args.work) as tmp:
            for mode in ("train", "eval"):
                split = perf_split(pack, mode, Path(tmp))
                print(
                    f"{mode}, perf (CPU samples): "
                    + ", ".join(f"{k} {v:.1f}%" for k, v in split.items()),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
