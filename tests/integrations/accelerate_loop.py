"""A plain accelerate training loop fed by a stoker ImageLoader (run by
tests/python/test_trainers.py under `accelerate launch` with 2 CPU processes): the model and
optimizer go through accelerator.prepare, the loader does not (it gives each process its share
itself) and is registered for checkpointing, so save_state/load_state carry its position.

Each rank writes OUT/rank-R.json: the sample indices of every step's batch."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import accelerate
import torch

import stoker
from teardown import end_process_group

parser = argparse.ArgumentParser()
parser.add_argument("pack")
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--stop-after", type=int, default=0, help="steps; save_state, then stop")
parser.add_argument("--resume", default=None, help="a folder save_state wrote")
args = parser.parse_args()


def main() -> None:
    torch.set_num_threads(1)
    accelerator = accelerate.Accelerator(cpu=True)
    loader = stoker.ImageLoader(args.pack, batch_size=4, size=16, threads=1, seed=3,
                                return_index=True)  # fmt: skip
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(loader)
    first_epoch = 0
    if args.resume:
        accelerator.load_state(args.resume)
        first_epoch = loader.state_dict()["epoch"]
    seen: list[list[int]] = []
    step = 0
    for epoch in range(first_epoch, args.epochs):
        loader.set_epoch(epoch)  # the epoch of the state loaded keeps its position
        for images, labels, indices in loader:
            loss = torch.nn.functional.cross_entropy(model(images.float() / 255), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            seen.append(indices.tolist())
            step += 1
            if step == args.stop_after:
                accelerator.save_state(str(Path(args.out) / "state"))
                break
        if step == args.stop_after:
            break
    Path(args.out, f"rank-{accelerator.process_index}.json").write_text(json.dumps({"seen": seen}))
    accelerator.free_memory()  # its prepared (DDP) model
    del model, optimizer
    end_process_group()


if __name__ == "__main__":
    main()
