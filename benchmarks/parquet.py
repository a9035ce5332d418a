"""Training straight from Parquet: the Hugging Face user's Parquet files read by `datasets` (from
local files, and streamed over HTTP), by LitData's ParquetLoader and by stoker (local, and over
HTTP cold and warm), against stoker reading its own pack of the same images, the same crop and
flip, in one run; writes its section of docs/BENCHMARKS.md ("Training from Parquet").

    make bench-parquet                                  # the LitData venv, then this
    .venv/bin/python benchmarks/parquet.py              # 3 interleaved rounds (about 10 min)
    .venv/bin/python benchmarks/parquet.py --rounds 1 --no-write --json build/bench-parquet/r.json

The data: ../shared/data/imagenet-sample (1,000 ImageNet validation JPEGs; label i for the i-th
file in name order, as bench_data.py lists them) as `datasets` writes a Parquet export: a
`Dataset.from_dict` of the paths with an `Image` and a `ClassLabel` feature, split into 4
contiguous shards, each with its images embedded (`embed_table_storage`) and written by
`to_parquet` with the row-group size `push_to_hub` computes (up to 100 MB a group: one group a
file here), named train-0000i-of-00004.parquet, under build/bench-parquet/parquet/ (made once).

The loaders, each making passes of RandomResizedCrop(224) + flip to uint8 CHW batches of 256:
- `datasets` + DataLoader: `load_dataset("parquet", data_files=[the files], split="train")`
  (its conversion to the Arrow cache timed once, apart), then hf_datasets.py's recipe:
  `set_transform` (PIL decode, torchvision's crop and flip written out), a
  `torch.utils.data.DataLoader(batch_size=256, shuffle=True, num_workers=N, persistent_workers)`
  for N in 1, 2 and 4; the best of them is the "datasets best" every ratio is taken against.
- `datasets` streaming over HTTP: `load_dataset("parquet", data_files=[http URLs],
  streaming=True)`, `.shuffle(seed=0, buffer_size=1000)` (its default buffer), `set_epoch`,
  `.map` of the same crop and flip, a DataLoader with N = 2 and 4 workers (4 files: 4 shards).
- LitData: `index_parquet_dataset` + `StreamingDataset(item_loader=ParquetLoader(),
  shuffle=True)` in its StreamingDataLoader with N = 2 and 4 spawned workers, in its own venv
  (peer_runners/litdata_parquet.py, set up by setup_peers.py), driven round by round.
- stoker, its pack: `stoker.pack(the Parquet folder, out)` (timed once), then
  `stoker.ImageLoader(out, batch_size=256, train=True, size=224)`. The pack adds restart markers
  to each JPEG (losslessly) so that the loader decodes only the region a crop needs; the same
  images' own bytes packed as they are (`restart_interval=None`) are a second pack, the one that
  measures what reading Parquet costs against reading a pack.
- stoker on the Parquet: the same call with the Parquet folder as the path; and with the
  files' URLs on the server (the list `datasets` streaming gets) and `cache_dir=`: "cold" is one
  epoch from a fresh cache folder timed from building the loader, "warm" epochs from the cache
  the loader's first epoch filled.

The server: nginx on loopback (tests/servers/nginx.py) serving build/bench-parquet/, behind
benchmarks/latency_proxy.py adding 20 ms to every request and new connection (remote.py's
LatencyProxy); the requests each epoch made are counted from nginx's access log. Both stream
over HTTP through the proxy: `datasets` and stoker. nginx rather than tests/servers/ranges.py's
RangeServer: that one answers from threads of this process, whose GIL and cores it would share
with the loaders being timed.

A pass is 2 epochs (2,000 images; 1 epoch for the cold row). Each loader makes one checked
warm-up pass (shapes, dtypes, every label once an epoch); then --rounds rounds each time one
pass of every loader in turn, each round starting with a different one. A loader that fails is
reported with its error, never given a figure. Never a timed test.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
# Hugging Face's `datasets` is imported with this folder off sys.path (no script here, this one
# named parquet.py least of all, may shadow what it imports), then bench_data.py from its file.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
import datasets as hf  # noqa: E402
from datasets.arrow_writer import (  # noqa: E402
    get_writer_batch_size_from_data_size,
    get_writer_batch_size_from_features,
)
from datasets.table import embed_table_storage  # noqa: E402

sys.path += [str(HERE), str(HERE / "peer_runners"), str(HERE.parent / "tests")]
_spec = importlib.util.spec_from_file_location("bench_data", HERE / "bench_data.py")
assert _spec is not None and _spec.loader is not None
bench_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_data)

import hf_datasets as recipe  # noqa: E402  (the script: its CropFlip and collate)
import interleaved  # noqa: E402
import stoker  # noqa: E402
from interleaved import Contender, PeerProcess  # noqa: E402
from remote import LatencyProxy  # noqa: E402
from servers.nginx import NGINX, Nginx  # noqa: E402
from stoker.machine import usable_cores  # noqa: E402

# 4 workers on 2 cores is one of the settings measured, on purpose.
warnings.filterwarnings("ignore", message="This DataLoader will create")

ROOT = HERE.parent
WORK = ROOT / "build" / "bench-parquet"
PARQUET = WORK / "parquet"  # only the .parquet files: every loader is given this folder
BEGIN, END = bench_data.markers("benchmarks/parquet.py")
BATCH, SIZE = 256, 224
EPOCHS_A_PASS = 2
SHARDS = 4
WORKERS = (1, 2, 4)  # datasets + DataLoader, local, as hf_datasets.py
STREAM_WORKERS = (2, 4)  # streaming and LitData: one per core, and one per file
DELAY_MS = 20.0
SHUFFLE_BUFFER = 1000  # datasets' default for IterableDataset.shuffle
DATASETS_BEST = "datasets + DataLoader"  # the prefix of the rows the "best" is taken from
PACK = "stoker, its pack"
PACK_ASIS = "stoker, a pack of the same bytes"  # restart_interval=None: the JPEGs as they are
STOKER_LOCAL = "stoker on the Parquet, local"
STOKER_COLD = f"stoker on the Parquet, HTTP + {DELAY_MS:g} ms, cold"
STOKER_WARM = f"stoker on the Parquet, HTTP + {DELAY_MS:g} ms, warm"


def workers_text(n: int) -> str:
    return f"{n} worker{'s' if n > 1 else ''}"


# --- the data -------------------------------------------------------------------------------------
def make_parquet() -> list[Path]:
    """imagenet-sample as `datasets` exports it: SHARDS Parquet files, images embedded, made
    once."""
    done = WORK / "parquet.done"
    if done.exists():
        return sorted(PARQUET.glob("*.parquet"))
    shutil.rmtree(PARQUET, ignore_errors=True)
    PARQUET.mkdir(parents=True)
    samples = bench_data.imagenet_sample()
    names = [f"class_{i:04d}" for i in range(len(samples))]
    features = hf.Features({"image": hf.Image(), "label": hf.ClassLabel(names=names)})
    ds = hf.Dataset.from_dict(
        {"image": [p for p, _ in samples], "label": [label for _, label in samples]},
        features=features,
    )
    # What Dataset.push_to_hub does to each shard before its to_parquet (datasets 5.2,
    # arrow_dataset.py: _push_parquet_shards_to_hub_single).
    rows_a_group = get_writer_batch_size_from_features(ds.features) or (
        get_writer_batch_size_from_data_size(len(ds), ds._estimate_nbytes())
    )
    for i in range(SHARDS):
        shard = ds.shard(num_shards=SHARDS, index=i, contiguous=True).with_format("arrow")
        shard = shard.map(embed_table_storage, batched=True, batch_size=rows_a_group,
                          keep_in_memory=True).with_format(None)  # fmt: skip
        out = PARQUET / f"train-{i:05d}-of-{SHARDS:05d}.parquet"
        shard.to_parquet(str(out), batch_size=rows_a_group)
    done.touch()
    return sorted(PARQUET.glob("*.parquet"))


def describe(files: list[Path]) -> str:
    import pyarrow.parquet as pq

    groups = [pq.ParquetFile(p).metadata.num_row_groups for p in files]
    rows = [pq.ParquetFile(p).metadata.num_rows for p in files]
    size = sum(p.stat().st_size for p in files)
    return (f"{len(files)} files, {sum(rows):,} rows, {sum(groups)} row groups "
            f"({', '.join(map(str, groups))} a file), {size / 1e6:,.0f} MB")  # fmt: skip


# --- the server -----------------------------------------------------------------------------------
class Server:
    """build/bench-parquet/ over HTTP on loopback: nginx, which logs every request, behind the
    latency proxy. `requests()`: the requests nginx has answered so far."""

    def __init__(self, root: Path, delay_ms: float):
        self.nginx = Nginx(root, WORK / "nginx")
        self.proxy = LatencyProxy(self.nginx.url, delay_ms)
        self.url = ""

    def __enter__(self) -> Server:
        (self.nginx.workdir / "access.log").unlink(missing_ok=True)
        self.nginx.start()
        try:
            self.url = self.proxy.__enter__().url
        except BaseException:
            self.nginx.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.proxy.__exit__()
        self.nginx.stop()

    def requests(self) -> int:
        with open(self.nginx.workdir / "access.log", "rb") as f:
            return sum(1 for _ in f)

    @staticmethod
    def version() -> str:
        out = subprocess.run([NGINX, "-v"], capture_output=True, text=True)
        return out.stderr.strip().split("/")[-1] or "?"


# --- the passes -----------------------------------------------------------------------------------
def checked_epochs(name: str, batches: Callable[[int], Any], labels: np.ndarray, epochs: int,
                   check: bool) -> tuple[int, str]:  # fmt: skip
    """`epochs` epochs of `batches(epoch)`: (images, what the checks found)."""
    counts = np.bincount(labels, minlength=len(labels))
    n = 0
    for e in range(epochs):
        seen = np.zeros_like(counts)
        for images, targets in batches(e):
            n += images.shape[0]
            if check:
                if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, SIZE, SIZE):
                    raise AssertionError(f"{name}: {images.dtype} {tuple(images.shape)}")
                seen += np.bincount(np.asarray(targets), minlength=len(labels))
        if check and not np.array_equal(seen, counts):
            raise AssertionError(f"{name}: an epoch's labels are not the dataset's")
    if n != epochs * len(labels):
        raise AssertionError(f"{name}: {n} images in {epochs} epochs")
    return n, f"{epochs} epoch{'s' if epochs > 1 else ''}, every label once an epoch"


class Measured(Contender):
    """A Contender whose passes count the server's requests (per epoch), and that may do some
    untimed work before each timed pass (`before`: the cold row's fresh cache folder)."""

    def __init__(self, name: str, run: Callable[[bool], tuple[int, str]], close=None, *,
                 server: Server | None = None, epochs: int = EPOCHS_A_PASS,
                 before: Callable[[], None] | None = None, loader: Any = None):  # fmt: skip
        super().__init__(name, run, close, loader=loader)
        self.server, self.epochs, self.before = server, epochs, before
        self.requests: list[float] = []  # per epoch, one a timed pass

    def timed(self) -> tuple[int, float]:
        if self.before is not None:
            self.before()
        start = self.server.requests() if self.server else 0
        out = super().timed()
        if self.server:
            self.requests.append((self.server.requests() - start) / self.epochs)
        return out


def datasets_local(files: list[Path], workers: int, labels: np.ndarray) -> Contender:
    ds = hf.load_dataset("parquet", data_files=[str(p) for p in files], split="train",
                                  cache_dir=str(WORK / "hf-cache"))  # fmt: skip
    ds.set_transform(recipe.CropFlip())
    torch.set_num_threads(1)  # the main process only collates; the workers do the work
    loader = torch.utils.data.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=workers, persistent_workers=True,
        prefetch_factor=2, collate_fn=recipe.collate,
    )  # fmt: skip
    name = f"{DATASETS_BEST}, {workers_text(workers)}"

    def run(check: bool) -> tuple[int, str]:
        return checked_epochs(name, lambda e: iter(loader), labels, EPOCHS_A_PASS, check)

    c = Measured(name, run)
    c.version = f"datasets {hf.__version__}, torch {torch.__version__}"
    return c


