"""MosaicML streaming from S3 (benchmarks/remote.py): MDS shards read by a StreamingDataset with
remote="s3://...", a fresh local cache folder and shuffle=True (its defaults otherwise: py1e,
predownload 8 x batch size, no cache limit), in a torch DataLoader with one worker per core;
each sample's JPEG is decoded by PIL and given torchvision's transforms in the worker, as the
DataLoader + PIL peer does (peer_runners/_dataloader.py).

Its S3 endpoint comes from S3_ENDPOINT_URL, the variable streaming's docs name for
S3-compatible stores, and the credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (boto3).
The shards are written by its MDSWriter: columns jpg (the file's bytes, as they are), cls, idx
(the sample's place in the listing), size_limit = --shard-bytes, no compression.
"""

from __future__ import annotations

import io
from pathlib import Path

import _dataloader
import _remote

# pip brings torchvision from PyPI with streaming: built against CUDA torch, it cannot load beside
# the CPU torch here (libc10_cuda.so), and importing it raises. It is removed, and `_streaming()`
# imports streaming.base without the package's __init__ (which imports streaming.vision and so
# torchvision), as benchmarks/shuffle_quality.py does: every line that lists, downloads, shuffles
# and reads is streaming's own.
ENV = {
    "torch": True,
    "pip": ["torch==2.13.0", "mosaicml-streaming==0.13.0", "pillow~=13.0"],
    "build": ["$PY -m pip uninstall -y -q torchvision"],
}


def _streaming():
    """streaming.base, with the `streaming` package stood in for by an empty module that points
    at the real folder (see ENV)."""
    import importlib.util
    import os
    import sys
    import types

    if "streaming" not in sys.modules:
        spec = importlib.util.find_spec("streaming")
        assert spec is not None and spec.origin is not None
        package = types.ModuleType("streaming")
        package.__path__ = [os.path.dirname(spec.origin)]
        sys.modules["streaming"] = package
    import streaming.base
    import streaming.base.util

    return streaming.base


def _dataset_class():
    from PIL import Image

    class Images(_streaming().StreamingDataset):
        transform = None

        def __getitem__(self, i):
            sample = super().__getitem__(i)
            with Image.open(io.BytesIO(sample["jpg"])) as img:
                return self.transform(img.convert("RGB")), sample["idx"]

    return Images


def build(args, job):
    # A run killed earlier may have left its shared memory behind.
    _streaming().util.clean_stale_shared_memory()
    Images = _dataset_class()
    Images.transform = staticmethod(_dataloader.pil_transform(job))
    dataset = Images(
        remote=args.source, local=str(args.cache), shuffle=True, batch_size=job.batch_size
    )
    # The dataset fetched index.json here, in the parent, with a boto3 client that keeps its
    # connection open; DataLoader's forked workers would all inherit that one client and send
    # their requests down the same TCP connection at once. One worker then reads another's
    # response (a shard of the right size with another object's bytes in it: PIL cannot open a
    # sample) while the other waits for an answer that never comes, until its 60 s read timeout
    # and a retry. Seen in most cold epochs with 20 ms of latency. Dropping the parent's client
    # (streaming's own clean_up, which its retry calls too) gives each worker its own.
    for stream in dataset.streams:
        stream._downloader.clean_up()
    return _remote.indexed_epochs(_dataloader.data_loader(job, dataset))


def version() -> str:
    from importlib.metadata import version as installed

    return f"mosaicml-streaming {installed('mosaicml-streaming')}, {_dataloader.torch_version()}"


def prepare(files, out, shard_bytes) -> None:
    MDSWriter = _streaming().MDSWriter
    columns = {"jpg": "bytes", "cls": "int", "idx": "int"}
    with MDSWriter(out=str(out), columns=columns, size_limit=shard_bytes, exist_ok=True) as w:
        for i, (path, label) in enumerate(files):
            w.write({"jpg": Path(path).read_bytes(), "cls": label, "idx": i})


def _imports():
    import torch
    from PIL import Image

    return torch, _streaming(), Image


if __name__ == "__main__":
    raise SystemExit(
        _remote.main(
            lambda: _remote.prepare_main(prepare),
            lambda: _remote.read_main("MosaicML streaming", build, version, _imports),
        )
    )
