"""Writes the images tests/wheel/check.py loads inside the bare root (make test-wheel), with
Pillow, outside it: the stoker wheel must decode them there with its own libraries.

    make_images.py OUT

OUT/folder/CLASS/*.{jpg,png,webp}: an ImageFolder tree, each class one solid colour, in every
format (baseline and progressive JPEG, PNG, lossless WebP) and a few sizes.
OUT/table/: table.csv (png,webp,cls) naming two-colour PNG and lossless WebP files (left half
one colour, right half another) and OUT/expected.json, what check.py compares against.
OUT/media/CLASS/0.mp4 (H.264, each class its solid colour) and OUT/sounds/HZ/0.flac (a sine
of HZ hertz), made with the ffmpeg command, for the wheel's stoker._media against
the root's own FFmpeg."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from PIL import Image

CLASS_COLOURS = {"ash": (200, 40, 60), "birch": (30, 180, 90), "cedar": (50, 70, 210)}
SIZES = [(40, 30), (64, 48), (33, 57)]
TONES = [220.0, 440.0, 1000.0]
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
    for name, (r, g, b) in CLASS_COLOURS.items():
        d = out / "media" / name
        d.mkdir(parents=True)
        ffmpeg("-f", "lavfi", "-i", f"color=c=0x{r:02x}{g:02x}{b:02x}:s=64x48:r=10:d=1.2",
               "-c:v", "libx264", "-pix_fmt", "yuv420p", d / "0.mp4")  # fmt: skip
    for hz in TONES:
        d = out / "sounds" / f"{hz:g}"
        d.mkdir(parents=True)
        ffmpeg("-f", "lavfi", "-i", f"sine=frequency={hz:g}:sample_rate=16000:duration=1.5",
               "-sample_fmt", "s16", d / "0.flac")  # fmt: skip
    expected = {"class_colours": CLASS_COLOURS, "counts": counts, "halves": HALVES,
                "tones": TONES}  # fmt: skip
    (out / "expected.json").write_text(json.dumps(expected))


def ffmpeg(*args: object) -> None:
    subprocess.run(["ffmpeg", "-v", "error", "-y", *map(str, args)], check=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
