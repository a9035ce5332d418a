"""stoker's transforms against torchvision's PIL path, written out here (torchvision itself is not
a dependency): RandomResizedCrop.get_params, Resize + CenterCrop, PIL's BILINEAR resampling.

The photos are ../shared/data/imagenet-sample (1,000 ImageNet validation JPEGs). Run with -s to
see the PSNR figures; the evaluation numbers are a release criterion.
"""

from __future__ import annotations

import math
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_data
from PIL import Image

import stoker._core as C

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)


# --- torchvision, written out -----------------------------------------------------------------


def torchvision_rrc_params(width: int, height: int, rng, scale=SCALE, ratio=RATIO, trace=None):
    """torchvision.transforms.RandomResizedCrop.get_params, step for step, with torch's RNG
    replaced by stoker's KeyedRandom: torch.empty(1).uniform_(a, b) -> rng.uniform(a, b) and
    torch.randint(0, n, (1,)) -> rng.below(n), i (top) drawn before j (left). Returns
    (i, j, h, w) as torchvision does. `trace`, a list, gets "fallback" when no try fit."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = rng.below(height - h + 1)
            j = rng.below(width - w + 1)
            return i, j, h, w
    # Fallback to central crop
    if trace is not None:
        trace.append("fallback")
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:  # whole image
        w = width
        h = height
    i = (height - h) // 2
    j = (width - w) // 2
    return i, j, h, w


def torchvision_resize_size(width: int, height: int, size: int) -> tuple[int, int]:
    """transforms.Resize(size)'s output (width, height) for a PIL image of width x height
    (torchvision's _compute_resized_output_size: the longer side truncated, not rounded)."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


def torchvision_eval(img: Image.Image, resize: int = 256, crop: int = 224) -> np.ndarray:
    """Resize(resize) + CenterCrop(crop) on a PIL image, as torchvision does it."""
    img = img.resize(torchvision_resize_size(*img.size, resize), Image.BILINEAR)
    w, h = img.size
    top = int(round((h - crop) / 2.0))
    left = int(round((w - crop) / 2.0))
    return np.asarray(img.crop((left, top, left + crop, top + crop)))


def torchvision_train(img: Image.Image, size: int, seed: int, epoch: int, index: int):
    """RandomResizedCrop(size) + RandomHorizontalFlip() on a PIL image, drawing from the key that
    stoker gives sample `index` of `epoch`: the crop's draws, then the flip's uniform < 0.5."""
    rng = C.KeyedRandom(seed, epoch, index)
    i, j, h, w = torchvision_rrc_params(*img.size, rng)
    flip = rng.uniform(0.0, 1.0) < 0.5
    out = img.crop((j, i, j + w, i + h)).resize((size, size), Image.BILINEAR)
    if flip:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(out), (j, i, j + w, i + h), flip


# --- helpers ------------------------------------------------------------------------------------


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    return psnr_of_mse(mse_of(a, b))


def psnr_of_mse(mse: float) -> float:
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def pooled_psnr(mses) -> float:
    mse = float(np.mean(mses))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def mse_of(a, b) -> float:
    return float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))


def summary(values_db, cap=99.0) -> str:
    v = np.minimum(np.asarray(values_db, dtype=np.float64), cap)
    exact = int(np.sum(np.isinf(values_db)))
    return (
        f"{len(v)} images, {exact} pixel-exact, mean {v.mean():.2f} dB (exact counted as "
        f"{cap:.0f} dB), min {v.min():.2f} dB"
    )


def imagenet_files() -> list[Path]:
    files = sorted((shared_data() / "imagenet-sample").iterdir())
    if len(files) < 1000:
        pytest.skip("imagenet-sample incomplete")
    return files


def rgb(data_path: Path) -> Image.Image:
    with Image.open(data_path) as im:
        return im.convert("RGB")


def parallel_map(fn, items):
    with ThreadPoolExecutor(max_workers=2) as pool:  # PIL and stoker both release the GIL
        return list(pool.map(fn, items))


# --- RandomResizedCrop parameters -----------------------------------------------------------------


