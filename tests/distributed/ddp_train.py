"""One rank of a DistributedDataParallel job fed by a stoker ImageLoader (launched by torchrun
from tests/python/test_distributed.py): trains a tiny model for a few epochs on CPU (gloo) and
writes what this rank saw to OUT/rank-R.json: per epoch, the sample indices of its batches, and
its state_dict() after the first batches of epoch 0."""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import stoker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("pack")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--shuffle", default="block")
    parser.add_argument("--shuffle-window", type=int, default=2)
    parser.add_argument("--drop-last", action="store_true")
    parser.add_argument("--state-after", type=int, default=2, help="batches of epoch 0")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    size = 16
    loader = stoker.ImageLoader(  # rank and world size from torch.distributed
        args.pack,
        batch_size=args.batch_size,
        size=size,
        shuffle=args.shuffle,
        shuffle_window=args.shuffle_window,
        drop_last=args.drop_last,
        threads=1,
        return_index=True,
        seed=7,
    )
    assert (loader.rank, loader.world_size) == (rank, world)
    classes = max(1, len(loader.classes))
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * size * size, classes))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: list[list[int]] = []
    batches: list[int] = []
    state = None
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        indices: list[int] = []
        count = 0
        for images, labels, idx in loader:
            optimizer.zero_grad()
            logits = model(images.float().div_(255))
            loss = torch.nn.functional.cross_entropy(logits, labels.clamp(min=0))
            loss.backward()  # an all-reduce: a rank with a batch fewer would hang the others
            optimizer.step()
            indices += idx.tolist()
            count += 1
            if epoch == 0 and count == args.state_after:
                state = loader.state_dict()
        seen.append(indices)
        batches.append(count)
    dist.barrier()
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(
            {"world": world, "len": len(loader), "batches": batches, "seen": seen, "state": state},
            f,
        )
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
