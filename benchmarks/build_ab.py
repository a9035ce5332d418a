"""Two builds of stoker, one ImageLoader: an interleaved A/B on the imagenet-sample pack.

    git worktree add /tmp/before <commit>
    (cd /tmp/before && ../main/.venv/bin/python -m pip install -q --no-build-isolation --no-deps \\
        --target /tmp/before-build -Cbuild-dir=/tmp/before-cmake .)
    .venv/bin/python benchmarks/build_ab.py /tmp/before-build [AFTER] [--rounds 5]

AFTER defaults to the installed stoker's directory. Each side runs in a fresh process with its
build first on PYTHONPATH: ImageLoader on imagenet-sample packed with the defaults
(benchmarks/first_batch.py's pack), batch 256, one warm-up epoch, then two timed epochs; train
and eval, with 2 threads and with 1. `--arrays` adds the array loader: a CIFAR-10-shaped array
pack (50,000 rows of 32x32x3 uint8 and a label), Loader with RandomCrop(32, padding=4) + flip,
batch 512, 2 threads (what issue 34's redesign of the Python layer must leave unchanged). The
rounds alternate which build goes first, so drift in the machine's load hits both alike.
Printed per configuration: the medians of img/s, of the process's CPU time an image, and of the
decode stage (`loader.stats()`), before -> after, with the range of the rounds' own ratios.
Never a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from first_batch import make_pack  # noqa: E402

ONE_RUN = r"""
import json, sys, time
import stoker
pack, mode, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
loader = stoker.ImageLoader(pack, batch_size=256, size=224, train=mode == "train",
                            threads=threads, seed=0)
for _ in loader:
    pass
before, n0 = loader.stats()["seconds"], loader.stats()["samples"]
t0, c0 = time.perf_counter(), time.process_time()
for epoch in (1, 2):
    loader.set_epoch(epoch)
    for _ in loader:
        pass
t1, c1 = time.perf_counter(), time.process_time()
after, n = loader.stats()["seconds"], loader.stats()["samples"] - n0
loader.close()
print(json.dumps({"images_per_s": n / (t1 - t0), "cpu_ms": (c1 - c0) / n * 1e3,
                  "decode_ms": (after["decode"] - before["decode"]) / n * 1e3}))
"""
CONFIGS = (("train", 2), ("eval", 2), ("train", 1), ("eval", 1))

ARRAY_RUN = r"""
import json, sys, time
import stoker
pack, threads = sys.argv[1], int(sys.argv[3])
fields = {"image": stoker.Image("image", size=32, geometry=stoker.RandomCrop(32, padding=4),
                                hflip=0.5), "label": stoker.Label("label")}
loader = stoker.Loader(pack, batch_size=512, fields=fields, threads=threads, seed=0)
for _ in loader:
    pass
n0 = loader.stats()["samples"]
t0, c0 = time.perf_counter(), time.process_time()
for epoch in (1, 2):
    loader.set_epoch(epoch)
    for _ in loader:
        pass
t1, c1 = time.perf_counter(), time.process_time()
n = loader.stats()["samples"] - n0
loader.close()
print(json.dumps({"images_per_s": n / (t1 - t0), "cpu_ms": (c1 - c0) / n * 1e3,
                  "decode_ms": 0.0}))
"""


def array_pack() -> str:
    """A CIFAR-10-shaped array pack, made once (under build/bench-arrays, as benchmarks/arrays.py
    makes its own)."""
    import numpy as np

    import stoker

    out = HERE.parent / "build" / "bench-arrays" / "build-ab-cifar"
    if not (out / "manifest.json").exists():
        rng = np.random.default_rng(0)
        stoker.pack_arrays({"image": rng.integers(0, 256, (50_000, 32, 32, 3), dtype=np.uint8),
                            "label": rng.integers(0, 10, 50_000)}, out, progress=False)  # fmt: skip
    return str(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="a directory holding a stoker package (pip --target)")
    parser.add_argument("after", nargs="?", default=None, help="default: the installed stoker")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--arrays", action="store_true", help="also the array loader")
    args = parser.parse_args()
    if args.after is None:
        import stoker

        args.after = str(Path(stoker.__file__).resolve().parents[1])
    builds = {"before": args.before, "after": args.after}
    pack = make_pack()
    configs = list(CONFIGS) + ([("arrays", 2)] if args.arrays else [])
    arrays = array_pack() if args.arrays else ""
    results: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for mode, threads in configs:
            for name in builds if r % 2 == 0 else reversed(builds):
                env = dict(os.environ, PYTHONPATH=builds[name])
                run, where = (ARRAY_RUN, arrays) if mode == "arrays" else (ONE_RUN, pack)
                command = [sys.executable, "-c", run, where, mode, str(threads)]
                out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                results.setdefault((mode, threads, name), []).append(json.loads(out.stdout))
    for mode, threads in configs:
        a, b = results[(mode, threads, "before")], results[(mode, threads, "after")]

        def med(runs: list[dict[str, float]], key: str) -> float:
            return statistics.median(run[key] for run in runs)

        ratios = [y["images_per_s"] / x["images_per_s"] for x, y in zip(a, b)]
        speed = med(b, "images_per_s") / med(a, "images_per_s")
        print(f"{mode}, threads={threads}: img/s {med(a, 'images_per_s'):,.0f} -> "
              f"{med(b, 'images_per_s'):,.0f} ({speed:.3f}x; rounds {min(ratios):.3f}-"
              f"{max(ratios):.3f}), CPU ms an image {med(a, 'cpu_ms'):.3f} -> "
              f"{med(b, 'cpu_ms'):.3f}, decode ms an image {med(a, 'decode_ms'):.3f} -> "
              f"{med(b, 'decode_ms'):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
