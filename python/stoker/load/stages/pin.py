"""device= on a GPU: each batch slot page-locked the first time the pass hands it on, so that the
feed's copies read it by DMA (the engine keeps its slots at fixed addresses: keep_slots). Where
page-locking is refused (and warned about) once, the feed stages every slot instead."""

from __future__ import annotations

from typing import Any

from . import HostBatch, Stage


class PinSlots(Stage):
    def __init__(self, source: Stage, backend: Any, slot_bytes: int):
        super().__init__(source)
        self.backend, self.slot_bytes = backend, slot_bytes
        self.pinned: set[int] = set()
        self.refused = False

    def apply(self, batch: HostBatch) -> HostBatch:
        if not self.refused and batch.address not in self.pinned:
            if self.backend.pin(batch.address, self.slot_bytes):
                self.pinned.add(batch.address)
            else:  # refused (and warned about): the feed stages this slot and all others
                self.refused = True
        return batch

    def stats(self, into: dict[str, Any]) -> None:
        super().stats(into)
        into.setdefault("device", {})["pinned_slots"] = len(self.pinned)

    def close(self) -> None:
        # Before the engine's (the chain closes it after): its workers may still write into a
        # slot, which page-locked or not is the same memory.
        for address in self.pinned:
            try:
                self.backend.unpin(address)
            except Exception:  # CUDA may already be shutting down at exit
                pass
        self.pinned.clear()
