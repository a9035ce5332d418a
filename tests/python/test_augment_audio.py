"""stoker.augment's audio ops (issue 36): the mel spectrogram against torchaudio's formulas written
out here in numpy (the STFT of a reflect-padded, periodic-Hann-windowed signal, and
melscale_fbanks' triangles in float64; torchaudio itself has no build for this torch), the
SpecAugment masks and the gain/noise mix against what their parameters promise, keyed like
every other op; and the ops on a loader's Audio field."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import stoker
from stoker.augment import FrequencyMasking, GainNoise, KeyedDraws, MelSpectrogram, TimeMasking


def hz_to_mel(f, scale):
    f = np.asarray(f, dtype=np.float64)
    if scale == "htk":
        return 2595.0 * np.log10(1.0 + f / 700.0)
    logstep = math.log(6.4) / 27.0
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-9) / 1000.0) / logstep,
                    f / (200.0 / 3))  # fmt: skip


def mel_to_hz(m, scale):
    if scale == "htk":
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    logstep = math.log(6.4) / 27.0
    return np.where(m >= 15.0, 1000.0 * np.exp(logstep * (m - 15.0)), m * 200.0 / 3)


def reference_mel(x, rate, n_fft, hop, n_mels, scale="htk", norm=None, power=2.0):
    """torchaudio.transforms.MelSpectrogram's definition, in float64 numpy."""
    x = np.asarray(x, dtype=np.float64)
    padded = np.pad(x, n_fft // 2, mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    frames = 1 + (len(padded) - n_fft) // hop
    spec = np.stack([np.abs(np.fft.rfft(padded[i * hop : i * hop + n_fft] * window)) ** power
                     for i in range(frames)], axis=1)  # fmt: skip
    freqs = np.linspace(0, rate // 2, n_fft // 2 + 1)
    points = mel_to_hz(np.linspace(hz_to_mel(0.0, scale), hz_to_mel(rate / 2, scale),
                                   n_mels + 2), scale)  # fmt: skip
    slopes = points[None, :] - freqs[:, None]
    down = -slopes[:, :-2] / np.diff(points)[:-1]
    up = slopes[:, 2:] / np.diff(points)[1:]
    fb = np.maximum(0, np.minimum(down, up))
    if norm == "slaney":
        fb *= 2.0 / (points[2:] - points[:-2])
    return fb.T @ spec


@pytest.mark.parametrize("scale,norm", [("htk", None), ("slaney", "slaney")])
def test_mel_spectrogram_is_torchaudios_definition(scale, norm):
    rate, t = 16000, torch.arange(8000) / 16000
    gen = torch.Generator().manual_seed(1)
    waves = torch.stack([torch.sin(2 * math.pi * 440 * t) * 0.5,
                         0.2 * torch.randn(8000, generator=gen)])[:, None, :]  # fmt: skip
    op = MelSpectrogram(rate, n_fft=512, hop_length=160, n_mels=64, mel_scale=scale, norm=norm)
    got = op(waves)
    assert got.shape == (2, 1, 64, 8000 // 160 + 1)
    for k in range(2):
        want = reference_mel(waves[k, 0].numpy(), rate, 512, 160, 64, scale, norm)
        scale_of = np.abs(want).max()
        assert np.max(np.abs(got[k, 0].numpy() - want)) <= 1e-4 * scale_of, k
    logged = MelSpectrogram(rate, n_fft=512, hop_length=160, n_mels=64, mel_scale=scale,
                            norm=norm, log=True)(waves)  # fmt: skip
    torch.testing.assert_close(logged, torch.log(got + 1e-6), rtol=1e-5, atol=1e-5)


def spectrograms(n=6):
    return torch.rand(n, 1, 40, 100, generator=torch.Generator().manual_seed(2)) + 1.0


@pytest.mark.parametrize("op,axis", [(TimeMasking(30, count=2), -1),
                                     (FrequencyMasking(12, count=2), -2)])  # fmt: skip
def test_masks_are_keyed_bands_below_their_width(op, axis):
    x = spectrograms()
    draws = KeyedDraws(7, 0, torch.arange(6))
    out = op(x, draws)
    masked = (out == 0).all(dim=1)  # [N, F, T]: the masked cells of each sample
    lines = masked.all(dim=-2) if axis == -1 else masked.all(dim=-1)  # masked frames/bins
    for k in range(6):
        where = torch.nonzero(lines[k]).flatten().tolist()
        assert len(where) <= 2 * op.max_width
        cells = masked[k].sum().item()
        other = x.shape[-2] if axis == -1 else x.shape[-1]
        assert cells == len(where) * other  # whole bands, nothing else
        np.testing.assert_array_equal(out[k][~masked[k][None]], x[k][~masked[k][None]])
    assert len({tuple(torch.nonzero(lines[k]).flatten().tolist()) for k in range(6)}) > 3
    again = op(x, KeyedDraws(7, 0, torch.arange(6)))
    assert torch.equal(out, again)
    assert not torch.equal(out, op(x, KeyedDraws(7, 1, torch.arange(6))))
    # p bounds the width by a share of the axis: at most 10% of 100 frames
    narrow = TimeMasking(90, p=0.1)(x, KeyedDraws(3, 0, torch.arange(6)))
    assert ((narrow == 0).all(dim=(1, 2)).sum(dim=1) <= 10).all()


def test_gain_and_noise_are_what_they_say():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 1, 4000, generator=gen) * 0.1
    draws = KeyedDraws(5, 0, torch.arange(64))
    out = GainNoise(gain_db=(-6, 6), snr_db=None, p=1.0)(x, draws)
    gain_db = 20 * torch.log10(out.abs().sum(dim=(1, 2)) / x.abs().sum(dim=(1, 2)))
    assert gain_db.min() >= -6.0001 and gain_db.max() <= 6.0001 and gain_db.std() > 2
    noisy = GainNoise(gain_db=(0, 0), snr_db=(10, 20), p=1.0)(x, KeyedDraws(5, 0, torch.arange(64)))
    noise = noisy - x
    snr = 20 * torch.log10(x.pow(2).mean(dim=(1, 2)).sqrt() / noise.pow(2).mean(dim=(1, 2)).sqrt())
    assert snr.min() > 9.5 and snr.max() < 20.5 and snr.std() > 1
    half = GainNoise(p=0.5)(x, KeyedDraws(5, 0, torch.arange(64)))
    untouched = (half == x).all(dim=(1, 2)).sum().item()
    assert 16 <= untouched <= 48  # about half the samples, left exactly as they were
    again = GainNoise(p=0.5)(x, KeyedDraws(5, 0, torch.arange(64)))
    assert torch.equal(half, again)


def test_a_pipeline_transforms_one_kind_of_field():
    from stoker.augment.pipeline import Pipeline

    with pytest.raises(stoker.InvalidArgumentError, match="mixes image and audio"):
        Pipeline([MelSpectrogram(), stoker.augment.ColorJitter(0.4)])
    with pytest.raises(stoker.InvalidArgumentError, match="not audio"):
        Pipeline([TimeMasking(10), stoker.augment.MixUp(0.2, num_classes=3)])
