"""Training a video model on cached latents: clips bucketed by resolution and length at a fixed
frame rate, encoded once, the latents attached to the pack without rewriting it, then a few
steps of a toy latent denoiser.

    .venv/bin/python examples/train_video_latents.py                   # 36 videos, 60 steps
    .venv/bin/python examples/train_video_latents.py --videos 12 --steps 6

1. Makes videos of several sizes, rates (24, 25, 29.97, 60 fps) and lengths (0.5-6 s) with the
   ffmpeg command (pans over ImageNet photos from ../shared/data) and packs them, once, under
   --data-dir; the pack records each video's frame count, rate and size (its video facts).
2. Encodes each video's clip once: ``stoker.Loader(..., buckets=stoker.VideoBuckets([(h, w,
   frames), ...], fps=8))`` gives every video the largest bucket it fills (those too short or
   too small for any are left out), each batch of one bucket's shape; a frozen toy encoder (a
   VAE's stand-in: 4x8x8 average pooling and a fixed projection to 4 channels) turns each clip
   into latent tokens, ``[frames/4 * h/8 * w/8, 4]``.
3. Attaches them: ``stoker.attach(pack, "latents", {key: tokens})`` writes a sidecar beside the
   pack (the shards untouched); a loader reads it as a field, ``stoker.Array("latents")``.
4. Trains a small denoiser on the latents (noise at a random level, predict the noise), each
   batch of one bucket's token count (``group_by`` on the sidecar's length), and prints the loss.

Exits with status 1 unless every clip batch had one bucket's shape (its latents that bucket's
token count), every video that fills a bucket was encoded, the attached latents read back
exactly as encoded, every latent batch had one length, and the loss on a fixed held-out batch
fell.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import stoker

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
FPS = 8
BUCKETS = [(96, 160, 16), (160, 96, 16), (128, 128, 16), (96, 160, 8), (128, 128, 8)]
KINDS = [("320x180", "25"), ("180x320", "30000/1001"), ("256x256", "24"), ("320x180", "60")]
CHANNELS = 4  # the latents' channels


def make_videos(folder: Path, count: int) -> None:
    photos = sorted((SHARED / "imagenet-sample").iterdir())
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        out = folder / f"clip{i:03d}.mp4"
        if out.exists():
            continue
        size, rate = KINDS[i % len(KINDS)]
        # 0.5 s: too short for any bucket; 1.5 s: for 8 frames at 8 fps, not 16
        seconds = (0.5, 1.5, 2.5, 4.0, 6.0)[i % 5]
        frames = int(seconds * 60)
        subprocess.run(
            ["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-loop", "1", "-i",
             str(photos[i]), "-vf",
             "scale=1280:960:force_original_aspect_ratio=increase,crop=1280:960,"
             f"zoompan=z='1.1+0.002*on':x='on*2':y='on':d={frames}:s={size}:fps=60,fps={rate}",
             "-t", str(seconds), "-c:v", "libx264", "-bf", "2", "-crf", "26",
             "-pix_fmt", "yuv420p", str(out)], check=True)  # fmt: skip


class ToyEncoder(nn.Module):
    """A frozen VAE stand-in: [B, T, 3, H, W] uint8 -> [B, T/4 * H/8 * W/8, 4] tokens."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.register_buffer("proj", torch.randn(3, CHANNELS, generator=generator) / 3)

    @torch.no_grad()
    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        x = clips.float().div(127.5).sub(1).permute(0, 2, 1, 3, 4)  # [B, 3, T, H, W]
        x = F.avg_pool3d(x, (4, 8, 8))  # [B, 3, T/4, H/8, W/8]
        x = x.flatten(2).transpose(1, 2)  # [B, tokens, 3]
        return (x @ self.proj).half()  # latents are stored in half precision, as usual