class StreamCropFlip:
    """The same crop and flip for `IterableDataset.map` (one example at a time)."""

    def __init__(self):
        self.crop_flip = recipe.CropFlip()

    def __call__(self, example: dict) -> dict:
        out = self.crop_flip({"image": [example["image"]], "label": [example["label"]]})
        return {"image": out["image"][0], "label": out["label"][0]}


def streaming_name(workers: int) -> str:
    return f"datasets streaming, HTTP + {DELAY_MS:g} ms, {workers_text(workers)}"


def datasets_streaming(urls: list[str], workers: int, labels: np.ndarray,
                       server: Server) -> Contender:  # fmt: skip
    ds = hf.load_dataset("parquet", data_files=urls, split="train", streaming=True)
    ds = ds.shuffle(seed=0, buffer_size=SHUFFLE_BUFFER).map(StreamCropFlip())
    torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=BATCH, num_workers=workers, persistent_workers=True, prefetch_factor=2,
        collate_fn=recipe.collate,
    )  # fmt: skip
    name = streaming_name(workers)
    epoch = [0]

    def batches(_: int) -> Any:
        ds.set_epoch(epoch[0])
        epoch[0] += 1
        return iter(loader)

    def run(check: bool) -> tuple[int, str]:
        return checked_epochs(name, batches, labels, EPOCHS_A_PASS, check)

    c = Measured(name, run, server=server)
    c.version = f"datasets {hf.__version__}, torch {torch.__version__}"
    return c


