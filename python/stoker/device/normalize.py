"""``Normalize``: images to ``dtype`` and normalised, with the same bits on the CPU and the GPU
(docs/GPU.md, contract 4: the exact conversion), and ImageNet's mean and std."""

from __future__ import annotations

from typing import Sequence

import torch

from ..errors import InvalidArgumentError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Normalize:
    """uint8 or float images -> ``dtype``, optionally ``(x/255 - mean) / std`` per channel.

    uint8 input is scaled by 1/255 first, so ``mean`` and ``std`` are in [0, 1] units, as in
    torchvision's ``Normalize`` after ``ToTensor``. The arithmetic is float32 in a fixed order of
    correctly rounded operations, so the GPU gives the CPU's result bit for bit; the cast to
    ``dtype`` comes last. 4-D output is channels_last.
    """

    def __init__(
        self,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        dtype: torch.dtype | None = None,
        channels_last: bool = True,
    ):
        if (mean is None) != (std is None):
            raise InvalidArgumentError("give mean and std together, or neither")
        self.mean: tuple[float, ...] | None = None
        self.std: tuple[float, ...] | None = None
        if mean is not None and std is not None:
            self.mean = tuple(float(m) for m in mean)
            self.std = tuple(float(s) for s in std)
            if len(self.mean) != len(self.std) or not self.mean:
                raise InvalidArgumentError(
                    f"mean and std need one value per channel: {len(self.mean)} and "
                    f"{len(self.std)} given"
                )
            if any(not s > 0 for s in self.std):
                raise InvalidArgumentError(f"std must be positive, not {self.std}")
        if dtype is None and mean is not None:
            dtype = torch.float32
        if dtype is not None and not (dtype.is_floating_point or dtype == torch.uint8):
            raise InvalidArgumentError(f"dtype must be a floating type or torch.uint8, not {dtype}")
        if dtype == torch.uint8 and mean is not None:
            raise InvalidArgumentError("mean/std give floats: choose a floating dtype")
        self.dtype = dtype
        self.channels_last = channels_last
        self._constants: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._divisors: dict[torch.device, torch.Tensor] = {}

    def _mean_scale(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(what to subtract, what to multiply by): float32 on x's device, shaped to broadcast.

        (x/255 - mean)/std is computed as (x - 255*mean) * (1/(255*std)), each constant worked
        out in float64 and rounded once to float32.
        """
        key = (x.device, x.dtype, x.dim())
        assert self.mean is not None and self.std is not None, "called only with mean and std"
        if key not in self._constants:
            unit = 255.0 if x.dtype == torch.uint8 else 1.0
            shape = (1, -1, 1, 1) if x.dim() == 4 else (-1, 1, 1)
            sub = torch.tensor([m * unit for m in self.mean], dtype=torch.float64)
            mul = torch.tensor([1.0 / (s * unit) for s in self.std], dtype=torch.float64)
            self._constants[key] = (
                sub.to(torch.float32).reshape(shape).to(x.device),
                mul.to(torch.float32).reshape(shape).to(x.device),
            )
        return self._constants[key]

    def _divisor(self, device: torch.device) -> torch.Tensor:
        if device not in self._divisors:
            self._divisors[device] = torch.full((), 255.0, dtype=torch.float32, device=device)
        return self._divisors[device]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        four_d = x.dim() == 4
        format = torch.channels_last if (four_d and self.channels_last) else torch.preserve_format
        if self.dtype is None or (self.dtype == x.dtype and self.mean is None):
            return x.contiguous(memory_format=format) if four_d and self.channels_last else x
        if self.mean is None:
            if self.dtype == torch.uint8 or not x.dtype == torch.uint8:
                return x.to(dtype=self.dtype, memory_format=format)
            y = x.to(dtype=torch.float32, memory_format=format)
            # x / 255 correctly rounded, as torchvision's ToTensor on the CPU. Divided by a tensor
            # on y's device, not by the number 255: CUDA's kernel multiplies by the float32
            # reciprocal of a number, which is one ulp off for 126 of the 256 values.
            y.div_(self._divisor(y.device))
            return y if self.dtype == torch.float32 else y.to(self.dtype)
        if x.dim() not in (3, 4):
            raise InvalidArgumentError(
                f"mean/std apply to images [N, C, H, W] or [C, H, W], not shape {tuple(x.shape)}"
            )
        channels = x.shape[1] if four_d else x.shape[0]
        if channels != len(self.mean):
            raise InvalidArgumentError(
                f"mean/std have {len(self.mean)} channels, the images {channels} "
                f"(shape {tuple(x.shape)}; channels are dim {1 if four_d else 0})"
            )
        sub, mul = self._mean_scale(x)
        y = x.to(dtype=torch.float32, memory_format=format)
        if y.data_ptr() == x.data_ptr():
            y = y.clone(memory_format=format)  # float32 input: never write into the caller's batch
        y.sub_(sub).mul_(mul)
        return y if self.dtype == torch.float32 else y.to(self.dtype)
