"""Random batch operations: each draws its samples' parameters from the keyed generator and calls
the functional op (stoker.augment.functional) once for the whole batch.

An op is called as ``op(images, draws)``: `images` uint8 or float [N, C, H, W] (channels_last
too) on any device, `draws` a KeyedDraws for the batch's samples (the Loader passes one; alone,
``op(images)`` draws from a key taken from torch's global generator, so torch.manual_seed makes
it repeatable). Semantics follow torchvision.transforms.v2 op by op; where one differs the
docstring says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import functional as F
from .keyed import KeyedDraws, stream_of


def _draws_for(images: torch.Tensor, draws: KeyedDraws | None) -> KeyedDraws:
    if draws is not None:
        if len(draws) != images.shape[0]:
            raise ValueError(f"draws for {len(draws)} samples, the batch has {images.shape[0]}")
        return draws
    seed = int(torch.randint(0, 2**62, (1,)).item())
    return KeyedDraws(seed, 0, torch.arange(images.shape[0], device=images.device))


def _host_bytes(images: torch.Tensor) -> bool:
    """A CPU uint8 RGB batch in channels_last memory (NHWC bytes), as stoker's loaders give."""
    return (
        images.device.type == "cpu"
        and images.dtype == torch.uint8
        and images.shape[1] == 3
        and images.is_contiguous(memory_format=torch.channels_last)
        and images.numel() > 0
    )


def _range(value: float | Sequence[float], name: str, center: float, bound: float | None):
    """torchvision's ColorJitter argument: a number v is [center - v, center + v] (clipped at 0
    for factors), a pair is the range itself."""
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, not {value}")
        low, high = center - value, center + value
        if bound is None:
            low = max(low, 0.0)
    else:
        low, high = (float(v) for v in value)
    if low > high or (bound is not None and (low < -bound or high > bound)):
        raise ValueError(f"{name} range {low}..{high} is not valid")
    return float(low), float(high)


def _checked(step: Any) -> Any:
    """A worker-form step, or None where the workers would refuse its options (the torch form
    then takes them, as it takes any)."""
    if step is None:
        return None
    from .. import _core
    from ..errors import StokerError

    try:
        _core.check_augment_step(step)
    except StokerError:
        return None
    return step


@dataclass(frozen=True)
class DrawnOp:
    """One op a sample drew in a policy (``RandAugment``, ``TrivialAugmentWide``,
    ``TimmRandAugment``): what ``op.drawn(draws, height, width)`` lists, round by round, for
    each sample. The same draws give the same ops in the loader's workers (C++) and in the
    batch op (torch): an image is these ops applied in order.

    `name`: the op's name in its library's list (torchvision's "ShearX", timm's
    "TranslateXRel"); `magnitude`: the argument it is applied with, its sign included
    (torchvision's magnitude as its _apply_op takes it; timm's after its level mapping: degrees,
    a shear factor, a fraction of the size, an enhance factor, bits, a threshold), None for an
    op without one; `applied`: False where timm's per-layer probability skipped it; `level`:
    timm's level after its noise and clipping, before the mapping; `interpolation`: the filter
    of timm's geometric ops ("bilinear", "bicubic" or "nearest"); `bin`: TrivialAugmentWide's
    magnitude bin."""

    name: str
    magnitude: float | None = None
    applied: bool = True
    level: float | None = None
    interpolation: str | None = None
    bin: int | None = None

    def __str__(self) -> str:
        args = [] if self.magnitude is None else [f"{self.magnitude:.4g}"]
        if self.interpolation is not None:
            args.append(self.interpolation)
        text = f"{self.name}({', '.join(args)})" if args else self.name
        return text if self.applied else f"{text} skipped"