def litdata(workers: int, threads: int) -> Contender:
    return PeerProcess(
        f"LitData ParquetLoader, {workers_text(workers)}", "litdata_parquet", data=PARQUET,
        work=WORK / "litdata", threads=threads, batch_size=BATCH,
        options={"workers": str(workers), "epochs": str(EPOCHS_A_PASS), "size": str(SIZE)},
    )  # fmt: skip


def stoker_loader(source: Any, threads: int, **options: Any) -> Any:
    return stoker.ImageLoader(source, batch_size=BATCH, train=True, size=SIZE, threads=threads,
                              **options)  # fmt: skip


def stoker_epochs(loader: Any) -> Callable[[int], Any]:
    epoch = [0]

    def batches(_: int) -> Any:
        loader.set_epoch(epoch[0])
        epoch[0] += 1
        return iter(loader)

    return batches


def stoker_local(name: str, source: Any, threads: int, labels: np.ndarray) -> Contender:
    loader = stoker_loader(source, threads)
    batches = stoker_epochs(loader)

    def run(check: bool) -> tuple[int, str]:
        return checked_epochs(name, batches, labels, EPOCHS_A_PASS, check)

    c = Measured(name, run, loader.close, loader=loader)
    c.threads = threads
    c.version = f"stoker {stoker.__version__}"
    return c


