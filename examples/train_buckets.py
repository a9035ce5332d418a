"""Training at native aspect with aspect-ratio buckets: a small text-to-image-style denoiser on
real photos of every shape, each batch of one bucket.

    .venv/bin/python examples/train_buckets.py                      # ~700 photos, 200 steps
    .venv/bin/python examples/train_buckets.py --images 60 --steps 6 --area 64

1. Packs photos of varied aspect (imagenet-sample and the photos of jpeg-variety, from
   ../shared/data) with a caption each (the ImageNet class, or the photo's source), once, under
   --data-dir. The pack records every image's size in its index.
2. Feeds them with ``stoker.Loader(..., buckets=stoker.AspectBuckets(area=..., step=16))``:
   each photo goes to the bucket nearest its aspect and is cropped there (random along the side
   with slack), every batch is one bucket's size, with a batch size from a pixel budget.
3. Trains a small fully convolutional noise predictor (a diffusion model's training step:
   noise a batch at a random level, predict the noise, conditioned on the level and on the
   caption's words), which takes any bucket's size, and prints the loss falling.
4. Draws a few bucketed batches, each one row at its own size, into --picture (a PNG).

Exits with status 1 unless every batch had one shape from the bucket set and the loss fell.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import zlib
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import stoker

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
WORDS = 512  # the caption's words hashed into this many buckets of a bag of words


def photo_list(limit: int) -> list[tuple[Path, str]]:
    """(path, caption) of the photos: ImageNet's with their class as caption, then the 8-bit
    photos of jpeg-variety (48 px or more) captioned by their source."""
    out = []
    for p in sorted((SHARED / "imagenet-sample").iterdir()):
        out.append((p, p.stem.split("_", 1)[1].replace("_", " ")))
    for line in (SHARED / "MANIFEST.tsv").read_text().splitlines()[1:]:
        f = line.split("\t")
        if not f[0].startswith("jpeg-variety/") or f[2] not in ("baseline", "progressive-huff"):
            continue
        w, h = (int(v) for v in f[4].split("x"))
        if f[3] == "8" and f[11] == "0" and min(w, h) >= 48:
            out.append((SHARED / f[0], "a photo from " + f[0].split("/")[1]))
    # Every kind of photo in a short list too: interleave the two sources.
    imagenet = [x for x in out if "imagenet-sample" in str(x[0])]
    others = [x for x in out if "imagenet-sample" not in str(x[0])]
    mixed = [x for pair in zip(imagenet, others, strict=False) for x in pair]
    mixed += imagenet[len(others):] + others[len(imagenet):]
    return mixed[:limit]


def make_pack(data_dir: Path, images: int) -> Path:
    pack = data_dir / f"photos-{images}"
    if (pack / "manifest.json").exists():
        return pack
    data_dir.mkdir(parents=True, exist_ok=True)
    table = data_dir / f"photos-{images}.jsonl"
    with open(table, "w") as f:
        for path, caption in photo_list(images):
            f.write(json.dumps({"jpg": str(path), "txt": caption}) + "\n")
    stoker.pack(table, pack, progress=False)
    return pack


def bag_of_words(captions: list[str]) -> torch.Tensor:
    """Each caption as counts of its words, hashed into WORDS buckets."""
    out = torch.zeros(len(captions), WORDS)
    for i, caption in enumerate(captions):
        for word in caption.lower().split():
            out[i, zlib.crc32(word.encode()) % WORDS] += 1
    return out


class Denoiser(nn.Module):
    """Predicts the noise in a noised image from it, its noise level and its caption: fully
    convolutional, so that every bucket's size goes through the same weights."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.text = nn.Linear(WORDS, width)
        self.level = nn.Linear(1, width)
        self.down = nn.Conv2d(3, width, 3, stride=2, padding=1)
        self.mid = nn.Conv2d(width, width, 3, padding=1)
        self.up = nn.ConvTranspose2d(width, width, 4, stride=2, padding=1)
        self.out = nn.Conv2d(width + 3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor, level: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        condition = (self.text(words) + self.level(level[:, None]))[:, :, None, None]
        h = F.silu(self.down(x) + condition)
        h = F.silu(self.mid(h) + condition)
        h = F.silu(self.up(h))
        h = h[:, :, : x.shape[2], : x.shape[3]]
        return self.out(torch.cat([h, x], dim=1))


def draw(batches: list[torch.Tensor], path: Path, height: int = 96) -> None:
    """Each batch one row, its images side by side at the row's height, its bucket written."""
    from PIL import Image, ImageDraw

    rows = []
    for images in batches:
        h, w = images.shape[2:]
        scale = height / h
        tiles = [Image.fromarray(x.permute(1, 2, 0).numpy()).resize((round(w * scale), height))
                 for x in images]  # fmt: skip
        row = Image.new("RGB", (sum(t.width + 4 for t in tiles) + 90, height + 4), "white")
        ImageDraw.Draw(row).text((4, height // 2 - 6), f"{h} x {w}", fill="black")
        x = 90
        for t in tiles:
            row.paste(t, (x, 2))
            x += t.width + 4
        rows.append(row)
    sheet = Image.new("RGB", (max(r.width for r in rows), sum(r.height for r in rows)), "white")
    y = 0
    for r in rows:
        sheet.paste(r, (0, y))
        y += r.height
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("build/train-buckets"))
    parser.add_argument("--images", type=int, default=700, help="photos to pack")
    parser.add_argument("--area", type=int, default=128, help="buckets of about area x area")
    parser.add_argument("--batch-pixels", type=int, default=8, help="images of area x area a batch")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", default="auto")
    parser.add_argument("--picture", type=Path, default=Path("build/train-buckets/batches.png"))
    args = parser.parse_args(argv)
    if not SHARED.exists():
        print(f"the photos are read from {SHARED}, which is not here", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    pack = make_pack(args.data_dir, args.images)
    buckets = stoker.AspectBuckets(area=args.area**2, step=16, max_ratio=2.5,
                                   batch_pixels=args.batch_pixels * args.area**2)  # fmt: skip
    loader = stoker.Loader(
        pack,
        batch_size=1,  # per bucket from batch_pixels
        buckets=buckets,
        fields={"image": stoker.Image("jpg", hflip=0.5), "caption": stoker.Text("txt")},
        threads=args.threads if args.threads == "auto" else int(args.threads),
        seed=0,
    )
    print(f"{len(loader.dataset)} photos in {len(buckets.sizes)} buckets:")
    for g in loader.groups or []:
        print(f"  {g['key'][0]:>4} x {g['key'][1]:<4} {g['samples']:>5} photos, "
              f"batches of {g['batch_size']}")  # fmt: skip
    model = Denoiser()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses, shapes, drawn = [], set(), []
    step, t0 = 0, time.perf_counter()
    while step < args.steps:
        for batch in loader:
            images = batch["image"]
            shapes.add(tuple(images.shape[2:]))
            if len(drawn) < 4 and all(d.shape[2:] != images.shape[2:] for d in drawn):
                drawn.append(images[:6].clone())
            x = images.float() / 127.5 - 1
            level = torch.rand(x.shape[0])
            noise = torch.randn_like(x)
            noised = torch.sqrt(1 - level)[:, None, None, None] * x + torch.sqrt(level)[
                :, None, None, None] * noise  # fmt: skip
            loss = F.mse_loss(model(noised, level, bag_of_words(batch["caption"])), noise)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            if step % max(1, args.steps // 10) == 0 or step == args.steps:
                print(f"step {step:>4}  {tuple(images.shape)}  loss {loss:.4f}")
            if step == args.steps:
                break
    seconds = time.perf_counter() - t0
    draw(drawn, args.picture)
    print(f"{step} steps in {seconds:.1f} s; batches' shapes {sorted(shapes)}; "
          f"picture of {len(drawn)} batches: {args.picture}")  # fmt: skip
    print(f"leftovers carried to the next epoch: {loader.stats()['leftovers']['carried']}")
    loader.close()
    in_set = shapes <= set(buckets.sizes)
    first = sum(losses[: max(1, len(losses) // 4)]) / max(1, len(losses) // 4)
    last = sum(losses[-max(1, len(losses) // 4):]) / max(1, len(losses) // 4)
    fell = last < first and all(math.isfinite(v) for v in losses)
    print(f"every batch one bucket's shape: {in_set}; loss {first:.4f} -> {last:.4f}")
    return 0 if in_set and fell else 1


if __name__ == "__main__":
    sys.exit(main())
