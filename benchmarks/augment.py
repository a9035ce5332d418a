"""Batch augmentations (issue 21, item 6), in one run; writes its section of docs/BENCHMARKS.md.

    make bench-augment                                  # installs kornia, runs this
    .venv/bin/python benchmarks/augment.py              # about 10 min on 2 cores
    .venv/bin/python benchmarks/augment.py --rounds 1 --batch 64 --no-write

0. The cost of each op on one image (issue 37): CPU microseconds per 224 x 224 image of
   imagenet-sample on one thread (the median of the calls' times, 4 images a call), at
   RandAugment's magnitude 9: stoker's worker form
   (`_core.augment_op`, the C++ the loader's threads run), PIL's own op (ImageEnhance,
   ImageOps, Image.transform with NEAREST, as timm and torchvision run them on PIL images) and
   the op on a uint8 tensor with torchvision's arithmetic (stoker.augment.functional, which the
   tests hold byte-equal to torchvision's; torchvision itself is not installed here), or with
   Pillow's (stoker.augment.pil: timm's geometry with Pillow's filters, and its Color, Contrast,
   Sharpness and AutoContrast as TimmRandAugment computes them, Pillow's bytes); and what
   RandAugment(2, 9) and timm's rand-m9-mstd0.5 cost per image in the worker form.
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
_spec = importlib.util.spec_from_file_location("bench_data", HERE / "bench_data.py")
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


# --- 0. one op on one image ------------------------------------------------------------------

PER_IMAGE = 64  # images per measurement
CHUNK = 4  # images per timed call
# The ops of timm's and torchvision's RandAugment (rows of the per-image table by their name).
POLICY_OPS = {"Brightness", "Color", "Contrast", "Sharpness", "Posterize", "Solarize",
              "SolarizeAdd", "Invert", "AutoContrast", "Equalize", "Rotate", "ShearX", "ShearY",
              "TranslateX", "TranslateY"}  # fmt: skip


def policy_op(row: str) -> bool:
    return row.split("(")[0].split(",")[0].strip() in POLICY_OPS


M9 = 9 / 10 * 1.8 + 0.1  # timm's factor at level 9: 1.72


PerImageOp = tuple[str, str, float, Callable[[Any], Any], Callable[[torch.Tensor], Any]]


def per_image_ops() -> list[PerImageOp]:
    """(row, stoker's op, its magnitude, PIL's op, the tensor op) at magnitude 9."""
    from PIL import Image, ImageEnhance, ImageFilter, ImageOps

    import stoker.augment.functional as F

    fill = MEAN_FILL

    def pil_affine(data):
        return lambda im: im.transform(im.size, Image.AFFINE, data, Image.NEAREST, fillcolor=fill)

    def tensor_affine(angle=0.0, translate=(0.0, 0.0), shear=(0.0, 0.0)):
        return lambda x: F.affine(x, angle=angle, translate=list(translate), scale=1.0,
                                  shear=list(shear), fill=list(fill))  # fmt: skip

    shear_deg = math.degrees(math.atan(0.27))
    move = 0.405 * SIZE  # TranslateXRel at level 9: 0.405 of the width
    return [  # fmt: skip
        (
            "Brightness",
            "brightness",
            M9,
            lambda im: ImageEnhance.Brightness(im).enhance(M9),
            lambda x: F.adjust_brightness(x, M9),
        ),
        (
            "Color (saturation), torchvision's",
            "saturation",
            M9,
            lambda im: ImageEnhance.Color(im).enhance(M9),
            lambda x: F.adjust_saturation(x, M9),
        ),
        (
            "Contrast, torchvision's",
            "contrast",
            M9,
            lambda im: ImageEnhance.Contrast(im).enhance(M9),
            lambda x: F.adjust_contrast(x, M9),
        ),
        (
            "Sharpness, torchvision's",
            "sharpness",
            M9,
            lambda im: ImageEnhance.Sharpness(im).enhance(M9),
            lambda x: F.adjust_sharpness(x, M9),
        ),
        (
            "Posterize(4)",
            "posterize",
            4,
            lambda im: ImageOps.posterize(im, 4),
            lambda x: F.posterize(x, 4),
        ),
        (
            "Solarize(128)",
            "solarize",
            128,
            lambda im: ImageOps.solarize(im, 128),
            lambda x: F.solarize(x, 128),
        ),
        (
            "SolarizeAdd(99)",
            "solarize_add",
            99,
            lambda im: im.point([min(255, i + 99) if i < 128 else i for i in range(256)] * 3),
            lambda x: torch.where(x < 128, (x.int() + 99).clamp_(max=255).to(torch.uint8), x),
        ),
        ("Invert", "invert", 0, ImageOps.invert, F.invert),
        (
            "AutoContrast, torchvision's",
            "autocontrast",
            0,
            ImageOps.autocontrast,
            F.autocontrast,
        ),  # fmt: skip
        *pillow_enhancers(),
        ("Equalize", "equalize", 0, ImageOps.equalize, F.equalize),
        (
            "Rotate(27)",
            "pil_rotate",
            27,
            lambda im: im.rotate(27, resample=Image.NEAREST, fillcolor=fill),
            lambda x: F.rotate(x, 27.0, fill=list(fill)),
        ),
        (
            "ShearX(0.27)",
            "pil_shear_x",
            0.27,
            pil_affine((1, 0.27, 0, 0, 1, 0)),
            tensor_affine(shear=(shear_deg, 0.0)),
        ),
        (
            "ShearY(0.27)",
            "pil_shear_y",
            0.27,
            pil_affine((1, 0, 0, 0.27, 1, 0)),
            tensor_affine(shear=(0.0, shear_deg)),
        ),
        (
            "TranslateX(0.405 w)",
            "pil_translate_x",
            move,
            pil_affine((1, 0, move, 0, 1, 0)),
            tensor_affine(translate=(int(move), 0)),
        ),
        (
            "TranslateY(0.405 h)",
            "pil_translate_y",
            move,
            pil_affine((1, 0, 0, 0, 1, move)),
            tensor_affine(translate=(0, int(move))),
        ),
        *filtered_geometry(move),
        (
            "Rotate(27), torchvision's",
            "rotate",
            27,
            lambda im: im.rotate(27, resample=Image.NEAREST, fillcolor=fill),
            lambda x: F.rotate(x, 27.0, fill=list(fill)),
        ),
        (
            "ShearX(0.27), torchvision's",
            "shear_x",
            0.27,
            pil_affine((1, 0.27, 0, 0, 1, 0)),
            tensor_affine(shear=(shear_deg, 0.0)),
        ),
        (
            "TranslateX(90 px), torchvision's",
            "translate_x",
            int(move),
            pil_affine((1, 0, int(move), 0, 1, 0)),
            tensor_affine(translate=(int(move), 0)),
        ),
        (
            "Hue(0.1) (ColorJitter)",
            "hue",
            0.1,
            lambda im: Image.merge(
                "HSV",
                [
                    c.point(lambda v: (v + 26) % 256) if k == 0 else c
                    for k, c in enumerate(im.convert("HSV").split())
                ],
            ).convert("RGB"),
            lambda x: F.adjust_hue(x, 0.1),
        ),
        (
            "Grayscale",
            "grayscale",
            0,
            lambda im: im.convert("L").convert("RGB"),
            lambda x: F.rgb_to_grayscale(x, 3),
        ),
        (
            "GaussianBlur(9, 1.0)",
            "gaussian_blur",
            1.0,
            lambda im: im.filter(ImageFilter.GaussianBlur(1.0)),
            lambda x: F.gaussian_blur(x, [9, 9], [1.0, 1.0]),
        ),
    ]


def pillow_enhancers() -> list[PerImageOp]:
    """timm's Color, Contrast, Sharpness and AutoContrast as TimmRandAugment computes them,
    Pillow's own arithmetic: stoker's worker form, PIL's own op (what timm calls), and stoker's
    batch form (stoker.augment.pil, torch)."""
    from PIL import ImageEnhance, ImageOps

    from stoker.augment import pil

    rows: list[PerImageOp] = [
        (f"{name}, Pillow's (timm)", f"pil_{name.lower()}", M9,
         lambda im, name=name: getattr(ImageEnhance, name)(im).enhance(M9),
         lambda x, name=name: getattr(pil, name.lower())(x[None], M9))
        for name in ("Color", "Contrast", "Sharpness")
    ]  # fmt: skip
    rows.append(("AutoContrast, Pillow's (timm)", "pil_autocontrast", 0, ImageOps.autocontrast,
                 lambda x: pil.autocontrast(x[None])))  # fmt: skip
    return rows


def filtered_geometry(move: float) -> list[PerImageOp]:
    """timm's geometry with Pillow's bilinear and bicubic filters (its default draws one of the
    two for each op): stoker's worker form, PIL's own op, and stoker's batch form (torch)."""
    from PIL import Image

    from stoker.augment import pil

    fill = MEAN_FILL
    rows = []
    for name, filt in (("bilinear", Image.BILINEAR), ("bicubic", Image.BICUBIC)):
        maps = [
            ("ShearX(0.27)", "pil_shear_x", 0.27, (1, 0.27, 0, 0, 1, 0)),
            ("ShearY(0.27)", "pil_shear_y", 0.27, (1, 0, 0, 0.27, 1, 0)),
            ("TranslateX(0.405 w)", "pil_translate_x", move, (1, 0, move, 0, 1, 0)),
            ("TranslateY(0.405 h)", "pil_translate_y", move, (1, 0, 0, 0, 1, move)),
        ]
        rows.append((
            f"Rotate(27), {name}", f"pil_rotate_{name}", 27,
            lambda im, filt=filt: im.rotate(27, resample=filt, fillcolor=fill),
            lambda x, name=name: pil.rotate(x[None], [27.0], list(fill), name),
        ))  # fmt: skip
        for row, op, m, data in maps:
            rows.append((
                f"{row}, {name}", f"{op}_{name}", m,
                lambda im, data=data, filt=filt: im.transform(im.size, Image.AFFINE, data, filt,
                                                              fillcolor=fill),
                lambda x, data=data, name=name: pil.affine(
                    x[None], torch.tensor([data], dtype=torch.float64), list(fill), name),
            ))  # fmt: skip
    return rows


