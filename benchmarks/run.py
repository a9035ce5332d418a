"""stoker against every peer, measured in one run; writes benchmarks/results/peers.json (every
round's figure, the machine, the date, the command), docs/BENCHMARKS.md from it, and the
README's chart (benchmarks/chart.py: docs/images/throughput.svg).

    make bench-peers                                # set up every peer's venv, then this
    .venv/bin/python benchmarks/run.py              # every installed peer (about an hour)
    .venv/bin/python benchmarks/run.py --quick      # one round, one timed epoch
    .venv/bin/python benchmarks/run.py --peers stoker,FFCV --datasets imagenet-sample --no-write

Each peer runs in its own process and virtual environment (benchmarks/peers.py), pinned to the
same cores: one warm-up epoch, then timed epochs; a peer's figure is the median over rounds of the
median epoch, and rounds interleave the peers so that a burst of load on the machine hits all of
them alike. Ratios compare numbers from this same run. Never a timed test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_data  # noqa: E402
import peers  # noqa: E402
from stoker.tools import bench  # noqa: E402
from stoker.machine import usable_cores  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Photos are few and large: a smaller batch gives each DataLoader worker whole batches to make.
BATCH_SIZE = {"imagenet-sample": 256, "photos": 32}
COPIES = {"imagenet-sample": 5, "photos": 1}  # epochs of 5,000 and 156 samples
DESCRIPTION = {
    "imagenet-sample": "../shared/data/imagenet-sample: 1,000 ImageNet validation JPEGs, mostly "
    "500x375, baseline, about 110 kB each; listed 5 times, so 5,000 samples an epoch.",
    "photos": "13 real photos of 1.2-16 MP from ../shared/data/jpeg-variety (phones, SLRs, "
    "Ultra HDR), every other one made progressive by `jpegtran -progressive` (lossless), "
    "each listed 12 times: 156 samples an epoch.",
}
warnings.filterwarnings("ignore", message="This DataLoader will create")


def ceiling(samples: list, threads: int, epochs: int) -> float:
    """libjpeg-turbo decoding every file at full size on `threads` threads, nothing else."""
    blobs = [Path(p).read_bytes() for p, _ in samples]
    return bench.time_epochs("ceiling", bench.decode_ceiling_epoch(blobs, threads=threads),
                             epochs=epochs).images_per_s  # fmt: skip


def loader_footprint(pack: Path, batch_size: int = 256) -> dict:
    """First-batch latency and anonymous memory of a loader, in a fresh process."""
    code = f"""
import json, time, statistics
import torch, stoker
def anon():
    for line in open('/proc/self/status'):
        if line.startswith('RssAnon'):
            return int(line.split()[1]) * 1024
firsts = []
for _ in range(5):
    t0 = time.perf_counter()
    loader = stoker.ImageLoader({str(pack)!r}, batch_size={batch_size})
    images, labels = next(iter(loader))
    firsts.append(time.perf_counter() - t0)
    loader.close()
    del loader, images, labels
base = anon()
peak = base
loader = stoker.ImageLoader({str(pack)!r}, batch_size={batch_size})
for epoch in range(3):
    for images, labels in loader:
        peak = max(peak, anon())