def stoker_warm(source: Any, threads: int, labels: np.ndarray, server: Server) -> Contender:
    """Its warm-up pass fills the cache (its first epoch is a cold one); every timed pass reads
    from that cache."""
    cache = WORK / "cache" / "warm"
    shutil.rmtree(cache, ignore_errors=True)
    name = STOKER_WARM
    loader = stoker_loader(source, threads, cache_dir=str(cache))
    batches = stoker_epochs(loader)

    def run(check: bool) -> tuple[int, str]:
        return checked_epochs(name, batches, labels, EPOCHS_A_PASS, check)

    c = Measured(name, run, loader.close, server=server, loader=loader)
    c.threads = threads
    c.version = f"stoker {stoker.__version__}"
    return c


def stoker_cold(source: Any, threads: int, labels: np.ndarray, server: Server) -> Contender:
    """Each pass: a new loader on an empty cache folder (emptied before the clock starts), one
    epoch, timed from building the loader."""
    cache = WORK / "cache" / "cold"
    name = STOKER_COLD

    def fresh() -> None:
        shutil.rmtree(cache, ignore_errors=True)

    def run(check: bool) -> tuple[int, str]:
        loader = stoker_loader(source, threads, cache_dir=str(cache))
        try:
            return checked_epochs(name, stoker_epochs(loader), labels, 1, check)
        finally:
            loader.close()

    c = Measured(name, run, fresh, server=server, epochs=1, before=fresh)
    c.threads = threads
    c.version = f"stoker {stoker.__version__}"
    fresh()
    return c


