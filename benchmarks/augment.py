"""Batch augmentations (issue 21, item 6), in one run; writes its section of docs/BENCHMARKS.md.

    make bench-augment                                  # installs kornia, runs this
    .venv/bin/python benchmarks/augment.py              # about 10 min on 2 cores
    .venv/bin/python benchmarks/augment.py --rounds 1 --batch 64 --no-write

1. The cost of each op on one batch (uint8 and float32 3 x 224 x 224 images, --batch of them,
   all cores): stoker.augment against kornia.augmentation (0.9) running the same op with the
   same ranges on the same batch (float32 in [0, 1], kornia's input), each call timed after a
   warm-up, the median of --rounds interleaved calls.
2. A timm-style training recipe on imagenet-sample (1,000 ImageNet JPEGs): RandomResizedCrop
   224 + flip, timm's RandAugment rand-m9-mstd0.5, RandomErasing p=0.25, MixUp 0.8 / CutMix 1.0
   (switch 0.5, label smoothing 0.1), batch 256:
   - the DataLoader way: PIL in N workers per sample (decode, crop and resize, flip, timm's
     RandAugment on PIL as timm runs it, to a uint8 tensor, erasing), MixUp/CutMix in the
     collate_fn, in the workers, as timm's FastCollateMixup (timm's semantics:
     stoker.augment.MixUp's torch form with torch's generator); N in 1, 2, 4, the best kept;
   - stoker: `ImageLoader(pack, train=True, augment=[TimmRandAugment.from_config(
     "rand-m9-mstd0.5"), RandomErasing(0.25), MixUp(...)])` on the host: RandAugment and
     erasing in the C++ workers as each image is decoded, the mix on the batch (C++ too).
   Images/s over a pass of 1,000 images, median of --rounds interleaved rounds after a warm-up.
Never a timed test.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # see hf_datasets.py
sys.path += [str(HERE / "peer_runners")]
_spec = importlib.util.spec_from_file_location("bench_datasets", HERE / "datasets.py")
assert _spec is not None and _spec.loader is not None
bench_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_data)

import stoker  # noqa: E402
import stoker.augment as A  # noqa: E402
from _dataloader import random_resized_crop_params  # noqa: E402
from stoker.machine import usable_cores  # noqa: E402

ROOT = HERE.parent
WORK = ROOT / "build" / "bench-augment"
BEGIN, END = bench_data.markers("benchmarks/augment.py")
SIZE = 224
MEAN_FILL = (124, 116, 104)


# --- 1. one op on one batch ----------------------------------------------------------------------


def op_pairs() -> dict[str, tuple[Callable[[torch.Tensor], Any], Callable[[torch.Tensor], Any]]]:
    """name -> (stoker's op on a batch, kornia's)."""
    import kornia.augmentation as K
    from kornia.augmentation import auto

    labels: dict[str, torch.Tensor] = {}

    def stoker_mix(cutmix: bool) -> Callable[[torch.Tensor], Any]:
        mix = A.MixUp(mixup_alpha=0.0 if cutmix else 0.8, cutmix_alpha=1.0 if cutmix else 0.0,
                      num_classes=1000)  # fmt: skip
        return lambda x: mix(x, labels.setdefault("y", torch.arange(len(x)) % 1000))

    def kornia_mix(op: Any) -> Callable[[torch.Tensor], Any]:
        return lambda x: op(x, labels.setdefault("y", torch.arange(len(x)) % 1000))

    return {
        "ColorJitter(0.4, 0.4, 0.4, 0.1)": (
            A.ColorJitter(0.4, 0.4, 0.4, 0.1), K.ColorJitter(0.4, 0.4, 0.4, 0.1, p=1.0)),
        "RandomGrayscale(p=0.2)": (A.RandomGrayscale(0.2), K.RandomGrayscale(p=0.2)),
        "GaussianBlur(9, sigma 0.1-2)": (
            A.GaussianBlur(9, (0.1, 2.0)), K.RandomGaussianBlur((9, 9), (0.1, 2.0), p=1.0)),
        "RandomErasing(p=0.25)": (A.RandomErasing(0.25), K.RandomErasing(p=0.25)),
        "RandAugment(2, 9)": (A.RandAugment(2, 9), auto.RandAugment(n=2, m=9)),
        "TrivialAugmentWide": (A.TrivialAugmentWide(), auto.TrivialAugment()),
        "MixUp(0.8)": (stoker_mix(False), kornia_mix(K.RandomMixUpV2(p=1.0))),
        "CutMix(1.0)": (stoker_mix(True), kornia_mix(K.RandomCutMixV2(p=1.0))),
    }  # fmt: skip


def time_call(fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> float:
    t0 = time.perf_counter()
    fn(x)
    return time.perf_counter() - t0


def in_workers(op: Any) -> Callable[[torch.Tensor], Any]:
    """The op's worker form (C++) over a channels_last uint8 batch, a copy of it, on torch's
    threads: what a host loader's workers spend on it for these images, batched."""
    from stoker import _core

    def run(x: torch.Tensor) -> torch.Tensor:
        out = x.clone(memory_format=torch.channels_last)
        step = op._engine_step("ops/0/", x.shape[2], x.shape[3])
        indices = torch.arange(x.shape[0]).numpy()
        _core.augment_images([step], out.permute(0, 2, 3, 1).numpy(), indices, 0, 0,
                             threads=torch.get_num_threads())  # fmt: skip
        return out

    return run


