"""Packing: every source stoker.pack reads (sources/, one module each) through one writer into
tar shards + indexes (image and typed-field packs); array packs (columns of fixed-shape arrays)
and token packs (flat token files). The formats are docs/FORMAT.md's."""

from .arrays import pack_arrays
from .attach import AttachResult, attach
from .inspection import inspect
from .videos import VideoFacts, video_facts
from .packer import pack
from .result import PackResult
from .tokens import pack_tokens

__all__ = [
    "pack", "pack_arrays", "pack_tokens", "inspect", "PackResult", "VideoFacts", "video_facts",
    "attach", "AttachResult",
]
