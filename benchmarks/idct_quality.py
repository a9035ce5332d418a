"""What `fast_idct=True` costs in quality, beside what FFCV's quality-90 re-encode costs.

    .venv/bin/python benchmarks/idct_quality.py

All 1,000 imagenet-sample files, packed with stoker's defaults, read by ImageLoader with the same
seed, so every sample gets the same crop on both sides of a comparison:
- fast vs accurate IDCT: the same pack, `fast_idct=True` against the default;
- quality 90 vs original: a pack of Pillow quality-90 re-encodes of the files (same size, 4:2:0,
  as the speed figure in docs/BENCHMARKS.md) against the pack of the originals, both decoded
  with the accurate IDCT. FFCV's recipe also shrinks the 122 files longer than 512 px, which
  this leaves out: it costs those files more.
Both at the loader's eval outputs (Resize 256 + CenterCrop 224) and its train outputs
(RandomResizedCrop 224 + flip), uint8. PSNR per image over its 224 x 224 x 3 values; printed:
the PSNR of the pooled mean squared error, the median and the minimum per image, and how many
outputs are identical (fast IDCT: the files decoded at a reduced DCT scale, whose scaled IDCT
has one method only). Never a timed test.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "imagenet-sample"


def make_packs(work: Path) -> tuple[Path, Path]:
    import stoker
    from PIL import Image

    files = sorted(p for p in DATA.iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
    q90 = work / "q90"
    q90.mkdir(parents=True, exist_ok=True)
    packs = []
    for name, paths in (
        ("original", files),
        ("q90", [q90 / (f.stem + ".jpg") for f in files]),
    ):
        pack = work / f"{name}.pack"
        packs.append(pack)
        if (pack / "manifest.json").exists():
            continue
        if name == "q90":
            for f, out in zip(files, paths, strict=True):
                if not out.exists():
                    with Image.open(f) as img:
                        img.convert("RGB").save(out, quality=90)
        table = work / f"{name}.csv"
        table.write_text("".join(f"{p},{i}\n" for i, p in enumerate(paths)))
        stoker.pack(table, pack, overwrite=True, progress=False)
    return packs[0], packs[1]


def outputs(pack: Path, train: bool, **options) -> np.ndarray:
    """[N, 224, 224, 3] uint8, in pack order."""
    import stoker

    loader = stoker.ImageLoader(
        str(pack), batch_size=100, train=train, seed=3, threads=2, return_index=True, **options
    )
    out = np.zeros((len(loader.dataset), 224, 224, 3), np.uint8)
    for images, _labels, index in loader:
        out[index.numpy()] = images.permute(0, 2, 3, 1).numpy()
    return out


def psnr(mse: float) -> float:
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def report(name: str, a: np.ndarray, b: np.ndarray) -> None:
    diff = a.astype(np.float64) - b.astype(np.float64)
    mse = (diff**2).reshape(len(a), -1).mean(axis=1)
    per_image = [psnr(m) for m in mse]
    finite = [p for p in per_image if math.isfinite(p)]
    print(
        f"{name}: PSNR of the pooled MSE {psnr(float(mse.mean())):.1f} dB; per image median "
        f"{statistics.median(per_image):.1f}, min {min(per_image):.1f}, "
        f"mean of the finite {statistics.mean(finite):.1f} dB; {len(a) - len(finite)} of "
        f"{len(a)} identical; max |difference| {int(np.abs(diff).max())}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "idct-quality")
    args = parser.parse_args()
    original, q90 = make_packs(args.work)
    for mode in ("eval", "train"):
        train = mode == "train"
        accurate = outputs(original, train)
        report(f"{mode}, fast vs accurate IDCT", outputs(original, train, fast_idct=True), accurate)
        report(f"{mode}, quality-90 re-encode vs original", outputs(q90, train), accurate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
