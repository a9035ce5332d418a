"""Audio batch operations, on the batch's device: a (log-)mel spectrogram equal to torchaudio's
``MelSpectrogram``, SpecAugment's time and frequency masks, and a random gain with noise at a
random signal-to-noise ratio, each sample's parameters drawn from the keyed generator like every
other op (stoker.augment.keyed): the same batch gets the same masks on the CPU and the GPU, with
any thread count, and after a resume.

Waveforms are ``float32 [N, C, T]`` (a stoker.Audio field's batch); spectrograms
``[N, C, n_mels, frames]``. In a loader: ``augment=[GainNoise(), MelSpectrogram(log=True),
FrequencyMasking(27), TimeMasking(40)]`` with one Audio field (named ``"audio"`` if there are
several).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .keyed import KeyedDraws
from .ops import BatchOp, _draws_for


class AudioOp(BatchOp):
    """An op on a batch of waveforms [N, C, T] or spectrograms [N, C, F, T]."""

    kind = "audio"

    def __call__(self, x: torch.Tensor, draws: KeyedDraws | None = None) -> torch.Tensor:
        if x.dim() < 2:
            raise ValueError(f"an audio batch is [N, ..., T], not {tuple(x.shape)}")
        return self.apply(x, _draws_for(x, draws))


# --- mel scale: torchaudio.functional.melscale_fbanks, step for step ---------------------------


def _hz_to_mel(freq: float, mel_scale: str) -> float:
    if mel_scale == "htk":
        return 2595.0 * math.log10(1.0 + freq / 700.0)
    f_sp, min_log_hz, min_log_mel = 200.0 / 3, 1000.0, 15.0
    logstep = math.log(6.4) / 27.0
    if freq >= min_log_hz:
        return min_log_mel + math.log(freq / min_log_hz) / logstep
    return freq / f_sp


def _mel_to_hz(mels: torch.Tensor, mel_scale: str) -> torch.Tensor:
    if mel_scale == "htk":
        return 700.0 * (10.0 ** (mels / 2595.0) - 1.0)
    f_sp, min_log_hz, min_log_mel = 200.0 / 3, 1000.0, 15.0
    logstep = math.log(6.4) / 27.0
    freqs = f_sp * mels
    log_t = mels >= min_log_mel
    freqs[log_t] = min_log_hz * torch.exp(logstep * (mels[log_t] - min_log_mel))
    return freqs


def melscale_fbanks(n_freqs: int, f_min: float, f_max: float, n_mels: int, sample_rate: int,
                    norm: str | None = None, mel_scale: str = "htk") -> torch.Tensor:  # fmt: skip
    """Triangular mel filters [n_freqs, n_mels], as torchaudio.functional.melscale_fbanks."""
    if norm not in (None, "slaney") or mel_scale not in ("htk", "slaney"):
        raise ValueError("norm must be None or 'slaney', mel_scale 'htk' or 'slaney'")
    all_freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    m_pts = torch.linspace(_hz_to_mel(f_min, mel_scale), _hz_to_mel(f_max, mel_scale), n_mels + 2)
    f_pts = _mel_to_hz(m_pts, mel_scale)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)
    down = (-1.0 * slopes[:, :-2]) / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    fb = torch.clamp(torch.min(down, up), min=0.0)
    if norm == "slaney":
        fb *= (2.0 / (f_pts[2 : n_mels + 2] - f_pts[:n_mels])).unsqueeze(0)
    return fb


class MelSpectrogram(AudioOp):
    """torchaudio.transforms.MelSpectrogram's output (the same defaults: Hann window, reflect
    padding, power 2, HTK mel scale) for waveforms [N, C, T] -> [N, C, n_mels, frames], as one
    batched STFT and one matrix product. ``log=True``: ``log(mel + log_offset)``, the log-mel
    most speech and audio models take."""

    name = "mel_spectrogram"

    def __init__(self, sample_rate: int = 16000, n_fft: int = 400, win_length: int | None = None,
                 hop_length: int | None = None, f_min: float = 0.0, f_max: float | None = None,
                 n_mels: int = 128, power: float = 2.0, center: bool = True,
                 pad_mode: str = "reflect", norm: str | None = None, mel_scale: str = "htk",
                 log: bool = False, log_offset: float = 1e-6):  # fmt: skip
        self.sample_rate, self.n_fft = sample_rate, n_fft
        self.win_length = win_length or n_fft
        self.hop_length = hop_length or self.win_length // 2
        self.f_min, self.f_max = f_min, float(f_max or sample_rate // 2)
        self.n_mels, self.power, self.center, self.pad_mode = n_mels, power, center, pad_mode
        self.norm, self.mel_scale, self.log, self.log_offset = norm, mel_scale, log, log_offset
        self._fb = melscale_fbanks(n_fft // 2 + 1, f_min, self.f_max, n_mels, sample_rate, norm,
                                   mel_scale)  # fmt: skip
        self._window = torch.hann_window(self.win_length)
        self._on: dict[torch.device, tuple[torch.Tensor, Any]] = {}

    def apply(self, x: torch.Tensor, draws: KeyedDraws) -> torch.Tensor:
        shape = x.shape
        frames = x.reshape(-1, shape[-1]).float()
        window, fb = self._tables(x.device)
        spec = torch.stft(frames, self.n_fft, self.hop_length, self.win_length, window,
                          self.center, self.pad_mode, False, onesided=True,
                          return_complex=True)  # fmt: skip
        if self.power == 2.0:  # |X|^2 without the square root abs() takes
            power = torch.addcmul(spec.real * spec.real, spec.imag, spec.imag)
        else:
            power = spec.abs().pow(self.power)
        if isinstance(fb, list):  # the CPU: the filters' bands, one product a group
            mel = torch.cat([torch.matmul(w, power[:, lo:hi]) for lo, hi, w in fb], dim=1)
        else:
            mel = torch.matmul(fb, power)  # [n_mels, bins] @ [N, bins, frames]
        if self.log:
            mel.add_(self.log_offset).log_()
        return mel.reshape(*shape[:-1], self.n_mels, mel.shape[-1])

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, Any]:
        """The window and the filters [n_mels, bins] on `device`, made there once: on the CPU
        as bands (`_bands`), elsewhere whole."""
        if device not in self._on:
            fb = self._fb.T.contiguous()
            self._on[device] = (
                self._window.to(device),
                _bands(fb) if device.type == "cpu" else fb.to(device),
            )
        return self._on[device]

    def __repr__(self) -> str:
        return (f"MelSpectrogram(sample_rate={self.sample_rate}, n_fft={self.n_fft}, "
                f"hop_length={self.hop_length}, n_mels={self.n_mels}, log={self.log})")  # fmt: skip


def _bands(fb: torch.Tensor, call_cost: int = 256) -> list[tuple[int, int, torch.Tensor]]:
    """The filters [n_mels, bins] as groups of consecutive filters, each with the bins where
    any of them is nonzero: (first bin, end bin, weights [filters, bins]). A triangular filter
    spans a few bins (torchaudio's 80 over 201 bins: 392 of 16,080 weights nonzero), so the
    dense product multiplies zeros forty times over; the groups are chosen to minimise the
    weights multiplied plus `call_cost` a product, and give the same sums (the zeros left out
    add nothing)."""
    n = fb.shape[0]
    nonzero = fb != 0
    first = [int(r.nonzero()[0]) if r.any() else -1 for r in nonzero]
    last = [int(r.nonzero()[-1]) + 1 if r.any() else -1 for r in nonzero]

    def span(a: int, b: int) -> tuple[int, int]:  # the bins filters [a, b) need
        lo = [first[i] for i in range(a, b) if first[i] >= 0]
        hi = [last[i] for i in range(a, b) if last[i] >= 0]
        return (min(lo), max(hi)) if lo else (0, 0)

    best, cut = [0.0] + [math.inf] * n, [0] * (n + 1)  # best[b]: cost of filters [0, b)
    for b in range(1, n + 1):
        for a in range(b):
            lo, hi = span(a, b)
            cost = best[a] + (b - a) * (hi - lo) + call_cost
            if cost < best[b]:
                best[b], cut[b] = cost, a
    groups, b = [], n
    while b > 0:
        a = cut[b]
        lo, hi = span(a, b)
        groups.append((lo, hi, fb[a:b, lo:hi].contiguous()))
        b = a
    return groups[::-1]


class _AxisMasking(AudioOp):
    axis = -1

    def __init__(self, max_width: int, count: int = 1, p: float = 1.0, value: float = 0.0):
        if max_width < 0 or count < 0 or not 0.0 <= p <= 1.0:
            raise ValueError("max_width and count must be >= 0, p in [0, 1]")
        self.max_width, self.count, self.p, self.value = max_width, count, p, value

    def apply(self, x: torch.Tensor, draws: KeyedDraws) -> torch.Tensor:
        size = x.shape[self.axis]
        # torchaudio's mask_along_axis_iid: a width below max_width (at most p of the axis),
        # then a start that keeps the mask inside
        bound = min(float(self.max_width), self.p * size)
        where = torch.arange(size, device=x.device)
        masked = torch.zeros(x.shape[0], size, dtype=torch.bool, device=x.device)
        for k in range(self.count):
            width = draws.uniform(f"width{k}") * bound
            start = draws.uniform(f"start{k}") * (size - width)
            first, last = start.long(), (start + width).long()
            masked |= (where >= first[:, None]) & (where < last[:, None])
        view = [x.shape[0]] + [1] * (x.dim() - 1)
        view[self.axis] = size
        return x.masked_fill(masked.reshape(view), self.value)


class TimeMasking(_AxisMasking):
    """SpecAugment's time masks (torchaudio's TimeMasking with iid_masks): ``count`` masks per
    sample along the last axis, each of a width drawn below ``max_width`` (and below ``p`` of
    the frames), set to ``value``."""

    name = "time_masking"
    axis = -1


class FrequencyMasking(_AxisMasking):
    """SpecAugment's frequency masks (torchaudio's FrequencyMasking with iid_masks): ``count``
    masks per sample along the mel axis (the second last)."""

    name = "frequency_masking"
    axis = -2


class GainNoise(AudioOp):
    """A random gain (uniform in ``gain_db``) and Gaussian noise at a random signal-to-noise
    ratio (uniform in ``snr_db``, against each sample's own RMS), each applied to a sample with
    probability ``p``, on waveforms [N, C, T]. The noise is a keyed window of a fixed table of
    2^20 standard normal values (made once from seed 0), so it is the same on every device."""

    name = "gain_noise"
    _table: dict[Any, torch.Tensor] = {}

    def __init__(self, gain_db: tuple[float, float] = (-6.0, 6.0),
                 snr_db: tuple[float, float] | None = (10.0, 40.0), p: float = 0.5):  # fmt: skip
        if gain_db[0] > gain_db[1] or (snr_db is not None and snr_db[0] > snr_db[1]):
            raise ValueError("gain_db and snr_db are (low, high) ranges")
        self.gain_db: tuple[float, float] = (float(gain_db[0]), float(gain_db[1]))
        self.snr_db = None if snr_db is None else (float(snr_db[0]), float(snr_db[1]))
        self.p = p

    @classmethod
    def _noise(cls, device: torch.device) -> torch.Tensor:
        if device not in cls._table:
            table = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0))
            cls._table[device] = table.to(device)
        return cls._table[device]

    def apply(self, x: torch.Tensor, draws: KeyedDraws) -> torch.Tensor:
        n = x.shape[0]
        on = draws.bernoulli("apply", self.p).to(x.dtype).reshape(n, *[1] * (x.dim() - 1))
        gain = 10.0 ** (draws.uniform("gain_db", self.gain_db[0], self.gain_db[1]) / 20.0)
        out = x * (1 + on * (gain.reshape(on.shape) - 1))
        if self.snr_db is None:
            return out
        snr = draws.uniform("snr_db", self.snr_db[0], self.snr_db[1])
        rms = out.reshape(n, -1).pow(2).mean(dim=1).sqrt()
        scale = (rms / 10.0 ** (snr / 20.0)).reshape(on.shape)
        table = self._noise(x.device)
        length = x[0].numel()
        start = draws.integers("noise_start", table.numel())
        where = (start[:, None] + torch.arange(length, device=x.device)[None, :]) % table.numel()
        noise = table[where].reshape(x.shape)
        return out + on * scale * noise
