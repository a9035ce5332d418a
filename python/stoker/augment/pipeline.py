"""What a loader's ``augment=`` holds: image ops in order, then at most one MixUp/CutMix, applied
to a batch's images (and labels, for the mix) with the batch's keyed draws; or audio ops
(augment.audio), applied to an Audio field's batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import InvalidArgumentError
from .keyed import KeyedDraws
from .mix import MixUp
from .ops import BatchOp, Compose, DrawnOp


class Pipeline:
    """``augment=op``, ``augment=[op, ..., MixUp(...)]`` or a Compose: the ops run on the image
    batch (uint8 NCHW on the batch's device, before the device feed normalises it), then the
    mix takes the images and labels and gives soft targets [N, num_classes] (float32) in the
    labels' place. Each op draws from the batch's KeyedDraws under its position, so a batch is
    augmented the same whatever the thread count, and after a resume."""

    def __init__(self, augment: Any):
        items = list(augment) if isinstance(augment, (list, tuple)) else [augment]
        if not items:
            raise InvalidArgumentError("augment= needs at least one operation")
        self.mix: MixUp | None = None
        if isinstance(items[-1], MixUp):
            self.mix = items.pop()
        for k, op in enumerate(items):
            if isinstance(op, MixUp):
                raise InvalidArgumentError(
                    "augment=: MixUp/CutMix goes last (it blends images and turns labels into "
                    "soft targets)"
                )
            if not isinstance(op, BatchOp):
                raise InvalidArgumentError(
                    f"augment[{k}] must be a stoker.augment operation (ColorJitter, "
                    f"RandAugment, Compose, MixUp...), not {type(op).__name__}"
                )
        kinds = {op.kind for op in items}
        if len(kinds) > 1:
            raise InvalidArgumentError(
                "augment= mixes image and audio operations: a pipeline transforms one field"
            )
        self.kind = kinds.pop() if kinds else "image"  # the kind of field it transforms
        if self.kind == "audio" and self.mix is not None:
            raise InvalidArgumentError("augment=: MixUp/CutMix blends images, not audio")
        self.ops = Compose(items) if items else None
        self.in_workers = 0  # the leading ops the loader's workers run (engine_steps)

    def engine_steps(self, height: int, width: int) -> list[Any]:
        """The leading ops that have a worker form, as the workers' steps; from then on this
        pipeline runs only the ops after them (and the mix) on the batch. A host loader hands
        them to its Image field: they run on each image as it is decoded, in the C++ threads,
        with the draws the batch ops would make."""
        from .ops import _checked

        steps = []
        for k, op in enumerate([] if self.ops is None else self.ops.ops):
            step = _checked(op._engine_step(f"ops/{k}/", height, width))
            if step is None:
                break
            steps.append(step)
        self.in_workers = len(steps)
        return steps

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor | None, draws: KeyedDraws
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.ops is not None:
            scoped = draws.scoped("ops")
            for k in range(self.in_workers, len(self.ops.ops)):  # as Compose names them
                images = self.ops.ops[k](images, scoped.scoped(f"{k}"))
        if self.mix is not None:
            if labels is None:
                raise InvalidArgumentError("augment=: MixUp needs the batch's labels")
            if bool((labels < 0).any()):
                raise InvalidArgumentError(
                    "augment=: MixUp needs a label for every sample (some have none, -1)"
                )
            images, labels = self.mix(images, labels, uniform=draws.scoped("mix").first)
        return images, labels

    def drawn(self, draws: KeyedDraws, height: int, width: int) -> list[list[DrawnOp]]:
        """The policy ops (RandAugment, TrivialAugmentWide, TimmRandAugment) each sample of the
        batch keyed by `draws` draws here, in order, on images of height x width: what the
        workers and the batch ops apply (BatchOp.drawn). `draws`: the batch's, as __call__
        takes them (KeyedDraws(seed, epoch, indices))."""
        if self.ops is None:
            return [[] for _ in range(len(draws))]
        return self.ops.drawn(draws.scoped("ops"), height, width)

    def __repr__(self) -> str:
        parts: Sequence[Any] = ([] if self.ops is None else self.ops.ops) + (
            [] if self.mix is None else [self.mix]
        )
        return f"Pipeline({', '.join(map(repr, parts))})"