def per_image_costs(rounds: int) -> tuple[list[tuple[str, float, float, float]], dict[str, float]]:
    """([(op, stoker us, PIL us, tensor us)], {policy: stoker us per image}), one thread."""
    import numpy as np
    from PIL import Image

    from stoker import _core

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    photos = []
    for path, _ in bench_data.imagenet_sample()[:PER_IMAGE]:
        with Image.open(path) as f:
            photos.append(f.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR))
    original = np.stack([np.asarray(p) for p in photos])  # [N, H, W, 3]
    tensors = [torch.from_numpy(a.copy()).permute(2, 0, 1).contiguous() for a in original]
    work = original.copy()

    # Each contender takes CHUNK images whose bytes are in the core's cache (600 kB), as a
    # loader's augmentation takes the image it has just decoded, after one untimed call on them
    # (stoker's restored from the originals before each). Timed in the calling thread's CPU
    # time (every contender runs there: one torch thread, threads=1); each call's time an image
    # is one sample, and the table gives the median of all of them: on a shared virtual machine
    # a call now and then takes several times as long (a 5 us op measured 31), which moved the
    # mean of small ops by half.
    def time_stoker(op: str, magnitude: float) -> list[float]:
        spent = []
        for k in range(0, PER_IMAGE, CHUNK):
            work[k : k + CHUNK] = original[k : k + CHUNK]
            _core.augment_op(work[k : k + CHUNK], op, magnitude, MEAN_FILL)
            work[k : k + CHUNK] = original[k : k + CHUNK]
            t = time.thread_time()
            _core.augment_op(work[k : k + CHUNK], op, magnitude, MEAN_FILL)
            spent.append((time.thread_time() - t) / CHUNK)
        return spent

    def time_each(fn: Callable[[Any], Any], items: list[Any]) -> list[float]:
        spent = []
        for k in range(0, len(items), CHUNK):
            for item in items[k : k + CHUNK]:
                fn(item)
            t = time.thread_time()
            for item in items[k : k + CHUNK]:
                fn(item)
            spent.append((time.thread_time() - t) / CHUNK)
        return spent

    rows = []
    for name, op, magnitude, pil, tensor in per_image_ops():
        calls = {"stoker": lambda op=op, m=magnitude: time_stoker(op, m),
                 "pil": lambda pil=pil: time_each(pil, photos),
                 "tensor": lambda tensor=tensor: time_each(tensor, tensors)}  # fmt: skip
        runs: dict[str, list[float]] = {k: [] for k in calls}
        for fn in calls.values():
            fn()  # warm-up
        for _ in range(rounds):
            for key, fn in calls.items():
                runs[key].extend(fn())
        us = {k: 1e6 * statistics.median(v) for k, v in runs.items()}
        rows.append((name, us["stoker"], us["pil"], us["tensor"]))
        print(f"  {name}: stoker {us['stoker']:.1f} us, PIL {us['pil']:.1f} us, tensor "
              f"{us['tensor']:.1f} us", flush=True)  # fmt: skip
    policies = {}
    indices = np.arange(PER_IMAGE, dtype=np.int64)
    for name, policy in [("RandAugment(2, 9)", A.RandAugment(2, 9)),
                         ("timm rand-m9-mstd0.5",
                          A.TimmRandAugment.from_config("rand-m9-mstd0.5"))]:  # fmt: skip
        step = policy._engine_step("ops/0/", SIZE, SIZE)
        times = []
        for epoch in range(rounds * 4 + 1):  # many draws: each epoch, other ops per image
            spent = 0.0
            for k in range(0, PER_IMAGE, CHUNK):
                work[k : k + CHUNK] = original[k : k + CHUNK]
                t = time.thread_time()
                _core.augment_images([step], work[k : k + CHUNK], indices[k : k + CHUNK], 0,
                                     epoch, threads=1)  # fmt: skip
                spent += time.thread_time() - t
            times.append(spent / PER_IMAGE)
        policies[name] = 1e6 * statistics.median(times[1:])
        print(f"  {name}: {policies[name]:.1f} us per image", flush=True)
    torch.set_num_threads(threads)
    return rows, policies


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
    """timm auto_augment.py's op on a PIL image (its level mapping, random sign, and for its
    geometry bilinear or bicubic drawn each time: _RANDOM_INTERPOLATION)."""
    from PIL import Image, ImageEnhance, ImageOps

    sign = -1 if rng.random() < 0.5 else 1
    filt = rng.choice((Image.BILINEAR, Image.BICUBIC))
    fill = MEAN_FILL
    if name == "AutoContrast":
        return ImageOps.autocontrast(img)
    if name == "Equalize":
        return ImageOps.equalize(img)
    if name == "Invert":
        return ImageOps.invert(img)
    if name == "Rotate":
        return img.rotate(sign * level / 10 * 30, resample=filt, fillcolor=fill)
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
    return img.transform(img.size, Image.AFFINE, data, filt, fillcolor=fill)


