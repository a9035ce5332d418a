"""What a pack call returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class PackResult:
    out: Path
    num_samples: int
    num_shards: int
    bytes: int
    seconds: float
    classes: list[str]
    failed: list[tuple[str, str]] = field(default_factory=list)  # (where, reason), skipped
    reencoded: int = 0
    fields: list[dict[str, Any]] = field(default_factory=list)  # the manifest's schema
    source_format: str = ""  # what was read: imagefolder, parquet, tfrecord, ...
    resumed: int = 0  # samples already written by an interrupted run of the same pack
    # `out` already held this pack (the same source and options): nothing was written
    already_packed: bool = False
    unit: str = "samples"  # what num_samples counts: a token pack's are tokens
    num_documents: int | None = None  # a token pack written from documents: how many

    def __str__(self) -> str:
        if self.already_packed:
            return (f"{self.out} is already a pack of this source with these options: "
                    f"{self.num_samples} {self.unit} in {self.num_shards} shard(s) "
                    "(overwrite=True packs it again)")  # fmt: skip
        s = (
            f"packed {self.num_samples} {self.unit}"
            + ("" if self.num_documents is None else f" ({self.num_documents} documents)")
            + f" into {self.num_shards} shard(s) "
            f"({self.bytes / 1e6:.1f} MB) at {self.out} in {self.seconds:.1f} s"
        )
        if self.resumed:
            s += f" (resumed: {self.resumed} were written by the interrupted run)"
        if self.reencoded:
            s += (f"; {self.reencoded} rewritten (max_side, restart markers, a lossless PNG, "
                  "or a video or sound transcoded)")  # fmt: skip
        if self.failed:
            s += f"; {len(self.failed)} record(s) skipped:"
            for where, reason in self.failed[:20]:
                s += f"\n  {where}: {reason}"
            if len(self.failed) > 20:
                s += f"\n  ... and {len(self.failed) - 20} more (see manifest.json)"
        return s
