"""How well each shuffle mixes a pack packed in class order, and how many shards it keeps open.

    .venv/bin/python benchmarks/shuffle_quality.py             # writes docs/shuffle_quality.png
    .venv/bin/python benchmarks/shuffle_quality.py --quick     # fewer epochs and windows

The pack is synthetic and sorted by class, as an ImageFolder tree packs (stoker.pack keeps
torchvision's order): --classes classes of --per-class tiny JPEGs in shards of --shard-size, so
that a shard holds about two classes, as a 256 MB shard of ImageNet does. stoker's orders are the
sample indices its ImageLoader hands out (return_index=True, one rank) for shuffle=False,
"global" and "block" with several shuffle_window values. MosaicML streaming's py1b and py1br
orders come from its own get_shuffle(algo, shard_sizes, num_canonical_nodes=1, seed, epoch,
block_size), run in a venv of its own (build/shuffle-peers/venv: numpy and mosaicml-streaming
0.7.6, the last release with py1b; 0.13 keeps py1br, py1e, py1s, py2s) on the same pack's shard
sizes, with block_size = the samples of the same number of shards as stoker's window.

Metrics, per method, over --epochs epochs:
- distinct classes per batch of --batch-size, as a fraction of what a uniform random order gives
  (classes * (1 - (1 - 1/classes) ** batch)): 1 is perfect mixing;
- how often two consecutive batches have the same majority class (a uniform order: about 1/classes
  or less);
- the spread of each sample's position across epochs (std of position / N; a uniform order gives
  1/sqrt(12) = 0.289);
- the most shards begun and not yet finished at any point of the epoch: what a reader must keep
  open or cached (the cost of mixing).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "shuffle-quality"
PEER_VENV = ROOT / "build" / "shuffle-peers" / "venv"
STREAMING = "mosaicml-streaming==0.7.6"

# Run inside the peer venv: streaming's shuffle modules need numpy only, but importing the
# `streaming` package imports its datasets (torch and more), so its two parent packages are
# stood in for by empty modules that point at the real folders.
PEER_SCRIPT = r"""
import importlib.util, json, os, sys, types
import numpy as np
spec = importlib.util.find_spec("streaming")
base = os.path.dirname(spec.origin)
for name, path in (("streaming", base), ("streaming.base", os.path.join(base, "base"))):
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module
from streaming.base.shuffle import get_shuffle
job = json.load(sys.stdin)
sizes = np.array(job["shard_sizes"], np.int64)
out = {}
for algo, block in job["runs"]:
    out[f"{algo}/{block}"] = np.stack(
        [get_shuffle(algo, sizes, 1, job["seed"], e, block) for e in range(job["epochs"])]
    )
np.savez(job["out"], **out)
"""


def make_pack(classes: int, per_class: int, shard_size: str) -> Path:
    """A pack sorted by class (ImageFolder's order), cached under build/shuffle-quality."""
    import stoker
    from PIL import Image

    pack = WORK / f"pack-{classes}x{per_class}-{shard_size}"
    if (pack / "manifest.json").exists():
        return pack
    folder = WORK / f"folder-{classes}x{per_class}"
    rng = np.random.default_rng(0)
    for c in range(classes):
        d = folder / f"class{c:04d}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(d / f"{i:04d}.jpg", quality=75)
    stoker.pack(folder, pack, shard_size=shard_size, progress=False, overwrite=True)
    return pack


def pack_layout(pack: Path) -> tuple[np.ndarray, np.ndarray]:
    """(label of each sample, shard sizes in pack order)."""
    import stoker

    dataset = stoker.load.loader.open_dataset(pack)
    labels = np.array([dataset.record(i)["label"] for i in range(len(dataset))])
    shards = [dataset.record(i)["shard"] for i in range(len(dataset))]
    sizes = [1]
    for a, b in zip(shards, shards[1:]):
        if a == b:
            sizes[-1] += 1
        else:
            sizes.append(1)
    return labels, np.array(sizes, np.int64)


def stoker_orders(pack: Path, shuffle, window: int, epochs: int, batch: int) -> np.ndarray:
    import stoker

    loader = stoker.ImageLoader(
        pack, batch_size=batch, size=8, train=False, shuffle=shuffle, shuffle_window=window,
        threads=2, return_index=True, seed=0,
    )  # fmt: skip
    orders = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        orders.append(np.concatenate([idx.numpy() for _, _, idx in loader]))
    loader.close()
    return np.stack(orders)


def ensure_peer_venv() -> Path:
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "numpy", "--no-deps", STREAMING],
            check=True,
        )
    return python


def streaming_orders(sizes: np.ndarray, runs: list[tuple[str, int]], epochs: int) -> dict:
    python = ensure_peer_venv()
    out = WORK / "streaming_orders.npz"
    job = {"shard_sizes": sizes.tolist(), "runs": runs, "seed": 0, "epochs": epochs,
           "out": str(out)}  # fmt: skip
    subprocess.run([str(python), "-c", PEER_SCRIPT], input=json.dumps(job), text=True, check=True)
    with np.load(out) as data:
        return {key: data[key] for key in data.files}