class TimmRecipe:
    """The DataLoader's dataset: a file, decoded by PIL, through the recipe's per-sample part."""

    def __init__(self, files: list[tuple[str, int]]):
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def augment(self, img: Any, rng: random.Random) -> Any:
        for name in rng.choices(_TIMM_OPS, k=2):  # rand-m9-mstd0.5: 2 layers, p=0.5 each
            if rng.random() > 0.5:
                continue
            level = min(10.0, max(0.0, rng.gauss(9, 0.5)))
            img = pil_timm_op(img, name, level, rng)
        return img

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
        img = self.augment(img, rng)
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


# torchvision's RandAugment(2, 9) on PIL images (31 bins; what transforms.RandAugment does to a
# PIL image: ImageEnhance, ImageOps and Image.transform with NEAREST, black outside).
_TV_OPS = ["Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness",
           "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast",
           "Equalize"]  # fmt: skip


def pil_torchvision_op(img: Any, name: str, rng: random.Random) -> Any:
    from PIL import Image, ImageEnhance, ImageOps

    sign = -1 if rng.random() < 0.5 else 1
    w, h = img.size
    if name == "Identity":
        return img
    if name in ("ShearX", "ShearY"):
        m = sign * 0.3 * 9 / 30
        data = (1, m, -m * h / 2, 0, 1, 0) if name == "ShearX" else (1, 0, 0, m, 1, -m * w / 2)
        return img.transform(img.size, Image.AFFINE, data, Image.NEAREST)
    if name in ("TranslateX", "TranslateY"):
        t = sign * int(150 / 331 * (w if name == "TranslateX" else h) * 9 / 30)
        data = (1, 0, -t, 0, 1, 0) if name == "TranslateX" else (1, 0, 0, 0, 1, -t)
        return img.transform(img.size, Image.AFFINE, data, Image.NEAREST)
    if name == "Rotate":
        return img.rotate(sign * 30 * 9 / 30, resample=Image.NEAREST)
    if name in ("Brightness", "Color", "Contrast", "Sharpness"):
        return getattr(ImageEnhance, name)(img).enhance(1 + sign * 0.9 * 9 / 30)
    if name == "Posterize":
        return ImageOps.posterize(img, 7)
    if name == "Solarize":
        return ImageOps.solarize(img, 0.7 * 255)
    if name == "AutoContrast":
        return ImageOps.autocontrast(img)
    return ImageOps.equalize(img)


