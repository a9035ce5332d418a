"""Type-checked, never run: stoker.mix as a user writes it. The mix is generic over the batch
type of its loaders, so an editor knows what a loop over it yields."""

from __future__ import annotations

from pathlib import Path
from typing import Any, assert_type

import torch
from torch.utils.data import DataLoader, TensorDataset

import stoker


def mix_two_packs(a: Path, b: Path) -> None:
    coco = stoker.ImageLoader(a, batch_size=64, size=160)
    extra = stoker.ImageLoader(b, batch_size=64, size=160)
    mixed: stoker.Mix[Any] = stoker.mix(
        [coco, extra], weights=[0.7, 0.3], seed=1, stop="all_exhausted", length=1000
    )
    batches: int = len(mixed)
    for epoch in range(3):
        mixed.set_epoch(epoch)
        for images, labels in mixed:
            print(images.shape, labels.shape)
    state: dict[str, Any] = mixed.state_dict()
    mixed.load_state_dict(state)
    stats: dict[str, Any] = mixed.stats()
    weights: tuple[float, ...] = mixed.weights
    on_gpu = stoker.to_device(mixed, "cuda", dtype=torch.bfloat16)
    print(batches, stats, weights, on_gpu)
    mixed.close()


def typed_batches(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    mixed = stoker.mix([pairs, pairs[::-1]], [1, 2], stop="all_exhausted_without_replacement")
    assert_type(mixed, stoker.Mix[tuple[torch.Tensor, torch.Tensor]])
    for x, y in mixed:
        assert_type(x, torch.Tensor)
        print(x + y)


def with_a_dataloader() -> None:
    loader = DataLoader(TensorDataset(torch.zeros(8, 3)), batch_size=4)
    with stoker.mix([loader], [1.0], stop="never", length=10, check_structure=False) as mixed:
        for batch in mixed:
            print(batch)
