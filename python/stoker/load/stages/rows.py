"""Rows of a formatted batch (a tuple or dict of tensors, lists, nested dicts): how many, one
replaced from a one-sample batch of the same structure, some kept: what the device decode does
with a sample the host decoded again, replaced or left out."""

from __future__ import annotations

from typing import Any


def rows(batch: Any) -> int:
    """How many samples a batch holds."""
    import torch

    items = batch.values() if isinstance(batch, dict) else batch
    for item in items:
        if isinstance(item, torch.Tensor):
            return int(item.shape[0])
        if isinstance(item, dict):
            return rows(item)
        if isinstance(item, list):
            return len(item)
    raise AssertionError("a batch without samples")


def replace_row(batch: Any, one: Any, row: int) -> None:
    """Row `row` of every tensor and list of `batch` set from the one-sample batch `one` (the
    same structure, on the host). To a GPU, each row goes through torch's pinned allocator: `one`
    lives in the engine's pool, page-locked by cudaHostRegister, which hands it to the next worker
    as soon as it is let go while a copy without blocking reads it only when its stream runs it;
    torch delays the reuse of its own pinned memory until then (its copies record their stream),
    not of registered memory."""
    import torch

    pairs = zip(batch.values(), one.values(), strict=True) if isinstance(batch, dict) else zip(
        batch, one, strict=True)  # fmt: skip
    for mine, theirs in pairs:
        if isinstance(mine, torch.Tensor):
            source = theirs[0]
            if mine.device.type == "cuda":
                source = torch.empty_like(source, pin_memory=True).copy_(source)
            mine[row].copy_(source, non_blocking=True)
        elif isinstance(mine, dict):
            replace_row(mine, theirs, row)
        elif isinstance(mine, list):
            mine[row] = theirs[0]


def keep_rows(batch: Any, keep: list[int]) -> Any:
    """`batch` with only rows `keep`, its tensors' memory format kept."""
    import torch

    index: dict[torch.device, torch.Tensor] = {}

    def kept(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            if item.device not in index:
                index[item.device] = torch.tensor(keep, dtype=torch.int64, device=item.device)
            out = item.index_select(0, index[item.device])
            if item.dim() == 4 and item.is_contiguous(memory_format=torch.channels_last):
                out = out.contiguous(memory_format=torch.channels_last)
            return out
        if isinstance(item, dict):
            return {k: kept(v) for k, v in item.items()}
        if isinstance(item, list):
            return [item[i] for i in keep]
        return item

    if isinstance(batch, dict):
        return kept(batch)
    return type(batch)(kept(item) for item in batch)
