"""LitData from S3 (benchmarks/remote.py): chunks written by litdata.optimize, read by a
litdata.StreamingDataset on "s3://..." with a fresh cache_dir and shuffle=True (its defaults
otherwise), in its StreamingDataLoader with one worker per core; each sample's JPEG is decoded
by PIL and given torchvision's transforms in the worker, as the DataLoader + PIL peer does
(peer_runners/_dataloader.py).

The S3 endpoint is given as LitData's docs show for S3-compatible stores,
storage_options={"endpoint_url": ...} (from AWS_ENDPOINT_URL); the credentials come from
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (boto3). optimize() writes each sample as
{"jpg": the file's bytes, as they are; "cls"; "idx": its place in the listing} in chunks of
chunk_bytes = --shard-bytes, no compression.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import _dataloader
import _remote

# pip brings torchvision from PyPI with litdata: built against CUDA torch, it cannot load beside
# the CPU torch here (libc10_cuda.so). It is removed; litdata uses it only when it is installed
# (to decode JPEGs it serialised as images: these samples are bytes).
ENV = {
    "torch": True,
    "pip": ["torch==2.13.0", "litdata==0.2.76", "pillow~=13.0"],
    "build": ["$PY -m pip uninstall -y -q torchvision"],
}


def _dataset_class():
    from litdata import StreamingDataset
    from PIL import Image

    class Images(StreamingDataset):
        transform_image = None

        def __getitem__(self, i):
            sample = super().__getitem__(i)
            with Image.open(io.BytesIO(sample["jpg"])) as img:
                return self.transform_image(img.convert("RGB")), sample["idx"]

    return Images


def _allow_http() -> None:
    """LitData fetches chunks with obstore (Rust's object_store; boto3 only for index.json),
    whose client refuses a plain-HTTP endpoint unless its options say allow_http, and LitData
    offers no way to pass that: its client options are a module constant. A real S3 endpoint is
    HTTPS and needs none of this; the loopback server is HTTP, so the option is added there.
    Nothing else of LitData's is changed."""
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"


def build(args, job):
    from litdata import StreamingDataLoader

    Images = _dataset_class()
    Images.transform_image = staticmethod(_dataloader.pil_transform(job))
    options = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]} if "://" in args.source else {}
    _allow_http()
    dataset = Images(args.source, cache_dir=str(args.cache), shuffle=True, storage_options=options)
    return _remote.indexed_epochs(_dataloader.data_loader(job, dataset, StreamingDataLoader))


def version() -> str:
    import litdata

    return f"litdata {litdata.__version__}, {_dataloader.torch_version()}"


def _sample(item):
    i, path, label = item
    return {"jpg": Path(path).read_bytes(), "cls": label, "idx": i}


def prepare(files, out, shard_bytes) -> None:
    from litdata import optimize

    items = [(i, path, label) for i, (path, label) in enumerate(files)]
    optimize(fn=_sample, inputs=items, output_dir=str(out), chunk_bytes=shard_bytes,
             num_workers=os.cpu_count() or 1, mode="overwrite")  # fmt: skip


def _imports():
    import torch
    import litdata
    import PIL.Image

    return torch, litdata, PIL.Image


if __name__ == "__main__":
    raise SystemExit(
        _remote.main(
            lambda: _remote.prepare_main(prepare),
            lambda: _remote.read_main("LitData", build, version, _imports),
        )
    )
