"""stoker.augment on a GPU: the same batch, the same keyed draws, the same images as on the CPU
(within the tolerances stated), and each functional op against torchvision.transforms.v2 itself
(installed on the GPU machine; skipped where it is not)."""

from __future__ import annotations

import pytest
import torch

import stoker.augment as A
from stoker.augment import functional as F

CUDA = torch.device("cuda")


def batch(n: int = 32, h: int = 64, w: int = 80) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=g)


def test_keyed_draws_are_the_same_on_the_gpu():
    idx = torch.arange(10_000, 10_512)
    cpu = A.KeyedDraws(7, 3, idx)
    gpu = A.KeyedDraws(7, 3, idx.to(CUDA))
    assert torch.equal(cpu.bits("x", size=3), gpu.bits("x", size=3).cpu())
    assert torch.equal(cpu.uniform("u"), gpu.uniform("u").cpu())


@pytest.mark.parametrize(
    "op",
    [
        A.ColorJitter(0.4, 0.4, 0.4, 0.1),
        A.RandomGrayscale(0.5),
        A.GaussianBlur(9),
        A.RandomErasing(0.5),
        A.RandAugment(2, 9),
        A.TrivialAugmentWide(),
        A.TimmRandAugment.from_config("rand-m9-mstd0.5"),
    ],
    ids=lambda op: type(op).__name__,
)
def test_an_op_gives_the_cpus_images_on_the_gpu(op):
    x = batch()
    idx = torch.arange(32)
    cpu = op(x, A.KeyedDraws(5, 0, idx))
    gpu = op(x.to(CUDA), A.KeyedDraws(5, 0, idx.to(CUDA))).cpu()
    diff = (cpu.int() - gpu.int()).abs()
    # float kernels may round a level differently on the GPU; geometry lands on the same pixels
    assert diff.max().item() <= 2 and (diff > 0).float().mean().item() < 0.01


def test_mixup_on_the_gpu():
    x = torch.rand(16, 3, 32, 32)
    y = torch.arange(16) % 10
    mix = A.MixUp(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=10, mode="elem")
    cpu = mix(x, y, uniform=A.KeyedDraws(1, 0, torch.arange(16)).first)
    gpu = mix(
        x.to(CUDA), y.to(CUDA), uniform=A.KeyedDraws(1, 0, torch.arange(16, device=CUDA)).first
    )
    torch.testing.assert_close(gpu[0].cpu(), cpu[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(gpu[1].cpu(), cpu[1], atol=1e-5, rtol=0)


def _tv():
    return pytest.importorskip("torchvision.transforms.v2.functional")


@pytest.mark.parametrize(
    "name,args",
    [
        ("adjust_brightness", (1.3,)), ("adjust_contrast", (0.6,)), ("adjust_saturation", (1.7,)),
        ("adjust_hue", (0.2,)), ("adjust_sharpness", (1.8,)), ("posterize", (3,)),
        ("solarize", (100,)), ("autocontrast", ()), ("equalize", ()), ("invert", ()),
        ("rotate", (23.0,)), ("rgb_to_grayscale", (3,)),
    ],
)  # fmt: skip
def test_functional_ops_equal_torchvisions_on_the_gpu(name, args):
    tvf = _tv()
    x = batch(8).to(CUDA)
    mine = getattr(F, name)(x, *args)
    theirs = getattr(tvf, name)(x, *args)
    diff = (mine.int() - theirs.int()).abs()
    assert diff.max().item() <= 1 and (diff > 0).float().mean().item() < 0.01, name


def test_affine_equals_torchvisions_on_the_gpu():
    tvf = _tv()
    x = batch(8).to(CUDA)
    mine = F.affine(x, 17.0, [5, -3], 1.1, [12.0, -4.0])
    theirs = tvf.affine(x, angle=17.0, translate=[5, -3], scale=1.1, shear=[12.0, -4.0])
    assert ((mine.int() - theirs.int()).abs() > 0).float().mean().item() < 0.01
