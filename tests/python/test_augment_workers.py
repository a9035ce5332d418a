"""The worker form of stoker.augment's ops (cpp/src/augment): what a host loader's C++ threads
run on each decoded image equals the batch op (torch) on the same images, pixel for pixel, draw
for draw; the loader's own use of it is in test_augment_loader.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import stoker
import stoker.augment as A
from stoker import _core
from stoker.augment.keyed import KeyedDraws
from stoker.augment.policies import TIMM_RAND_OPS

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it


def photos(n: int, height: int = 40, width: int = 56, seed: int = 0) -> torch.Tensor:
    """uint8 [N, 3, H, W]: gradients under noise, with flat and saturated patches (the edge
    cases of autocontrast, equalize and solarize)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.linspace(0, 1, height).view(1, 1, -1, 1)
    x = torch.linspace(0, 1, width).view(1, 1, 1, -1)
    tone = torch.rand(n, 3, 1, 1, generator=g)
    images = 255 * (0.6 * tone * y + 0.4 * (1 - tone) * x)
    images = images + 30 * torch.randn(n, 3, height, width, generator=g)
    images[:, :, :8, :8] = 255  # saturated
    images[n // 2 :, 1] = 77  # flat channels
    return images.clamp(0, 255).to(torch.uint8)


def in_workers(op, images, indices, seed, epoch, prefix="ops/0/"):
    nhwc = images.permute(0, 2, 3, 1).contiguous()
    _core.augment_images([op._engine_step(prefix, *images.shape[2:])], nhwc, indices, seed, epoch)
    return nhwc.permute(0, 3, 1, 2)


@pytest.mark.parametrize(
    "op",
    [
        A.TimmRandAugment.from_config("rand-m9-mstd0.5", prob=1.0, num_layers=3),
        A.TimmRandAugment(magnitude=10, magnitude_std=0.0, prob=1.0, fill=None),
        A.TimmRandAugment(magnitude=3, magnitude_std=2.0, prob=0.5, fill=200),
    ],
    ids=["rand-m9-mstd0.5-n3", "m10-black", "m3-std2-grey"],
)
def test_timm_rand_augment_in_the_workers_equals_the_batch_op(op):
    images, indices = photos(400), torch.arange(400) * 13 + 5
    want = op(images, KeyedDraws(11, 4, indices).scoped("ops").scoped("0"))
    got = in_workers(op, images, indices, 11, 4)
    assert torch.equal(got, want)
    # every one of timm's 15 ops was drawn, and applied
    draws = KeyedDraws(11, 4, indices).scoped("ops").scoped("0")
    drawn = torch.cat([draws.integers(f"{op.name}.op{r}", len(TIMM_RAND_OPS))
                       for r in range(op.num_layers)])  # fmt: skip
    assert set(drawn.tolist()) == set(range(len(TIMM_RAND_OPS)))
    assert (got != images).flatten(1).any(1).float().mean() > 0.5


@pytest.mark.parametrize("value", [0, 128.7, (10, 20, 30)])
def test_random_erasing_in_the_workers_equals_the_batch_op(value):
    op = A.RandomErasing(0.7, scale=(0.05, 0.5), value=value)
    images, indices = photos(300, 33, 65), torch.arange(300)
    want = op(images, KeyedDraws(2, 9, indices).scoped("ops").scoped("0"))
    got = in_workers(op, images, indices, 2, 9)
    assert torch.equal(got, want)
    erased = (got != images).flatten(1).any(1).float().mean()
    assert 0.5 < erased < 0.8


def test_each_draw_is_keyed_by_its_place_seed_epoch_and_sample():
    op = A.TimmRandAugment.from_config("rand-m9-mstd0.5", prob=1.0)
    images, indices = photos(64), torch.arange(64)
    base = in_workers(op, images, indices, 1, 0)
    assert torch.equal(base, in_workers(op, images, indices, 1, 0))  # repeatable
    for other in (
        in_workers(op, images, indices, 2, 0),
        in_workers(op, images, indices, 1, 1),
        in_workers(op, images, indices + 1000, 1, 0),
        in_workers(op, images, indices, 1, 0, prefix="ops/1/"),
    ):
        assert not torch.equal(base, other)
    # a sample's result does not depend on its batch
    alone = in_workers(op, images[5:6], indices[5:6], 1, 0)
    assert torch.equal(alone[0], base[5])


@pytest.mark.parametrize(
    "op",
    [
        A.ColorJitter(0.4, 0.4, 0.4, 0.1),
        A.ColorJitter(hue=0.5),
        A.ColorJitter(brightness=(0.2, 1.8), saturation=(0.0, 3.0)),
        A.RandomGrayscale(0.5),
        A.RandAugment(2, 9),
        A.RandAugment(3, 14, fill=(124.5, 116, 104)),
        A.TrivialAugmentWide(),
        A.TrivialAugmentWide(fill=7),
    ],
    ids=[
        "jitter",
        "hue",
        "jitter-wide",
        "grayscale",
        "randaugment",
        "randaugment-fill",
        "trivialaugment",
        "trivialaugment-fill",
    ],  # fmt: skip
)
def test_torchvision_ops_in_the_workers_equal_the_batch_op(op):
    """Pixel for pixel, but for torchvision's geometry: its grid is a float32 matrix product,
    which the BLAS may fuse, so a sampling point within rounding of a pixel boundary may take
    the neighbouring pixel (at most 1 pixel in 10,000 here)."""
    images, indices = photos(400), torch.arange(400) * 3 + 1
    want = op(images, KeyedDraws(5, 2, indices).scoped("ops").scoped("0"))
    got = in_workers(op, images, indices, 5, 2)
    differ = (got != want).any(dim=1)
    if isinstance(op, (A.RandAugment, A.TrivialAugmentWide)):
        assert differ.float().mean() <= 1e-4
    else:
        assert not differ.any()
    assert (got != images).flatten(1).any(1).float().mean() > 0.3


def test_gaussian_blur_in_the_workers_within_one_level():
    """Within one level where the two sums of float products round apart at a half."""
    op = A.GaussianBlur(9, (0.1, 2.0))
    images, indices = photos(200), torch.arange(200)
    want = op(images, KeyedDraws(5, 2, indices).scoped("ops").scoped("0"))
    got = in_workers(op, images, indices, 5, 2)
    diff = (got.int() - want.int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3
    assert (got != images).float().mean() > 0.3


def test_ops_without_a_worker_form_stay_batch_ops():
    assert A.RandomErasing(0.5, value="random")._engine_step("ops/0/", 8, 8) is None
    assert A.TimmRandAugment(fill=(1, 2))._engine_step("ops/0/", 8, 8) is None  # not 3 values
    assert A.RandAugment(fill=300)._engine_step("ops/0/", 8, 8) is None  # not a byte
    assert A.Compose([A.RandomGrayscale()])._engine_step("ops/0/", 8, 8) is None


def test_bad_options_are_refused_not_run():
    step = A.RandomErasing(0.5)._engine_step("ops/0/", 8, 8)
    step.random_erasing.ratio = (2.0, 1.0)
    nhwc = np.zeros((1, 8, 8, 3), np.uint8)
    with pytest.raises(Exception, match="ratio"):
        _core.augment_images(
            [step], torch.from_numpy(nhwc), torch.zeros(1, dtype=torch.int64), 0, 0
        )


@pytest.mark.parametrize(
    "op",
    [
        A.TimmRandAugment.from_config("rand-m9-mstd0.5"),
        A.RandomErasing(0.5),
        A.ColorJitter(0.4, 0.4, 0.4, 0.1),
        A.RandomGrayscale(0.5),
        A.RandAugment(2, 9),
        A.TrivialAugmentWide(),
        A.Compose([A.RandomGrayscale(0.2), A.ColorJitter(0.2)]),
    ],
    ids=lambda op: type(op).__name__,
)
def test_a_host_batch_in_stoker_s_layout_takes_the_worker_form(op):
    """op(batch) on a channels_last uint8 CPU batch (what a loader gives) runs the C++ form on
    torch's threads: the same bytes as the torch path, with any number of threads."""
    images, indices = photos(64), torch.arange(64) + 40
    want = op(images, KeyedDraws(8, 1, indices))  # NCHW-contiguous: the torch path
    host = images.contiguous(memory_format=torch.channels_last)
    threads = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            got = op(host, KeyedDraws(8, 1, indices))
            assert got.is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(got, want)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(host, images)  # the input is left as it was


def test_draws_spent_by_the_worker_form_cannot_be_drawn_again():
    """The C++ form draws from the streams' starts without moving them on: reusing the same
    draws would repeat them (the torch form would draw on), so it raises instead."""
    op = A.ColorJitter(0.4, 0.4)
    host = photos(8).contiguous(memory_format=torch.channels_last)
    draws = KeyedDraws(1, 0, torch.arange(8))
    op(host, draws)
    with pytest.raises(ValueError, match="used by an op on a host batch"):
        op(host, draws)
    op(host, KeyedDraws(1, 0, torch.arange(8)).scoped("again"))  # fresh draws: fine


def test_options_the_workers_refuse_stay_with_the_torch_form(packed):
    reversed_ratio = A.RandomErasing(1.0, ratio=(3.3, 0.3))  # torch takes it, C++ checks it
    host = photos(8).contiguous(memory_format=torch.channels_last)
    want = reversed_ratio(photos(8), KeyedDraws(2, 0, torch.arange(8)))
    assert torch.equal(reversed_ratio(host, KeyedDraws(2, 0, torch.arange(8))), want)
    loader = stoker.ImageLoader(packed, batch_size=4, size=32, augment=[reversed_ratio])
    assert loader._augment.in_workers == 0 and len(list(loader)) == 9
