"""How long Hugging Face's Trainer takes to resume a checkpoint taken at 90% of an epoch, fed by
stoker (StokerTrainer: the loader's position restored from the checkpoint) against the two ways
users feed Trainer today: a map-style Dataset (Trainer's DataLoader; accelerate skips the
trained batches' indices without loading them) and a WebDataset IterableDataset over the same
shards (accelerate's skip iterates, decoding every trained batch again).

    .venv/bin/python benchmarks/trainer_resume.py [--rounds 3] [--no-write]

Data: imagenet-sample (1,000 ImageNet JPEGs) listed 3 times, RandomResizedCrop 224 + flip, batch
64, 2 threads or DataLoader workers, one process on the CPU, a model small enough that loading
dominates. Each round and loader: a run to the step at 90% of the epoch saves a checkpoint; a
fresh Trainer then resumes from it and the time from `train(resume_from_checkpoint=...)` to the
end of the first step after it is measured, with the samples the loader handed out meanwhile.
Loaders run interleaved, medians over rounds. Writes its section of docs/BENCHMARKS.md."""

from __future__ import annotations

import argparse
import importlib.util
import io
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# This folder off sys.path before transformers is imported (its peer_runners/ and scripts are not
# packages transformers should see); bench_data.py is loaded below from its file.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402

import stoker  # noqa: E402
from stoker.integrations.huggingface import StokerTrainer  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_data", HERE / "bench_data.py")
assert _spec is not None and _spec.loader is not None
datasets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(datasets)


SCRIPT = "benchmarks/trainer_resume.py"
SIZE = 224
BATCH = 64
THREADS = 2
REPEAT = 3
FRACTION = 0.9


