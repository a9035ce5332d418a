"""The inputs of benchmarks/fields.py, generated once under build/bench-fields/ (never committed).

The pictures are the 1,000 JPEGs of ../shared/data/imagenet-sample; everything else is made up
here, deterministically (numpy's PCG64 keyed by (SEED, image index), so a rerun writes the same
bytes):

- boxes: 1-20 per image, COCO style (``[{"bbox": [x, y, w, h], "category_id": c}, ...]``, pixels
  of the source image, two decimals), each side 4-60% of the image's, placed wholly inside it,
  ``c`` in 0..NUM_BOX_CLASSES-1;
- masks: a palette PNG the image's size (``KEY.seg.png``; VOC's colour map), background 0 with
  1-6 random polygons of 3-8 vertices, each filled with a class id in 1..NUM_MASK_CLASSES-1,
  later ones over earlier ones;
- captions: "<a/an> <adjective> photo of a <class name>, <phrase>.", the class name taken from
  the file name (``n01440764_tench.JPEG`` -> "tench").

One JSON Lines table lists each image REPEAT times (an epoch of 3,000 samples) with all four
members (``jpg`` a path, ``seg.png`` a path, ``json`` the boxes, ``txt`` the caption), and
``stoker.pack`` packs it once (default options: restart markers). Each pipeline's loader reads
only the members it asks for.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
OUT = ROOT / "build" / "bench-fields"
SEED = 2026
REPEAT = 3
NUM_BOX_CLASSES = 80
NUM_MASK_CLASSES = 21  # 0 (background) and 20 object classes, as Pascal VOC
VERSION = 1  # bump when the generator changes: the data is rebuilt

ADJECTIVES = ("blurry", "bright", "dark", "close-up", "cropped", "old", "colourful", "small",
              "large", "grainy", "sharp", "washed-out")  # fmt: skip
PHRASES = ("taken outdoors", "seen from above", "in natural light", "on a plain background",
           "with other objects around it", "at the centre of the frame", "partly hidden",
           "in the evening", "from a distance", "on a cluttered table")  # fmt: skip


@dataclass(frozen=True)
class Sample:
    jpg: str  # absolute path
    mask: str  # absolute path of the palette PNG
    boxes: list[dict]  # COCO: bbox xywh in source pixels, category_id
    caption: str


def _rng(index: int, what: int) -> np.random.Generator:
    return np.random.default_rng([SEED, index, what])


def make_boxes(index: int, width: int, height: int) -> list[dict]:
    rng = _rng(index, 0)
    boxes = []
    for _ in range(int(rng.integers(1, 21))):
        w = width * rng.uniform(0.04, 0.6)
        h = height * rng.uniform(0.04, 0.6)
        x = rng.uniform(0, width - w)
        y = rng.uniform(0, height - h)
        boxes.append(
            {
                "bbox": [round(x, 2), round(y, 2), round(w, 2), round(h, 2)],
                "category_id": int(rng.integers(0, NUM_BOX_CLASSES)),
            }
        )
    return boxes


def _voc_palette() -> list[int]:
    palette = []
    for i in range(256):
        r = g = b = 0
        c = i
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        palette += [r, g, b]
    return palette


def make_mask(index: int, width: int, height: int, path: Path) -> None:
    from PIL import Image, ImageDraw

    rng = _rng(index, 1)
    mask = Image.new("P", (width, height), 0)
    mask.putpalette(_voc_palette())
    draw = ImageDraw.Draw(mask)
    for _ in range(int(rng.integers(1, 7))):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        radius = rng.uniform(0.1, 0.5) * min(width, height)
        n = int(rng.integers(3, 9))
        angles = np.sort(rng.uniform(0, 2 * np.pi, n))
        radii = radius * rng.uniform(0.4, 1.0, n)
        points = [
            (float(cx + r * np.cos(a)), float(cy + r * np.sin(a)))
            for a, r in zip(angles, radii, strict=True)
        ]
        draw.polygon(points, fill=int(rng.integers(1, NUM_MASK_CLASSES)))
    mask.save(path, optimize=False)


def make_caption(index: int, name: str) -> str:
    rng = _rng(index, 2)
    adjective = ADJECTIVES[int(rng.integers(len(ADJECTIVES)))]
    article = "an" if adjective[0] in "aeiou" else "a"
    phrase = PHRASES[int(rng.integers(len(PHRASES)))]
    return f"{article.capitalize()} {adjective} photo of a {name}, {phrase}."


def _class_name(path: Path) -> str:
    return path.stem.split("_", 1)[-1].replace("_", " ")


def build() -> tuple[list[Sample], Path]:
    """(the samples, REPEAT times over, in table order; the pack of the same table)."""
    from PIL import Image

    import stoker

    src = SHARED / "imagenet-sample"
    files = sorted(p for p in src.iterdir() if p.suffix.lower() in (".jpeg", ".jpg"))
    if not files:
        raise SystemExit(f"{src}: no JPEGs")
    masks = OUT / "masks"
    table = OUT / "table.jsonl"
    pack = OUT / "pack"
    stamp = OUT / "done"
    signature = hashlib.sha256(
        json.dumps([VERSION, SEED, REPEAT, [f.name for f in files]]).encode()
    ).hexdigest()
    fresh = stamp.exists() and stamp.read_text() == signature and (pack / "manifest.json").exists()

    if not fresh:
        masks.mkdir(parents=True, exist_ok=True)
        rows = []
        for i, f in enumerate(files):
            with Image.open(f) as im:
                width, height = im.size
            mask = masks / f"{i:04d}.seg.png"
            make_mask(i, width, height, mask)
            rows.append(
                {
                    "jpg": str(f),
                    "seg.png": str(mask),
                    "json": make_boxes(i, width, height),
                    "txt": make_caption(i, _class_name(f)),
                }
            )
        with open(table, "w", encoding="utf-8") as out:
            for _ in range(REPEAT):
                out.writelines(json.dumps(row) + "\n" for row in rows)
        print(stoker.pack(table, pack, overwrite=True, progress=False), flush=True)
        stamp.write_text(signature)

    samples = []
    with open(table, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            samples.append(Sample(row["jpg"], row["seg.png"], row["json"], row["txt"]))
    return samples, pack