class BatchOp:
    """An augmentation over a batch; subclasses implement `apply(images, draws)`."""

    name = "op"
    kind = "image"  # what it transforms: "image" (uint8 or float NCHW) or "audio" (augment.audio)
    # Whether the worker form gives the torch form's bytes exactly (op(batch) on a host batch
    # takes it only then; a loader's workers take it either way).
    _exact_worker_form = True

    def __call__(self, images: torch.Tensor, draws: KeyedDraws | None = None) -> torch.Tensor:
        if images.dim() != 4:
            raise ValueError(f"a batch is [N, C, H, W], not {tuple(images.shape)}")
        keyed = _draws_for(images, draws)
        if _host_bytes(images) and self._exact_worker_form and keyed.fresh:
            # A host uint8 RGB batch in stoker's layout: the op's worker form (C++, the same
            # draws and bytes) on torch's intra-op threads, each image on one thread. The draws
            # are spent then: drawing from them again raises (the streams did not move on).
            step = _checked(self._engine_step(keyed.prefix, images.shape[2], images.shape[3]))
            if step is not None:
                keyed.spend()
                from .. import _core

                out = images.clone(memory_format=torch.channels_last)
                _core.augment_images(
                    [step],
                    out.permute(0, 2, 3, 1).numpy(),
                    keyed.indices.cpu().numpy(),
                    keyed.seed,
                    keyed.epoch,
                    threads=torch.get_num_threads(),
                )
                return out
        return self.apply(images, keyed)

    def apply(self, images: torch.Tensor, draws: KeyedDraws) -> torch.Tensor:
        raise NotImplementedError

    def drawn(self, draws: KeyedDraws, height: int, width: int) -> list[list[DrawnOp]]:
        """The ops each sample of `draws` draws here, on images of height x width, without
        applying them: one list per sample (empty for an op that is not a policy). `draws`:
        fresh draws, keyed as the op's own (a loader's op k: ``KeyedDraws(seed, epoch,
        indices).scoped("ops").scoped(str(k))``; stoker.augment_draws does that
        for a loader's step)."""
        return [[] for _ in range(len(draws))]

    def _engine_step(self, prefix: str, height: int, width: int) -> Any:
        """The op as the workers run it on each decoded uint8 RGB image of height x width (a
        _core.AugmentStep drawing the names this op draws, under `prefix`), or None where only
        the batch op runs (the loader then runs it, and every op after it, on the batch)."""
        return None

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class ColorJitter(BatchOp):
    """torchvision's ColorJitter: brightness, contrast, saturation and hue factors drawn per
    sample, applied in an order drawn per sample (torchvision draws one order per call, that is
    per sample in a per-sample pipeline). Each op runs once per sample: the samples that have
    it at a position are gathered and processed together."""

    name = "color_jitter"

    def __init__(
        self,
        brightness: float | Sequence[float] = 0,
        contrast: float | Sequence[float] = 0,
        saturation: float | Sequence[float] = 0,
        hue: float | Sequence[float] = 0,
    ):
        self.brightness = _range(brightness, "brightness", 1.0, None)
        self.contrast = _range(contrast, "contrast", 1.0, None)
        self.saturation = _range(saturation, "saturation", 1.0, None)
        self.hue = _range(hue, "hue", 0.0, 0.5)

    def _engine_step(self, prefix: str, height: int, width: int) -> Any:
        from .. import _core

        step = _core.AugmentStep()
        step.kind = _core.AugmentStepKind.color_jitter
        o = step.color_jitter
        o.brightness, o.contrast = self.brightness, self.contrast
        o.saturation, o.hue = self.saturation, self.hue
        names = ("0", "1", "2", "3", "order")
        o.streams = tuple(stream_of(f"{prefix}{self.name}.{d}") for d in names)
        return step

    def apply(self, images: torch.Tensor, draws: KeyedDraws) -> torch.Tensor:
        steps = [
            (F.adjust_brightness, self.brightness, 1.0),
            (F.adjust_contrast, self.contrast, 1.0),
            (F.adjust_saturation, self.saturation, 1.0),
            (F.adjust_hue, self.hue, 0.0),
        ]
        factors = [draws.uniform(f"{self.name}.{k}", lo, hi) for k, (_, (lo, hi), _) in
                   enumerate(steps)]  # fmt: skip
        # A per-sample order: the argsort of 4 uniforms is a uniform random permutation.
        order = draws.uniform(f"{self.name}.order", size=4).argsort(dim=1, stable=True)
        out = images.clone()
        for position in range(4):
            for k, (fn, (lo, hi), identity) in enumerate(steps):
                if lo == hi == identity:
                    continue
                chosen = (order[:, position] == k).nonzero().flatten()
                if chosen.numel():
                    out[chosen] = fn(out[chosen], factors[k][chosen].to(images.device))
        return out