class TorchvisionRecipe(TimmRecipe):
    """RandomResizedCrop + flip, torchvision's RandAugment(2, 9) on PIL, RandomErasing(0.25)."""

    def augment(self, img: Any, rng: random.Random) -> Any:
        for name in rng.choices(_TV_OPS, k=2):
            img = pil_torchvision_op(img, name, rng)
        return img


def rand_augment_contenders(files, pack, threads, batch):
    """The recipe: name -> pass() giving images delivered."""
    out: dict[str, Callable[[], int]] = {}
    for workers in (1, 2, 4):
        loader = torch.utils.data.DataLoader(
            TorchvisionRecipe(files), batch_size=batch, shuffle=True, num_workers=workers,
            persistent_workers=True, prefetch_factor=2,
        )  # fmt: skip
        out[f"DataLoader + PIL, {workers} workers"] = lambda loader=loader: sum(
            len(images) for images, _ in loader
        )
    for name, augment in [("no augmentation", None),
                          ("RandAugment(2, 9) + RandomErasing(0.25)",
                           [A.RandAugment(2, 9), A.RandomErasing(0.25)])]:  # fmt: skip
        ld = stoker.ImageLoader(pack, batch_size=batch, train=True, size=SIZE, threads=threads,
                                augment=augment)  # fmt: skip
        epoch = [0]

        def run(ld=ld, epoch=epoch) -> int:
            ld.set_epoch(epoch[0])
            epoch[0] += 1
            return sum(len(images) for images, _ in ld)

        out[f"stoker, {name}, {threads} threads"] = run
    return out


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


