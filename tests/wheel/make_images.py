"""Writes the images tests/wheel/check.py loads inside the bare root (make test-wheel), with
Pillow, outside it: the stoker wheel must decode them there with its own libraries.

    make_images.py OUT

OUT/folder/CLASS/*.{jpg,png,webp}: an ImageFolder tree, each class one solid colour, in every
format (baseline and progressive JPEG, PNG, lossless WebP) and a few sizes.
OUT/table/: table.csv (png,webp,cls) naming two-colour PNG and lossless WebP files (left half
one colour, right half another) and OUT/expected.json, what check.py compares against."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from PIL import Image

CLASS_COLOURS = {"ash": (200, 40, 60), "birch": (30, 180, 90), "cedar": (50, 70, 210)}
SIZES = [(40, 30), (64, 48), (33, 57)]
HALVES = [((250, 10, 10), (10, 10, 250)), ((0, 200, 0), (255, 255, 0)), ((90, 0, 90), (0, 90, 90))]


def main(out: Path) -> None:
    counts = {}
    for name, colour in CLASS_COLOURS.items():
        d = out / "folder" / name
        d.mkdir(parents=True)
        n = 0
        for w, h in SIZES:
            im = Image.new("RGB", (w, h), colour)
            im.save(d / f"{n}.jpg", quality=95)
            im.save(d / f"{n + 1}.jpg", quality=95, progressive=True)
            im.save(d / f"{n + 2}.png")
            im.save(d / f"{n + 3}.webp", lossless=True)
            n += 4
        counts[name] = n
    table = out / "table"
    table.mkdir()
    rows = ["png,webp,cls"]
    for i, (left, right) in enumerate(HALVES):
        im = Image.new("RGB", (64, 32), left)
        im.paste(right, (32, 0, 64, 32))
        im.save(table / f"{i}.png")
        im.save(table / f"{i}.webp", lossless=True)
        rows.append(f"{i}.png,{i}.webp,{i}")
    (table / "table.csv").write_text("\n".join(rows) + "\n")
    expected = {"class_colours": CLASS_COLOURS, "counts": counts, "halves": HALVES}
    (out / "expected.json").write_text(json.dumps(expected))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
