"""stoker.augment's random batch ops: each sample's parameters come from the keyed draws, so a
sample is augmented the same in any batch (what resume and thread counts rely on), and each op
equals its functional op applied sample by sample with the drawn parameters."""

from __future__ import annotations

import math

import pytest
import torch

from stoker.augment import functional as F
from stoker.augment.keyed import KeyedDraws
from stoker.augment.ops import ColorJitter, Compose, GaussianBlur, RandomErasing, RandomGrayscale


def batch(n: int = 12, h: int = 24, w: int = 40, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=g)


def draws(n: int, seed: int = 5, epoch: int = 1, first: int = 100) -> KeyedDraws:
    return KeyedDraws(seed, epoch, torch.arange(first, first + n))


OPS = {
    "jitter": ColorJitter(0.4, 0.4, 0.4, 0.1),
    "grey": RandomGrayscale(0.5),
    "blur": GaussianBlur(5, (0.1, 2.0)),
    "erase": RandomErasing(0.7),
    "compose": Compose([ColorJitter(0.3, 0.3), RandomGrayscale(0.3), RandomErasing(0.5)]),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_a_sample_is_augmented_the_same_in_any_batch(name):
    op, x = OPS[name], batch()
    whole = op(x, draws(12))
    assert whole.dtype == x.dtype and whole.shape == x.shape
    assert not torch.equal(whole, x)
    # the same samples split into other batches, in another order
    order = torch.tensor([7, 2, 11, 0, 5, 9, 1, 3, 4, 6, 8, 10])
    shuffled = op(x[order], KeyedDraws(5, 1, torch.arange(100, 112)[order]))
    assert torch.equal(shuffled, whole[order])
    for a, b in ((0, 5), (5, 12)):
        part = op(x[a:b], KeyedDraws(5, 1, torch.arange(100 + a, 100 + b)))
        assert torch.equal(part, whole[a:b])
    # another epoch draws otherwise; channels_last input gives the same values
    assert not torch.equal(op(x, draws(12, epoch=2)), whole)
    assert torch.equal(op(x.contiguous(memory_format=torch.channels_last), draws(12)), whole)


def test_color_jitter_is_the_functional_ops_in_each_samples_order():
    op, x = ColorJitter(0.4, 0.4, 0.4, 0.1), batch(8).float() / 255
    d = draws(8)
    out = op(x, d)
    ref_draws = draws(8)
    factors = [ref_draws.uniform(f"color_jitter.{k}", lo, hi) for k, (lo, hi) in
               enumerate([op.brightness, op.contrast, op.saturation, op.hue])]  # fmt: skip
    order = ref_draws.uniform("color_jitter.order", size=4).argsort(dim=1)
    fns = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
    assert len({tuple(o) for o in order.tolist()}) > 1  # the order really differs by sample
    for i in range(8):
        img = x[i : i + 1]
        for k in order[i].tolist():
            img = fns[k](img, factors[k][i : i + 1])
        torch.testing.assert_close(out[i : i + 1], img, atol=1e-6, rtol=0)
    # factors in torchvision's ranges: brightness [0.6, 1.4], hue [-0.1, 0.1]
    assert 0.6 <= factors[0].min() and factors[0].max() < 1.4
    assert -0.1 <= factors[3].min() and factors[3].max() < 0.1


def test_random_grayscale_greys_about_p_of_the_samples():
    x = batch(400, 8, 8)
    out = RandomGrayscale(0.25)(x, draws(400))
    grey = (out[:, 0] == out[:, 1]).all(dim=(1, 2)) & (out[:, 1] == out[:, 2]).all(dim=(1, 2))
    changed = (out != x).flatten(1).any(dim=1)
    assert torch.equal(grey, changed)
    assert 0.18 < grey.float().mean().item() < 0.32
    torch.testing.assert_close(out[grey], F.rgb_to_grayscale(x[grey], num_output_channels=3))


def test_gaussian_blur_sigma_per_sample():
    x = batch(6).float()
    op = GaussianBlur(7, (0.5, 3.0))
    out = op(x, draws(6))
    sigma = draws(6).uniform("gaussian_blur", 0.5, 3.0)
    for i in range(6):
        ref = F.gaussian_blur(x[i : i + 1], [7, 7], float(sigma[i]))
        torch.testing.assert_close(out[i : i + 1], ref, atol=1e-4, rtol=0)


def reference_erase_box(u_area, u_ratio, u_at, height, width, scale, ratio):
    """torchvision's RandomErasing.get_params, fed the same uniforms."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for t in range(10):
        erase_area = area * (scale[0] + (scale[1] - scale[0]) * u_area[t])
        aspect = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * u_ratio[t])
        h = int(round(math.sqrt(erase_area * aspect)))
        w = int(round(math.sqrt(erase_area / aspect)))
        if not (h < height and w < width):
            continue
        i = int(math.floor(u_at[0] * (height - h + 1)))
        j = int(math.floor(u_at[1] * (width - w + 1)))
        return i, j, h, w
    return None


def test_random_erasing_boxes_are_torchvisions():
    x = batch(64, 30, 50)
    op = RandomErasing(0.6, value=(10, 20, 30))
    out = op(x, draws(64))
    ref = draws(64)
    apply = ref.bernoulli("random_erasing.apply", 0.6)
    u_area = ref.uniform("random_erasing.area", 0.02, 0.33, size=10)
    u_ratio = ref.uniform("random_erasing.ratio", math.log(0.3), math.log(3.3), size=10)
    u_at = ref.uniform("random_erasing.at", size=2)
    erased = 0
    for n in range(64):
        expected = x[n].clone()
        if apply[n]:
            # back from the drawn values to the [0, 1) uniforms torchvision's formula takes
            ua = ((u_area[n] - 0.02) / 0.31).tolist()
            ur = ((u_ratio[n] - math.log(0.3)) / (math.log(3.3) - math.log(0.3))).tolist()
            box = reference_erase_box(ua, ur, u_at[n].tolist(), 30, 50, (0.02, 0.33), (0.3, 3.3))
            if box is not None:
                i, j, h, w = box
                expected[:, i : i + h, j : j + w] = torch.tensor([10, 20, 30])[:, None, None]
                erased += 1
        assert torch.equal(out[n], expected), n
    assert 25 < erased < 55


def test_random_erasing_noise_is_repeatable_and_needs_floats():
    x = batch(16).float() / 255
    op = RandomErasing(1.0, value="random")
    a, b = op(x, draws(16)), op(x, draws(16))
    assert torch.equal(a, b) and not torch.equal(a, x)
    noise = a[a != x]
    assert abs(noise.mean().item()) < 0.1 and abs(noise.std().item() - 1) < 0.1
    with pytest.raises(ValueError, match="float"):
        op(batch(4), draws(4))


def test_alone_an_op_follows_torch_manual_seed():
    x = batch(8)
    torch.manual_seed(3)
    a = ColorJitter(0.5)(x)
    torch.manual_seed(3)
    assert torch.equal(ColorJitter(0.5)(x), a)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="brightness"):
        ColorJitter(brightness=-1)
    with pytest.raises(ValueError, match="hue"):
        ColorJitter(hue=0.7)
    with pytest.raises(ValueError, match="odd"):
        GaussianBlur(4)
    with pytest.raises(ValueError, match=r"\[N, C, H, W\]"):
        ColorJitter(0.1)(torch.zeros(3, 4, 4))
    with pytest.raises(ValueError, match="draws for 3"):
        ColorJitter(0.1)(batch(4), draws(3))
