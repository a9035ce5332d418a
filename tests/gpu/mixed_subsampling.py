"""A batch mixing chroma subsamplings, with regions, on the GPU: run by tests/gpu/test_gpu_decode.py
in a process of its own (NVIDIA/nvImageCodec#55 reports crashes on such batches).

    python tests/gpu/mixed_subsampling.py WORK_DIR RESULT_JSON

Makes 4:4:4, 4:2:2 and 4:2:0 JPEGs and grey ones with Pillow from imagenet-sample photos, adds
jpeg-variety's baseline 8-bit JPEGs of 1 or 3 components (4:4:0 and rarer ones among them), then:
nvImageCodec alone decodes random regions of the whole mix, shuffled, 20 times (stoker's
NvImageCodec backend, one call a batch); the loader (decode="gpu", train=True: regions) decodes
the mix as one batch, against the host path. Writes what it saw as JSON."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import stoker
from stoker import _core
from stoker.device.gpu_decode import NvImageCodec, Targets

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
NAMES = {(0x11,): "grey", (0x11, 0x11, 0x11): "4:4:4", (0x21, 0x11, 0x11): "4:2:2",
         (0x22, 0x11, 0x11): "4:2:0", (0x12, 0x11, 0x11): "4:4:0"}  # fmt: skip


def sampling(data: bytes) -> tuple[int, ...] | None:
    """The components' sampling factors (H << 4 | V) of a baseline or extended sequential 8-bit
    JPEG; None for anything else."""
    i = 2
    while i + 4 <= len(data) and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if marker in (0xC0, 0xC1):
            if data[i + 4] != 8:
                return None
            n = data[i + 9]
            return tuple(data[i + 10 + 3 * k + 1] for k in range(n))
        if 0xC2 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) or marker == 0xDA:
            return None
        i += 2 + length
    return None


def mixed_files(work: Path) -> list[tuple[Path, str]]:
    files = []
    photos = sorted((SHARED / "imagenet-sample").glob("*.JPEG"))[:8]
    for k, photo in enumerate(photos):
        with Image.open(photo) as im:
            rgb = im.convert("RGB")
        for name, sub in (("4:4:4", 0), ("4:2:2", 1), ("4:2:0", 2)):
            path = work / f"made{k}_{name.replace(':', '')}.jpg"
            rgb.save(path, quality=90, subsampling=sub)
            files.append(path)
        path = work / f"made{k}_grey.jpg"
        rgb.convert("L").save(path, quality=90)
        files.append(path)
    variety = SHARED / "jpeg-variety"
    if variety.exists():
        for path in sorted(variety.rglob("*")):
            if path.is_file() and path.stat().st_size < 60_000:
                data = path.read_bytes()
                s = sampling(data) if data[:2] == b"\xff\xd8" else None
                if s is not None and len(s) in (1, 3):
                    files.append(path)
    out = []
    for path in files:
        s = sampling(path.read_bytes())
        out.append((path, NAMES.get(s or (), "other " + ",".join(f"{v:x}" for v in s or ()))))
    return out


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def main() -> None:
    work, out = Path(sys.argv[1]), Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    files = mixed_files(work)
    kinds: dict[str, int] = {}
    for _, kind in files:
        kinds[kind] = kinds.get(kind, 0) + 1
    print(f"{len(files)} files: {kinds}", flush=True)
    device = torch.device("cuda", torch.cuda.current_device())
    blobs = [p.read_bytes() for p, _ in files]
    sizes = [(_core.image_info(b)["width"], _core.image_info(b)["height"]) for b in blobs]
    decoder = NvImageCodec(device, batch_size=len(blobs))
    rng = np.random.default_rng(0)
    decoded = refused = 0
    for _ in range(20):
        order = rng.permutation(len(blobs))
        regions, offsets, pitches, heights, widths, at = [], [], [], [], [], 0
        for i in order:
            w, h = sizes[i]
            x0, y0 = int(rng.integers(0, max(1, w // 2))), int(rng.integers(0, max(1, h // 2)))
            x1, y1 = int(rng.integers(x0 + 1, w + 1)), int(rng.integers(y0 + 1, h + 1))
            regions.append((1, x0, y0, x1, y1))
            offsets.append(at)
            pitches.append((x1 - x0) * 3)
            heights.append(y1 - y0)
            widths.append(x1 - x0)
            at += (x1 - x0) * (y1 - y0) * 3
        buffer = torch.empty(at, dtype=torch.uint8, device=device)
        done = decoder.decode_into([blobs[i] for i in order], np.array(regions, dtype=np.int64),
                                   Targets(buffer, offsets, pitches, heights, widths))  # fmt: skip
        torch.cuda.synchronize()
        decoded += sum(done)
        refused += len(done) - sum(done)
    print(f"nvImageCodec alone, 20 shuffled batches with regions: {decoded} decoded, "
          f"{refused} left to the host, {decoder.refused_regions} regions decoded whole",
          flush=True)  # fmt: skip
    table = work / "mixed.csv"
    table.write_text("".join(f"{p},{k % 5}\n" for k, (p, _) in enumerate(files)))
    pack = work / "pack"
    stoker.pack(table, pack, progress=False)
    common = dict(batch_size=len(files), size=128, seed=3, threads=4, device="cuda",
                  dtype=torch.uint8, train=True, return_index=True)  # fmt: skip
    host = list(stoker.ImageLoader(pack, **common))
    gpu_loader = stoker.ImageLoader(pack, decode="gpu", **common)
    gpu = list(gpu_loader)
    values = []
    for (x, y, i), (h, hy, hi) in zip(gpu, host, strict=True):
        assert torch.equal(i, hi) and torch.equal(y, hy)
        values += [psnr(x[k], h[k]) for k in range(len(x))]
    counts = gpu_loader.stats()["decode"]
    finite = [v for v in values if v != math.inf] or [math.inf]
    print(f"loader: PSNR against the host path min {min(finite):.1f} dB; {counts}", flush=True)
    out.write_text(json.dumps({
        "kinds": kinds,
        "alone": {"decoded": decoded, "refused": refused,
                  "regions_whole": decoder.refused_regions},
        "loader": {"psnr_min": min(finite), "device": counts["device"],
                   "device_failed": counts["device_failed"]},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