class Denoiser(nn.Module):
    """Predicts the noise added to latent tokens, given the noise level: a token-wise MLP with
    a token-mixing step (attention would be the real thing)."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.inp = nn.Linear(CHANNELS + 1, width)
        self.mix = nn.Linear(width, width)
        self.out = nn.Sequential(nn.GELU(), nn.Linear(width, width), nn.GELU(),
                                 nn.Linear(width, CHANNELS))  # fmt: skip

    def forward(self, x: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
        h = self.inp(torch.cat([x, level[:, None, None].expand(-1, x.shape[1], 1)], -1))
        h = h + self.mix(h.mean(1, keepdim=True))  # what every token of the clip shares
        return self.out(h)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=36)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, default=Path("build/example-video-latents"))
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    pack = args.data_dir / f"pack-{args.videos}"
    if not (pack / "manifest.json").exists():
        make_videos(args.data_dir / f"videos-{args.videos}" / "clips", args.videos)
        stoker.pack(args.data_dir / f"videos-{args.videos}", pack, progress=False)

    # 2. Each video's clip, in its bucket, encoded once.
    buckets = stoker.VideoBuckets(BUCKETS, fps=FPS, batch_size=4)
    clips = stoker.Loader(pack, batch_size=4, buckets=buckets, train=False, threads=args.threads,
                          return_index=True, fields={"video": stoker.Video()})  # fmt: skip
    print(f"{len(clips.dataset)} videos; {clips.groups_excluded} fill no bucket (too short or "
          "too small); buckets (h, w, frames):")
    for g in clips.groups:
        print(f"  {g['key']}: {g['samples']} videos, batches of {g['batch_size']}")
    encoder = ToyEncoder()
    keys = [clips.dataset.record(i)["key"] for i in range(len(clips.dataset))]
    latents: dict[str, np.ndarray] = {}
    one_shape = True
    t0 = time.perf_counter()
    for batch in clips:
        video = batch["video"]  # uint8 [B, T, 3, h, w], one bucket's shape
        h, w, t = video.shape[3], video.shape[4], video.shape[1]
        one_shape &= (h, w, t) in BUCKETS
        for i, tokens in zip(batch["index"].tolist(), encoder(video), strict=True):
            one_shape &= tokens.shape[0] == t // 4 * (h // 8) * (w // 8)  # the bucket's
            latents[keys[i]] = tokens.numpy()
    every = len(latents) == len(keys) - clips.groups_excluded  # each video that fills a bucket
    print(f"encoded {len(latents)} clips in {time.perf_counter() - t0:.1f} s; every batch one "
          f"bucket's shape: {one_shape}; every video that fills a bucket encoded: {every}")
    if not latents:
        print("no video fills a bucket: make longer or larger ones")
        return 1

    # 3. Attached beside the pack: the shards are not rewritten. The videos left out get an
    # empty latent (0 tokens), which the training loader leaves out in turn.
    values = {k: latents.get(k, np.zeros((0, CHANNELS), np.float16)) for k in keys}
    result = stoker.attach(pack, "latents", values, overwrite=True, progress=False)
    print(f"attached 'latents': {result.samples} values, {result.bytes:,} bytes, fingerprint "
          f"{result.fingerprint}")

    # 4. Training on the latents alone, each batch of one token count (one bucket).
    longest = max(v.shape[0] for v in latents.values())

    def tokens_of(entry: stoker.load.grouping.SampleEntry) -> int | tuple[int, int]:
        n = entry.length("latents")
        return (n, 4) if n > 0 else (0, 1)  # (key, batch size): the empty ones together

    train = stoker.Loader(pack, batch_size=4, group_by=tokens_of, threads=args.threads, seed=1,
                          return_index=True,
                          fields={"latents": stoker.Array("latents", max_length=longest)})
    model = Denoiser()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    # A fixed evaluation batch (its noise and levels drawn once): the loss before and after.
    generator = torch.Generator().manual_seed(1)
    held = torch.from_numpy(np.stack([v for v in latents.values()
                                      if v.shape == next(iter(latents.values())).shape][:4]))
    held = held.float()
    held_level = torch.rand(len(held), generator=generator)
    held_noise = torch.randn(held.shape, generator=generator)

    @torch.no_grad()
    def evaluate() -> float:
        a = held_level[:, None, None]
        return F.mse_loss(model(held * (1 - a).sqrt() + held_noise * a.sqrt(), held_level),
                          held_noise).item()  # fmt: skip

    before = evaluate()
    exact, one_length, step = True, True, 0
    epoch = 0
    while step < args.steps:
        train.set_epoch(epoch)
        epoch += 1
        for batch in train:
            values, length = batch["latents"]["values"], batch["latents"]["length"]
            one_length &= len(set(length.tolist())) == 1
            n = int(length[0])
            if n == 0:
                continue  # videos that filled no bucket
            x = values[:, :n].float()
            for row, i in enumerate(batch["index"].tolist()[:2]):
                exact &= bool(np.array_equal(values[row, :n].numpy(), latents[keys[i]]))
            level = torch.rand(len(x))
            noise = torch.randn_like(x)
            noisy = x * (1 - level)[:, None, None].sqrt() + noise * level[:, None, None].sqrt()
            loss = F.mse_loss(model(noisy, level), noise)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % max(1, args.steps // 6) == 0 or step == 1:
                print(f"step {step:4d}  tokens {n:5d}  loss {loss.item():.4f}")
            if step >= args.steps:
                break
    after = evaluate()
    fell = after < before and math.isfinite(after)
    print(f"latents read back as encoded: {exact}; every latent batch one length: {one_length}")
    print(f"held-out loss {before:.4f} -> {after:.4f} (fell: {fell})")
    return 0 if one_shape and every and exact and one_length and fell else 1


if __name__ == "__main__":
    sys.exit(main())