def build(make: Callable[[], Contender], name: str) -> Contender:
    """A contender, or one that carries the error its construction raised."""
    try:
        return make()
    except Exception as e:  # reported in the section, never a figure
        c = Contender(name)
        c.error = f"{type(e).__name__}: {e}"
        print(f"  {name}: could not be built: {c.error}", flush=True)
        return c


def run_round(contenders: list[Contender], r: int) -> None:
    """One timed pass of every contender in turn (interleaved.run_rounds, with the round's
    number)."""
    cells = []
    for c in contenders:
        if c.error:
            continue
        try:
            items, seconds = c.timed()
        except Exception as e:  # reported in the section; its earlier rounds are kept
            c.error = f"round {r + 1}: {type(e).__name__}: {e}"
            print(f"  {c.name}: FAILED in {c.error}", flush=True)
            continue
        c.runs.append(items / seconds)
        cells.append(f"{c.name} {show(c.runs[-1])}")
    print(f"  round {r + 1}: " + ", ".join(cells), flush=True)


# --- the report -----------------------------------------------------------------------------------
def show(rate: float) -> str:
    return f"{rate:,.0f}"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def rounds_text(mine: Contender, theirs: list[Contender]) -> str:
    ratios = interleaved.per_round_ratios(mine, theirs) if theirs else []
    return ", ".join(f"{r:.2f}x" for r in ratios) or "-"


def requests_cell(c: Contender) -> str:
    values = getattr(c, "requests", None)
    if not values or getattr(c, "server", None) is None:
        return ""
    mid = float(np.median(values))
    return f"{mid:,.0f}" if min(values) == max(values) else (
        f"{mid:,.1f} ({min(values):,.0f}-{max(values):,.0f})"
    )  # fmt: skip


