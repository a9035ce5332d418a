"""The worker forms of stoker.augment's RandAugment and TrivialAugmentWide (the C++ ops a host
loader's threads run on each decoded image: what `op(images)` runs on a CPU uint8 batch in
channels_last memory) against torchvision's own: each sample's drawn ops, read with
`op.drawn(draws, height, width)`, applied one after another by
torchvision.transforms.v2.RandAugment._apply_image_or_video_transform (the function
RandAugment.forward and TrivialAugmentWide.forward call), each magnitude taken from
torchvision's own _AUGMENTATION_SPACE at the drawn bin with the drawn sign. Byte for byte, on
real photos, every one of the 14 ops drawn.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from torchvision.transforms import InterpolationMode, v2

import stoker.augment as A
from stoker.augment.keyed import KeyedDraws

SEED, EPOCH = 21, 2


@pytest.fixture(scope="module")
def images(photos) -> torch.Tensor:
    """uint8 [96, 3, 96, 128] in channels_last memory (a loader's batch): the twelve photos,
    each 8 times (each copy a sample of its own, with its own draws)."""
    batch = torch.from_numpy(np.stack(photos)).permute(0, 3, 1, 2)
    return batch.repeat(8, 1, 1, 1).contiguous(memory_format=torch.channels_last)


def torchvision_policy(policy: Any) -> Any:
    """torchvision's transform of the same kind and fill (its ops, its magnitude tables)."""
    fill = policy.fill
    if isinstance(policy, A.RandAugment):
        return v2.RandAugment(policy.num_ops, policy.magnitude, policy.num_magnitude_bins,
                              interpolation=InterpolationMode.NEAREST, fill=fill)  # fmt: skip
    return v2.TrivialAugmentWide(policy.num_magnitude_bins,
                                 interpolation=InterpolationMode.NEAREST, fill=fill)  # fmt: skip


def torchvision_magnitude(reference: Any, name: str, bin_: int, negative: bool, h: int,
                          w: int) -> float:  # fmt: skip
    """What torchvision's forward passes to _apply_image_or_video_transform: its table's value
    at the bin, negated where the drawn sign says so (0.0 for the ops without one)."""
    table, signed = reference._AUGMENTATION_SPACE[name]
    values = table(reference.num_magnitude_bins, h, w)
    if values is None:
        return 0.0
    magnitude = float(values[bin_])
    return -magnitude if signed and negative else magnitude


@pytest.mark.parametrize(
    "policy",
    [A.RandAugment(), A.RandAugment(num_ops=3, magnitude=27, fill=[20, 200, 90]),
     A.RandAugment(magnitude=5, num_magnitude_bins=11, fill=128),
     A.TrivialAugmentWide(fill=[255, 0, 60])],
    ids=["RandAugment-2-9", "RandAugment-3-27-fill", "RandAugment-5-of-11-grey",
         "TrivialAugmentWide-fill"],
)  # fmt: skip
def test_the_worker_form_is_torchvisions_ops_with_the_same_draws(images, policy):
    n, _, height, width = images.shape
    indices = torch.arange(n) * 7 + 3
    got = policy(images, KeyedDraws(SEED, EPOCH, indices))  # the worker form (C++)
    drawn = policy.drawn(KeyedDraws(SEED, EPOCH, indices), height, width)
    reference = torchvision_policy(policy)
    names = set()
    for i in range(n):
        want = images[i].contiguous()
        for op in drawn[i]:
            bin_ = policy.magnitude if isinstance(policy, A.RandAugment) else op.bin
            negative = op.magnitude is not None and math.copysign(1.0, op.magnitude) < 0
            magnitude = torchvision_magnitude(reference, op.name, bin_, negative, height, width)
            if op.magnitude is not None:  # stoker's table holds torchvision's value
                assert op.magnitude == magnitude, (i, op, magnitude)
            want = reference._apply_image_or_video_transform(
                want, op.name, magnitude, interpolation=reference.interpolation,
                fill=reference._fill)  # fmt: skip
            names.add(op.name)
        assert torch.equal(got[i], want), (i, [str(op) for op in drawn[i]])
    assert names == set(reference._AUGMENTATION_SPACE), set(reference._AUGMENTATION_SPACE) - names