def op_costs(batch: int, rounds: int) -> list[tuple[str, float, float, float]]:
    """(op, stoker uint8 ms, stoker float32 ms, kornia float32 ms) per batch."""
    g = torch.Generator().manual_seed(0)
    x8 = torch.randint(0, 256, (batch, 3, SIZE, SIZE), dtype=torch.uint8, generator=g)
    x8 = x8.contiguous(memory_format=torch.channels_last)
    xf = x8.float() / 255
    rows = []
    for name, (mine, theirs) in op_pairs().items():
        runs: dict[str, list[float]] = {"u8": [], "f32": [], "kornia": []}
        calls = {"u8": (mine, x8), "f32": (mine, xf), "kornia": (theirs, xf)}
        if hasattr(mine, "_engine_step"):  # uint8: the op's worker form, as a loader runs it
            calls["u8"] = (in_workers(mine), x8)
        # MixUp/CutMix mix the uint8 batch in one C++ pass, as timm's FastCollateMixup does
        for fn, x in calls.values():
            fn(x)  # warm-up
        for _ in range(rounds):
            for key, (fn, x) in calls.items():
                runs[key].append(time_call(fn, x))
        ms = {k: 1e3 * statistics.median(v) for k, v in runs.items()}
        rows.append((name, ms["u8"], ms["f32"], ms["kornia"]))
        print(f"  {name}: stoker uint8 {ms['u8']:.0f} ms, float32 {ms['f32']:.0f} ms, kornia "
              f"{ms['kornia']:.0f} ms", flush=True)  # fmt: skip
    return rows


# --- 2. the recipe -------------------------------------------------------------------------------

_TIMM_OPS = ["AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
             "SolarizeAdd", "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY",
             "TranslateXRel", "TranslateYRel"]  # fmt: skip


def pil_timm_op(img: Any, name: str, level: float, rng: random.Random) -> Any:
    """timm auto_augment.py's op on a PIL image (its level mapping, random sign)."""
    from PIL import Image, ImageEnhance, ImageOps

    sign = -1 if rng.random() < 0.5 else 1
    fill = MEAN_FILL
    if name == "AutoContrast":
        return ImageOps.autocontrast(img)
    if name == "Equalize":
        return ImageOps.equalize(img)
    if name == "Invert":
        return ImageOps.invert(img)
    if name == "Rotate":
        return img.rotate(sign * level / 10 * 30, resample=Image.NEAREST, fillcolor=fill)
    if name == "Posterize":
        bits = int(level / 10 * 4)
        return img if bits >= 8 else ImageOps.posterize(img, max(bits, 1))
    if name == "Solarize":
        return ImageOps.solarize(img, int(level / 10 * 256))
    if name == "SolarizeAdd":
        add = int(level / 10 * 110)
        return img.point([min(255, i + add) if i < 128 else i for i in range(256)] * 3)
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return getattr(ImageEnhance, name)(img).enhance(level / 10 * 1.8 + 0.1)
    m = sign * level / 10 * (0.3 if name.startswith("Shear") else 0.45)
    data = {"ShearX": (1, m, 0, 0, 1, 0), "ShearY": (1, 0, 0, m, 1, 0),
            "TranslateXRel": (1, 0, m * img.size[0], 0, 1, 0),
            "TranslateYRel": (1, 0, 0, 0, 1, m * img.size[1])}[name]  # fmt: skip
    return img.transform(img.size, Image.AFFINE, data, Image.NEAREST, fillcolor=fill)