class SmallModel(torch.nn.Module):
    """uint8 NCHW images in, a loss out: a strided convolution and a linear layer."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = torch.nn.Conv2d(3, 8, kernel_size=16, stride=16)
        self.head = torch.nn.Linear(8 * (SIZE // 16) ** 2, classes)

    def forward(self, pixel_values, labels):
        x = pixel_values.float().div_(255)
        logits = self.head(self.features(x).flatten(1))
        return {"loss": torch.nn.functional.cross_entropy(logits, labels)}


def random_resized_crop(img: Image.Image) -> Image.Image:
    """torchvision's RandomResizedCrop(224) + RandomHorizontalFlip on PIL (torchvision is not
    installed here): the parameters drawn as its get_params draws them."""
    width, height = img.size
    area = width * height
    for _ in range(10):
        target = area * torch.empty(1).uniform_(0.08, 1.0).item()
        aspect = math.exp(torch.empty(1).uniform_(math.log(3 / 4), math.log(4 / 3)).item())
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, (1,)))
            j = int(torch.randint(0, width - w + 1, (1,)))
            break
    else:
        w, h, i, j = width, height, 0, 0
    img = img.crop((j, i, j + w, i + h)).resize((SIZE, SIZE), Image.BILINEAR)
    if torch.rand(1).item() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return img


def to_sample(img: Image.Image, label: int) -> dict:
    pixels = np.asarray(random_resized_crop(img.convert("RGB"))).copy()
    return {"pixel_values": torch.from_numpy(pixels).permute(2, 0, 1), "labels": label}


class Files(torch.utils.data.Dataset):
    """The usual map-style dataset: one file opened and decoded by PIL per item."""

    def __init__(self, files: list[tuple[Path, int]]):
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict:
        path, label = self.files[i]
        return to_sample(Image.open(path), label)


def webdataset(shards: list[str]) -> torch.utils.data.IterableDataset:
    import webdataset as wds

    def decode(sample: dict) -> dict:
        return to_sample(Image.open(io.BytesIO(sample["jpg"])), int(sample["cls"]))

    return (
        wds.WebDataset(shards, shardshuffle=False, empty_check=False, nodesplitter=None)
        .shuffle(1000)
        .map(decode)
    )


class FirstStep(transformers.TrainerCallback):
    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: float | None = None

    def on_step_end(self, *_args, **_kwargs):
        if self.seconds is None:
            self.seconds = time.perf_counter() - self.started


def arguments(
    output: Path, max_steps: int, save: bool, workers: int
) -> transformers.TrainingArguments:
    return transformers.TrainingArguments(
        output_dir=str(output),
        max_steps=max_steps,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        save_strategy="steps" if save else "no",
        save_steps=max_steps,
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=workers,
        dataloader_persistent_workers=False,
        disable_tqdm=True,
        seed=0,
    )


def stack(samples: list[dict]) -> dict:
    return {
        "pixel_values": torch.stack([s["pixel_values"] for s in samples]),
        "labels": torch.tensor([s["labels"] for s in samples]),
    }


def trainer_for(kind: str, data: dict, output: Path, max_steps: int, save: bool):
    """A Trainer for `kind`, and a function giving the samples its loader has handed out."""
    model = SmallModel()
    if kind == "stoker":
        loader = stoker.Loader(
            data["pack"],
            batch_size=BATCH,
            fields={"pixel_values": stoker.Image(size=SIZE), "labels": stoker.Label()},
            threads=THREADS,
            seed=0,
        )
        trainer = StokerTrainer(
            model=model, args=arguments(output, max_steps, save, 0), train_loader=loader
        )
        return trainer, lambda: loader.stats()["samples"]
    if kind == "dataloader":
        dataset: torch.utils.data.Dataset = Files(data["files"])
    else:
        dataset = webdataset(data["shards"])
    trainer = transformers.Trainer(
        model=model,
        args=arguments(output, max_steps, save, THREADS),
        train_dataset=dataset,
        data_collator=stack,
    )
    return trainer, None


def measure(kind: str, data: dict, work: Path, steps: int) -> dict:
    """Train to `steps` with a checkpoint there; then resume from it, timed to the next step."""
    output = work / kind
    shutil.rmtree(output, ignore_errors=True)
    trainer, _ = trainer_for(kind, data, output, steps, save=True)
    t0 = time.perf_counter()
    trainer.train()
    to_checkpoint = time.perf_counter() - t0
    checkpoint = output / f"checkpoint-{steps}"
    assert checkpoint.is_dir(), checkpoint
    trainer, handed_out = trainer_for(kind, data, output, steps + 1, save=False)
    first = FirstStep()
    trainer.add_callback(first)
    first.started = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(checkpoint))
    assert first.seconds is not None
    return {
        "resume_s": first.seconds,
        "trained_s": to_checkpoint,
        "handed_out": handed_out() if handed_out else None,
    }


def prepare(work: Path) -> dict:
    sample = datasets.imagenet_sample()
    files = [(Path(p), label) for p, label in sample] * REPEAT
    folder = work / "listing"
    if not (work / "pack" / "manifest.json").exists():
        shutil.rmtree(folder, ignore_errors=True)
        for k, (path, label) in enumerate(files):
            target = folder / f"{label:04d}" / f"{k:05d}.JPEG"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path.resolve())
        stoker.pack(folder, work / "pack", shard_size="32MB", progress=False, overwrite=True)
    shards = sorted(str(p) for p in (work / "pack").glob("*.tar"))
    return {"files": files, "pack": work / "pack", "shards": shards}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = args.work or Path(tempfile.gettempdir()) / "stoker-trainer-resume"
    work.mkdir(parents=True, exist_ok=True)
    data = prepare(work)
    batches = math.ceil(len(data["files"]) / BATCH)
    steps = int(batches * FRACTION)
    kinds = ["stoker", "dataloader", "webdataset"]
    results: dict[str, list[dict]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in kinds:
            got = measure(kind, data, work, steps)
            results[kind].append(got)
            print(f"round {r + 1} {kind}: resume {got['resume_s']:.2f} s, "
                  f"to the checkpoint {got['trained_s']:.1f} s, handed out {got['handed_out']}",
                  flush=True)  # fmt: skip
    median = {
        k: {m: statistics.median(v[m] for v in results[k]) for m in ("resume_s", "trained_s")}
        for k in kinds
    }
    text = render(median, results, steps, batches, len(data["files"]), args.rounds)
    print(text)
    if not args.no_write:
        datasets.write_section(SCRIPT, text)


NAMES = {
    "stoker": "**stoker** (StokerTrainer, position restored)",
    "dataloader": "DataLoader + PIL, map-style Dataset (accelerate skips indices)",
    "webdataset": "DataLoader + WebDataset, IterableDataset (accelerate reads the batches again)",
}


def render(median: dict, results: dict, steps: int, batches: int, samples: int, rounds: int) -> str:
    begin, end = datasets.markers(SCRIPT)
    m = datasets.machine()
    lines = [
        begin,
        "## Resuming a Trainer checkpoint",
        "",
        f"`{SCRIPT}` ({time.strftime('%Y-%m-%d')}, {m['cpu']}, {m['cores']} cores, torch "
        f"{m['torch']}, transformers {transformers.__version__}; {THREADS} threads or workers, "
        f"median of {rounds} interleaved "
        f"rounds). Hugging Face Trainer, one CPU process, {samples} samples (imagenet-sample "
        f"x{REPEAT}) in batches of {BATCH}: {batches} steps an epoch. A checkpoint at step "
        f"{steps} ({FRACTION:.0%} of the epoch) is resumed by a fresh Trainer; the time is from "
        "`train(resume_from_checkpoint=...)` to the end of the first step after it (loading the "
        "model, optimizer and random state included).",
        "",
        "| loader | resume to the next step, s | training to the checkpoint, s | resume/training |",
        "|---|---:|---:|---:|",
    ]
    for kind, got in median.items():
        lines.append(
            f"| {NAMES[kind]} | {got['resume_s']:.2f} | {got['trained_s']:.1f} | "
            f"{got['resume_s'] / got['trained_s']:.0%} |"
        )
    handed = [r["handed_out"] for r in results["stoker"]]
    lines += [
        "",
        f"stoker's loader handed out {handed[0]} samples during the resume (one step's batch "
        "and what it prefetched is not counted): none of the skipped batches was read or decoded. "
        "An IterableDataset has no other way to reach its position than reading up to it.",
        end,
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
