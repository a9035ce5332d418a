"""torch DataLoader (wds.WebLoader) over WebDataset tar shards, PIL decode and torchvision's PIL
transforms (the code of DataLoader + PIL).

prepare() writes the listed samples into shards once (each listing its own sample, the .jpg bytes
as they are, .cls the label), at most 1,000 samples a shard and at least 16 shards, so that every
DataLoader worker has shards to read (split_by_worker hands out whole shards); --option
shard_size=N sets the samples per shard. Train: each worker shuffles its own shards (webdataset
splits the shard list by worker before shuffling; detshuffle, a new order each epoch), then a
1,000-sample shuffle buffer; eval: in order.
"""

from __future__ import annotations

import json
import math
import shutil

import _common
import _dataloader

ENV = {"torch": True, "pip": ["numpy", "pillow", "webdataset"]}


def _shard_size(job) -> int:
    return int(job.options.get("shard_size", min(1000, max(1, math.ceil(len(job.files) / 16)))))


def _folder(job):
    return job.work / f"{job.key}.{_shard_size(job)}"


def _urls(job) -> list[str]:
    return json.loads((_folder(job) / "shards.json").read_text())


def prepare(job):
    import webdataset as wds

    out = _folder(job)
    if (out / "shards.json").exists():
        return
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    per, urls = _shard_size(job), []
    for start in range(0, len(job.files), per):
        url = str(out / f"shard-{start // per:06d}.tar")
        with wds.TarWriter(url) as sink:
            for index in range(start, min(start + per, len(job.files))):
                path, label = job.files[index]
                with open(path, "rb") as f:
                    sink.write({"__key__": f"{index:08d}", "jpg": f.read(), "cls": label})
        urls.append(url)
    (out / "shards.json").write_text(json.dumps(urls))


def make_epoch(job):
    import io

    import torch
    import webdataset as wds
    from PIL import Image

    transform = _dataloader.pil_transform(job)

    def sample(jpg):
        return transform(Image.open(io.BytesIO(jpg)).convert("RGB"))

    urls = _urls(job)
    dataset = wds.WebDataset(
        urls,
        shardshuffle=len(urls) if job.train else False,
        detshuffle=True,  # a new shard order each epoch (shuffle() with a seed repeats one)
        seed=0,
        nodesplitter=wds.single_node_only,
        workersplitter=wds.split_by_worker,
        empty_check=False,
    )
    if job.train:
        dataset = dataset.shuffle(1000)
    dataset = (
        dataset.to_tuple("jpg", "cls").map_tuple(sample, int).batched(job.batch_size, partial=True)
    )
    torch.set_num_threads(1)  # the main process only passes batches on
    n = _dataloader.workers(job)
    loader = wds.WebLoader(
        dataset,
        batch_size=None,
        num_workers=n,
        persistent_workers=n > 0,
        prefetch_factor=2 if n > 0 else None,
    )
    return lambda: iter(loader)


def version():
    import PIL
    import webdataset

    return (
        f"webdataset {webdataset.__version__}, Pillow {PIL.__version__}, "
        f"{_dataloader.torch_version()}"
    )


if __name__ == "__main__":
    raise SystemExit(
        _common.main(
            "DataLoader + WebDataset",
            make_epoch,
            version=version,
            prepare=prepare,
            notes="torchvision's PIL transforms exactly; the order differs (shards shuffled, "
            "then a 1,000-sample buffer per worker, instead of a full permutation), and batches "
            "are made per worker, so a worker's last batch of an epoch can be short.",
        )
    )
