"""The audio ops on the GPU: the same values as on the CPU (the keyed draws and the noise table
are device-independent), and the mel spectrogram equal to torchaudio's own where it is
installed (this machine's torch has no torchaudio build on PyPI)."""

import math

import pytest
import torch

from stoker.augment import FrequencyMasking, GainNoise, KeyedDraws, MelSpectrogram, TimeMasking


def waves():
    gen = torch.Generator().manual_seed(0)
    t = torch.arange(16000) / 16000
    return (
        torch.stack([torch.sin(2 * math.pi * 330 * t), torch.randn(16000, generator=gen)])[:, None]
        * 0.3
    )


def test_audio_ops_give_the_cpus_values_on_the_gpu():
    x = waves()
    ops = [GainNoise(p=1.0), MelSpectrogram(16000, n_mels=80, log=True), FrequencyMasking(10),
           TimeMasking(15)]  # fmt: skip
    out = {}
    for device in ("cpu", "cuda"):
        y = x.to(device)
        for k, op in enumerate(ops):
            y = op(y, KeyedDraws(3, 1, torch.arange(2, device=device)).scoped(str(k)))
        out[device] = y.cpu()
    torch.testing.assert_close(out["cuda"], out["cpu"], rtol=1e-3, atol=1e-3)
    assert torch.equal(out["cuda"] == 0, out["cpu"] == 0)  # the same masks


def test_mel_spectrogram_is_torchaudios():
    torchaudio = pytest.importorskip("torchaudio")
    x = waves().cuda()
    for kw in [{}, {"n_fft": 512, "hop_length": 160, "n_mels": 64, "norm": "slaney",
                    "mel_scale": "slaney"}]:  # fmt: skip
        want = torchaudio.transforms.MelSpectrogram(16000, **kw).cuda()(x)
        got = MelSpectrogram(16000, **kw)(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