class RandomGrayscale(BatchOp):
    """Each sample grey (its channel count kept) with probability p."""

    name = "random_grayscale"

    def __init__(self, p: float = 0.1):
        self.p = float(p)

    def _engine_step(self, prefix: str, height: int, width: int) -> Any:
        from .. import _core

        step = _core.AugmentStep()
        step.kind = _core.AugmentStepKind.random_grayscale
        step.random_grayscale.p = self.p
        step.random_grayscale.stream = stream_of(f"{prefix}{self.name}")
        return step

    def apply(self, images: torch.Tensor, draws: KeyedDraws) -> torch.Tensor:
        chosen = draws.bernoulli(self.name, self.p).nonzero().flatten()
        if not chosen.numel():
            return images
        out = images.clone()
        out[chosen] = F.rgb_to_grayscale(images[chosen], num_output_channels=images.shape[1])
        return out


class GaussianBlur(BatchOp):
    """torchvision's GaussianBlur: one kernel size for the batch, sigma drawn per sample."""

    name = "gaussian_blur"
    _exact_worker_form = False  # two float sums may round apart at a half: within one level

    def __init__(
        self, kernel_size: int | Sequence[int], sigma: float | Sequence[float] = (0.1, 2.0)
    ):
        sizes = [kernel_size, kernel_size] if isinstance(kernel_size, int) else list(kernel_size)
        if len(sizes) != 2 or any(k <= 0 or k % 2 == 0 for k in sizes):
            raise ValueError(f"kernel_size must be odd and positive, not {kernel_size}")
        self.kernel_size = sizes
        low, high = (sigma, sigma) if isinstance(sigma, (int, float)) else sigma
        if not 0 < low <= high:
            raise ValueError(f"sigma must be positive with min <= max, not {sigma}")
        self.sigma = (float(low), float(high))

    def _engine_step(self, prefix: str, height: int, width: int) -> Any:
        from .. import _core

        step = _core.AugmentStep()
        step.kind = _core.AugmentStepKind.gaussian_blur
        o = step.gaussian_blur
        o.kernel_width, o.kernel_height = self.kernel_size
        o.sigma_min, o.sigma_max = self.sigma
        o.stream = stream_of(f"{prefix}{self.name}")
        return step

    def apply(self, images: torch.Tensor, draws: KeyedDraws) -> torch.Tensor:
        sigma = draws.uniform(self.name, *self.sigma).to(images.device)
        return F.gaussian_blur(images, self.kernel_size, sigma)