class TimmRecipe:
    """The DataLoader's dataset: a file, decoded by PIL, through the recipe's per-sample part."""

    def __init__(self, files: list[tuple[str, int]]):
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        import numpy as np
        from PIL import Image

        rng = random.Random(torch.randint(0, 2**31, (1,)).item())
        path, label = self.files[i]
        with Image.open(path) as f:
            img = f.convert("RGB")
        width, height = img.size
        top, left, h, w = random_resized_crop_params(width, height)
        img = img.crop((left, top, left + w, top + h)).resize((SIZE, SIZE), Image.BILINEAR)
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        for name in rng.choices(_TIMM_OPS, k=2):  # rand-m9-mstd0.5: 2 layers, p=0.5 each
            if rng.random() > 0.5:
                continue
            level = min(10.0, max(0.0, rng.gauss(9, 0.5)))
            img = pil_timm_op(img, name, level, rng)
        x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)
        if rng.random() < 0.25:  # RandomErasing(p=0.25): torchvision's box, zeros
            area = SIZE * SIZE
            for _ in range(10):
                target = area * rng.uniform(0.02, 0.33)
                aspect = math.exp(rng.uniform(math.log(0.3), math.log(3.3)))
                eh, ew = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
                if eh < SIZE and ew < SIZE:
                    t, l0 = rng.randint(0, SIZE - eh), rng.randint(0, SIZE - ew)
                    x[:, t : t + eh, l0 : l0 + ew] = 0
                    break
        return x, label


def recipe_contenders(files, pack, threads, batch):
    """name -> pass() giving images delivered."""
    mix = A.MixUp(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=1000)
    out: dict[str, Callable[[], int]] = {}

    def collate(samples):  # timm's FastCollateMixup: the mix in the collate, in the workers
        images, labels = torch.utils.data.default_collate(samples)
        return mix(images, labels)

    for workers in (1, 2, 4):
        loader = torch.utils.data.DataLoader(
            TimmRecipe(files), batch_size=batch, shuffle=True, num_workers=workers,
            persistent_workers=True, prefetch_factor=2, collate_fn=collate,
        )  # fmt: skip

        def run(loader=loader) -> int:
            n = 0
            for images, targets in loader:
                assert targets.shape == (len(images), 1000)
                n += len(images)
            return n

        out[f"DataLoader + PIL, {workers} workers"] = run
    recipe = [
        A.TimmRandAugment.from_config("rand-m9-mstd0.5"),
        A.RandomErasing(0.25),
        A.MixUp(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=1000),
    ]
    ld = stoker.ImageLoader(pack, batch_size=batch, train=True, size=SIZE, threads=threads,
                            augment=recipe)  # fmt: skip
    epoch = [0]

    def run_stoker() -> int:
        ld.set_epoch(epoch[0])
        epoch[0] += 1
        n = 0
        for images, targets in ld:
            assert targets.shape == (len(images), 1000)
            n += len(images)
        return n

    out[f"stoker, augment=, {threads} threads"] = run_stoker
    return out


