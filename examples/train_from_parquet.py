"""Training an image classifier straight from Parquet, the way Hugging Face `datasets` writes a
dataset (an ``Image`` and a ``ClassLabel`` feature), with no packing step: read where it is, or
over HTTP from a local server, and resumed mid-epoch from a checkpoint.

    .venv/bin/python examples/train_from_parquet.py                 # 1,000 photos, 2 epochs
    .venv/bin/python examples/train_from_parquet.py --images 200 --epochs 1 --http

1. Writes ../shared/data/imagenet-sample (ImageNet validation photos; the class is in the file
   name) as Parquet files with `datasets`, once, under --data-dir.
2. Feeds them with ``stoker.ImageLoader(the folder)``, the same call as for a pack: the image
   and label columns are found from the features, the class names from the ClassLabel. With
   --http the files are served by a loopback HTTP server and read by URL: each file's footer
   is one range request, each row group's columns another, kept in a local cache.
3. Trains a small convolutional classifier, saves ``loader.state_dict()`` halfway through the
   first epoch, and checks that a loader resumed from it hands out exactly the batches the
   uninterrupted one did.

Exits with status 1 unless the resumed batches equal the uninterrupted run's and the loss fell.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import stoker

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def write_parquet(folder: Path, images: int) -> Path:
    """The photos as Parquet files of 4 row groups each, as `datasets` writes them."""
    out = folder / f"parquet-{images}"
    if (out / "done").exists():
        return out
    import datasets

    photos = sorted((SHARED / "imagenet-sample").iterdir())[:images]
    names = sorted({p.stem.split("_", 1)[1] for p in photos})
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=names)})  # fmt: skip
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": p.read_bytes(), "path": None} for p in photos],
         "label": [names.index(p.stem.split("_", 1)[1]) for p in photos]},
        features=features,
    )  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    shards = 2
    for k in range(shards):
        part = ds.shard(shards, k, contiguous=True)
        part.to_parquet(str(out / f"train-{k:05d}-of-{shards:05d}.parquet"),
                        batch_size=max(1, len(part) // 4))  # fmt: skip
    (out / "done").touch()
    return out


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, list[str]]:
    """The files over HTTP on loopback, and their URLs (Python's own file server does not
    answer range requests: _RangeHandler does)."""
    handler = functools.partial(_RangeHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    return server, [f"{base}/{p.name}" for p in sorted(folder.glob("*.parquet"))]


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """SimpleHTTPRequestHandler with single byte ranges (``bytes=a-b``, ``bytes=-n``)."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        spec = self.headers.get("Range")
        path = Path(self.translate_path(self.path))
        if not spec or not path.is_file():
            return super().do_GET()
        size = path.stat().st_size
        lo, hi = spec.removeprefix("bytes=").split("-")
        start, end = (size - int(hi), size - 1) if not lo else (int(lo), int(hi or size - 1))
        start, end = max(0, start), min(end, size - 1)
        with open(path, "rb") as f:
            f.seek(start)
            body = f.read(end - start + 1)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", f'"{size}-{path.stat().st_mtime_ns}"')
        self.end_headers()
        self.wfile.write(body)


class Net(nn.Module):
    def __init__(self, classes: int):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(3, 16, 3, 2, 1), nn.Conv2d(16, 32, 3, 2, 1),
                                    nn.Conv2d(32, 64, 3, 2, 1)])  # fmt: skip
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float() / 255
        for conv in self.convs:
            x = F.relu(conv(x))
        return self.head(x.mean((2, 3)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--http", action="store_true", help="read the files over HTTP")
    parser.add_argument("--data-dir", type=Path, default=Path("build/example-parquet"))
    args = parser.parse_args()
    folder = write_parquet(args.data_dir, args.images)
    source: str | list[str] = str(folder)
    server = None
    if args.http:
        server, source = serve(folder)
    kw = dict(batch_size=args.batch_size, size=args.size, train=True, seed=0,
              cache_dir=args.data_dir / "cache")  # fmt: skip

    loader = stoker.ImageLoader(source, **kw)
    print(f"{len(loader.dataset)} rows, {loader.dataset.num_shards} row groups, "
          f"{len(loader.classes)} classes ({loader.classes[0]}, ...)")  # fmt: skip
    torch.manual_seed(0)  # the same model each run: the loss check below is then repeatable
    model = Net(len(loader.classes))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    halfway, state, after = len(loader) // 2, None, []
    losses = []
    start = time.perf_counter()
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        for step, (images, labels) in enumerate(loader):
            loss = F.cross_entropy(model(images), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if epoch == 0 and step == halfway - 1:
                state = loader.state_dict()  # a checkpoint: the batches handed out so far
            elif epoch == 0 and step >= halfway:
                after.append(labels.clone())
        print(f"epoch {epoch}: loss {sum(losses[-len(loader):]) / len(loader):.3f}")
    seconds = time.perf_counter() - start
    print(f"{len(losses) * args.batch_size / seconds:.0f} images/s with training")
    if args.http:
        print(f"requests: {loader.stats()['remote']['requests']}")
    loader.close()

    resumed = stoker.ImageLoader(source, **kw)
    resumed.load_state_dict(state)
    again = [labels for _, labels in resumed]
    resumed.close()
    if server is not None:
        server.shutdown()
    same = len(again) == len(after) and all(torch.equal(a, b) for a, b in zip(again, after))
    fell = sum(losses[-5:]) < sum(losses[:5])
    print(f"resumed mid-epoch, the same batches: {same}")
    print(f"the loss fell: {fell}")
    return 0 if same and fell else 1


if __name__ == "__main__":
    sys.exit(main())
