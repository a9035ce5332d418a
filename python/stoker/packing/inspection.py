"""stoker.inspect: what a pack holds, from its manifest, with every index (or column header)
checked against its file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .. import _core
from .packer import MANIFEST


def inspect(path: str | os.PathLike) -> dict[str, Any]:
    """What a pack holds: format version, classes and counts, shards and their sizes, fields."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.exists():
        ds = _core.Dataset.open(str(path))  # foreign WebDataset shards: indexed now
        return {
            "format": "webdataset",
            "version": None,
            "num_samples": len(ds),
            "classes": [],
            "shards": ds.num_shards,
            "bytes": None,
        }
    with open(manifest_path) as f:
        m = json.load(f)
    if m.get("format") == "stoker-tokens":
        ds = _core.Dataset.open(str(path), seq_len=1)  # validates every file's size
        return {
            "format": m["format"],
            "version": m["version"],
            "num_samples": int(m["num_tokens"]),  # tokens: windows depend on the reader
            "num_tokens": int(m["num_tokens"]),
            "dtype": m["dtype"],
            "eos_id": m.get("eos_id"),
            "classes": [],
            "shards": len(m["shards"]),
            "bytes": m.get("bytes"),
            "shard_bytes": [s.get("bytes") for s in m["shards"]],
            "fields": [],
        }
    ds = _core.Dataset.open(str(path))  # validates every index (or column header) against its file
    if m.get("format") == "stoker-arrays":
        return {
            "format": m["format"],
            "version": m["version"],
            "num_samples": len(ds),
            "classes": m.get("classes", []),
            "source_format": m.get("source_format"),
            "shards": len(m["shards"]),
            "bytes": m.get("bytes"),
            "shard_bytes": [sum(f["bytes"] for f in s["files"]) for s in m["shards"]],
            "fields": m["fields"],
        }
    return {
        "format": m["format"],
        "version": m["version"],
        "num_samples": len(ds),
        "classes": m["classes"],
        "class_counts": m.get("class_counts"),
        "source_format": m.get("source_format"),
        "shards": len(m["shards"]),
        "bytes": m.get("bytes"),
        "shard_bytes": [s.get("bytes") for s in m["shards"]],
        "max_side": m.get("max_side"),
        "codec": m.get("codec", "source"),
        "quality": m.get("quality"),
        "video_keyint": m.get("video_keyint"),
        "video_remux": m.get("video_remux"),
        "audio_rate": m.get("audio_rate"),
        "audio_channels": m.get("audio_channels"),
        "failed": len(m.get("failed", [])),
        "fields": m.get("fields", []),
    }