def make_pack(files) -> Path:
    pack = WORK / f"pack-{len(files)}"
    if not (pack / "manifest.json").exists():
        WORK.mkdir(parents=True, exist_ok=True)
        listing = WORK / "files.csv"
        listing.write_text("".join(f"{p},{label}\n" for p, label in files))
        stoker.pack(listing, pack, overwrite=True, progress=False)
    return pack


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--images", type=int, default=1000, help="of imagenet-sample, for a trial")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    t0 = time.time()
    threads = usable_cores()
    torch.set_num_threads(threads)
    load_start = os.getloadavg()[0]
    machine = bench_data.machine()
    print(f"machine: {machine}; load average {load_start:.2f}", flush=True)
    import kornia

    print("1. one op, one batch", flush=True)
    costs = op_costs(args.batch, args.rounds)
    print("2. the recipe", flush=True)
    files = bench_data.imagenet_sample()[: args.images]
    contenders = recipe_contenders(files, make_pack(files), threads, args.batch)
    for run in contenders.values():
        run()  # warm-up (workers started, pages cached)
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(args.rounds):
        cells = []
        for name, run in contenders.items():
            t = time.perf_counter()
            n = run()
            rates[name].append(n / (time.perf_counter() - t))
            cells.append(f"{name} {rates[name][-1]:,.0f}")
        print(f"  round {r + 1}: " + "; ".join(cells), flush=True)
    load = (load_start, os.getloadavg()[0])
    command = "python benchmarks/augment.py" + " ".join(
        [""] + [a for a in sys.argv[1:] if a != "--no-write"]
    )
    text = section(costs, rates, machine, command, time.time() - t0, threads, args, load,
                   f"kornia {kornia.__version__}, torch {torch.__version__}")  # fmt: skip
    print(text)
    if not args.no_write:
        bench_data.write_section("benchmarks/augment.py", text)
    return 0


def section(costs, rates, machine, command, seconds, threads, args, load, versions) -> str:
    med = {name: statistics.median(v) for name, v in rates.items()}
    mine = next(n for n in med if n.startswith("stoker"))
    best = max((n for n in med if n != mine), key=lambda n: med[n])
    lines = [
        BEGIN,
        "## Batch augmentations (stoker.augment)",
        "",
        "Written by `benchmarks/augment.py` (`make bench-augment`); every number here comes from "
        "the same run.",
        "",
        f"- command: `{command}`",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}; Python "
        f"{machine['python']}, {versions}; load average {load[0]:.2f} at the start, "
        f"{load[1]:.2f} at the end",
        f"- date: {time.strftime('%Y-%m-%d')}, run time {seconds / 60:.1f} min",
        "",
        f"One op on one batch of {args.batch} x 3 x {SIZE} x {SIZE} on the CPU ({threads} "
        f"threads), ms, median of {args.rounds} interleaved calls after a warm-up:",
        "",
        "| op | stoker, uint8 | stoker, float32 | kornia, float32 | kornia / stoker, uint8 "
        "| kornia / stoker, float32 |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {n} | {a:,.0f} | {b:,.0f} | {c:,.0f} | {c / a:.2f}x | {c / b:.2f}x |"
            for n, a, b, c in costs
        ),  # fmt: skip
        "",
        "- stoker, uint8: the batch a loader gives (channels_last bytes) through the ops' C++ "
        "form, the one a host loader's workers run on each image (here over the batch on the "
        "same threads; `op(batch)` takes it too, but for GaussianBlur, whose C++ form is within "
        "one level of its torch form rather than equal); MixUp/CutMix: their one C++ pass over "
        "the batch. float32: the ops' torch form, on the batch as kornia takes it "
        "(kornia.augmentation works on floats only). Every stoker op is >= 2x kornia on the "
        "same batches: "
        f"**{'met' if all(c / min(a, b) >= 2 for _, a, b, c in costs) else 'missed'}** "
        "(each op's faster stoker form); on the float form alone: "
        f"**{'met' if all(c / b >= 2 for _, _, b, c in costs) else 'missed'}**.",
        "",
        "The timm-style recipe (RandomResizedCrop 224 + flip, rand-m9-mstd0.5, RandomErasing "
        f"0.25, MixUp/CutMix), batch {args.batch}, imagenet-sample, images/s, median of "
        f"{args.rounds} interleaved rounds:",
        "",
        "| loader | images/s |",
        "|---|---:|",
        *(f"| {n} | {v:,.0f} |" for n, v in med.items()),
        "",
        f"- stoker / the best DataLoader ({best}): **{med[mine] / med[best]:.2f}x**; "
        "target >= 3x (issue 21): "
        f"**{'met' if med[mine] / med[best] >= 3 else 'missed'}**",
        "",
        END,
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