def _sizes():
    r = random.Random(1234)
    sizes = [
        (500, 375),
        (375, 500),
        (500, 333),
        (224, 224),
        (1, 1),
        (1, 2),
        (2, 1),
        (1, 1000),
        (1000, 1),
        (3, 5000),
        (5000, 3),
        (7, 10000),
        (10000, 7),
        (2, 3),
        (3, 4),
        (4, 3),
        (17, 23),
        (8192, 8192),
        (65500, 1),
        (299, 1),
        (1, 299),
        (100, 74),
        (100, 76),
        (133, 100),
        (134, 100),
    ]
    while len(sizes) < 600:
        kind = r.random()
        if kind < 0.5:  # ordinary photos
            sizes.append((r.randint(32, 4000), r.randint(32, 4000)))
        elif kind < 0.8:  # tiny images
            sizes.append((r.randint(1, 12), r.randint(1, 12)))
        else:  # extreme aspect ratios: most tries fail and the fallback decides
            long, short = r.randint(200, 20000), r.randint(1, 40)
            sizes.append((long, short) if r.random() < 0.5 else (short, long))
    return sizes


@pytest.mark.parametrize(
    "scale,ratio",
    [
        (SCALE, RATIO),
        ((0.5, 1.0), (0.5, 2.0)),
        ((0.01, 0.02), (1.0, 1.0)),
        ((1.0, 1.0), (0.2, 5.0)),
    ],
)
def test_random_resized_crop_matches_torchvision_get_params(scale, ratio):
    mismatches, fallbacks, checked = [], 0, 0
    for n, (w, h) in enumerate(_sizes()):
        for k in range(8):
            key = (n * 7919 + k, k % 3, n * 8 + k)
            trace = []
            i, j, ch, cw = torchvision_rrc_params(w, h, C.KeyedRandom(*key), scale, ratio, trace)
            expect = (float(j), float(i), float(j + cw), float(i + ch))
            got = tuple(
                C.random_resized_crop(
                    w, h, C.KeyedRandom(*key), scale[0], scale[1], ratio[0], ratio[1]
                )
            )
            checked += 1
            fallbacks += bool(trace)
            if got != expect:
                mismatches.append(f"{w}x{h} key {key}: stoker {got}, torchvision {expect}")
            # Every crop lies inside the image and is not empty.
            x0, y0, x1, y1 = got
            assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h, (w, h, key, got)
    print(f"\nscale={scale} ratio={ratio}: {checked} crops, {fallbacks} from the fallback")
    assert fallbacks > 0
    assert not mismatches, f"{len(mismatches)} of {checked} differ:\n  " + "\n  ".join(
        mismatches[:30]
    )


def test_random_resized_crop_fallback_cases_are_exercised():
    """The centre-crop fallback, both branches, and the whole-image branch are all reached."""
    seen = set()
    for w, h in [(1, 1000), (1000, 1), (7, 10000), (10000, 7), (1, 1)]:
        for k in range(50):
            i, j, ch, cw = torchvision_rrc_params(w, h, C.KeyedRandom(5, 0, k))
            if w / h < RATIO[0]:
                seen.add("tall" if (cw, ch) == (w, int(round(w / RATIO[0]))) else "tall-try")
            elif w / h > RATIO[1]:
                seen.add("wide" if (cw, ch) == (int(round(h * RATIO[1])), h) else "wide-try")
            else:
                seen.add("whole" if (cw, ch) == (w, h) else "try")
            assert tuple(C.random_resized_crop(w, h, C.KeyedRandom(5, 0, k))) == (
                j,
                i,
                j + cw,
                i + ch,
            )
    assert {"tall", "wide", "whole"} <= seen, seen


# --- resize_box against PIL -----------------------------------------------------------------------


def _boxes(w: int, h: int):
    return [
        ((0, 0, w, h), (224, 224)),  # whole image, downscale, aspect change
        ((0, 0, w, h), (w, h)),  # identity
        ((0, 0, w, h), (2 * w + 1, 2 * h - 1)),  # upscale
        ((10.5, 20.25, w - 99.25, h - 50.5), (224, 224)),  # fractional edges
        ((0.3, 0.7, w - 0.2, h - 0.9), (64, 48)),  # fractional, close to the borders
        ((100, 100, 150, 130), (224, 224)),  # small box upscaled ~4.5x / 7.5x
        ((w / 3, h / 5, w / 3 + 37.7, h / 5 + 12.3), (300, 97)),  # fractional, upscale
        ((5, 7, w - 3, h - 1), (1, 1)),  # one output pixel
        ((0, 0, w, h), (w - 1, h + 1)),  # nearly 1:1
        ((w - 40, h - 30, w, h), (40, 30)),  # bottom-right corner, 1:1
        ((17, 0, 17 + 224, h), (224, 224)),  # one axis 1:1, the other scaled
        ((0, 0, w, h), (3, 500)),  # extreme output aspect
    ]


