"""Packing throughput from every source format stoker.pack reads, on this machine's cores, in one
run (issue 20, item 6); writes its section of docs/BENCHMARKS.md.

    make bench-formats                                  # this and hf_datasets.py
    .venv/bin/python benchmarks/pack_sources.py         # 3 interleaved rounds (about 4 min)
    .venv/bin/python benchmarks/pack_sources.py --rounds 1 --no-write

The same 1,000 ImageNet validation JPEGs (../shared/data/imagenet-sample, 1,000 classes) are
written once under build/bench-formats/ by each format's own library: a path,label CSV of the
files, Parquet (pyarrow; an image struct of bytes and path, and a label), a Hugging Face
`save_to_disk` folder (Image + ClassLabel), LMDB (the lmdb package; labels from a dict), TFRecord
(the tfrecord package, TF's ImageNet layout, 4 files), HDF5 (h5py; variable-length uint8 images
and a label dataset), and two torch Datasets (one returning the file's bytes, one returning the
PIL image, which stoker encodes as PNG, lossless). Plus a .pt file of CIFAR-shaped uint8 arrays
(10,000 x 32 x 32 x 3 and labels: an array pack).

Each is packed with `stoker.pack(src, out, threads=<cores>, restart_interval=0)`: the images kept
byte for byte, so the figure is the source's reading and the writing, not the transcoder's; the
folder is also packed with the default (`restart_interval=1`, a lossless transcode adding
restart markers) for scale. Every pack is checked: 1,000 samples (10,000 for the .pt), labels in
order. Rounds time one pack of every source in turn; the figure is the median. Never a timed test.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # see hf_datasets.py
import datasets as hf_datasets  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_data", HERE / "bench_data.py")
assert _spec is not None and _spec.loader is not None
bench_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_data)

import stoker  # noqa: E402
from stoker.machine import usable_cores  # noqa: E402

ROOT = HERE.parent
WORK = ROOT / "build" / "bench-formats"
BEGIN, END = bench_data.markers("benchmarks/pack_sources.py")


class FileBytes:
    """A torch Dataset as research code writes one: the file's bytes and its label."""

    def __init__(self, samples: list[tuple[str, int]]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        path, label = self.samples[i]
        with open(path, "rb") as f:
            return f.read(), label


class PilImages(FileBytes):
    """The same, decoded: a PIL image (what torchvision's ImageFolder returns)."""

    def __getitem__(self, i: int) -> tuple[Any, int]:  # type: ignore[override]
        from PIL import Image

        path, label = self.samples[i]
        with Image.open(path) as img:
            return img.convert("RGB"), label


def make_sources(samples: list[tuple[str, int]]) -> dict[str, tuple[Any, dict]]:
    """name -> (what stoker.pack is given, its options); each written once."""
    WORK.mkdir(parents=True, exist_ok=True)
    images = [Path(p).read_bytes() for p, _ in samples]
    labels = [label for _, label in samples]
    names = [Path(p).name for p, _ in samples]
    sources: dict[str, tuple[Any, dict]] = {}

    csv = WORK / "files.csv"
    if not csv.exists():
        csv.write_text("".join(f"{Path(p).resolve()},{label}\n" for p, label in samples))
    sources["image files (path,label CSV)"] = (csv, {})

    parquet = WORK / "images.parquet"
    if not parquet.exists():
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table(
            {
                "image": [{"bytes": b, "path": n} for b, n in zip(images, names, strict=True)],
                "label": pa.array(labels, pa.int64()),
            }
        )
        pq.write_table(table, parquet, row_group_size=100)
    sources["Parquet (pyarrow)"] = (parquet, {})

    hf = WORK / "hf"
    if not (hf / "dataset_info.json").exists():
        features = hf_datasets.Features(
            {
                "image": hf_datasets.Image(),
                "label": hf_datasets.ClassLabel(names=[f"c{i}" for i in range(len(samples))]),
            }
        )
        rows = {"image": [{"bytes": b, "path": n} for b, n in zip(images, names, strict=True)],
                "label": labels}  # fmt: skip
        hf_datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(hf))
    sources["Hugging Face (save_to_disk)"] = (hf, {})

    lmdb_dir = WORK / "lmdb"
    if not (lmdb_dir / "data.mdb").exists():
        import lmdb

        env = lmdb.open(str(lmdb_dir), map_size=1 << 30)
        with env.begin(write=True) as txn:
            for name, data in zip(names, images, strict=True):
                txn.put(name.encode(), data)
        env.close()
    sources["LMDB (lmdb)"] = (lmdb_dir, {"label": dict(zip(names, labels, strict=True))})

    tfr = WORK / "tfrecord"
    if not tfr.exists():
        import tfrecord

        tfr.mkdir()
        for shard in range(4):
            writer = tfrecord.TFRecordWriter(str(tfr / f"train-{shard:05d}-of-00004"))
            for i in range(shard * len(samples) // 4, (shard + 1) * len(samples) // 4):
                writer.write({"image/encoded": (images[i], "byte"),
                              "image/class/label": (labels[i], "int")})  # fmt: skip
            writer.close()
    sources["TFRecord (tfrecord)"] = (tfr, {})

    h5 = WORK / "images.h5"
    if not h5.exists():
        import h5py

        with h5py.File(h5, "w") as f:
            data = f.create_dataset("images", (len(images),), dtype=h5py.vlen_dtype(np.uint8))
            for i, b in enumerate(images):
                data[i] = np.frombuffer(b, np.uint8)
            f.create_dataset("labels", data=np.array(labels, np.int64))
    sources["HDF5 (h5py)"] = (h5, {"members": {"jpg": "images"}, "label": "labels"})

    sources["torch Dataset of file bytes"] = (FileBytes(samples), {})
    sources["torch Dataset of PIL images (PNG)"] = (PilImages(samples), {})

    pt = WORK / "cifar.pt"
    if not pt.exists():
        import torch

        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (10_000, 32, 32, 3), dtype=torch.uint8, generator=g)
        torch.save({"image": x, "label": torch.arange(10_000) % 10}, pt)
    sources[".pt file (torch.save, 10,000 arrays)"] = (pt, {})
    return sources


