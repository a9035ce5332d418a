"""LitData on a folder of Parquet files (benchmarks/parquet.py): the files indexed in place by
litdata.index_parquet_dataset, as LitData's docs show for Parquet datasets, then read by
StreamingDataset(folder, item_loader=ParquetLoader(), shuffle=True) in its StreamingDataLoader
with one worker per core (--option workers=N; persistent, spawned workers: LitData refuses
fork with ParquetLoader).
Each row is {"image": {"bytes", "path"}, "label"} (a Hugging Face Image + ClassLabel export):
the dataset's transform= decodes the JPEG with PIL and gives it torchvision's RandomResizedCrop
+ flip in the worker, as the DataLoader + PIL peer does (peer_runners/_dataloader.py).

--data: the folder of .parquet files. index_parquet_dataset writes index.json beside the files
it indexes, so the folder it indexes is a folder of links to them under --work (the benchmark's
folder is read by the other loaders as it is). --option epochs=N: epochs a pass (default 1).
"""

from __future__ import annotations

import hashlib
import io
from types import SimpleNamespace

import _dataloader
import _serve

# Its own venv: LitData's ParquetLoader needs polars and pyarrow, which litdata_s3's venv lacks.
# pip brings torchvision from PyPI with litdata: built against CUDA torch, it cannot load beside
# the CPU torch here (libc10_cuda.so). It is removed; litdata uses it only when it is installed.
ENV = {
    "torch": True,
    "pip": ["torch==2.13.0", "litdata==0.2.76", "pillow~=13.0", "polars==2.1.0", "pyarrow==26.0.1"],
    "build": ["$PY -m pip uninstall -y -q torchvision"],
}


def indexed_folder(job: _serve.Job):
    """Links to the benchmark's .parquet files and LitData's index.json of them, made once
    (keyed by the files' names, sizes and times)."""
    from litdata import index_parquet_dataset

    files = sorted(job.data.glob("*.parquet"))
    if not files:
        raise SystemExit(f"LitData: no .parquet files in {job.data}")
    h = hashlib.sha256()
    for p in files:
        st = p.stat()
        h.update(f"{p.name}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    out = job.work / f"litdata-parquet-{h.hexdigest()[:12]}"
    if (out / "index.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for p in files:
        link = out / p.name
        link.unlink(missing_ok=True)
        link.symlink_to(p.resolve())
    index_parquet_dataset(str(out), num_workers=job.threads)
    return out


class DecodeCropFlip:
    """StreamingDataset's transform: a row -> (CHW uint8 tensor, label), the JPEG decoded by PIL
    and given _dataloader.pil_transform's train pipeline. Picklable: the workers are spawned."""

    def __init__(self, size: int):
        self.size, self._crop_flip = size, None

    def __getstate__(self):
        return {"size": self.size, "_crop_flip": None}

    def __call__(self, row):
        from PIL import Image

        if self._crop_flip is None:
            geometry = SimpleNamespace(train=True, size=self.size, resize=256)
            self._crop_flip = _dataloader.pil_transform(geometry)
        with Image.open(io.BytesIO(row["image"]["bytes"])) as img:
            return self._crop_flip(img.convert("RGB")), row["label"]


def make_epoch(job: _serve.Job):
    import torch
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.item_loader import ParquetLoader

    folder = indexed_folder(job)
    epochs = int(job.options.get("epochs", 1))
    size = int(job.options.get("size", 224))
    dataset = StreamingDataset(str(folder), item_loader=ParquetLoader(), shuffle=True,
                               transform=DecodeCropFlip(size))  # fmt: skip
    # LitData refuses fork with ParquetLoader (polars' thread pool deadlocks in forked workers).
    loader = _dataloader.data_loader(job, dataset, StreamingDataLoader,
                                     multiprocessing_context="spawn")  # fmt: skip
    n = len(dataset)

    def epoch(check: bool):
        images = 0
        for _ in range(epochs):
            seen = torch.zeros(n, dtype=torch.int64)
            for batch, labels in loader:
                images += batch.shape[0]
                if check:
                    if batch.dtype != torch.uint8 or tuple(batch.shape[1:]) != (3, size, size):
                        raise SystemExit(f"LitData: a batch of {batch.dtype} {tuple(batch.shape)}")
                    seen += torch.bincount(labels, minlength=n)
            if check and not bool((seen == 1).all()):
                raise SystemExit("LitData: an epoch's labels are not every label once")
        if images != epochs * n:
            raise SystemExit(f"LitData: {images} images in {epochs} epochs of {n}")
        return images, f"{epochs} epochs, every label once an epoch" if check else ""

    return epoch


def version() -> str:
    from importlib.metadata import version as v

    return ", ".join(f"{name} {v(name)}" for name in ("litdata", "polars", "pyarrow", "torch"))


if __name__ == "__main__":
    raise SystemExit(_serve.serve("LitData ParquetLoader", make_epoch, version=version))