def test_resize_box_matches_pil():
    files = imagenet_files()[::125]  # 8 photos
    worst, checked, exact = 0, 0, 0
    failures = []
    for path in files:
        img = rgb(path)
        arr = np.array(img)  # a writable copy: resize_box does not take read-only arrays
        w, h = img.size
        for box, size in _boxes(w, h):
            box = tuple(float(v) for v in box)
            ref = np.asarray(img.resize(size, Image.BILINEAR, box=box))
            got = C.resize_box(arr, *box, *size)
            assert got.shape == ref.shape
            d = int(np.abs(got.astype(np.int16) - ref.astype(np.int16)).max())
            worst, checked, exact = max(worst, d), checked + 1, exact + (d == 0)
            if d > 1:
                failures.append(f"{path.name} box {box} -> {size}: max diff {d}")
    print(f"\nresize_box vs PIL: {checked} resizes, {exact} pixel-exact, worst max diff {worst}")
    assert not failures, "\n".join(failures)


def test_whole_pixel_crops_at_scale_one_are_pils_exactly():
    """A box of the output's size at whole-pixel offsets (RandomCrop) is copied, not filtered:
    Pillow's bilinear weights there are exactly 1 and 0, so its result is the same bytes."""
    rng = np.random.default_rng(3)
    arr = rng.integers(0, 256, (61, 77, 3), dtype=np.uint8)
    img = Image.fromarray(arr)
    for x0, y0, w, h in ((0, 0, 32, 32), (13, 5, 40, 56), (45, 29, 32, 32), (0, 0, 77, 61)):
        box = (float(x0), float(y0), float(x0 + w), float(y0 + h))
        ref = np.asarray(img.resize((w, h), Image.BILINEAR, box=box))
        assert np.array_equal(ref, arr[y0 : y0 + h, x0 : x0 + w])  # what makes the copy right
        assert np.array_equal(C.resize_box(arr, *box, w, h), ref)


# --- evaluation: Resize(256) + CenterCrop(224) ----------------------------------------------------


def eval_box(width: int, height: int, resize: int = 256, crop: int = 224):
    """The source box that Resize(resize) + CenterCrop(crop) shows: the crop's edges in the
    resized image, mapped back by the resize's scale."""
    new_w, new_h = torchvision_resize_size(width, height, resize)
    top = int(round((new_h - crop) / 2.0))
    left = int(round((new_w - crop) / 2.0))
    sx, sy = width / new_w, height / new_h
    return (left * sx, top * sy, (left + crop) * sx, (top + crop) * sy)


@pytest.mark.slow("all 1,000 photos of imagenet-sample against torchvision, the release bar: 8 s")
def test_eval_matches_torchvision_resize_center_crop():
    """Release criterion: over all 1,000 imagenet-sample photos, transform_image(train=False)
    (with DCT scaling, as the loader runs) against Resize(256) + CenterCrop(224) on PIL: mean
    PSNR >= 38 dB, none below 25 dB.

    Without DCT scaling the output is PIL's resize(box=...) of the crop's source box, bit for bit,
    which differs from resize-then-crop by at most one grey level: Pillow (and stoker, to match
    it) rounds a box to C floats, and a filter centre computed from the box's edge rounds
    differently from one computed from the image's. So: exact against the box resize, within 1
    of torchvision."""
    files = imagenet_files()

    def one(path):
        data = path.read_bytes()
        img = rgb(path)
        ref = torchvision_eval(img)
        out, denom = C.transform_image(data, 224, train=False)
        full = (
            out if denom == 1 else C.transform_image(data, 224, train=False, dct_scaling=False)[0]
        )
        box_ref = np.asarray(img.resize((224, 224), Image.BILINEAR, box=eval_box(*img.size)))
        full_diff = int(np.abs(full.astype(np.int16) - ref).max())
        mse = mse_of(out, ref)  # once: at full scale (most photos) `full` is `out`
        return (
            path.name,
            denom,
            psnr_of_mse(mse),
            mse,
            psnr_of_mse(mse) if full is out else psnr(full, ref),
            full_diff,
            bool(np.array_equal(full, box_ref)),
        )

    results = parallel_map(one, files)
    db = [r[2] for r in results]
    pooled = pooled_psnr([r[3] for r in results])
    scaled = [r for r in results if r[1] > 1]
    print(
        f"\neval 224 vs torchvision Resize(256)+CenterCrop(224): {summary(db)}; "
        f"pooled PSNR {pooled:.2f} dB; {len(scaled)} DCT-scaled"
    )
    if scaled:
        print(f"  DCT-scaled ones: {summary([r[2] for r in scaled])}")
    print(
        f"  without DCT scaling: {summary([r[4] for r in results])}, max diff "
        f"{max(r[5] for r in results)}; {sum(r[6] for r in results)} equal to PIL's box resize"
    )
    for name, denom, p, _, p_full, *_ in sorted(results, key=lambda r: r[2])[:5]:
        print(f"  worst: {name} 1/{denom} scale: {p:.2f} dB ({p_full:.2f} dB without scaling)")
    assert np.minimum(db, 99.0).mean() >= 38.0
    assert pooled >= 38.0
    assert min(db) >= 25.0, sorted(results, key=lambda r: r[2])[:5]
    assert max(r[5] for r in results) <= 1
    not_box = [r[0] for r in results if not r[6]]
    assert not not_box, f"differ from PIL's resize(box=...): {not_box[:20]}"