print(json.dumps({{"first_batch_s": statistics.median(firsts), "anon_mb": (peak - base) / 2**20}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fmt(values: list[float]) -> str:
    """The median of the rounds, with their range when there are several."""
    if not values:
        return "-"
    mid = f"{statistics.median(values):,.0f}"
    return mid if len(values) == 1 else f"{mid} ({min(values):,.0f}-{max(values):,.0f})"


RESULTS = ROOT / "benchmarks" / "results" / "peers.json"


def write_results(results, ceilings, machine, command, seconds, threads, rounds, epochs) -> None:
    """The run's figures as data (benchmarks/chart.py draws the README's chart from them)."""
    datasets_out = {}
    for dataset, by_pipeline in results.items():
        entry: dict = {"batch_size": BATCH_SIZE[dataset], "description": DESCRIPTION[dataset]}
        for pipe, by_peer in by_pipeline.items():
            entry[pipe] = {peer: {"median": statistics.median(rates), "rounds": rates}
                           for peer, rates in by_peer.items() if rates}  # fmt: skip
        if dataset in ceilings:
            entry["ceiling"] = round(ceilings[dataset])
        datasets_out[dataset] = entry
    out = {
        "format": "stoker-bench-peers", "version": 1, "command": command,
        "date": time.strftime("%Y-%m-%d"), "run_minutes": round(seconds / 60, 1),
        "machine": machine, "threads": threads, "rounds": rounds, "epochs": epochs,
        "datasets": datasets_out,
    }  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RESULTS}")


def write_report(results, failures, info, ceilings, footprint, machine, command, seconds):
    lines = [
        "# Benchmarks",
        "",
        "Written by `benchmarks/run.py` (`make bench-peers`); every number in a table comes "
        "from the same run.",
        "",
        f"- command: `{command}`",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}; "
        f"Python {machine['python']}, torch {machine['torch']}, "
        f"libjpeg-turbo {machine['libjpeg-turbo']}",
        f"- date: {time.strftime('%Y-%m-%d')}, run time {seconds / 60:.1f} min",
        "- throughput: images/s over whole epochs, output 224x224 uint8 (every sample once an "
        "epoch, checked); each peer in its own process and virtual environment, pinned to the "
        "same cores and told to use that many threads or workers; one warm-up epoch (JIT "
        "compiles, page cache), then timed epochs; the figure is the median over interleaved "
        "rounds of each round's median epoch, with the rounds' range in brackets.",
        "- train: RandomResizedCrop 224 (scale 0.08-1, ratio 3/4-4/3) + horizontal flip; "
        "eval: Resize 256 (shorter side) + CenterCrop 224. Each peer's own way of doing them, "
        "and how it differs from torchvision's, is listed under the tables.",
        "- ceiling: libjpeg-turbo decoding every file at full size on the same cores, "
        "nothing else.",
        "- elsewhere: how well each shuffle mixes a pack, against MosaicML streaming's "
        "(`benchmarks/shuffle_quality.py`), is in "
        "[docs/DISTRIBUTED.md](DISTRIBUTED.md#measured-block-against-global-and-mosaicml-"
        "streamings-py1b-and-py1br); reading from S3 against streaming and LitData "
        "(`benchmarks/remote.py`) is the last section here.",
        "",
    ]
    by_name = {peer.name: peer for peer in peers.all_peers()}
    for dataset, by_pipeline in results.items():
        lines += [
            f"## {dataset} (batch {BATCH_SIZE[dataset]})",
            "",
            DESCRIPTION[dataset],
            "",
            "| loader | train | eval | stoker / it, train | stoker / it, eval |",
            "|---|---:|---:|---:|---:|",
        ]
        mine = {
            p: statistics.median(r["stoker"]) for p, r in by_pipeline.items() if r.get("stoker")
        }
        for peer in peers.all_peers():
            if peer.name in failures:
                continue
            cells = [_fmt(by_pipeline[p].get(peer.name, [])) for p in ("train", "eval")]
            ratios = [
                f"{mine[p] / statistics.median(by_pipeline[p][peer.name]):.2f}x"
                if p in mine and by_pipeline[p].get(peer.name) and not peer.ours else ""
                for p in ("train", "eval")
            ]  # fmt: skip
            lines.append(f"| {peer.name} | {cells[0]} | {cells[1]} | {ratios[0]} | {ratios[1]} |")
        if dataset in ceilings:
            lines.append(f"| full-decode ceiling | {ceilings[dataset]:,.0f} | | | |")
        lines.append("")
        for p, res in by_pipeline.items():
            others = {
                peer.name: statistics.median(res[peer.name])
                for peer in peers.all_peers()
                if not peer.ours and res.get(peer.name)
            }
            originals = {n: v for n, v in others.items() if by_name[n].decodes_originals}
            if p not in mine or not others:
                continue
            best = max(others, key=others.__getitem__)
            text = f"- {p}: stoker / fastest peer ({best}) = **{mine[p] / others[best]:.2f}x**"
            if originals and best not in originals:
                b2 = max(originals, key=originals.__getitem__)
                text += (f"; / fastest peer decoding the original files ({b2}) = "
                         f"**{mine[p] / originals[b2]:.2f}x**")  # fmt: skip
            if dataset in ceilings:
                text += f"; / full-decode ceiling = {mine[p] / ceilings[dataset]:.2f}x"
            lines.append(text)
            # Like for like: stoker on the kind of data FFCV's .beton holds (512 px copies).
            ffcv = others.get("FFCV")
            alike = [q for q in peers.all_peers() if q.like_ffcv and res.get(q.name)]
            if ffcv and alike:
                lines.append(
                    f"- {p}, like for like with FFCV (both decoding copies at most 512 px): "
                    + "; ".join(
                        f"{q.name} / FFCV = **{statistics.median(res[q.name]) / ffcv:.2f}x**"
                        for q in alike
                    )
                )
        lines.append("")
    lines += ["## The peers", ""]
    for peer in peers.all_peers():
        if peer.name in failures:
            lines.append(f"- **{peer.name}**: not measured, {failures[peer.name]}")
        elif peer.name in info:
            version, notes = info[peer.name]
            lines.append(f"- **{peer.name}** ({version}). {notes}".rstrip())
    lines.append("")
    if footprint:
        lines += [
            "## Loader footprint (imagenet-sample, batch 256, train)",
            "",
            "- first batch after the loader is built: "
            f"{footprint['first_batch_s'] * 1000:.0f} ms (median of 5)",
            "- anonymous memory of the loader while iterating 3 epochs: "
            f"{footprint['anon_mb']:.0f} MB",
            "",
        ]
    lines += [
        "## Where the time goes, and what bounds it",
        "",
        "- Where one image's time goes (`benchmarks/stage_split.py --option fast_idct=1 "
        "--rounds 5 --perf`: imagenet-sample packed with restart markers, ImageLoader with one "
        "worker thread, `loader.stats()` per stage, medians of 5 interleaved rounds): train "
        "1.33 ms an image, of which decoding 77% (libjpeg: entropy decoding, IDCT, upsampling, "
        "colour conversion; the restart cut), the resampler 21%, reading 2%, the rest under "
        "1%; eval 1.53 ms: decoding 80%, the resampler 18%, reading 2%. The machine was not "
        "quiet (load average 2.3-3.0 from other work), which stretches every stage alike; "
        "`perf` samples of the worker thread, taken only while it runs, split the same way: "
        "libjpeg 69% (train) and 73% (eval), stoker's extension (the resampler, the restart "
        "cut) 23% and 21%, libc 5% and 4%, the kernel 2%. The resampler is Pillow's algorithm "
        "with AVX2 kernels, about 5x faster than Pillow (153 vs 717 us for 500x375 -> 224), "
        "and each pass reads only the rows and columns its taps need; the one slack seen is "
        "the horizontal kernel's fourth lane (each pixel's RGB in four int32 lanes), at most a "
        "quarter of one pass's multiplies. No cheap resampler win is visible: the time is in "
        "the decoder.",
        "- A training crop of a 500x375 ImageNet file is too small for any DCT scale (the crop "
        "would fall below 224 px). On 300 of these files (one thread) a full decode takes 0.95 ms "
        "of which Huffman decoding is 0.67 ms (71%), and libjpeg must Huffman-decode every row "
        "down to a crop's bottom; skipping columns saves only IDCT and colour work. A pack that "
        "keeps the files byte for byte (`--restart-interval 0`) therefore gives only about 1.2x "
        "the full-decode ceiling, which is itself 2x DataLoader.",
        "- By default `stoker pack` rewrites baseline JPEGs losslessly (same coefficients, same "
        "pixels; the pack grows 5.5%) with a restart marker after every MCU; the decoder then "
        "builds a smaller JPEG from the restart intervals a crop covers and entropy-decodes only "
        "those.",
        "- What the markers cost, and stoker's Huffman decoder: libjpeg-turbo 2.1 decodes a "
        "scan with restart markers on its slow Huffman path only (jdhuff.c: `usefast = 0` "
        "whenever `restart_interval` is set). `benchmarks/decoder_limit.py` (each "
        "imagenet-sample file's training crop and evaluation crop cut out losslessly with "
        "`jpegtran -crop`, with and without a marker every MCU; libjpeg alone, one thread, CPU "
        "time, medians of 3 interleaved rounds, 2026-11-26): the markers cost 38 us a training "
        "crop (545 against 507 us, +7.6%) and 46 us an evaluation crop (733 against 687, "
        "+6.6%). stoker therefore decodes such scans with its own Huffman decoder "
        "(cpp/src/decode/restart_huffman.cc: a 64-bit bit buffer filled 8 bytes at a time, a "
        "9-bit lookup table, branchless sign extension), which gives libjpeg's coefficients or "
        "hands the scan back to libjpeg's (damaged data, a marker out of sequence, data that "
        "ends early). An interleaved A/B of the builds before and after it (5 rounds, "
        "imagenet-sample pack, batch 256) gave train 2,575 -> 2,701 img/s (1.05x), eval 2,053 "
        "-> 2,187 (1.07x) with 2 threads, 1.06x with one, and a second run "
        "(`benchmarks/build_ab.py BEFORE --rounds 5`) 1.02x and 1.06x with 2 threads, 1.06x and "
        "1.05x with one; the decode stage went from 0.622 to 0.584 ms an image (train) and from "
        "0.809 to 0.751 (eval). The loader's whole decode of a training crop (0.562 ms, finding "
        "the pack's restart markers, about 28 us, and cutting the JPEG, 3 us, included) is now "
        "within 55 us of libjpeg's decode of the same crop cut out without markers (0.507 ms). "
        "A marker-free pack with a stored per-MCU index of bit offsets and DC predictors would "
        "save at most the marker scan, at the price of a new pack format: not built. Cutting "
        "the JPEG was 8.6 us an ImageNet crop while it grew its vector interval by interval; "
        "one copy per MCU row made it 3.1 us.",
        "- Thread placement: each worker pinned to its own core "
        "(`os.sched_setaffinity` on the `stoker-worker<i>` threads after the warm-up epoch, "
        "against the same loader unpinned, fresh processes, interleaved): medians 1.10x train "
        "and 1.03x eval in a run of 5 rounds, 1.04x and 1.07x in one of 7, with rounds from "
        "0.84x to 1.22x. Not adopted: the gain is within this machine's noise, and a default "
        "that pins worker i to core i would put every rank of a multi-GPU machine (each process "
        "sees all cores) on the same few cores.",
        "- What FFCV's recipe gains from re-encoding: the same 1,000 files re-encoded by Pillow at "
        "quality 90 shrink from 110 to 62 kB on average, and stoker on a pack of those copies "
        "runs at 2,312-2,366 img/s train and 1,956-1,977 eval against 1,573-1,612 and "
        "1,226-1,232 on the originals (two interleaved rounds, "
        "`benchmarks/peer_runners/stoker_pack.py` on each listing): 1.49x and 1.60x, from "
        "Huffman decoding fewer bits. Like for like (both reading quality-90 copies), stoker is "
        "about 2.4x FFCV on train and 2.2x on eval. stoker keeps the original coefficients by "
        "default; a lossy re-encode is the user's choice.",
        "- The fast IDCT, opt-in (`fast_idct=True`: libjpeg's JDCT_IFAST instead of JDCT_ISLOW "
        "wherever it runs an 8x8 IDCT). Its cost, over all 1,000 files at the loader's outputs "
        "with the same crops on both sides (`benchmarks/idct_quality.py`): 44.3 dB PSNR "
        "against the accurate IDCT at eval (Resize 256 + CenterCrop 224; per image median 44.6 "
        "dB, minimum 39.1) and 44.0 dB at train (minimum 39.1). For scale, FFCV's quality-90 "
        "re-encode (Pillow, same size) costs 39.3 dB at eval (minimum 26.3) and 38.3 dB at "
        "train (minimum 24.9). Its gain: libjpeg-turbo's own tjbench decodes whole files 6% "
        "faster with -fastdct (median of 20 imagenet-sample files, accurate-fast-accurate back "
        "to back, one thread); in the loader, where the IDCT is a smaller part still, no gain "
        "shows above the machine's noise: interleaved A/Bs (`benchmarks/option_ab.py --option "
        "fast_idct=1 --rounds 5`, the same build, imagenet-sample x5, batch 256, 2 threads, "
        "warm-up epoch, medians of 3 epochs a run) gave fast / accurate train 0.98x img/s and "
        "1.01x CPU time an image, eval 1.03x img/s and 0.89x CPU, with rounds spread over "
        "558-1,886 img/s by other work on the machine; the single-thread stage split above "
        "gave decoding 0.87x and the resampler, which the option does not touch, 0.86x. "
        "libjpeg-turbo 2.1 has an AVX2 kernel for the accurate IDCT and only an SSE2 one for "
        "the fast (its djpeg manual: similar performance on CPUs with AVX2, 5-15% faster "
        "elsewhere). Kept opt-in, off by default: 44 dB for no measurable gain on x86 with "
        "AVX2; it may pay on CPUs without AVX2.",
        "- Does our FFCV runner hold FFCV back? Checked against FFCV's own ImageNet example "
        "(libffcv/ffcv-imagenet: train_imagenet.py, write_imagenet.py, its README): the loader "
        "is set up as there: RandomResizedCropRGBImageDecoder + RandomHorizontalFlip, or "
        "CenterCropRGBImageDecoder with ratio 224/256, then ToTensor and ToTorchImage "
        "(channels_last, a view: no copy; the recipe's ToDevice and NormalizeImage run on its "
        "GPU), os_cache=True (its in_memory=1), batches_ahead 3 (the default), not "
        "distributed, libjpeg-turbo with TJFLAG_FASTDCT; numba runs each batch's prange on TBB "
        "with 2 threads under the runners' pinning (`numba.threading_layer()`, "
        "`numba.get_num_threads()`). The benchmark forces drop_last=False (every sample once "
        "an epoch: one short batch in 20) and as many threads as cores. Two of the recipe's "
        "settings differ, and were measured: its training order when not distributed, "
        "QUASI_RANDOM (samples drawn from a few 8 MB pages of the file at a time; "
        "`ffcv_beton.py --option order=quasi_random`): 832 against 817 img/s with RANDOM and "
        "1.98 against 2.01 ms of CPU an image (medians of 3 interleaved rounds of 2 epochs, "
        "train, load average 1.3-1.7), the same, so the runner keeps the full permutation "
        "every other loader here uses; and its data: ffcv-imagenet's ResNet-50 set keeps only "
        "half the images as JPEG and the other half as raw pixels, at 500 px (its ResNet-18 "
        "set: 10% JPEG at 400 px), 5x the bytes (a 1.43 GB .beton for the 5,000 samples "
        "against 0.29 GB) to skip half the decoding. FFCV on such data (`--option "
        "write_mode=proportion --option compress_probability=0.5 --option max_resolution=500`) "
        "took 0.78x the CPU an image at train (1.48 against 1.89 ms) and 0.83x at eval (1.62 "
        "against 1.94 ms), with stoker at 1.21 and 1.40 ms (2 interleaved rounds of the three, "
        "the runners' `cpu_s_per_image`). The runner keeps one JPEG per sample, what stoker "
        "and every other peer decode; `benchmarks/run.py --peers stoker,ffcv_beton --no-write` "
        "also runs both variants. Nothing in the runner's set-up held FFCV back. What moves "
        "its ratio to stoker from run to run is the machine's load: FFCV decodes a batch as one "
        "parallel loop that ends when its slower thread does, so a thread that loses its core "
        "to other work holds up the batch, where stoker's workers take samples independently. "
        "In interleaved runs under other work (load average 4-8) FFCV's "
        "throughput ranged from 0.29x to 1.25x stoker's from one round to the next, while its "
        "CPU time an image stayed 1.4-1.6x stoker's (train 1.57x, eval 1.39x). Only a run of "
        "`make bench-peers` on a quiet machine settles the table's ratios.",
        "- On large photos the DCT scales apply: 1/8 for most crops of 8-16 MP images, and "
        "progressive files stop reading after the scans that scale needs (DC only at 1/8).",
        "- Output quality (tests/python/test_transforms.py, all 1,000 imagenet-sample files): the "
        "evaluation output against torchvision's Resize(256) + CenterCrop(224) on PIL has mean "
        "PSNR 76 dB, minimum 31 dB (a 1/2-scale decode); training crops without DCT scaling are "
        "pixel-exact against PIL's crop + resize.",
        "",
    ]
    path = ROOT / "docs" / "BENCHMARKS.md"
    path.parent.mkdir(exist_ok=True)
    # Sections other scripts own (benchmarks/fields.py, ...) sit between their markers: kept.
    old = path.read_text() if path.exists() else ""
    blocks = re.finditer(r"^<!-- (\S+): begin -->$.*?^<!-- \1: end -->$", old, re.M | re.S)
    for block in blocks:
        lines += [block.group(0), ""]
    path.write_text("\n".join(lines))
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, one timed epoch")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (2)")
    parser.add_argument("--epochs", type=int, default=None, help="timed epochs a round (3)")
    parser.add_argument("--datasets", default="imagenet-sample,photos")
    parser.add_argument(
        "--peers", default=None, help="names or runners to run, comma-separated (all)"
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 2)
    epochs = args.epochs or (1 if args.quick else 3)
    threads = usable_cores()
    t0 = time.time()
    machine = bench_data.machine()
    print(f"machine: {machine}", flush=True)
    chosen = peers.all_peers()
    if args.peers:
        wanted = set(args.peers.split(","))
        chosen = [p for p in chosen if p.name in wanted or p.runner in wanted] + [
            v
            for v in peers.variants()
            if v.name in wanted  # a variant only by its name
        ]
    failures: dict[str, str] = {}
    for peer in chosen:
        status = peer.status()
        if not status.get("ok"):
            failures[peer.name] = "its environment did not install: " + status.get("error", "?")
            print(f"  {peer.name}: NOT INSTALLED: {failures[peer.name]}", flush=True)
    lists = {}
    for name in args.datasets.split(","):
        samples = bench_data.imagenet_sample() if name == "imagenet-sample" else bench_data.photos()
        lists[name] = (samples, bench_data.listing(name, samples, COPIES[name]))
    results: dict = {n: {"train": {}, "eval": {}} for n in lists}
    info: dict[str, tuple[str, str]] = {}
    for r in range(rounds):
        for name, (_, listing) in lists.items():
            for pipe in ("train", "eval"):
                pipeline = peers.Pipeline(pipe, batch_size=BATCH_SIZE[name])
                for peer in chosen:
                    if peer.name in failures:
                        continue
                    out = peer.run(listing, pipeline, threads, epochs)
                    if "error" in out:
                        failures[peer.name] = f"its run failed ({name}, {pipe}): {out['error']}"
                        print(f"  {peer.name}: FAILED: {out['error']}", flush=True)
                        continue
                    info[peer.name] = (out["version"], out.get("notes", ""))
                    rate = out["median_images_per_s"]
                    results[name][pipe].setdefault(peer.name, []).append(rate)
                    print(f"  round {r + 1} [{name} / {pipe}] {peer.name:<36} {rate:8.0f} img/s",
                          flush=True)  # fmt: skip
    ceilings = {}
    if "imagenet-sample" in lists:
        ceilings["imagenet-sample"] = ceiling(lists["imagenet-sample"][0], threads, epochs)
        print(f"  full-decode ceiling: {ceilings['imagenet-sample']:.0f} img/s", flush=True)
    footprint = None
    if "imagenet-sample" in lists:
        # The stoker runner's pack of this listing: named by the digest of the listing's lines.
        key = hashlib.sha256(lists["imagenet-sample"][1].read_bytes()).hexdigest()[:16]
        pack = ROOT / "build" / "peers" / "stoker_pack" / "work" / f"{key}.default.pack"
        if pack.exists():
            footprint = loader_footprint(pack)
            print(f"  footprint: {footprint}", flush=True)
    if not args.no_write:
        everything = not (args.quick or args.peers or args.rounds or args.epochs)
        command = "make bench-peers" if everything else "python " + " ".join(sys.argv)
        seconds = time.time() - t0
        write_results(results, ceilings, machine, command, seconds, threads, rounds, epochs)
        write_report(results, failures, info, ceilings, footprint, machine, command, seconds)
        import chart

        chart.main([])  # the README's chart, from the results just written
    return 0


if __name__ == "__main__":
    sys.exit(main())
