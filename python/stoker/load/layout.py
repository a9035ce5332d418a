"""How a loader's batches look to the training loop: a preset's one difference from the Loader
in what it hands out. A layout turns a batch's fields (a dict, one entry per field) into what
the loop gets, says which of its entries the device feed converts and normalises, and lets
augment= reach the images, labels and sample indices inside it.

- `DictLayout` (Loader): the fields' dict, with ``index`` when asked for.
- `ImageLabelLayout` (ImageLoader): ``(images, labels[, indices])``.
- `TokenLayout` (TokenLoader): ``(x, y[, offsets][, positions, cu_seqlens, max_seqlen])``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# augment='s work on a batch: (images, labels or None, sample indices) -> (images, labels)
AugmentFn = Callable[[Any, Any, Any], tuple[Any, Any]]


class DictLayout:
    """The fields' dict as it is; ``index`` (the samples' pack indices) added when asked."""

    def __init__(
        self, image_keys: tuple[str, ...] = (), augment_keys: tuple[str, Any] = ("", None)
    ):
        self.image_keys: Any = image_keys  # what the device feed converts and normalises
        self.augment_keys = augment_keys  # (image field, label field or None) augment= takes

    def key(self, field: str) -> Any:
        """Where a field is in the formatted batch."""
        return field

    def format(self, fields: dict[str, Any], indices: Any, with_index: bool) -> Any:
        if with_index:
            fields["index"] = indices
        return fields

    def augment(self, batch: Any, fn: AugmentFn, keep_index: bool) -> Any:
        image, label = self.augment_keys
        indices = batch["index"] if keep_index else batch.pop("index")
        batch[image], mixed = fn(batch[image], batch[label] if label is not None else None,
                                 indices)  # fmt: skip
        if label is not None:
            batch[label] = mixed
        return batch


class ImageLabelLayout:
    """``(images, labels)``, or ``(images, labels, indices)``."""

    image_keys: Any = 0  # the tuple's first element

    def key(self, field: str) -> Any:
        return {"image": 0, "label": 1}[field]

    def format(self, fields: dict[str, Any], indices: Any, with_index: bool) -> Any:
        images, labels = fields["image"], fields["label"]
        return (images, labels, indices) if with_index else (images, labels)

    def augment(self, batch: Any, fn: AugmentFn, keep_index: bool) -> Any:
        images, labels, indices = batch
        images, labels = fn(images, labels, indices)
        return (images, labels, indices) if keep_index else (images, labels)


class TokenLayout:
    """``(x, y)``, then each window's first token's offset in the stream (``return_offsets``),
    then ``positions, cu_seqlens, max_seqlen`` (``return_positions``)."""

    image_keys: Any = ()  # tokens are moved, never converted

    def __init__(self, offsets: Callable[[Any], Any] | None, positions: bool):
        self.offsets, self.positions = offsets, positions

    def key(self, field: str) -> Any:
        raise AssertionError("a TokenLoader's batches have no Image field")

    def format(self, fields: dict[str, Any], indices: Any, with_index: bool) -> Any:
        tokens = fields["tokens"]
        out: tuple[Any, ...] = (tokens["inputs"], tokens["targets"])
        if self.offsets is not None:
            out += (self.offsets(indices),)
        if self.positions:
            if "varlen" in tokens:  # computed on the device (resident=True on a GPU)
                out += tokens["varlen"]
            else:
                out += (tokens["positions"], *varlen(tokens["cu_seqlens"], tokens["documents"]))
        return out

    def augment(self, batch: Any, fn: AugmentFn, keep_index: bool) -> Any:
        raise AssertionError("a TokenLoader has no augment=")


def varlen(cu_rows: Any, documents: Any) -> tuple[Any, int]:
    """The batch's rows laid end to end as one sequence: the cumulative document lengths
    (int32, what flash_attn_varlen_func takes as cu_seqlens) and the longest document."""
    import torch

    rows, width = cu_rows.shape  # width = seq_len + 1
    seq_len = width - 1
    at = torch.arange(width, device=cu_rows.device)
    used = at[None, :] <= documents[:, None]
    used[1:, 0] = False  # a row's 0 is the previous row's end
    shifted = cu_rows.to(torch.int64) + (
        torch.arange(rows, device=cu_rows.device, dtype=torch.int64)[:, None] * seq_len
    )
    cu = shifted[used].to(torch.int32)
    max_seqlen = int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0
    return cu, max_seqlen