# --- training: RandomResizedCrop + flip ---------------------------------------------------


def test_train_crop_matches_torchvision_without_dct_scaling():
    """With the decoder at full size, transform_image(train=True) is RandomResizedCrop(224) +
    RandomHorizontalFlip on PIL for the same key: expected pixel-exact (bound: 30 dB)."""
    files = imagenet_files()[::5]  # 200 photos, three keys each

    def one(args):
        path, key = args
        out, denom = C.transform_image(
            path.read_bytes(),
            224,
            train=True,
            seed=key[0],
            epoch=key[1],
            index=key[2],
            dct_scaling=False,
        )
        ref, box, flip = torchvision_train(rgb(path), 224, *key)
        return path.name, key, box, flip, denom, psnr(out, ref)

    jobs = [(p, (s, e, n)) for n, p in enumerate(files) for s, e in ((0, 0), (1, 3), (99, 7))]
    results = parallel_map(one, jobs)
    db = [r[5] for r in results]
    flips = sum(r[3] for r in results)
    print(f"\ntrain 224, full-size decode: {summary(db)}; {flips} of {len(results)} flipped")
    assert all(r[4] == 1 for r in results)
    assert 0.35 < flips / len(results) < 0.65
    bad = [r for r in results if r[5] < 30.0]
    assert not bad, bad[:10]
    not_exact = [r for r in results if not math.isinf(r[5])]
    assert len(not_exact) <= len(results) // 100, not_exact[:10]


@pytest.mark.parametrize("size", [64, 112])
def test_train_crop_with_dct_scaling(size):
    """The loader's default: crops at least twice the output size are decoded at 1/2, 1/4 or 1/8
    scale by libjpeg's scaled IDCT, which is not PIL's downscale: a looser bound (28 dB)."""
    files = imagenet_files()[::4]  # 250 photos, four keys each

    def one(args):
        n, path = args
        data, img = path.read_bytes(), rgb(path)  # read and decoded once for the four keys
        results = []
        for key in ((s, 2, n) for s in range(4)):
            out, denom = C.transform_image(
                data, size, train=True, seed=key[0], epoch=key[1], index=key[2]
            )
            ref, box, _ = torchvision_train(img, size, *key)
            results.append((path.name, key, box, denom, psnr(out, ref)))
        return results

    results = [r for rs in parallel_map(one, list(enumerate(files))) for r in rs]
    by_denom = {}
    for r in results:
        by_denom.setdefault(r[3], []).append(r[4])
    print(f"\ntrain {size}, DCT scaling allowed: {summary([r[4] for r in results])}")
    for denom in sorted(by_denom):
        print(f"  1/{denom} scale: {summary(by_denom[denom])}")
    worst = sorted(results, key=lambda r: r[4])[:3]
    print("  worst:", "; ".join(f"{r[0]} box {r[2]} 1/{r[3]}: {r[4]:.2f} dB" for r in worst))
    assert any(d > 1 for d in by_denom), "no crop was DCT-scaled: the test checks nothing"
    scaled = [p for d, v in by_denom.items() if d > 1 for p in v]
    assert min(scaled) >= 28.0, worst
    assert np.mean(np.minimum(scaled, 99.0)) >= 32.0
    assert all(math.isinf(p) for p in by_denom.get(1, [])), "unscaled crops must match exactly"