def interleaved(contenders: dict[str, Callable[[], int]], rounds: int) -> dict[str, list[float]]:
    """Images/s of each contender's pass, `rounds` interleaved rounds after a warm-up."""
    for run in contenders.values():
        run()  # warm-up (workers started, pages cached)
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(rounds):
        cells = []
        for name, run in contenders.items():
            t = time.perf_counter()
            n = run()
            rates[name].append(n / (time.perf_counter() - t))
            cells.append(f"{name} {rates[name][-1]:,.0f}")
        print(f"  round {r + 1}: " + "; ".join(cells), flush=True)
    return rates


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

    print("0. one op, one image", flush=True)
    per_image, policies = per_image_costs(args.rounds)
    print("1. one op, one batch", flush=True)
    costs = op_costs(args.batch, args.rounds)
    print("2. the recipe", flush=True)
    files = bench_data.imagenet_sample()[: args.images]
    pack = make_pack(files)
    rates = interleaved(recipe_contenders(files, pack, threads, args.batch), args.rounds)
    print("3. RandAugment(2, 9) + RandomErasing(0.25)", flush=True)
    rand_rates = interleaved(rand_augment_contenders(files, pack, threads, args.batch),
                             args.rounds)  # fmt: skip
    load = (load_start, os.getloadavg()[0])
    command = "python benchmarks/augment.py" + " ".join(
        [""] + [a for a in sys.argv[1:] if a != "--no-write"]
    )
    versions = f"kornia {kornia.__version__}, torch {torch.__version__}"
    text = section(per_image, policies, costs, rates, rand_rates, machine, command,
                   time.time() - t0, threads, args, load, versions)  # fmt: skip
    print(text)
    if not args.no_write:
        bench_data.write_section("benchmarks/augment.py", text)
    return 0


