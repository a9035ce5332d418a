"""The batch as the training loop gets it: a `HostBatch`'s fields through the preset's layout
(stoker.load.layout): a dict, ImageLoader's (images, labels) or TokenLoader's (x, y)."""

from __future__ import annotations

from typing import Any

from . import HostBatch, Stage


class FormatBatch(Stage):
    def __init__(self, source: Stage, layout: Any, with_index: bool):
        super().__init__(source)
        # augment= keys its draws by the samples' indices: they ride along until it has run
        self.layout, self.with_index = layout, with_index

    def apply(self, batch: HostBatch) -> Any:
        return self.layout.format(batch.fields, batch.indices, self.with_index)
