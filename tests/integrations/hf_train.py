"""Hugging Face Trainer fed by a stoker Loader (run by tests/python/test_trainers.py under
`accelerate launch` with 2 CPU processes): a small ViT trained on dict batches straight from the
loader, checkpoints with the loader's position, and a resume from one.

Each rank writes OUT/rank-R.json: the sample indices of every batch the model was trained on,
the samples the train loader handed out in this run, the evaluation's batches and loss, the
final parameters' checksum and the seconds from train() to the first step."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import transformers

import stoker
from stoker.integrations.huggingface import StokerTrainer
from teardown import end_process_group

parser = argparse.ArgumentParser()
parser.add_argument("pack")
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--max-steps", type=int, default=-1)
parser.add_argument("--save-steps", type=int, default=0)
parser.add_argument("--resume", action="store_true", help="from the last checkpoint in OUT/..")
parser.add_argument("--checkpoints", required=True, help="Trainer's output_dir")
args = parser.parse_args()

SIZE = 16


class Recording(torch.nn.Module):
    """The ViT, and the indices of every batch it is given (the loader's `index` field)."""

    def __init__(self) -> None:
        super().__init__()
        config = transformers.ViTConfig(
            image_size=SIZE, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=1,
            num_attention_heads=2, intermediate_size=64, num_labels=3,
        )  # fmt: skip
        torch.manual_seed(0)
        self.vit = transformers.ViTForImageClassification(config)
        self.seen: list[list[int]] = []

    def forward(self, pixel_values, labels, index):
        self.seen.append(index.tolist())
        return self.vit(pixel_values=pixel_values, labels=labels)


class FirstStep(transformers.TrainerCallback):
    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.first_step_s: float | None = None

    def on_step_end(self, *_args, **_kwargs):
        if self.first_step_s is None:
            self.first_step_s = time.perf_counter() - self.started


def make_loader(train: bool) -> stoker.Loader:
    return stoker.Loader(
        args.pack,
        batch_size=3,
        fields={"pixel_values": stoker.Image(size=SIZE), "labels": stoker.Label()},
        train=train,
        threads=1,
        seed=11,
        return_index=True,
        device="cpu",  # on a GPU, "cuda": converted and normalised there
        dtype=torch.float32,
        mean=stoker.IMAGENET_MEAN,
        std=stoker.IMAGENET_STD,
    )


def main() -> None:
    torch.set_num_threads(1)
    loader = make_loader(train=True)
    training = transformers.TrainingArguments(
        output_dir=args.checkpoints,
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        gradient_accumulation_steps=3,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        ddp_find_unused_parameters=False,
    )
    model = Recording()
    first = FirstStep()
    trainer = StokerTrainer(
        model=model,
        args=training,
        train_loader=loader,
        eval_loader=make_loader(train=False),
        callbacks=[first],
    )
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    trained = len(model.seen)
    metrics = trainer.evaluate()
    rank = trainer.args.process_index
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    Path(args.out, f"rank-{rank}.json").write_text(
        json.dumps(
            {
                "world_size": trainer.args.world_size,
                "len": len(loader),
                "seen": model.seen[:trained],
                "evaluated": model.seen[trained:],
                "eval_loss": metrics.get("eval_loss"),
                "delivered": loader.stats()["samples"],
                "checksum": checksum,
                "global_step": trainer.state.global_step,
                "first_step_s": first.first_step_s,
            }
        )
    )
    del trainer  # its accelerator holds DDP's reducer: let go before the group
    end_process_group()


if __name__ == "__main__":
    main()