class RandomErasing(BatchOp):
    """torchvision's RandomErasing: with probability p a box of area scale x the image's and
    aspect ratio in `ratio` (log-uniform) erased with `value` (a number, one per channel, or
    "random": standard normal noise, for normalised float batches). As torchvision, up to 10
    boxes are tried and the first that fits is taken (all 10 drawn at once per sample)."""

    name = "random_erasing"
    TRIES = 10

    def __init__(
        self,
        p: float = 0.5,
        scale: Sequence[float] = (0.02, 0.33),
        ratio: Sequence[float] = (0.3, 3.3),
        value: float | Sequence[float] | str = 0,
    ):
        if not 0 <= p <= 1:
            raise ValueError(f"p must be in [0, 1], not {p}")
        self.p, self.value = float(p), value
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))

    def _engine_step(self, prefix: str, height: int, width: int) -> Any:
        if isinstance(self.value, str):
            return None  # "random": normal noise, for float batches
        value = torch.as_tensor(self.value, dtype=torch.uint8).flatten()  # as the batch op casts
        if value.numel() not in (1, 3):
            return None
        from .. import _core

        step = _core.AugmentStep()
        step.kind = _core.AugmentStepKind.random_erasing
        o = step.random_erasing
        o.p, o.scale, o.ratio = self.p, self.scale, self.ratio
        o.value = tuple(int(v) for v in value.expand(3))
        o.streams = tuple(
            stream_of(f"{prefix}{self.name}.{d}") for d in ("apply", "area", "ratio", "at")
        )
        return step

    def apply(self, images: torch.Tensor, draws: KeyedDraws) -> torch.Tensor:
        n, c, height, width = images.shape
        area = float(height * width)
        dev = images.device
        apply = draws.bernoulli(f"{self.name}.apply", self.p).to(dev)
        target = area * draws.uniform(f"{self.name}.area", *self.scale, size=self.TRIES).to(dev)
        log_r = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        aspect = torch.exp(draws.uniform(f"{self.name}.ratio", *log_r, size=self.TRIES).to(dev))
        h = torch.round(torch.sqrt(target * aspect)).long()
        w = torch.round(torch.sqrt(target / aspect)).long()
        fits = (h < height) & (w < width)
        first = fits.float().argmax(dim=1)  # the first try that fits (0 where none does)
        found = fits.any(dim=1) & apply
        h = h.gather(1, first[:, None]).squeeze(1)
        w = w.gather(1, first[:, None]).squeeze(1)
        u_i, u_j = draws.uniform(f"{self.name}.at", size=2).to(dev).unbind(1)
        i = torch.floor(u_i * (height - h + 1)).long().clamp(min=0)
        j = torch.floor(u_j * (width - w + 1)).long().clamp(min=0)
        chosen = found.nonzero().flatten()
        if not chosen.numel():
            return images
        if self.value == "random":
            if not images.is_floating_point():
                raise ValueError("value='random' erases with normal noise: a float batch")
            # Noise from one generator keyed by the erased samples' draws: the same batch gets
            # the same noise (resume, thread counts), on one kind of device.
            key = int(draws.bits(f"{self.name}.noise")[chosen].sum().item()) & (2**63 - 1)
            generator = torch.Generator(device=dev).manual_seed(key)
            value: Any = torch.randn((len(chosen), c, height, width), dtype=images.dtype,
                                     device=dev, generator=generator)  # fmt: skip
        else:
            value = torch.as_tensor(self.value, dtype=images.dtype, device=dev)
            if value.dim() == 1:  # one value per channel
                value = value.view(1, -1, 1, 1)
        out = images.clone()
        out[chosen] = F.erase(images[chosen], i[chosen], j[chosen], h[chosen], w[chosen], value)
        return out


class Compose(BatchOp):
    """Ops applied in turn, each with its own draws (its position names them, so two ops of
    one kind draw independently)."""

    name = "compose"

    def __init__(self, ops: Sequence[BatchOp]):
        self.ops = list(ops)

    def apply(self, images: torch.Tensor, draws: KeyedDraws) -> torch.Tensor:
        for k, op in enumerate(self.ops):
            images = op(images, draws.scoped(f"{k}"))
        return images

    def drawn(self, draws: KeyedDraws, height: int, width: int) -> list[list[DrawnOp]]:
        out: list[list[DrawnOp]] = [[] for _ in range(len(draws))]
        for k, op in enumerate(self.ops):
            for sample, ops in zip(out, op.drawn(draws.scoped(f"{k}"), height, width),
                                   strict=True):  # fmt: skip
                sample.extend(ops)
        return out