def input_bytes(src: Any) -> int:
    if isinstance(src, FileBytes):
        return sum(os.path.getsize(p) for p, _ in src.samples)
    path = Path(src)
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    if path.suffix == ".csv":
        return sum(os.path.getsize(line.split(",")[0]) for line in path.read_text().splitlines())
    return path.stat().st_size


def check(name: str, result: Any, out: Path, expected: list[int]) -> None:
    if result.num_samples != len(expected) or result.failed:
        raise AssertionError(f"{name}: {result.num_samples} samples, failed {result.failed[:3]}")
    if name.startswith(".pt"):
        return
    got = [int(line.split("\t")[1]) for line in (out / "sources.tsv").read_text().splitlines()]
    if got != expected:
        raise AssertionError(f"{name}: the labels are not the source's, in its order")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    t0 = time.time()
    threads = usable_cores()
    load_start = os.getloadavg()[0]
    machine = bench_data.machine()
    print(f"machine: {machine}; load average {load_start:.2f}", flush=True)
    samples = bench_data.imagenet_sample()
    labels = [label for _, label in samples]
    sources = make_sources(samples)
    runs: dict[str, list[float]] = {}
    sizes: dict[str, tuple[int, int]] = {}
    plans: list[tuple[str, Any, dict]] = [
        (name, src, {"restart_interval": 0, **opts}) for name, (src, opts) in sources.items()
    ]
    csv_src = sources["image files (path,label CSV)"][0]
    plans.insert(1, ("image files, default restart markers", csv_src, {}))
    for r in range(args.rounds):
        cells = []
        for name, src, opts in plans:
            out = WORK / "out"
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            result = stoker.pack(src, out, threads=threads, progress=False, **opts)
            took = time.perf_counter() - t
            expected = labels if not name.startswith(".pt") else [i % 10 for i in range(10_000)]
            if r == 0:
                check(name, result, out, expected)
            runs.setdefault(name, []).append(result.num_samples / took)
            sizes[name] = (result.num_samples, input_bytes(src))
            cells.append(f"{name} {result.num_samples / took:,.0f}/s")
        print(f"round {r + 1}: " + "; ".join(cells), flush=True)
    shutil.rmtree(WORK / "out", ignore_errors=True)
    load = (load_start, os.getloadavg()[0])
    command = "python benchmarks/pack_sources.py" + " ".join(
        [""] + [a for a in sys.argv[1:] if a != "--no-write"]
    )
    text = section(runs, sizes, machine, command, time.time() - t0, threads, args.rounds, load)
    print(text)
    if not args.no_write:
        bench_data.write_section("benchmarks/pack_sources.py", text)
    return 0


def section(runs, sizes, machine, command, seconds, threads, rounds, load) -> str:
    median: Callable[[list[float]], float] = statistics.median
    lines = [
        BEGIN,
        "## Packing from the formats users have",
        "",
        "Written by `benchmarks/pack_sources.py` (`make bench-formats`); every number here comes "
        "from the same run.",
        "",
        f"- command: `{command}`",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}; Python "
        f"{machine['python']}, torch {machine['torch']}; load average {load[0]:.2f} at the "
        f"start, {load[1]:.2f} at the end",
        f"- date: {time.strftime('%Y-%m-%d')}, run time {seconds / 60:.1f} min",
        "- data: ../shared/data/imagenet-sample (1,000 ImageNet validation JPEGs, 110 KB on "
        "average) written by each format's own library; "
        f"`stoker.pack(src, out, threads={threads}, restart_interval=0)` (images kept byte for "
        "byte) unless the row says otherwise; every pack checked (count, labels in order).",
        f"- median of {rounds} interleaved rounds.",
        "",
        "| source | samples | samples/s | input MB/s |",
        "|---|---:|---:|---:|",
    ]
    for name, rates in runs.items():
        n, size = sizes[name]
        rate = median(rates)
        lines.append(f"| {name} | {n:,} | {rate:,.0f} | {rate * size / n / 1e6:,.1f} |")
    lines += ["", END]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
