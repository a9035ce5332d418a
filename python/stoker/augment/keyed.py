"""Per-sample random draws keyed by (seed, epoch, sample index) and a name, on any device.

Every random parameter of an augmentation is a pure function of the loader's seed, the epoch,
the sample's index in the dataset and the name of the draw, never of a generator's state: a
batch is augmented the same on the CPU and the GPU, with any thread count, and after a resume
from ``state_dict`` (the same batches carry the same indices). It is the engine's KeyedRandom
(cpp/include/stoker/core/random.h: splitmix64 over the key, a counter per draw) computed with
int64 tensor arithmetic, so it runs where the batch is, vectorised over the samples.

    draws = KeyedDraws(seed, epoch, indices)           # indices: int64 [N], the samples' own
    factor = draws.uniform("jitter.brightness", 0.6, 1.4)   # float32 [N]
    which = draws.integers("randaug.op0", 14)               # int64 [N] in [0, 14)
"""

from __future__ import annotations

import hashlib

import torch

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_STEP = 0x632BE59BD9B4E019
_MASK = (1 << 64) - 1


def _signed(x: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    x &= _MASK
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 lanes taken as uint64."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 lanes (bits as uint64; products wrap mod 2^64)."""
    x = x + _signed(_GOLDEN)
    x = (x ^ _shr(x, 30)) * _signed(_M1)
    x = (x ^ _shr(x, 27)) * _signed(_M2)
    return x ^ _shr(x, 31)


def stream_of(name: str) -> int:
    """A draw's name as a 64-bit stream id (stable across processes and versions)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


class KeyedDraws:
    """Draws for the samples `indices` (int64 [N]) of `epoch` under `seed`, on their device.

    Each named draw is its own stream: ``uniform("a")`` is the same whatever else was drawn
    before, so adding an op to a pipeline leaves the other ops' parameters as they were. A name
    drawn again gives the next values of its stream (``count`` of them at once with ``size``)."""

    def __init__(self, seed: int, epoch: int, indices: torch.Tensor, prefix: str = ""):
        if indices.dtype != torch.int64 or indices.dim() != 1:
            raise ValueError("indices must be an int64 tensor [N]")
        self.seed, self.epoch, self.indices = int(seed), int(epoch), indices
        self.prefix = prefix
        self._counters: dict[str, int] = {}
        self._spent = False  # drawn by an op's worker form, whose draws do not move streams on

    def scoped(self, prefix: str) -> KeyedDraws:
        """The same samples' draws under names prefixed `prefix/` (an op's place in a pipeline)."""
        return KeyedDraws(self.seed, self.epoch, self.indices, f"{self.prefix}{prefix}/")

    @property
    def device(self) -> torch.device:
        return self.indices.device

    def __len__(self) -> int:
        return int(self.indices.numel())

    @property
    def fresh(self) -> bool:
        """Nothing drawn yet: every stream at its start."""
        return not self._counters and not self._spent

    def spend(self) -> None:
        """Mark these draws as used by an op's worker form (C++), which draws from the streams'
        starts without moving them on: drawing again from them raises."""
        self._spent = True

    def bits(self, name: str, size: int = 1) -> torch.Tensor:
        """`size` fresh 64-bit words per sample: int64 [N] (size 1) or [N, size]."""
        if self._spent:
            raise ValueError(
                "these draws were used by an op on a host batch (its C++ form): give the next op "
                "its own, draws.scoped(name) or new KeyedDraws"
            )
        name = self.prefix + name
        seed = torch.tensor(_signed(self.seed), dtype=torch.int64, device=self.device)
        stream = _signed(stream_of(name) ^ (self.epoch * _GOLDEN))
        key = mix64(mix64(mix64(seed) ^ stream) ^ self.indices)  # KeyedRandom's key
        start = self._counters.get(name, 0)
        self._counters[name] = start + size
        steps = torch.arange(start + 1, start + size + 1, dtype=torch.int64, device=self.device)
        words = mix64(key[:, None] + steps[None, :] * _signed(_STEP))
        return words[:, 0] if size == 1 else words

    def uniform(
        self, name: str, low: float = 0.0, high: float = 1.0, size: int = 1
    ) -> torch.Tensor:
        """Uniform in [low, high): float32 [N] (or [N, size]), from the top 24 bits."""
        u = _shr(self.bits(name, size), 40).to(torch.float32) * (1.0 / (1 << 24))
        return low + (high - low) * u

    def integers(self, name: str, high: int, size: int = 1) -> torch.Tensor:
        """Uniform integers in [0, high): int64 [N] (or [N, size]); bias below 2^-31."""
        if not 0 < high < 1 << 31:
            raise ValueError(f"high must be in [1, 2^31), not {high}")
        return (_shr(self.bits(name, size), 33) * high) >> 31

    def first(self, name: str, n: int) -> torch.Tensor:
        """The first `n` samples' uniforms of `name`: MixUp's ``uniform`` for a whole batch's
        (n=1) or a pair's parameters, ``mix(images, labels, uniform=draws.first)``."""
        if not 0 < n <= len(self):
            raise ValueError(f"{n} draws asked of a batch of {len(self)}")
        return self.uniform(name)[:n]

    def bernoulli(self, name: str, p: float) -> torch.Tensor:
        """True with probability p: bool [N]."""
        return self.uniform(name) < p
