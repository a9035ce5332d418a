"""Helpers over a batch: a tensor, or a tuple, list or dict of them (nested structures, named
tuples too), where anything else passes through."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from ..errors import InvalidArgumentError


def _map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_map_tensors(b, fn) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map_tensors(b, fn) for b in batch)
    if isinstance(batch, dict):
        return type(batch)((k, _map_tensors(v, fn)) for k, v in batch.items())
    return batch


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    """The tensors of a batch, nested structures included, without rebuilding it."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            yield from _tensors(item)
    elif isinstance(batch, dict):
        for item in batch.values():
            yield from _tensors(item)


def _replace(
    batch: Any, image: int | str | tuple[int | str, ...], fn: Callable[[torch.Tensor], torch.Tensor]
) -> Any:
    """`batch` with fn applied to its image tensor: the batch itself, or batch[image] (each of
    them, for a tuple of keys)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(image, tuple):
        for key in image:
            batch = _replace(batch, key, fn)
        return batch
    try:
        element = batch[image]
    except (KeyError, IndexError, TypeError):
        raise InvalidArgumentError(
            f"the batch has no element {image!r} to normalise (a {type(batch).__name__})"
        ) from None
    if not isinstance(element, torch.Tensor):
        raise InvalidArgumentError(f"batch[{image!r}] is a {type(element).__name__}, not a tensor")
    if isinstance(batch, dict):
        out = type(batch)(batch)
        out[image] = fn(element)
        return out
    items = list(batch)
    assert isinstance(image, int), "a str key raised above for a sequence"
    items[image] = fn(element)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*items)
    return type(batch)(items)