def metrics(orders: np.ndarray, labels: np.ndarray, sizes: np.ndarray, batch: int) -> dict:
    epochs, n = orders.shape
    classes = int(labels.max()) + 1
    ideal = classes * (1 - (1 - 1 / classes) ** batch)
    shard_of = np.repeat(np.arange(len(sizes)), sizes)
    distinct, same_majority, most_open = [], [], 0
    for order in orders:
        assert np.array_equal(np.sort(order), np.arange(n)), "not a permutation"
        batches = [labels[order[i : i + batch]] for i in range(0, n - batch + 1, batch)]
        distinct += [len(np.unique(b)) for b in batches]
        majority = [np.bincount(b).argmax() for b in batches]
        same_majority += [a == b for a, b in zip(majority, majority[1:])]
        # Shards open: begun (a sample read) and not finished (samples left).
        shards = shard_of[order]
        first = np.full(len(sizes), n)
        last = np.zeros(len(sizes), np.int64)
        np.minimum.at(first, shards, np.arange(n))
        np.maximum.at(last, shards, np.arange(n))
        opened = np.zeros(n + 1, np.int64)
        np.add.at(opened, first, 1)
        np.add.at(opened, last, -1)
        most_open = max(most_open, int(np.cumsum(opened).max()))
    position = np.empty_like(orders)
    for e, order in enumerate(orders):
        position[e, order] = np.arange(n)
    return {
        "distinct_classes_per_batch": float(np.mean(distinct)),
        "distinct_fraction_of_ideal": float(np.mean(distinct) / ideal),
        "same_majority_class": float(np.mean(same_majority)),
        "position_std": float(np.mean(position.std(axis=0, ddof=1)) / n),
        "most_shards_open": most_open,
    }


def plot(results: dict, shard_samples: float, batch: int, classes: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {"block": ("stoker block", "o-"), "py1b": ("streaming py1b", "s--"),
              "py1br": ("streaming py1br", "^:")}  # fmt: skip
    for family, (label, style) in styles.items():
        rows = sorted((r for r in results.values() if r["family"] == family),
                      key=lambda r: r["window_shards"])  # fmt: skip
        x = [r["window_shards"] for r in rows]
        left.plot(x, [r["distinct_fraction_of_ideal"] for r in rows], style, label=label)
        right.plot([r["most_shards_open"] for r in rows],
                   [r["distinct_fraction_of_ideal"] for r in rows], style, label=label)  # fmt: skip
    for key, label, color in (("global", "stoker global", "k"), ("none", "pack order", "grey")):
        r = results[key]
        left.axhline(r["distinct_fraction_of_ideal"], color=color, lw=1, ls="-.", label=label)
        right.plot([r["most_shards_open"]], [r["distinct_fraction_of_ideal"]], "D", color=color,
                   label=label)  # fmt: skip
    left.set_xscale("log", base=2)
    left.set_xlabel(f"window: shards (block_size = shards x {shard_samples:.0f} samples)")
    left.set_ylabel(f"distinct classes per batch of {batch}\n(fraction of a uniform order's)")
    left.set_title(f"Mixing, {classes} classes packed in class order")
    right.set_xscale("log", base=2)
    right.set_xlabel("most shards open at once (begun, not finished)")
    right.set_title("Mixing against what the reader keeps open")
    for ax in (left, right):
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    left.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int, default=200)
    parser.add_argument("--per-class", type=int, default=64)
    parser.add_argument("--shard-size", default="256KB")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--windows", default="1,2,4,8,16,32,64")
    parser.add_argument("--quick", action="store_true", help="3 epochs, windows 2,8,32")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "shuffle_quality.png")
    parser.add_argument("--json", type=Path, default=WORK / "results.json")
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.windows = 3, "2,8,32"
    windows = [int(w) for w in args.windows.split(",")]
    WORK.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    pack = make_pack(args.classes, args.per_class, args.shard_size)
    labels, sizes = pack_layout(pack)
    shard_samples = float(sizes.mean())
    print(f"pack: {len(labels)} samples, {len(sizes)} shards of {shard_samples:.1f} on average, "
          f"{args.classes} classes in class order")  # fmt: skip
    orders: dict[str, tuple[str, int, np.ndarray]] = {}
    for key, shuffle in (("none", False), ("global", "global")):
        orders[key] = (key, 0, stoker_orders(pack, shuffle, 1, args.epochs, args.batch_size))
    for w in windows:
        block = stoker_orders(pack, "block", w, args.epochs, args.batch_size)
        orders[f"block/{w}"] = ("block", w, block)
    runs = [(algo, int(round(w * shard_samples))) for algo in ("py1b", "py1br") for w in windows]
    peer = streaming_orders(sizes, runs, args.epochs)
    for (algo, block), w in zip(runs, windows * 2):
        orders[f"{algo}/{w}"] = (algo, w, peer[f"{algo}/{block}"])
    results = {}
    for key, (family, w, o) in orders.items():
        results[key] = {"family": family, "window_shards": w,
                        **metrics(o, labels, sizes, args.batch_size)}  # fmt: skip
    print(f"{'method':<14}{'classes/batch':>14}{'of ideal':>10}{'same major':>12}"
          f"{'pos std':>9}{'open':>6}")  # fmt: skip
    for key, r in results.items():
        print(f"{key:<14}{r['distinct_classes_per_batch']:>14.1f}"
              f"{r['distinct_fraction_of_ideal']:>10.3f}{r['same_majority_class']:>12.3f}"
              f"{r['position_std']:>9.3f}{r['most_shards_open']:>6d}")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                     "shards": len(sizes), "samples": len(labels),
                                     "results": results}, indent=1))  # fmt: skip
    plot(results, shard_samples, args.batch_size, args.classes, args.figure)
    print(f"figure: {args.figure}  ({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
