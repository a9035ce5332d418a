"""stoker.augment.keyed: per-sample draws keyed by (seed, epoch, index, name), checked against
the engine's KeyedRandom written out with Python integers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stoker.augment.keyed import KeyedDraws, stream_of

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

MASK = (1 << 64) - 1


def mix64(x: int) -> int:  # cpp/include/stoker/core/random.h, in Python's unbounded integers
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def reference_words(seed: int, epoch: int, index: int, name: str, count: int) -> list[int]:
    stream = (stream_of(name) ^ (epoch * 0x9E3779B97F4A7C15)) & MASK
    key = mix64(mix64(mix64(seed & MASK) ^ stream) ^ (index & MASK))
    return [mix64((key + 0x632BE59BD9B4E019 * c) & MASK) for c in range(1, count + 1)]


@pytest.mark.parametrize("seed", [0, 7, 2**63 + 5, 2**64 - 1])
def test_words_equal_keyed_random(seed):
    indices = torch.tensor([0, 1, 2, 999, 2**40 + 3, 2**62], dtype=torch.int64)
    draws = KeyedDraws(seed, 3, indices)
    got = draws.bits("jitter.brightness", size=4) & MASK  # as uint64 values, in Python ints
    for row, index in zip(got.tolist(), indices.tolist(), strict=True):
        want = reference_words(seed, 3, index, "jitter.brightness", 4)
        assert [w & MASK for w in row] == want


def test_a_stream_continues_and_names_are_independent():
    idx = torch.arange(64)
    a = KeyedDraws(1, 0, idx)
    first, second = a.uniform("x"), a.uniform("x")
    b = KeyedDraws(1, 0, idx)
    b.uniform("other")  # drawing another name first changes nothing of "x"
    assert torch.equal(b.uniform("x"), first) and torch.equal(b.uniform("x"), second)
    assert not torch.equal(first, second)
    assert not torch.equal(KeyedDraws(1, 1, idx).uniform("x"), first)  # another epoch
    assert not torch.equal(KeyedDraws(2, 0, idx).uniform("x"), first)  # another seed


def test_a_sample_draws_the_same_in_any_batch():
    """What resume and any batch composition rely on: a sample's draw depends on its index only."""
    idx = torch.tensor([5, 17, 3, 40])
    whole = KeyedDraws(9, 2, idx).uniform("crop", 0.08, 1.0)
    alone = torch.cat(
        [KeyedDraws(9, 2, idx[i : i + 1]).uniform("crop", 0.08, 1.0) for i in range(4)]
    )
    assert torch.equal(whole, alone)


def test_distributions():
    draws = KeyedDraws(123, 0, torch.arange(200_000))
    u = draws.uniform("u", -1.0, 3.0).numpy()
    assert u.min() >= -1.0 and u.max() < 3.0
    assert abs(u.mean() - 1.0) < 0.02 and abs(u.var() - 16 / 12) < 0.02
    k = draws.integers("k", 14).numpy()
    counts = np.bincount(k, minlength=14)
    assert k.min() == 0 and k.max() == 13
    expected = len(k) / 14
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 40  # 13 degrees of freedom: p < 1e-3 above 34.5 for a fair draw
    p = draws.bernoulli("b", 0.25).float().mean().item()
    assert abs(p - 0.25) < 0.005


def test_bad_indices_are_refused():
    with pytest.raises(ValueError, match="int64"):
        KeyedDraws(0, 0, torch.arange(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="high"):
        KeyedDraws(0, 0, torch.arange(4)).integers("x", 0)


def test_mixup_draws_from_the_keyed_generator():
    """MixUp's parameters from the batch's keyed draws: the same batch mixes the same way (what
    resume relies on), another epoch otherwise."""
    from stoker.augment import MixUp

    x = torch.rand(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    y = torch.arange(8) % 4
    mix = MixUp(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=4)
    a = mix(x, y, uniform=KeyedDraws(3, 0, torch.arange(8)).first)
    b = mix(x, y, uniform=KeyedDraws(3, 0, torch.arange(8)).first)
    c = mix(x, y, uniform=KeyedDraws(3, 1, torch.arange(8)).first)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    torch.testing.assert_close(a[1].sum(dim=1), torch.ones(8))
