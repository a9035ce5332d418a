"""stoker's RandomResizedCrop draw against torchvision's RandomResizedCrop.get_params, written out
here: box for box where both read the same keyed stream, and as distributions (scale, aspect
ratio, position, the central fallback) over 20,000 keyed draws against the reference fed by an
independent generator. The statistical check is shown to reject rules that are wrong in one
point each (no central fallback, uniform rather than log-uniform ratios, ...)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from stoker import _core

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
DRAWS = 20_000
ALPHA = 1e-4  # per statistic; every sample below is seeded, so a verdict never changes by chance

# (width, height): a photo; 4:1, where about one draw in eight falls back to the central crop; a
# 1:4 portrait, where the fallback keeps the width instead.
SHAPES = [(500, 375), (800, 200), (150, 600)]


def get_params(width, height, scale, ratio, uniform, randint, *, rule="torchvision"):
    """torchvision.transforms.RandomResizedCrop.get_params, as (left, top, right, bottom).

    `uniform(a, b)` and `randint(a, b)` (both ends included) are the generator; `rule` names a
    deliberately wrong variant that the statistical check must reject ("fallback_only": the box
    when no try fits)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    tries = {"one_try": 1, "until_it_fits": 10_000, "fallback_only": 0}.get(rule, 10)
    for _ in range(tries):
        if rule == "side_scale":  # the scale taken as the side's fraction, not the area's
            target_area = area * uniform(math.sqrt(scale[0]), math.sqrt(scale[1])) ** 2
        else:
            target_area = area * uniform(scale[0], scale[1])
        if rule == "linear_ratio":
            aspect_ratio = uniform(ratio[0], ratio[1])
        else:
            aspect_ratio = math.exp(uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            if rule == "exclusive_randint":  # randint(0, H - h) with the top end left out
                i = randint(0, max(0, height - h - 1))
                j = randint(0, max(0, width - w - 1))
            else:
                i = randint(0, height - h)
                j = randint(0, width - w)
            return (j, i, j + w, i + h)
    if rule == "whole_image_fallback":  # no fallback to the central crop
        return (0, 0, width, height)
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    if rule == "corner_fallback":
        return (0, 0, w, h)
    i = (height - h) // 2
    j = (width - w) // 2
    return (j, i, j + w, i + h)


def keyed(rng: _core.KeyedRandom):
    """The engine's generator as get_params' uniform and randint: uniform(a, b) is
    a + (b - a) * u, a randint of n values is below(n)."""
    return rng.uniform, lambda a, b: a + rng.below(b - a + 1)


def stoker_draws(width, height, n=DRAWS, seed=2024, epoch=1):
    """n draws of the engine, one per sample index, as the loader keys them."""
    return np.array(
        [
            _core.random_resized_crop(width, height, _core.KeyedRandom(seed, epoch, k))
            for k in range(n)
        ],
        dtype=np.float64,
    )


def reference_draws(width, height, n=DRAWS, seed=7, rule="torchvision"):
    gen = random.Random(seed)
    return np.array(
        [get_params(width, height, SCALE, RATIO, gen.uniform, gen.randint, rule=rule)
         for _ in range(n)],
        dtype=np.float64,
    )  # fmt: skip


def central_fallback(width, height):
    """The box get_params returns when no try fits."""
    return get_params(width, height, SCALE, RATIO, None, None, rule="fallback_only")


def statistics_of(boxes, width, height):
    """What the crop's law is made of: the area fraction, the log aspect ratio, where the crop
    sits within the room it had on each axis, whether it touches the far edges, and whether it
    is exactly the central fallback."""
    x0, y0, x1, y1 = boxes.T
    w, h = x1 - x0, y1 - y0
    room_x, room_y = width - w, height - h
    with np.errstate(invalid="ignore", divide="ignore"):
        at_x = np.where(room_x > 0, x0 / room_x, -1.0)  # -1: no room, the crop is as wide
        at_y = np.where(room_y > 0, y0 / room_y, -1.0)
    fallback = np.all(boxes == np.array(central_fallback(width, height)), axis=1)
    return {
        "area": w * h / (width * height),
        "log_ratio": np.log(w / h),
        "position_x": at_x,
        "position_y": at_y,
        "far_edge": ((x1 == width) & (room_x > 0)) | ((y1 == height) & (room_y > 0)),
        "central_fallback": fallback,
    }


def homogeneity_p(a: np.ndarray, b: np.ndarray, bins: int = 24) -> float:
    """Chi-square test that two samples come from one law: on their values where they take few
    (a flag), else on bins at the pooled sample's quantiles (a point mass, such as the
    fallback's area, stays within one bin)."""
    stats = pytest.importorskip("scipy.stats")  # here: the other tests import this module
    a, b = a.astype(np.float64), b.astype(np.float64)
    pooled = np.concatenate([a, b])
    values = np.unique(pooled)
    if len(values) <= bins:
        edges = values[1:]
    else:
        edges = np.unique(np.quantile(pooled, np.linspace(0, 1, bins + 1)[1:-1]))
    counts = np.array([np.bincount(np.searchsorted(edges, x, side="right"),
                                   minlength=len(edges) + 1) for x in (a, b)])  # fmt: skip
    counts = counts[:, counts.sum(axis=0) > 0]
    if counts.shape[1] < 2:
        return 1.0  # one value in both samples: nothing tells them apart
    return float(stats.chi2_contingency(counts).pvalue)


def same_law(got: np.ndarray, want: np.ndarray, width: int, height: int) -> dict[str, float]:
    """Each statistic's p-value; the laws differ where one is below ALPHA."""
    a, b = statistics_of(got, width, height), statistics_of(want, width, height)
    assert a.keys() == b.keys()
    return {k: homogeneity_p(a[k], b[k]) for k in a}


@pytest.fixture(scope="module")
def engine():
    return {shape: stoker_draws(*shape) for shape in SHAPES}


@pytest.fixture(scope="module")
def reference():
    return {shape: reference_draws(*shape) for shape in SHAPES}


@pytest.mark.parametrize(
    "width, height, scale, ratio",
    [
        (500, 375, SCALE, RATIO),
        (800, 200, SCALE, RATIO),
        (150, 600, SCALE, RATIO),
        (37, 41, SCALE, RATIO),
        (3, 1000, SCALE, RATIO),
        (640, 480, (0.3, 0.6), (0.5, 2.0)),
        (640, 480, (0.9, 1.0), (2.0, 3.0)),  # most tries fail: many fallbacks
    ],
)
def test_the_engine_draws_get_params_box_for_box_from_its_keyed_stream(width, height, scale, ratio):
    """Fed the same keyed stream (uniform for the scale and the ratio, then a randint for the
    top and one for the left), get_params written out gives the engine's box every time."""
    fallbacks = 0
    for k in range(2000):
        got = _core.random_resized_crop(width, height, _core.KeyedRandom(11, 3, k), *scale,
                                        *ratio)  # fmt: skip
        uniform, randint = keyed(_core.KeyedRandom(11, 3, k))
        want = get_params(width, height, scale, ratio, uniform, randint)
        assert got == want, (k, got, want)
        fallbacks += want == get_params(width, height, scale, ratio, None, None,
                                        rule="fallback_only")  # fmt: skip
    if (width, height, scale) == (640, 480, (0.9, 1.0)):
        assert fallbacks > 1000  # the fallback was exercised, not only the tries


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_20000_keyed_draws_follow_torchvisions_law(engine, reference, shape):
    """Scale, ratio, position, far-edge and fallback frequencies of 20,000 draws keyed by
    (seed, epoch, sample) against 20,000 of the reference on an independent generator."""
    width, height = shape
    got, want = engine[shape], reference[shape]
    assert len(got) == len(want) == DRAWS
    p = same_law(got, want, width, height)
    assert min(p.values()) > ALPHA, p
    share = statistics_of(got, width, height)["central_fallback"].mean()
    if shape == (800, 200):
        assert 0.08 < share < 0.16, share  # ~12% of 10 failed tries; the test sees them
    if shape == (500, 375):
        assert share < 0.01, share


WRONG_RULES = {
    "whole_image_fallback": [(800, 200), (150, 600)],
    "corner_fallback": [(800, 200), (150, 600)],
    "until_it_fits": [(800, 200), (150, 600)],
    "one_try": SHAPES,
    "linear_ratio": SHAPES,
    "side_scale": SHAPES,
    "exclusive_randint": [(500, 375)],
}


@pytest.mark.parametrize("rule", sorted(WRONG_RULES))
def test_the_statistical_check_rejects_a_rule_wrong_in_one_point(engine, rule):
    """Had the engine drawn by one of these rules, the test above would have failed: the check
    tells the engine's draws from each of them, on every shape where the rule differs."""
    for shape in WRONG_RULES[rule]:
        width, height = shape
        wrong = reference_draws(width, height, rule=rule)
        p = same_law(engine[shape], wrong, width, height)
        assert min(p.values()) < ALPHA, (rule, shape, p)


def test_the_check_accepts_two_independent_samples_of_the_reference():
    """Its false-alarm side: the reference against itself on two seeds passes."""
    width, height = 800, 200
    a = reference_draws(width, height, seed=1)
    b = reference_draws(width, height, seed=2)
    p = same_law(a, b, width, height)
    assert min(p.values()) > ALPHA, p