def section(report: dict, contenders: list[Contender]) -> str:
    m = report["machine"]
    measured = [c for c in contenders if c.runs]
    datasets_rows = [c for c in measured if c.name.startswith(DATASETS_BEST)]
    best = max(datasets_rows, key=lambda c: c.median or 0) if datasets_rows else None
    pack = next((c for c in measured if c.name == PACK), None)
    asis = next((c for c in measured if c.name == PACK_ASIS), None)
    rounds = max((len(c.runs) for c in measured), default=0)
    head = " | ".join(f"round {i + 1}" for i in range(rounds))
    table = [
        f"| loader (images/s) | {head} | median | / datasets best | / stoker's pack | "
        "/ the same bytes packed | requests an epoch |",
        "|---" + "|---:" * (rounds + 5) + "|",
    ]
    for c in measured:
        cells = [show(v) for v in c.runs] + ["-"] * (rounds - len(c.runs))
        table.append(
            f"| {c.name} | " + " | ".join(cells) + f" | **{show(c.median)}** | "
            f"{ratio(c.median, best.median if best else None)} | "
            f"{ratio(c.median, pack.median if pack else None)} | "
            f"{ratio(c.median, asis.median if asis else None)} | {requests_cell(c)} |"
        )
    local = next((c for c in measured if c.name == STOKER_LOCAL), None)
    local_vs_asis = ratio(local.median if local else None, asis.median if asis else None)
    versions = sorted({c.version for c in contenders if c.version})
    lines = [
        BEGIN,
        "## Training from Parquet",
        "",
        "Written by `benchmarks/parquet.py` (`make bench-parquet`); every number here comes "
        "from the same run.",
        "",
        f"- command: `{report['command']}`",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory']}; Python {m['python']}, "
        f"libjpeg-turbo {m['libjpeg-turbo']}; {'; '.join(versions)}; nginx "
        f"{report['nginx']}; load average {report['load'][0]:.2f} at the start, "
        f"{report['load'][1]:.2f} at the end",
        f"- date: {report['date']}, run time {report['seconds'] / 60:.1f} min",
        "- data: ../shared/data/imagenet-sample (1,000 ImageNet validation JPEGs) as `datasets` "
        "exports it: `Dataset.from_dict` of the paths with `Image` + `ClassLabel`, "
        f"{SHARDS} contiguous shards each embedded (`embed_table_storage`) and written by "
        "`to_parquet` with `push_to_hub`'s row-group size: " + report["data"] + ".",
        f"- server: nginx on loopback behind `benchmarks/latency_proxy.py`, which holds every "
        f"request and new connection {DELAY_MS:g} ms (no `tc netem` in this sandbox); requests "
        "counted from nginx's access log (nginx, in its own process: a Python server in the "
        "benchmark's process would share its GIL with the loaders timed).",
        f"- `datasets` + DataLoader: `load_dataset('parquet', data_files=[...])` (its Arrow "
        f"cache made once in {report['hf_convert_s']:.1f} s, untimed) + `set_transform` (PIL "
        f"decode, RandomResizedCrop({SIZE}) + flip as torchvision draws them), batch {BATCH}, "
        'shuffled, persistent workers; the best of them is "datasets best". Streaming: '
        "`load_dataset('parquet', data_files=[http URLs], streaming=True)`, "
        f"`.shuffle(seed=0, buffer_size={SHUFFLE_BUFFER})`, `set_epoch`, `.map` of the same "
        "crop and flip, a DataLoader with persistent workers.",
        "- LitData: `index_parquet_dataset(folder)` + `StreamingDataset(folder, "
        "item_loader=ParquetLoader(), shuffle=True, transform=<PIL decode, the same crop and "
        "flip>)` in its StreamingDataLoader (spawned workers: it refuses fork with "
        "ParquetLoader), in its own venv and process on the same cores.",
        f"- stoker: `stoker.ImageLoader(path, batch_size={BATCH}, train=True, size={SIZE})` with "
        f"path = its pack (`stoker.pack(the Parquet folder, out)`: {report['packing']}; its "
        "JPEGs given restart markers, so that a crop's region alone is decoded), a pack of the "
        "same bytes (`restart_interval=None`: the JPEGs as they are in the Parquet), the "
        f"Parquet folder, or {report['stoker_http_source']} on the server with `cache_dir=` "
        "(cold: a fresh cache folder each pass, one epoch timed from building the loader; "
        "warm: epochs from the cache its warm-up pass filled).",
        f"- throughput: images/s over passes of {EPOCHS_A_PASS} epochs (the cold row: 1), "
        f"median of {report['rounds']} interleaved rounds (each starting with another loader) "
        "after a checked warm-up pass of each; requests an epoch: their median over the timed "
        "passes (range in brackets).",
        "",
        *table,
        "",
        f"- reading: the Parquet path's own cost is the row group's decode and hand-over: "
        f"against a pack of the same bytes it reads {local_vs_asis}. stoker's default pack gives "
        "its JPEGs restart markers when packing, with which only a crop's region is "
        "entropy-decoded; a JPEG as `datasets` stores it has none, and is decoded down to the "
        "crop's last row in a loader's first epoch (the warm-up pass here; the cold row is one), "
        "which records where its MCU rows start (its scan index), then cut through that index "
        "in the later epochs these rows time.",
        *(
            f"- {c.name}, round by round: {rounds_text(c, datasets_rows)} the best "
            f"`datasets` + DataLoader of the round; {rounds_text(c, [pack] if pack else [])} "
            f"stoker's pack; {rounds_text(c, [asis] if asis else [])} the same bytes packed"
            for c in measured
            if c.name.startswith("stoker on the Parquet")
        ),
        *(f"- {c.name}: {c.note}" for c in measured),
        *(f"- {c.name}: **not run**: {c.error}" for c in contenders if c.error and not c.runs),
        *(
            f"- {c.name}: stopped after {len(c.runs)} rounds: {c.error}"
            for c in contenders
            if c.error and c.runs
        ),  # fmt: skip
        "",
        END,
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    t0 = time.time()
    threads = usable_cores()
    load_start = os.getloadavg()[0]
    machine = bench_data.machine()
    print(f"machine: {machine}; load average {load_start:.2f}", flush=True)
    files = make_parquet()
    data = describe(files)
    print(f"  data: {data}", flush=True)
    labels = np.array([label for _, label in bench_data.imagenet_sample()])

    pack = WORK / "pack"
    t = time.perf_counter()
    result = stoker.pack(PARQUET, pack, overwrite=True, progress=False)
    took = time.perf_counter() - t
    packing = (f"{result.num_samples:,} images in {took:.1f} s, {threads} threads")  # fmt: skip
    print(f"  packed: {packing}", flush=True)
    asis = WORK / "pack-asis"
    stoker.pack(PARQUET, asis, overwrite=True, progress=False, restart_interval=None)

    shutil.rmtree(WORK / "hf-cache", ignore_errors=True)
    t = time.perf_counter()
    hf.load_dataset("parquet", data_files=[str(p) for p in files], split="train",
                             cache_dir=str(WORK / "hf-cache"))  # fmt: skip
    hf_convert_s = time.perf_counter() - t

    contenders: list[Contender] = []
    with Server(WORK, DELAY_MS) as server:
        urls = [f"{server.url}/{PARQUET.name}/{p.name}" for p in files]
        # The files' URLs, as `datasets` is given them (a folder's URL reads nginx's index page:
        # one request more).
        http_source = urls
        http_text = "the files' URLs (the list `datasets` streaming is given)"
        for w in WORKERS:
            contenders.append(build(lambda w=w: datasets_local(files, w, labels),
                                    f"{DATASETS_BEST}, {workers_text(w)}"))  # fmt: skip
        for w in STREAM_WORKERS:
            contenders.append(build(lambda w=w: datasets_streaming(urls, w, labels, server),
                                    streaming_name(w)))  # fmt: skip
        for w in STREAM_WORKERS:
            contenders.append(litdata(w, threads))
        contenders.append(build(lambda: stoker_local(PACK, pack, threads, labels), PACK))
        contenders.append(build(lambda: stoker_local(PACK_ASIS, asis, threads, labels),
                                PACK_ASIS))  # fmt: skip
        contenders.append(build(lambda: stoker_local(STOKER_LOCAL, PARQUET, threads, labels),
                                STOKER_LOCAL))  # fmt: skip
        contenders.append(build(lambda: stoker_cold(http_source, threads, labels, server),
                                STOKER_COLD))  # fmt: skip
        contenders.append(build(lambda: stoker_warm(http_source, threads, labels, server),
                                STOKER_WARM))  # fmt: skip
        kept = interleaved.warm_up(contenders)
        try:
            for r in range(args.rounds):
                k = r % len(kept)
                run_round(kept[k:] + kept[:k], r)
        finally:
            for c in kept:
                c.close()
        nginx = server.version()
    command = "python benchmarks/parquet.py" + "".join(
        f" {a}" for a in sys.argv[1:] if a != "--no-write"
    )
    report = {
        "command": command, "date": time.strftime("%Y-%m-%d"), "machine": machine,
        "rounds": args.rounds, "data": data, "packing": packing, "hf_convert_s": hf_convert_s,
        "stoker_http_source": http_text, "nginx": nginx, "delay_ms": DELAY_MS,
        "load": (load_start, os.getloadavg()[0]), "seconds": time.time() - t0,
        "loaders": [
            {"name": c.name, "images_per_s": c.runs, "median": c.median,
             "requests_an_epoch": getattr(c, "requests", []), "check": c.note,
             "error": c.error, "version": c.version}
            for c in contenders
        ],
    }  # fmt: skip
    text = section(report, contenders)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    if not args.no_write:
        bench_data.write_section("benchmarks/parquet.py", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