def section(per_image, policies, costs, rates, rand_rates, machine, command, seconds, threads,
            args, load, versions) -> str:  # fmt: skip
    med = {name: statistics.median(v) for name, v in rates.items()}
    rand = {name: statistics.median(v) for name, v in rand_rates.items()}
    plain = next(v for n, v in rand.items() if "no augmentation" in n)
    augmented = next(v for n, v in rand.items() if "RandAugment" in n)
    best_pil = max((n for n in rand if n.startswith("DataLoader")), key=lambda n: rand[n])
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
        f"One op on one {SIZE} x {SIZE} image of imagenet-sample, one thread, microseconds of "
        f"CPU (the calling thread's) an image at RandAugment's magnitude 9 (timm's factor "
        f"1.72), {CHUNK} images a call, each in the core's cache as a loader's just-decoded image "
        f"is, after one untimed call on them (stoker's restored from a copy before each): the "
        f"median over {args.rounds} rounds of the {PER_IMAGE // CHUNK} calls over {PER_IMAGE} "
        f"images (a median, as a call on this shared virtual machine now and then takes several "
        f"times as long):",
        "",
        "| op | stoker (C++ worker form) | PIL's own op | tensor op (the batch form: "
        "torchvision's arithmetic, or Pillow's for the rows so named) | PIL / stoker "
        "| tensor / stoker |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {n} | {a:,.1f} | {b:,.1f} | {c:,.1f} | {b / a:.1f}x | {c / a:.1f}x |"
            for n, a, b, c in per_image
        ),  # fmt: skip
        "",
        *(
            f"- {name} in the worker form: **{us / 1000:.3f} ms** per image (its ops drawn per "
            f"image, over {PER_IMAGE} images and several epochs)"
            for name, us in policies.items()
        ),
        "- every op of the timm and torchvision policies >= 3x PIL's own: "
        f"**{'met' if all(b / a >= 3 for n, a, b, _ in per_image if policy_op(n)) else 'missed'}**"
        f" (slowest: {min((b / a, n) for n, a, b, _ in per_image if policy_op(n))[1]}); "
        f"RandAugment(2, 9) <= 0.15 ms: "
        f"**{'met' if policies['RandAugment(2, 9)'] <= 150 else 'missed'}**",
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
        "target >= 3x: "
        f"**{'met' if med[mine] / med[best] >= 3 else 'missed'}**",
        "",
        "The recipe: RandomResizedCrop 224 + flip, torchvision's RandAugment(2, 9), "
        f"RandomErasing(0.25), batch {args.batch}, imagenet-sample, images/s, median of "
        f"{args.rounds} interleaved rounds; the DataLoader's workers run the same ops with PIL "
        "(what transforms.RandAugment does to a PIL image):",
        "",
        "| loader | images/s |",
        "|---|---:|",
        *(f"| {n} | {v:,.0f} |" for n, v in rand.items()),
        "",
        f"- stoker with the recipe / without augmentation: **{augmented / plain:.0%}** (target "
        f">= 75%: **{'met' if augmented / plain >= 0.75 else 'missed'}**); / the best "
        f"DataLoader ({best_pil}): **{augmented / rand[best_pil]:.2f}x** (target >= 3x: "
        f"**{'met' if augmented / rand[best_pil] >= 3 else 'missed'}**)",
        "",
        END,
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
