"""The decoder's limit on imagenet-sample (issue 25): what libjpeg-turbo itself costs for exactly
the pixels a crop needs, against what ImageLoader spends an image.

    .venv/bin/python benchmarks/decoder_limit.py [--rounds 5]

For each of the 1,000 files, a training crop (torchvision's RandomResizedCrop, seeded) and the
evaluation crop (the centred square Resize(256) + CenterCrop(224) reads), each cut out
losslessly with ``jpegtran -crop`` (whole MCUs, the same coefficients) twice: without restart
markers, which libjpeg-turbo entropy-decodes on its fast Huffman path, and with a marker after
every MCU (``-restart 1B``), what a stoker pack's restart cut holds, which libjpeg decodes on its
slow path (jdhuff.c: ``usefast = 0`` whenever a restart interval is set; stoker's loader uses its
own Huffman decoder for such scans, cpp/src/decode/restart_huffman.cc). The whole files too.
`decoder_limit.c` (compiled here) times libjpeg on each set, one thread, CPU time: entropy
decoding alone (``jpeg_read_coefficients``) and a whole decode to RGB; interleaved rounds,
medians. Then ImageLoader on a default pack (restart markers), one worker thread, per stage
(benchmarks/stage_split.py's measure). Printed: both, what the markers cost libjpeg a crop, and
the loader's time an image were its decode libjpeg's of the marker-free crop (the limit: exactly
the crop's MCUs, on libjpeg-turbo's fast path). Never a timed test.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from stage_split import DATA, make_pack, timed  # noqa: E402

WORK = HERE.parent / "build" / "bench-decoder-limit"
SETS = ("train", "eval", "whole")


def compile_helper() -> Path:
    binary = WORK / "decoder_limit"
    source = HERE / "decoder_limit.c"
    if not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime:
        pkg = ["pkg-config", "--cflags", "--libs", "libjpeg"]
        flags = subprocess.run(pkg, capture_output=True, text=True, check=True).stdout.split()
        subprocess.run(["cc", "-O2", "-o", str(binary), str(source), *flags], check=True)
    return binary


def random_resized_crop(width: int, height: int, rng: random.Random) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop parameters (scale 0.08-1, ratio 3/4-4/3): x, y, w, h."""
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    side = min(width, height)
    return (width - side) // 2, (height - side) // 2, side, side


def make_crops() -> dict[str, list[Path]]:
    """{set-markers: files}, made once under build/."""
    from PIL import Image

    rng = random.Random(0)
    out: dict[str, list[Path]] = {}
    for path in sorted(p for p in DATA.iterdir() if p.suffix.lower() in (".jpeg", ".jpg")):
        with Image.open(path) as image:
            width, height = image.size
        side = min(width, height) * 224 // 256
        crops = {
            "train": random_resized_crop(width, height, rng),
            "eval": ((width - side) // 2, (height - side) // 2, side, side),
            "whole": None,
        }
        for name, crop in crops.items():
            for markers in ("none", "restart"):
                target = WORK / f"{name}-{markers}" / path.name
                out.setdefault(f"{name}-{markers}", []).append(target)
                if target.exists():
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                args = ["jpegtran", "-copy", "none", "-optimize"]
                if crop:
                    x, y, w, h = crop
                    args += ["-crop", f"{w}x{h}+{x}+{y}"]
                cut = subprocess.run([*args, str(path)], capture_output=True, check=True).stdout
                if markers == "restart":
                    cut = subprocess.run(["jpegtran", "-restart", "1B", "-optimize"], input=cut,
                                         capture_output=True, check=True).stdout  # fmt: skip
                target.write_bytes(cut)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    helper = compile_helper()
    crops = make_crops()
    libjpeg: dict[str, list[tuple[float, float]]] = {k: [] for k in crops}
    loader: dict[str, list[dict[str, float]]] = {"train": [], "eval": []}
    pack = make_pack(WORK)
    for _ in range(args.rounds):
        for key, files in crops.items():
            out = subprocess.run([str(helper), "3", *map(str, files)], capture_output=True,
                                 text=True, check=True).stdout.split()  # fmt: skip
            libjpeg[key].append((float(out[0]), float(out[1])))
        for mode in loader:
            loader[mode].append(timed(pack, mode == "train", 1))

    def med(key: str, i: int) -> float:
        return statistics.median(r[i] for r in libjpeg[key])

    print(f"libjpeg-turbo, one thread, CPU us an image (medians of {args.rounds} rounds):")
    print("  set     markers   entropy decoding   whole decode")
    for name in SETS:
        for markers in ("none", "restart"):
            key = f"{name}-{markers}"
            print(f"  {name:<7} {markers:<9} {med(key, 0):>16.0f} {med(key, 1):>14.0f}")
    for name in SETS:
        none, restart = med(f"{name}-none", 1), med(f"{name}-restart", 1)
        cost = restart - none
        print(f"  {name}: markers cost {cost:.0f} us a decode ({restart / none - 1:+.1%})")
    print("ImageLoader, threads=1, default pack (restart markers), ms an image:")
    for mode, runs in loader.items():
        stage = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        limit = med(f"{mode}-none", 1) / 1000 + stage["transform"] + stage["read"]
        print(f"  {mode}: wall {stage['wall']:.3f} = read {stage['read']:.3f} + decode "
              f"{stage['decode']:.3f} + transform {stage['transform']:.3f} + rest "
              f"{stage['wall'] - stage['read'] - stage['decode'] - stage['transform']:.3f}; "
              f"with libjpeg's decode of the marker-free crop instead: {limit:.3f} "
              f"({stage['wall'] / limit:.2f}x faster at most, {2 / limit * 1000:,.0f} img/s "
              "on 2 threads at perfect scaling)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
