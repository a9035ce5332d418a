"""What each step handed out, written as it happens: ``record=`` on a loader or a mix (JSON
lines, one per step and rank), and ``read_record`` to read them back. stoker.tools.replay draws
a step's batch; ``Loader.sample_ids``/``batch_at`` compute it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from .. import faults


class StepRecorder:
    """Appends a JSON line per batch a rank hands out to `path`. A loader's lines are
    ``{"epoch", "step", "rank", "world_size", "index": [...], "key": [...]}`` (pack indices and
    keys, substitutes and all, skipped samples left out); a mix's are ``{"epoch", "step",
    "rank", "world_size", "source", "source_epoch", "source_step"}`` (the loader each step drew,
    and that loader's own epoch and step, under which its record lists the samples). With
    several ranks, each writes its own file: `path` with ``{rank}`` formatted, or
    ``NAME.rankR.jsonl``. Line-buffered: a job that dies has written every step its loader
    handed out (with a device feed, up to ``device_prefetch`` steps ahead of the training
    loop)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._file: IO[str] | None = None
        self._opened = ""
        self._at = (0, 0, 0, 1)  # epoch, next step, rank, world size
        self._keyed: bool | None = None  # whether samples have keys of their own (tar packs)

    def file_for(self, rank: int, world_size: int) -> str:
        if "{rank}" in self.path:
            return self.path.replace("{rank}", str(rank))
        if world_size == 1:
            return self.path
        p = Path(self.path)
        return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))

    def begin(self, epoch: int, step: int, rank: int, world_size: int) -> None:
        """A pass starts (or resumes) at `step` of `epoch`."""
        name = self.file_for(rank, world_size)
        if name != self._opened:
            self.close()
            Path(name).parent.mkdir(parents=True, exist_ok=True)
            faults.point("file_open", name, OSError)
            self._file = open(name, "a", buffering=1)  # noqa: SIM115 - held across passes
            self._opened = name
        self._at = (epoch, step, rank, world_size)

    def write(self, **fields: Any) -> None:
        """The next step's line: its position, then `fields`."""
        epoch, step, rank, world_size = self._at
        line = {"epoch": epoch, "step": step, "rank": rank, "world_size": world_size, **fields}
        assert self._file is not None  # begin() opened it
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._at = (epoch, step + 1, rank, world_size)

    def write_samples(self, indices: Any, dataset: Any) -> None:
        """A loader's step: its samples' pack indices, and their keys in a pack of files (an
        array or token pack's keys are the indices: not written, which keeps the record's cost
        small beside batches of 10^5 samples a second)."""
        index = indices.tolist()
        if self._keyed is None:
            self._keyed = dataset.num_shards > 0 and dataset.layout(0) == "tar"
        if self._keyed:
            self.write(index=index, key=[dataset.record(i)["key"] for i in index])
        else:
            self.write(index=index)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            self._opened = ""


def read_record(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The lines a ``record=`` file holds, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
