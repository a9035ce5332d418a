"""augment=: stoker.augment's pipeline on the formatted batch, each sample's parameters drawn from
(seed, the pass's epoch, its index), on the batch's device: the host's after FormatBatch, or the
GPU's inside the device feed, before the conversion. (The ops with a worker form run in the
engine's workers instead, on each image as it is decoded: `worker_steps` plans them into the
Image field's options.) MixUp turns the labels into soft targets."""

from __future__ import annotations

import time
from typing import Any

from . import Stage
from .engine import EnginePass


class AugmentBatch(Stage):
    def __init__(self, source: Stage | None, pipeline: Any, layout: Any, engine: EnginePass,
                 seed: int, keep_index: bool):  # fmt: skip
        super().__init__(source)
        self.pipeline, self.layout, self.engine = pipeline, layout, engine
        self.seed, self.keep_index = seed, keep_index
        self.seconds = 0.0

    def apply(self, batch: Any) -> Any:
        from ...augment.keyed import KeyedDraws

        def run(images: Any, labels: Any, indices: Any) -> tuple[Any, Any]:
            draws = KeyedDraws(self.seed, self.engine.epoch, indices)
            return self.pipeline(images, labels, draws)

        t0 = time.perf_counter()
        try:
            return self.layout.augment(batch, run, self.keep_index)
        finally:
            self.seconds += time.perf_counter() - t0

    def stats(self, into: dict[str, Any]) -> None:
        super().stats(into)
        # The thread that takes the batch: the ops' time on the host, or, inside the device
        # feed, the time to queue them on its stream.
        into.setdefault("seconds", {})["augment"] = self.seconds


def plan(augment: Any, fields: dict[str, Any], resident_on_gpu: bool) -> tuple[Any, Any]:
    """augment= checked against the fields: (the pipeline, (image field, label field))."""
    from ...augment.pipeline import Pipeline
    from ...errors import InvalidArgumentError
    from ..fields import Audio, Image, Label

    pipeline = Pipeline(augment)
    if resident_on_gpu:
        raise InvalidArgumentError(
            "augment= with resident=True on a GPU is not supported yet: its batches are "
            "gathered there already normalised"
        )
    kind = Audio if pipeline.kind == "audio" else Image
    targets = [n for n, f in fields.items() if isinstance(f, kind)]
    name = pipeline.kind if pipeline.kind in targets else (
        targets[0] if len(targets) == 1 else None)  # fmt: skip
    if name is None:
        raise InvalidArgumentError(
            f"augment= transforms an {kind.__name__} field: name it {pipeline.kind!r} (the "
            f"loader has {len(targets)} {kind.__name__} fields)"
        )
    followers = [n for n, f in fields.items() if getattr(f, "follow", None) == name]
    if followers:
        raise InvalidArgumentError(
            f"augment= does not move the fields that follow {name!r} ({', '.join(followers)})"
            " yet: their pixels and boxes would no longer match the image's"
        )
    labels = [n for n, f in fields.items() if isinstance(f, Label)]
    label = labels[0] if len(labels) == 1 else None
    if pipeline.mix is not None and label is None:
        raise InvalidArgumentError("augment=: MixUp needs one Label field for its targets")
    return pipeline, (name, label)
