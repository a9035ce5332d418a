"""What the doctor measures in the situations its tests set up, as figures: the numbers that
tests/python/test_doctor.py and test_map_stage.py no longer assert, since other jobs on the
machine move them.

    .venv/bin/python benchmarks/doctor_trials.py [--rounds 5]     # about 15 s a round

The tests check what load cannot change (each figure lies between the step's own calls, the
decisions on a model of the machine, trials built as the advice says, gains bounded by what a
bug would give); here each situation runs for real, and the median of --rounds runs (and the
lowest and highest) is printed with the machine it ran on:
1. a step that sleeps 50 ms beside a loader of 32-px images (2 threads): the verdict, the share
   of time waiting, step and loader times, the doubled batch's gain (~2x: the step is a sleep);
2. `stoker.watch` over the same loop: the share of time waiting (compute under 5%);
3. reads made slow (10 ms a sample, 2 threads): the gain of 4 threads (~2x: reads use no CPU);
4. a DataLoader without workers whose samples wait 20 ms: the gain of 2 workers (~2x);
5. a map= stage that sleeps 3 ms a sample: the loader without it, against the loader;
6. 1600x1200 JPEGs under a trivial step: the gains of max_side and of raw pixels.
Run it beside other jobs to see how far load moves each figure. Never a timed test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import stoker

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_data  # noqa: E402


def image_folder(root: Path, size=None, per_class=12, quality=90) -> Path:
    """3 classes of noisy gradients: sizes drawn from 60-400 px, or all `size` (h, w) with
    full-range noise (decoding dominates)."""
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            h, w = size or (int(rng.integers(60, 400)), int(rng.integers(60, 400)))
            yy, xx = np.mgrid[0:h, 0:w]
            base = np.stack([(xx * (c + 1)) % 256, (yy * 2) % 256, (xx + yy) % 256], -1)
            noise = rng.integers(0, 256 if size else 30, size=(h, w, 3))
            pixels = (base + noise).clip(0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / f"c{c}" / f"{i}.jpg", quality=quality)
    return root


class SlowReadDataset(torch.utils.data.Dataset):
    """test_doctor.py's: each sample waits 20 ms, then a small PIL resize."""

    def __init__(self, n=48, wait=0.02):
        self.n, self.wait = n, wait
        rng = np.random.default_rng(1)
        self.image = Image.fromarray(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.wait)
        img = self.image.resize((32, 32))
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1), i % 3


def gain(d, action):
    found = [r.gain for r in d.recommendations if r.action == action and r.gain is not None]
    return found[0] if found else float("nan")


def sleep_step(seconds):
    def step(batch):
        time.sleep(seconds)

    return step


def one_round(small: Path, big: Path) -> dict[str, float | str]:
    out: dict[str, float | str] = {}
    d = stoker.diagnose(
        stoker.ImageLoader(small, batch_size=4, size=32, threads=2), sleep_step(0.05),
        steps=8, warmup=1,
    )  # fmt: skip
    out["1. verdict"] = d.verdict
    out["1. stall"] = d.stall
    out["1. step (ms)"] = 1e3 * d.step_s
    out["1. loader alone (ms a batch)"] = 1e3 * d.loader_s
    out["1. doubled batch gain"] = gain(d, "batch_size")
    with stoker.watch(stoker.ImageLoader(small, batch_size=4, size=32, threads=2)) as w:
        for _batch in w:
            time.sleep(0.05)
    assert w.diagnosis is not None
    out["2. watch verdict"] = w.diagnosis.verdict
    out["2. watch stall"] = w.diagnosis.stall
    slow = stoker.ImageLoader(small, batch_size=4, size=32, threads=2, simulated_read_latency=0.01)
    out["3. io: 4 threads gain"] = gain(stoker.diagnose(slow, lambda b: None, steps=15), "threads")
    loader = torch.utils.data.DataLoader(SlowReadDataset(), batch_size=4, num_workers=0)
    d = stoker.diagnose(loader, lambda b: None, steps=10, warmup=1)
    out["4. DataLoader: workers gain"] = gain(d, "workers")

    def mapped(sample):
        time.sleep(0.003)
        return {}

    ld = stoker.ImageLoader(
        small, batch_size=8, size=48, seed=4, train=False, threads=2, map=mapped, map_threads=1
    )
    d = stoker.diagnose(ld, sleep_step(0.001), steps=12, warmup=2)
    out["5. map: loader without it, gain"] = gain(d, "map")
    d = stoker.diagnose(stoker.ImageLoader(big, batch_size=4, size=64, threads=1),
                        lambda b: None, steps=5, warmup=1)  # fmt: skip
    out["6. 1600x1200: max_side gain"] = gain(d, "max_side")
    out["6. 1600x1200: raw gain"] = gain(d, "raw")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="stoker-doctor-trials-") as tmp:
        small, big = Path(tmp) / "small", Path(tmp) / "big"
        stoker.pack(image_folder(Path(tmp) / "src"), small, shard_size="128KB", progress=False)
        src = image_folder(Path(tmp) / "big-src", size=(1200, 1600), per_class=8, quality=95)
        stoker.pack(src, big, progress=False)
        rounds = [one_round(small, big) for _ in range(args.rounds)]
    print(", ".join(f"{k}: {v}" for k, v in bench_data.machine().items()))
    print(f"{args.rounds} rounds: median (lowest - highest)")
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        if isinstance(values[0], str):
            print(f"  {key:<34} {', '.join(str(v) for v in values)}")
            continue
        numbers = [float(v) for v in values]
        print(f"  {key:<34} {statistics.median(numbers):9.3f}  "
              f"({min(numbers):.3f} - {max(numbers):.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
