"""Train an image classifier from a stoker pack: the reference recipe.

    python examples/train_classifier.py PACK [--val VAL_PACK] [--model auto] [--amp bf16]

Each line that is there for speed or for correctness says why. The recipe is the training-side
checklist of the field notes behind stoker (../shared/seeds): data arrives on the GPU already
normalised, from pinned memory on a side stream; mixed precision; channels_last; cudnn autotuning;
no host synchronisation per step; gradient accumulation; checkpoints that resume mid-epoch.

It runs anywhere: on a machine without a GPU it trains on the CPU (the tests run it there with
`--model tiny`), with the same code path.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import stoker


def tiny_net(num_classes: int) -> nn.Module:
    """Small enough to train in seconds on a CPU; the tests use it."""

    def block(cin: int, cout: int) -> nn.Sequential:
        # bias=False: the BatchNorm that follows has its own shift.
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True),  # in place: one activation buffer fewer
        )

    return nn.Sequential(
        block(3, 16),
        block(16, 32),
        block(32, 64),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


def make_model(name: str, num_classes: int) -> nn.Module:
    if name == "tiny":
        return tiny_net(num_classes)
    try:
        import torchvision
    except ImportError:
        if name == "auto":  # torchvision is not a dependency of stoker
            print("torchvision is not installed: training --model tiny (pip install torchvision "
                  "for ResNet-50, the default with it)")  # fmt: skip
            return tiny_net(num_classes)
        raise SystemExit(f"--model {name} needs torchvision (pip install torchvision)") from None
    return torchvision.models.get_model("resnet50" if name == "auto" else name,
                                        num_classes=num_classes)  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("pack", help="training pack (stoker pack, .tar shards, or a glob)")
    p.add_argument("--val", help="validation pack, evaluated after each epoch")
    p.add_argument("--model", default="auto",
                   help="'tiny', a torchvision model name, or 'auto': resnet50 where torchvision "
                   "is installed, else tiny")  # fmt: skip
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--batch-size", type=int, default=256, help="per optimizer micro-batch")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--lr", type=float, default=0.1, help="for a batch of 256 (scaled linearly)")
    p.add_argument("--amp", choices=["bf16", "fp16", "off"], default="bf16")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--device", default="auto", help="'cuda', 'cpu' or 'auto'")
    p.add_argument("--threads", type=int, default=None, help="stoker's decode threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", help="where to save a checkpoint (and to resume from)")
    p.add_argument("--checkpoint-every", type=int, default=500, help="optimizer steps")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint if present")
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="stop after this many optimizer steps in total (a preemption, for tests)",
    )
    p.add_argument("--log-every", type=int, default=50, help="optimizer steps between log lines")
    return p.parse_args(argv)


def save_checkpoint(path: str, state: dict) -> None:
    # Written next to the target and renamed over it: a job killed while saving leaves the
    # previous checkpoint whole.
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def rng_states() -> dict:
    """Every generator a resumed run must continue: the CPU's and each GPU's (dropout, random
    augmentation on the device)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["cpu"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def optimizer_step(optimizer, scaler, scheduler) -> bool:
    """One optimizer step through the GradScaler; the learning rate moves on only if the step
    was taken. Under fp16 the scaler skips a step whose gradients overflowed (and lowers the
    scale): stepping the scheduler anyway would shift the whole schedule by one step."""
    scale = scaler.get_scale()  # a host read only under fp16, whose step() reads one anyway
    scaler.step(optimizer)
    scaler.update()
    if scaler.is_enabled() and scaler.get_scale() < scale:
        return False
    scheduler.step()
    return True


def evaluate(model: nn.Module, loader, device: torch.device, amp) -> tuple[float, float]:
    model.eval()  # BatchNorm uses its running statistics, dropout is off
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.int64)
    seen = 0
    # inference_mode: no autograd graph and no version counters; cheaper than no_grad.
    with torch.inference_mode(), amp():
        for images, labels in loader:
            logits = model(images)
            loss_sum += F.cross_entropy(logits, labels, reduction="sum").float()
            correct += (logits.argmax(1) == labels).sum()
            seen += labels.numel()
    model.train()
    # One transfer to the host per evaluation, not one per batch.
    return loss_sum.item() / max(seen, 1), correct.item() / max(seen, 1)


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    cuda = device.type == "cuda"
    torch.manual_seed(args.seed)

    # cudnn tries each convolution algorithm once per input shape and keeps the fastest: a win
    # when shapes do not change, which drop_last=True below guarantees for training.
    torch.backends.cudnn.benchmark = True
    # TF32 matmuls and convolutions on Ampere and later: float32 range, 10-bit mantissa.
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}[args.amp]

    # Mixed precision: matmuls and convolutions in 16 bits, reductions in 32. bf16 has float32's
    # range and needs no loss scaling; fp16 needs a GradScaler so small gradients do not flush to 0.
    def amp():
        if amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=amp_dtype)

    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")

    # The input pipeline: decoded and augmented by stoker's C++ threads into pinned batch slots,
    # copied to the GPU on a side stream two batches ahead, converted and normalised there. The
    # images arrive in the autocast dtype (half the bytes of float32) and channels_last.
    input_dtype = amp_dtype or torch.float32
    loader = stoker.ImageLoader(
        args.pack,
        batch_size=args.batch_size,
        size=args.size,
        train=True,
        drop_last=True,  # every step the same shape: cudnn.benchmark and torch.compile stay valid
        threads=args.threads,
        seed=args.seed,
        device=device,
        dtype=input_dtype,
        mean=stoker.IMAGENET_MEAN,
        std=stoker.IMAGENET_STD,
    )
    val_loader = None
    if args.val:
        val_loader = stoker.ImageLoader(
            args.val,
            batch_size=args.batch_size,
            size=args.size,
            train=False,
            threads=args.threads,
            device=device,
            dtype=input_dtype,
            mean=stoker.IMAGENET_MEAN,
            std=stoker.IMAGENET_STD,
        )

    model = make_model(args.model, len(loader.classes))
    # channels_last (NHWC) is the layout tensor cores' convolution kernels want; the input
    # already is, so no layout conversion happens at the first layer.
    model = model.to(device, memory_format=torch.channels_last)

    steps_per_epoch = len(loader) // args.accum
    total_steps = steps_per_epoch * args.epochs
    lr = args.lr * args.batch_size * args.accum / 256  # the linear scaling rule
    # No weight decay on BatchNorm parameters and biases.
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    optimizer = torch.optim.SGD(
        [{"params": decay, "weight_decay": 5e-5}, {"params": no_decay, "weight_decay": 0}],
        lr=lr,
        momentum=0.9,
        nesterov=True,
    )

    def cosine(s: int) -> float:  # the learning rate's factor at optimizer step s
        return 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / max(total_steps, 1)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)

    step, start_epoch = 0, 0
    if args.resume and args.checkpoint and os.path.exists(args.checkpoint):
        # On the CPU: the RNG state must stay a CPU tensor; load_state_dict moves the rest.
        state = torch.load(args.checkpoint, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        set_rng_states(state["rng"])
        # The loader's position: the next batch is the first one this run has not trained on,
        # in the middle of an epoch if that is where the checkpoint was taken.
        loader.load_state_dict(state["loader"])
        step, start_epoch = state["step"], state["loader"]["epoch"]
        print(
            f"resumed at step {step}, epoch {start_epoch}, "
            f"batch {state['loader']['batches_done']} of {len(loader)}",
            flush=True,
        )

    # Compile after loading weights: the compiled module shares the parameters. Only training
    # goes through it: evaluation (inference_mode, a last partial batch) would recompile it.
    train_model = torch.compile(model) if args.compile else model

    def checkpoint() -> None:
        if args.checkpoint:
            save_checkpoint(
                args.checkpoint,
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "scaler": scaler.state_dict(),
                    "rng": rng_states(),
                    "loader": loader.state_dict(),  # batches handed out so far, not those in flight
                    "step": step,
                    "args": vars(args),
                },
            )

    done = False
    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a resumed position within this epoch
        # Micro-batches left over at the end of the last epoch (fewer than `accum`) are dropped,
        # so that an epoch's steps do not depend on where a run was resumed.
        optimizer.zero_grad(set_to_none=True)
        # Loss and accuracy are summed on the device and read once per log line: an .item()
        # per step would make the host wait for the GPU every step.
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), device=device, dtype=torch.int64)
        seen, micro, t0, wait0 = 0, 0, time.perf_counter(), loader.stats()["seconds"]["wait"]
        for images, labels in loader:
            with amp():
                logits = train_model(images)
                loss = F.cross_entropy(logits, labels)
            # Gradient accumulation: the loss of each micro-batch is divided by their number, so
            # `accum` micro-batches of B make the same gradient as one batch of accum * B.
            scaler.scale(loss / args.accum).backward()
            loss_sum += loss.detach().float() * labels.numel()
            correct += (logits.detach().argmax(1) == labels).sum()
            seen += labels.numel()
            micro += 1
            if micro % args.accum:
                continue
            optimizer_step(optimizer, scaler, scheduler)
            # set_to_none: the next backward writes the gradients instead of adding to zeros,
            # and no memset kernel runs.
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % args.log_every == 0:
                elapsed = time.perf_counter() - t0
                print(
                    f"epoch {epoch} step {step}: loss {loss_sum.item() / seen:.4f} "
                    f"acc {correct.item() / seen:.3f} {seen / elapsed:.0f} img/s",
                    flush=True,
                )
            # Checkpoints only between optimizer steps: no half-accumulated gradient is lost.
            if step % args.checkpoint_every == 0:
                checkpoint()
            if args.max_steps is not None and step >= args.max_steps:
                done = True
                break
        if done:
            break
        elapsed = time.perf_counter() - t0
        wait = loader.stats()["seconds"]["wait"] - wait0
        line = (
            f"epoch {epoch}: loss {loss_sum.item() / max(seen, 1):.4f} "
            f"acc {correct.item() / max(seen, 1):.3f} {seen / elapsed:.0f} img/s, "
            f"waiting for data {100 * wait / elapsed:.0f}% of the time"
        )
        if val_loader is not None:
            val_loss, val_acc = evaluate(model, val_loader, device, amp)
            line += f"; val loss {val_loss:.4f} acc {val_acc:.3f}"
        print(line, flush=True)
    checkpoint()
    loader.close()
    if val_loader is not None:
        val_loader.close()
    return {"step": step, "cuda": cuda}


if __name__ == "__main__":
    main()
