"""The loaders compared. A peer turns (samples, pack, pipeline) into a callable that runs one
epoch and returns the number of images it produced. Add a loader by adding a Peer here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from stoker import bench


@dataclass
class Pipeline:
    name: str
    train: bool
    size: int = 224
    batch_size: int = 256


@dataclass
class Peer:
    name: str
    # (samples, packs {"plain", "restart"}, pipeline, threads) -> one epoch
    make_epoch: Callable[[list, dict, Pipeline, int], Callable[[], int]]


def _stoker(kind):
    def make(samples, packs, pipeline, threads):
        return bench.stoker_epoch(
            str(packs[kind]),
            batch_size=pipeline.batch_size,
            size=pipeline.size,
            train=pipeline.train,
            threads=threads,
        )

    return make


def _dataloader(workers):
    def make(samples, pack, pipeline, threads):
        transform = bench.TorchvisionTransform(pipeline.size, pipeline.train)
        return bench.dataloader_epoch(
            bench.FileDataset(samples, transform), batch_size=pipeline.batch_size, workers=workers
        )

    return make


def _ceiling(samples, packs, pipeline, threads):
    return bench.decode_ceiling_epoch(bench.pack_images(str(packs["plain"])), threads=threads)


def all_peers(workers=(0, 1, 2, 3, 4)) -> list[Peer]:
    return (
        [
            Peer("stoker", _stoker("restart")),
            Peer("stoker, pack --restart-interval 0", _stoker("plain")),
        ]
        + [Peer(f"DataLoader workers={w}", _dataloader(w)) for w in workers]
        + [Peer("full-decode ceiling", _ceiling)]
    )
