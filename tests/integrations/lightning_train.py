"""A Lightning training script fed by stoker (run by tests/python/test_trainers.py), written as
Lightning's docs write theirs: the loader is built at the top of the script, before the Trainer
and before any process group exists. Under strategy="ddp" Lightning runs this file again for
rank 1; under "ddp_spawn" the loader is pickled into each spawned process.

Each rank writes OUT/rank-R.json: for every training step, (epoch, batch_idx, the batch's
sample indices), and len(loader) as the rank saw it when training started."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import lightning as L
import torch

import stoker
from teardown import end_process_group

parser = argparse.ArgumentParser()
parser.add_argument("pack")
parser.add_argument("out")
parser.add_argument("--strategy", default="ddp")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--max-steps", type=int, default=-1)
parser.add_argument("--limit-train-batches", type=int, default=None)
parser.add_argument("--checkpoint-every", type=int, default=0, help="steps; 0: never")
parser.add_argument("--resume", default=None, help="a checkpoint to resume from")
parser.add_argument("--datamodule", action="store_true", help="a LightningDataModule makes it")
args = parser.parse_args()

SIZE = 16


def make_loader() -> stoker.ImageLoader:
    # No rank or world_size: stoker takes them from torch.distributed when each pass starts.
    return stoker.ImageLoader(
        args.pack, batch_size=4, size=SIZE, threads=1, seed=5, return_index=True
    )


loader = None if args.datamodule else make_loader()


class Data(L.LightningDataModule):
    def train_dataloader(self) -> stoker.ImageLoader:
        return make_loader()


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * SIZE * SIZE, 3))
        self.steps: list[tuple[int, int, list[int]]] = []
        self.lengths: list[int] = []

    def on_train_epoch_start(self) -> None:
        self.lengths.append(len(self.trainer.train_dataloader))

    def training_step(self, batch, batch_idx):
        images, labels, indices = batch
        self.steps.append((self.current_epoch, batch_idx, indices.tolist()))
        logits = self.net(images.float() / 255)
        return torch.nn.functional.cross_entropy(logits, labels.clamp(min=0))

    def on_train_end(self) -> None:
        out = Path(args.out) / f"rank-{self.global_rank}.json"
        out.write_text(
            json.dumps(
                {
                    "world_size": self.trainer.world_size,
                    "lengths": self.lengths,
                    "steps": self.steps,
                    "pid": os.getpid(),
                }
            )
        )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    torch.set_num_threads(1)
    callbacks = []
    if args.checkpoint_every:
        callbacks.append(
            L.pytorch.callbacks.ModelCheckpoint(
                dirpath=args.out, every_n_train_steps=args.checkpoint_every, save_top_k=-1
            )
        )
    trainer = L.Trainer(
        strategy=args.strategy,
        devices=2,
        accelerator="cpu",
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        limit_train_batches=args.limit_train_batches,
        logger=False,
        enable_checkpointing=bool(callbacks),
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Model()
    if args.datamodule:
        trainer.fit(model, datamodule=Data(), ckpt_path=args.resume)
    else:
        trainer.fit(model, train_dataloaders=loader, ckpt_path=args.resume)
    del trainer, model  # Lightning leaves the process group to interpreter shutdown
    end_process_group()


if __name__ == "__main__":
    main()
